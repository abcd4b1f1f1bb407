"""Scalar rows read by the C kernel: only the row's blosc block vs the whole chunk.

Usage (from the repository root)::

    python benchmarks/bench_kernel_rows.py --shards 8 --rows 256 --repeats 15

Builds a small-frame store (``bench_rss.build``: one template shard of 4096 rows repeated)
and reads ``--rows`` random rows of ``action`` (int64, byte-shuffled) and ``reward``
(float32) with one ``_kernels.read_rows`` call each way, interleaved: decoding each row's
whole 4096-row chunk (as when the chunk is kept in a value slot) against decoding only
the block holding the row and gathering its bytes from the shuffled planes (what a read
does when the decoded-values budget covers less than half the field's shards). Prints
median µs per row of each and their ratio; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import expstore as es  # noqa: E402
from benchmarks.bench_rss import build  # noqa: E402
from expstore.storage import backend_for  # noqa: E402
from expstore.storage.read import ShardReader  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--repeats", type=int, default=15)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        path = Path(tmp) / "s.zarr"
        build(path, a.shards * 4096, subsample=21).close()
        store = es.open(path)
        L = store.layout
        S = L.shard_rows
        reader = ShardReader(backend_for(store.url), L, row_cache_bytes=0, values_budget=0)
        rng = np.random.default_rng(0)
        rows = rng.integers(0, a.shards * S, a.rows)
        steps = store.index.steps(rows)
        n = len(rows)
        for name in ("action", "reward"):
            fds = reader.tables[name].fds
            f = L.fields[name]
            flat = np.zeros((n, *f.shape), f.dtype).reshape(n, -1).view(np.uint8)
            scratch = np.zeros((1, S * f.dtype.itemsize), np.uint8)
            reader.known[:] = 1 << 40  # (every step committed: the kernel trusts them)

            def read(whole: bool, fds=fds, flat=flat, scratch=scratch) -> float:
                extra = (scratch, np.zeros(n, np.int64)) if whole else ()
                t = time.perf_counter()
                got, _ = fds.read(rows // S, rows % S, steps, np.arange(n), flat,
                                  reader.stats, *extra)
                dt = time.perf_counter() - t
                assert got.all()
                return dt

            read(True), read(False)
            whole, alone = [], []
            for _ in range(a.repeats):
                whole.append(read(True))
                alone.append(read(False))
            w = statistics.median(whole) / n * 1e6
            r = statistics.median(alone) / n * 1e6
            print(f"{name}: whole chunk {w:.2f} µs/row, row's block only {r:.2f} µs/row, "
                  f"ratio {w / r:.2f}")
        reader.close()
        store.close()


if __name__ == "__main__":
    main()
