"""In-process ``store.sample(B)`` on a store already on disk: for A/B runs of two checkouts.

Usage (from the repository root)::

    python benchmarks/bench_sample_store.py --store /work/bench_msp/expstore.zarr \\
        --batch-sizes 32,256 --warmup 5 --repeats 5

Opens the store read-only in this process, samples for ``--warmup`` seconds (the hot set,
the frame cache and the held arenas fill as they would in training), then times
``store.sample(B)`` for a second ``--repeats`` times per batch size, the sizes
alternating, dropping each batch before the next as a training loop does. Prints and
saves (``results/sample_store.json``) median µs per batch and transitions/s; writes no
RESULTS section (``compare_revisions.py`` reads the json). The store is not changed.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--batch-sizes", default="32,256")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    sizes = [int(b) for b in a.batch_sizes.split(",")]
    store = es.open(a.store, mode="r")
    t = time.perf_counter()
    while time.perf_counter() - t < a.warmup:
        for B in sizes:
            store.sample(B)
    per: dict[int, list[float]] = {B: [] for B in sizes}
    for r in range(a.repeats):
        for B in (sizes if r % 2 == 0 else sizes[::-1]):
            rate = timed_loop(lambda B=B: store.sample(B), B, 1.0, warmup=0)
            per[B].append(B / rate * 1e6)
    store.close()
    row: dict[str, object] = {"case": "expstore"}
    for B in sizes:
        us = statistics.median(per[B])
        row[f"us_per_batch_bs{B}"] = us
        row[f"tps_bs{B}"] = B / us * 1e6
    print(markdown_table([row]))
    save_json("sample_store", {"args": vars(a), "runs": per, "rows": [row]})


if __name__ == "__main__":
    main()
