"""What the per-chunk crc32c costs: the same Atari transitions in a store with checksums
(the default) and one without, read and written in the same run, interleaved.

    python benchmarks/bench_checksum.py [--n 20000] [--repeats 7]

Reads: uniform stacked batches (``store.sample``, 4 x 84x84 frames obs + next obs) of 32
and 256, warm page cache, one process; also the raw frame decode path alone
(``ShardReader.read`` of single frames). Writes: ``extend`` of the whole stream (no fsync,
so the codec path dominates). Writes the "Checksum cost" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import expstore as es  # noqa: E402
from benchmarks.expstore_case import extend_batches, spec_for_frames  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402


def build(data: dict, path: Path, checksum: bool) -> tuple[es.Store, float]:
    store = es.create(path, spec_for_frames(), capacity=len(data["frames"]), fsync=False,
                      overwrite=True, checksum=checksum)
    t0 = time.perf_counter()
    for batch in extend_batches(data, 1000):
        store.extend(batch)
    store.flush()
    dt = time.perf_counter() - t0
    store.close()
    return es.open(path), int(np.sum(data["valid"])) / dt


def sample_rate(store: es.Store, bs: int, seconds: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    store.sample(bs, rng=rng)  # warm
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        store.sample(bs, rng=rng)
        n += bs
    return n / (time.perf_counter() - t0)


def decode_rate(store: es.Store, seconds: float, seed: int) -> float:
    """Single frames through ``ShardReader.read`` (no stacking, no batch assembly)."""
    rng = np.random.default_rng(seed)
    idx = store.index
    lo, hi = int(idx.lower_bound()[0]), int(idx.count[0])
    out = np.empty((256, 84, 84), np.uint8)
    reader = store.reader
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps = rng.integers(lo, hi, 256)
        reader.read("obs", idx.lane_rows(0, steps), steps, out)
        n += 256
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--game", default="Pong")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    data = load_atari_frames(args.n, args.game)
    runs: dict[str, dict[str, list[float]]] = {"crc32c": {}, "none": {}}
    with tempfile.TemporaryDirectory(prefix="expstore-crc-") as tmp:
        stores = {}
        for r in range(args.repeats):
            for name, flag in (("crc32c", True), ("none", False)) if r % 2 == 0 else \
                    (("none", False), ("crc32c", True)):
                if name in stores:
                    stores[name].close()
                stores[name], ext = build(data, Path(tmp) / f"{name}.zarr", flag)
                res = runs[name]
                res.setdefault("extend", []).append(ext)
                res.setdefault("decode", []).append(decode_rate(stores[name], args.seconds, r))
                for bs in (32, 256):
                    res.setdefault(f"sample{bs}", []).append(
                        sample_rate(stores[name], bs, args.seconds, r))
        for s in stores.values():
            s.close()
    med = {k: {m: statistics.median(v) for m, v in res.items()} for k, res in runs.items()}
    rows = []
    for metric, label in (("decode", "frame decode (frames/s)"),
                          ("sample32", "sample bs32 (transitions/s)"),
                          ("sample256", "sample bs256 (transitions/s)"),
                          ("extend", "extend (transitions/s)")):
        a, b = med["crc32c"][metric], med["none"][metric]
        rows.append({"metric": label, "crc32c (default)": f"{a:,.0f}",
                     "no checksum": f"{b:,.0f}", "crc32c / none": f"{a / b:.3f}"})
    print(markdown_table(rows))
    save_json("checksum", {"args": vars(args), "runs": runs, "medians": med})
    cfg = spec_for_frames().fields["obs"].resolved_codec()
    codec = f"{cfg.get('name')}-{cfg.get('cname', '')}-{cfg.get('clevel', cfg.get('level'))}"
    body = (markdown_table(rows) + f"\n\nMedians of {args.repeats} interleaved repeats "
            f"({args.seconds:g} s each for reads), {args.n:,} {args.game} frames, warm page "
            f"cache, one process, frames coded {codec}. The checksum adds 4 bytes per inner chunk "
            "and one crc32c per chunk read (hardware crc32c, ~1 µs per frame).")
    write_section("Checksum cost", body, command=command_line())


if __name__ == "__main__":
    main()
