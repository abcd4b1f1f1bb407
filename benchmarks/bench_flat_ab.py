"""Sampling cost against store size, both sizes in one process, timed in alternation.

``bench_rss.py --flat`` measures each size in its own process, one after the other: on a
machine whose speed drifts from minute to minute, the ratio of two such figures moves by a
third from run to run (RESULTS, "Issue 26: read path, status", item 3's 100M row). Here the
stores of each size are opened side by side in one process, warmed as ``bench_rss`` warms
them, and timed in rounds: each round times every size at batch 32 and 256 (the order
reversed every other round), so each round's ratio is taken over the same seconds of the
machine. The figure is the median of the rounds' ratios.

Usage (from the repository root; the stores are ``bench_rss --flat``'s small-frame stores,
built there if missing)::

    python benchmarks/bench_flat_ab.py --sizes 1000000,100000000 --path /work/bench_flat/store.zarr
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import expstore as es  # noqa: E402
from benchmarks.baselines import timed_loop, warm_page_cache  # noqa: E402
from benchmarks.bench_rss import build, warm_up  # noqa: E402
from benchmarks.page_cache import DiskMeter, resident_fraction, resident_pct, warmth_note  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402

BATCH_SIZES = (32, 256)


def store_path(root: Path, rows: int) -> Path:
    """Where ``bench_rss --flat --keep`` keeps its ``rows``-row small-frame store."""
    return root / f"small_{rows}.zarr"


def warm(store: es.Store) -> None:
    """Batches of each size as ``bench_rss.flat_child`` warms a store (``warm_up``)."""
    shards = len(store) // store.layout.shard_rows
    for bs in BATCH_SIZES:
        warm_up(functools.partial(store.sample, bs), bs, shards)


def alternate(stores: dict[int, es.Store], rounds: int, seconds: float) -> dict:
    """µs per batch of each store and batch size in each round (``{(rows, bs): [µs]}``),
    and the kB read from the disk per batch over all rounds."""
    us: dict[tuple[int, int], list[float]] = {(n, bs): [] for n in stores for bs in BATCH_SIZES}
    meters = {n: {bs: DiskMeter(functools.partial(s.sample, bs)) for bs in BATCH_SIZES}
              for n, s in stores.items()}
    for m in (m for per in meters.values() for m in per.values()):
        m.start()
    for r in range(rounds):
        order = list(stores) if r % 2 == 0 else list(reversed(stores))
        for n in order:
            for bs in BATCH_SIZES:
                us[(n, bs)].append(1e6 * bs / timed_loop(meters[n][bs], bs, seconds))
    for m in (m for per in meters.values() for m in per.values()):
        m.stop()
    disk = {n: {bs: meters[n][bs].kb_per_call for bs in BATCH_SIZES} for n in stores}
    return {"us": us, "disk_kb": disk}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000000,100000000",
                   help="comma-separated row counts; the first is the baseline")
    p.add_argument("--path", default=".bench_rss/store.zarr",
                   help="as bench_rss --path: the stores lie beside it")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--seconds", type=float, default=1.0, help="per size, batch size and round")
    p.add_argument("--subsample", type=int, default=21,
                   help="pixels kept when a store is built (bench_rss --subsample)")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    load0 = os.getloadavg()[0]
    root = Path(a.path).parent
    root.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in a.sizes.split(",")]
    before = {}
    for n in sizes:
        path = store_path(root, n)
        if not (path / "_index").is_dir():
            print(f"building a {n:,}-row small-frame store at {path} ...", flush=True)
            build(path, n, subsample=a.subsample).close()
        warm_page_cache(path)
        before[n] = resident_fraction(path)
    stores = {n: es.open(store_path(root, n)) for n in sizes}
    for n in sizes:
        print(f"warming {n:,} rows ...", flush=True)
        warm(stores[n])
    res = alternate(stores, a.rounds, a.seconds)
    held = {n: (len(s), s.layout.shard_rows) for n, s in stores.items()}
    for s in stores.values():
        s.close()
    base = sizes[0]
    rows = []
    for n in sizes:
        row: dict = {"rows": held[n][0], "shard_rows": held[n][1]}
        for bs in BATCH_SIZES:
            us, ref = res["us"][(n, bs)], res["us"][(base, bs)]
            ratios = [x / y for x, y in zip(us, ref)]
            row[f"us_bs{bs}"] = statistics.median(us)
            row[f"bs{bs}_x_smallest"] = statistics.median(ratios)
            row[f"bs{bs}_x_range"] = f"{min(ratios):.2f}-{max(ratios):.2f}"
            row[f"bs{bs}_rounds_over_1.5"] = sum(x > 1.5 for x in ratios)
            row[f"disk_kb_per_batch_bs{bs}"] = res["disk_kb"][n][bs]
        row["resident_pct"] = resident_pct(before[n], store_path(root, n))
        rows.append(row)
        print(row, flush=True)
    cols = ["rows", "shard_rows"]
    for bs in BATCH_SIZES:
        cols += [f"us_bs{bs}", f"bs{bs}_x_smallest", f"bs{bs}_x_range",
                 f"bs{bs}_rounds_over_1.5"]
    cols += ["resident_pct"] + [f"disk_kb_per_batch_bs{bs}" for bs in BATCH_SIZES]
    body = markdown_table(rows, cols)
    body += (f"\n\nThe small-frame stores of \"Sampling vs store size\" (4x4 frames stacked 4, "
             f"one row per chunk, blosc-lz4), opened side by side in one process with the "
             f"defaults and warmed as there; then {a.rounds} rounds, each timing "
             f"`store.sample(B)` for {a.seconds:g} s per store and batch size (the stores' "
             f"order reversed every other round). us = median µs per batch over the rounds; "
             f"x_smallest = median over the rounds of the round's µs / the first size's in "
             f"the same round; x_range = the rounds' smallest and largest ratio; "
             f"rounds_over_1.5 = rounds whose ratio exceeded 1.5. " + warmth_note())
    save_json("flat_ab", {"results": rows, "us": {f"{n}_{bs}": v for (n, bs), v
                                                   in res["us"].items()}})
    if not a.no_write:
        write_section("Sampling vs store size, alternated in one process", body,
                      command=command_line(),
                      extra={"load average (1 min) start/end":
                             f"{load0:.2f} / {os.getloadavg()[0]:.2f}"})
    print(body)


if __name__ == "__main__":
    main()
