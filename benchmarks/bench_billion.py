"""The read side at a billion rows: a store of tiny rows, sampled at 1M and at 1B rows.

Usage (from the repository root)::

    python benchmarks/bench_billion.py --sizes 1000000,1000000000 --path /work/bench_1b --keep

A frame store of a billion rows would need ~40-60 GB of disk (each frame is its own
chunk, ~40 B of it overhead), so this store holds what fits: every row a 2-byte vector
observation (``obs``, shape ``(2,)``, in multi-row vector chunks), a discrete action, a
reward and the two end flags, with the metadata a writer leaves (``_step_id``,
``_episode_step``, ``_flags``, the index snapshot). Shards are written by hand from one
encoded template shard (as ``bench_rss.py`` builds its stores), each with its own header.

Each size is opened and sampled in a fresh process, after the store's files were read
into the page cache: open time and peak RSS, then ``store.sample(32)`` and
``store.sample(256)`` after a warm-up drawing every shard, and every 16,384 rows, ~8 times
(medians of repeats).
x_smallest = the figure / the smallest store's. How warm that was is measured
(``benchmarks/page_cache.py``): the store's pages resident before and after, and the disk
bytes the sampling process read per batch. Writes section "Sampling at a billion
rows" of benchmarks/RESULTS.md and results/billion.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import expstore as es  # noqa: E402
from benchmarks.baselines import dir_bytes, warm_page_cache  # noqa: E402
from benchmarks.bench_rss import chunks_of, template_scalars, write_template_shards  # noqa: E402
from benchmarks.page_cache import resident_fraction, resident_pct, warmth_note  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402


def build(path: Path, rows: int, episode_len: int = 800) -> int:
    """A ``rows``-row store of tiny rows (module doc); its bytes on disk."""
    spec = es.Spec.create(obs=es.Field((2,), np.uint8),
                          action=es.Field((), np.int64, low=0, high=17))
    store = es.create(path, spec, capacity=rows, overwrite=True, fsync=False)
    L, S = store.layout, store.layout.shard_rows
    obs = np.random.default_rng(1).integers(0, 256, (S, 2)).astype(np.uint8)
    chunks, pos, flags = template_scalars(store, episode_len)
    chunks["obs"] = chunks_of(L, "obs", obs)
    write_template_shards(store, chunks, pos, flags, episode_len, every=5000)
    store.close()
    return dir_bytes(path)[0]


CHILD = r"""
import json, resource, statistics, sys, time
sys.path.insert(0, sys.argv[2])
import expstore as es
from benchmarks.baselines import timed_loop
from benchmarks.page_cache import DiskMeter
t0 = time.perf_counter()
store = es.open(sys.argv[1])
r = {"open_s": time.perf_counter() - t0,
     "open_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
     "rows": len(store), "shard_rows": store.layout.shard_rows,
     "shards": store.capacity // store.layout.shard_rows}
repeats, seconds = int(sys.argv[3]), float(sys.argv[4])
for bs in (32, 256):
    step = DiskMeter(lambda: store.sample(bs))
    # (every shard ~8 times, and every 16,384 rows: stores of larger shards warm as long)
    for _ in range(max(1, 8 * max(r["shards"], r["rows"] // 16384) // bs)):
        step()
    step.start()
    runs = [timed_loop(step, bs, seconds) for _ in range(repeats)]
    step.stop()
    r[f"us_per_batch_bs{bs}"] = 1e6 * bs / statistics.median(runs)
    r[f"disk_kb_per_batch_bs{bs}"] = step.kb_per_call
r["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(r))
"""


def measure(path: Path, repeats: int, seconds: float) -> dict:
    warm_page_cache(path)  # the measurement is of warm reads
    before = resident_fraction(path)
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), root, str(repeats),
                          str(seconds)], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["resident_pct"] = resident_pct(before, path)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000000,1000000000", help="comma-separated rows")
    ap.add_argument("--path", default=".bench_billion", help="folder of the stores")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--keep", action="store_true", help="keep the stores (and reuse them)")
    ap.add_argument("--no-write", action="store_true", help="print, do not write RESULTS")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    root = Path(a.path)
    root.mkdir(parents=True, exist_ok=True)
    results = []
    for rows in (int(x) for x in a.sizes.split(",")):
        path = root / f"tiny_{rows}.zarr"
        built = None
        if not (a.keep and (path / "_state").is_dir()):
            print(f"building a {rows:,}-row store at {path} ...", flush=True)
            t0 = time.perf_counter()
            size = build(path, rows)
            built = time.perf_counter() - t0
        else:
            size = dir_bytes(path)[0]
        r = {**measure(path, a.repeats, a.seconds), "gb_on_disk": size / 1e9,
             "build_s": built}
        print(r, flush=True)
        results.append(r)
        if not a.keep:
            shutil.rmtree(path, ignore_errors=True)
    base = results[0]
    for r in results:
        for k in ("us_per_batch_bs32", "us_per_batch_bs256"):
            r[k.replace("us_per_batch_", "") + "_x_smallest"] = r[k] / base[k]
    body = markdown_table(results, [
        "rows", "shards", "gb_on_disk", "open_s", "open_rss_mb", "us_per_batch_bs32",
        "bs32_x_smallest", "us_per_batch_bs256", "bs256_x_smallest", "resident_pct",
        "disk_kb_per_batch_bs256", "rss_mb"])
    body += (
        "\n\nA store of tiny rows (obs: 2 bytes, a vector in multi-row chunks; a discrete "
        "action, a reward, two end flags; one template shard written per shard with its own "
        "header, and the writer's index snapshot): a frame store of 1B rows would need "
        "40-60 GB of disk. Each size in a fresh process, warm page cache: open_s / "
        "open_rss_mb = `es.open` time and the peak RSS after it (MiB); `store.sample(B)` "
        "after a warm-up drawing every shard and every 16,384 rows ~8 times, medians of "
        "repeats; rss_mb = peak RSS "
        f"at the end. {warmth_note()} Load average (1 min) {load0:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end.")
    print(body)
    save_json("billion", {"results": results})
    if not a.no_write:
        write_section("Sampling at a billion rows", body, command=command_line())


if __name__ == "__main__":
    main()
