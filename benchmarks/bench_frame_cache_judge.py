"""The frame cache used or passed by, on one store: what the judge's line costs.

Usage (from the repository root)::

    python benchmarks/bench_frame_cache_judge.py --build pong:/work/bench_cache/pong100k.zarr
    python benchmarks/bench_frame_cache_judge.py --store /work/bench_cache/pong100k.zarr \\
        --cache-bytes 268435456 --batch-size 32 --rounds 5

A frame cache is passed by when fewer than its ``line`` of the lookups that find their slot
taken hit (``read_cache.BYPASS_BELOW``, ``FRAME_BYPASS_BELOW`` for image frames). This
opens a store read-only with ``--cache-bytes`` of frame cache, samples for ``--warmup``
seconds, then moves that line between 1.01 (never used but by its probes) and 0 (always
used) ``--rounds`` times: after each move
1 s of sampling lets the cache fill or drain, then ``store.sample(B)`` is timed for
``--seconds``. Prints median µs per batch either way and the judged hit rate; saves
``results/frame_cache_judge.json``; writes no RESULTS section.

``--build KIND:PATH`` makes a store first with ``bench_rss.build``: ``pong`` (100k rows
of 84x84 Pong frames) or ``small`` (10M rows of 4x4 frames).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import expstore as es  # noqa: E402
from benchmarks.baselines import timed_loop  # noqa: E402
from benchmarks.report import markdown_table, save_json  # noqa: E402

BUILDS = {"pong": (100_000, 1), "small": (10_000_000, 21)}  # rows, pixel subsample


def us_per_batch(store: es.Store, B: int, seconds: float) -> float:
    return 1e6 * B / timed_loop(lambda: store.sample(B), B, seconds, warmup=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store")
    ap.add_argument("--build", help="KIND:PATH, KIND one of " + ", ".join(BUILDS))
    ap.add_argument("--cache-bytes", type=int, default=256 << 20)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=1.5)
    a = ap.parse_args()
    if a.build:
        from benchmarks.bench_rss import build

        kind, path = a.build.split(":", 1)
        rows, subsample = BUILDS[kind]
        build(Path(path), rows, subsample=subsample).close()
        if not a.store:
            return
    store = es.open(a.store, mode="r", cache_bytes=a.cache_bytes)
    t = time.perf_counter()
    while time.perf_counter() - t < a.warmup:
        store.sample(a.batch_size)
    cache = store._reader.row_caches.get("obs")  # (the reader is made by the first read)
    if not cache:
        raise SystemExit(f"{a.store}: no frame cache for 'obs' (a field of frames, stack > 1)")
    runs: dict[str, list[float]] = {"passed_by": [], "used": []}
    rates, line = [], cache.line
    for _ in range(a.rounds):
        for case, value in (("passed_by", 1.01), ("used", 0.0)):
            cache.line = value
            us_per_batch(store, a.batch_size, 1.0)  # the cache fills or drains
            runs[case].append(us_per_batch(store, a.batch_size, a.seconds))
            if case == "used":
                rates.append(cache.hit_rate)
    row = {"store": a.store, "cache_mib": a.cache_bytes >> 20, "batch": a.batch_size,
           "line": line,
           "hit_rate": statistics.median(rates),
           "passed_by_us": statistics.median(runs["passed_by"]),
           "used_us": statistics.median(runs["used"])}
    row["used_x_passed_by"] = row["used_us"] / row["passed_by_us"]
    print(markdown_table([row]))
    save_json("frame_cache_judge", {"rows": [row], "runs": runs})


if __name__ == "__main__":
    main()
