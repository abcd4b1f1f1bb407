"""Sampler benchmarks on synthetic indexes of 10k .. 100M rows (index work only, no reads).

* ``per``: one step = ``PrioritizedSampler.plan(256)`` (stratified draw, validity check,
  IS weights, read plan) + ``update_priorities(rows, td, step_id)``, against TorchRL's
  ``PrioritizedSampler.sample(storage, 256)`` + ``update_priority`` (C++ trees) holding the
  same priorities; at 10k, 1M and 10M rows.
* ``seq``: one step = ``SequenceSampler(length=80, overlap=40).plan(64)`` (uniform and
  prioritized) at 1M, 10M and 100M rows, against TorchRL's ``SliceSampler(slice_len=80,
  traj_key=...)`` (``cache_values=False``, the default: it rescans the storage each call,
  TorchRL issue #2669) at 1M and 10M rows.
* ``memory``: bytes per row of the row index plus the PER priorities (``nbytes``), and the
  resident-memory growth measured while building them.

The index is built directly (no store on disk): episodes of 100..2000 steps, each followed
by its final row, the ring full. Implementations are interleaved within each repeat;
figures are medians over repeats of the mean time per step.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.report import markdown_table, save_json, write_section  # noqa: E402
from expstore import PrioritizedSampler, SequenceSampler  # noqa: E402
from expstore.index import RowIndex  # noqa: E402
from expstore.rows import FLAG_FIRST, FLAG_LAST  # noqa: E402


class IndexOnly:
    """The part of a store a sampler needs to plan: its index (no storage)."""

    mode = "r"

    def __init__(self, index: RowIndex, history: int = 0) -> None:
        self.index = index
        self.history = history
        self.capacity = index.capacity

    def __len__(self) -> int:
        return int((self.index.count - self.index.valid_from).sum())


def synthetic_index(n: int, seed: int = 0, lo: int = 100, hi: int = 2000) -> RowIndex:
    """A full one-lane ring of ``n`` rows: episodes of ``lo..hi`` steps + a final row each."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(lo + 1, hi + 2, size=n // lo + 2)  # rows incl. the final row
    ends = np.cumsum(lengths)
    k = int(np.searchsorted(ends, n)) + 1
    lengths, ends = lengths[:k], ends[:k]
    idx = RowIndex(1, n)
    starts = ends - lengths
    ep = np.arange(n, dtype=np.int32)
    ep -= np.repeat(starts.astype(np.int32), lengths)[:n]
    idx.episode_step[:] = ep
    del ep
    flags = idx.flags
    flags[idx.episode_step == 0] = FLAG_FIRST
    last = ends[ends <= n] - 1
    flags[last] |= FLAG_LAST
    idx.count[0] = n
    idx.committed[0] = n
    return idx


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _median_runs(cases: dict[str, Callable[[], None]], blocks: int,
                 steps: int) -> dict[str, tuple[float, float]]:
    """Per case: median over ``blocks`` of the mean (wall, CPU) seconds per call in a block
    of ``steps`` calls. The cases' blocks alternate, so machine noise hits all alike; CPU
    time (this process) is what a busy machine distorts least."""
    for fn in cases.values():  # warm-up
        fn()
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for _ in range(blocks):
        for k, fn in cases.items():
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                fn()
            runs[k].append(((time.perf_counter() - w0) / steps,
                            (time.process_time() - c0) / steps))
    return {k: (float(np.median([r[0] for r in v])), float(np.median([r[1] for r in v])))
            for k, v in runs.items()}


# -- PER -------------------------------------------------------------------------------------
def per_cases(n: int, seed: int) -> dict[str, Callable[[], None]]:
    import torch
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler as TRLSampler
    from torchrl.data.replay_buffers.storages import TensorStorage

    idx = synthetic_index(n, seed)
    rng = np.random.default_rng(seed)
    p = (rng.random(n, dtype=np.float32) + np.float32(1e-3))
    p[(idx.flags & FLAG_LAST) != 0] = 0
    s = PrioritizedSampler(IndexOnly(idx), alpha=1.0, eps=0.0, beta=0.4, seed=seed,
                           persist=False)
    s.priorities.set(np.arange(n), p)  # (rows not drawn, final ones: skipped)

    def ours() -> None:  # what TorchRL's sampler does: rows + IS weights, then update
        rows, _w = s.sample_rows(256)
        s.update_priorities(rows, rng.random(256), idx.steps(rows))

    def ours_plan() -> None:  # and the read plan (horizon, frame-stack rows) on top
        plan = s.plan(256)
        s.update_priorities(plan.rows, rng.random(256), plan.steps)

    trl = TRLSampler(max_capacity=n, alpha=1.0, beta=0.4)
    storage = TensorStorage(torch.zeros(n, dtype=torch.uint8), max_size=n)
    trl.update_priority(torch.arange(n), torch.from_numpy(p))
    torch.manual_seed(seed)

    def theirs() -> None:
        i, _info = trl.sample(storage, 256)
        trl.update_priority(i, torch.from_numpy(rng.random(256, dtype=np.float32)))

    return {"expstore": ours, "expstore+plan": ours_plan, "torchrl": theirs}


# -- sequences -------------------------------------------------------------------------------
def seq_cases(n: int, seed: int, torchrl: bool) -> dict[str, Callable[[], None]]:
    idx = synthetic_index(n, seed)
    store = IndexOnly(idx)
    uni = SequenceSampler(store, length=80, overlap=40, seed=seed)
    pri = SequenceSampler(store, length=80, overlap=40, prioritized=True, seed=seed,
                          persist=False)
    live = np.flatnonzero(pri.priorities.get() > 0)
    pri.priorities.set(live, np.random.default_rng(seed).random(len(live)) + 1e-3)
    del live
    cases: dict[str, Callable[[], None]] = {
        "expstore uniform": lambda: uni.plan(64),
        "expstore prioritized": lambda: pri.plan(64),
    }
    if torchrl:
        import torch
        from tensordict import TensorDict
        from torchrl.data.replay_buffers.samplers import SliceSampler
        from torchrl.data.replay_buffers.storages import TensorStorage

        episode = torch.from_numpy(np.cumsum(idx.episode_step == 0).astype(np.int64))
        st = TensorStorage(TensorDict({"episode": episode}, batch_size=[n]), max_size=n)
        sl = SliceSampler(slice_len=80, traj_key="episode", cache_values=False,
                          strict_length=False)
        cases["torchrl SliceSampler"] = lambda: sl.sample(st, 64 * 80)
    return cases


def memory_case(n: int, seed: int) -> dict[str, Any]:
    gc.collect()
    before = _rss()
    idx = synthetic_index(n, seed)
    gc.collect()
    mid = _rss()
    s = PrioritizedSampler(IndexOnly(idx), persist=False)
    gc.collect()
    after = _rss()
    out = {
        "rows": n,
        "index B/row (nbytes)": idx.nbytes / n,
        "PER priorities B/row (nbytes)": s.priorities.nbytes / n,
        "total B/row (nbytes)": (idx.nbytes + s.priorities.nbytes) / n,
        "index B/row (RSS growth)": (mid - before) / n,
        "total B/row (RSS growth)": (after - before) / n,
    }
    del s, idx
    gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=60, help="timed blocks per case")
    ap.add_argument("--per-steps", type=int, default=20, help="PER steps per block")
    ap.add_argument("--seq-steps", type=int, default=5, help="sequence batches per block")
    ap.add_argument("--per-sizes", default="10000,1000000,10000000")
    ap.add_argument("--seq-sizes", default="1000000,10000000,100000000")
    ap.add_argument("--torchrl-seq-max", type=int, default=10_000_000,
                    help="largest size the TorchRL SliceSampler baseline runs at")
    ap.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")
    args = ap.parse_args()
    seed = 0
    load = os.getloadavg()[0]
    result: dict[str, Any] = {"memory": memory_case(10_000_000, seed), "load_avg_1m": load}
    print("memory", result["memory"], flush=True)

    per_rows = []
    for n in map(int, args.per_sizes.split(",")):
        cases = per_cases(n, seed)
        t = _median_runs(cases, args.blocks, args.per_steps)
        row: dict[str, Any] = {"rows": n}
        for i, clock in enumerate(("wall", "cpu")):
            row.update({f"{k} {clock} (us)": v[i] * 1e6 for k, v in t.items()})
            row[f"vs torchrl {clock}"] = t["torchrl"][i] / t["expstore"][i]
            row[f"+plan vs torchrl {clock}"] = t["torchrl"][i] / t["expstore+plan"][i]
        per_rows.append(row)
        print(row, flush=True)
        del cases
        gc.collect()
    for clock in ("wall", "cpu"):
        base = per_rows[0][f"expstore {clock} (us)"]
        for r in per_rows:
            r[f"expstore vs first {clock}"] = r[f"expstore {clock} (us)"] / base
    result["per"] = per_rows

    seq_rows = []
    for n in map(int, args.seq_sizes.split(",")):
        cases = seq_cases(n, seed, torchrl=n <= args.torchrl_seq_max)
        t = _median_runs(cases, args.blocks, args.seq_steps)
        row = {"rows": n, **{f"{k} {clock} (ms)": v[i] * 1e3 for k, v in t.items()
                             for i, clock in enumerate(("wall", "cpu"))}}
        seq_rows.append(row)
        print(row, flush=True)
        del cases
        gc.collect()
    for case in ("expstore uniform", "expstore prioritized", "torchrl SliceSampler"):
        for clock in ("wall", "cpu"):
            key = f"{case} {clock} (ms)"
            first = seq_rows[0].get(key)
            for r in seq_rows:
                if key in r and first:
                    r[f"{case} vs first {clock}"] = r[key] / first
    result["seq"] = seq_rows
    save_json("sampling", result)
    if args.no_write:
        return
    mem = result["memory"]
    per_cols = ["rows"] + [f"{k} wall (us)" for k in ("expstore", "expstore+plan", "torchrl")]
    per_cols += [f"{a} {c}" for a in ("vs torchrl", "+plan vs torchrl") for c in ("wall", "cpu")]
    per_cols += [f"expstore vs first {c}" for c in ("wall", "cpu")]
    cases = ("expstore uniform", "expstore prioritized", "torchrl SliceSampler")
    seq_cols = ["rows"] + [f"{k} wall (ms)" for k in cases]
    seq_cols += [f"{k} vs first {c}" for k in cases for c in ("wall", "cpu")]
    body = "\n\n".join([
        "**PER sample + update of 256** on the same priorities. `expstore`: "
        "`PrioritizedSampler.sample_rows(256)` (stratified draw, validity check against the "
        "index, IS weights) + `update_priorities(rows, td, step_id)` (skips rows overwritten "
        "since); `expstore+plan` also builds the read plan (`plan(256)`: n-step horizon and "
        "frame-stack rows the reader needs). TorchRL: `PrioritizedSampler` (C++ sum/min "
        "trees) `sample(storage, 256)` (indices + weights) + `update_priority`. "
        "`vs torchrl` = TorchRL time / expstore time (> 1: expstore faster); "
        "`vs first` = time / time at the smallest size.",
        markdown_table(per_rows, per_cols),
        "**Sequence sampling, batch 64 x length 80 (overlap 40)**: "
        "`SequenceSampler.plan(64)` (start rows, window validity, masks, frame-stack rows), "
        "uniform and prioritized. TorchRL `SliceSampler(slice_len=80, traj_key=..., "
        "cache_values=False)` (64 x 80 elements); not run above "
        f"{args.torchrl_seq_max:,} rows.",
        markdown_table(seq_rows, seq_cols),
        "**Index memory** at 10M rows: row index (episode position int32 + flags uint8) "
        "plus the PER sum/min tree (float32 leaves, float64 sums / float32 minima per "
        "8 children), by `nbytes` and by resident-memory growth while building them.",
        markdown_table([mem]),
        f"Figures: median over {args.blocks} timed blocks of the mean time per step in a "
        f"block of {args.per_steps} PER steps / {args.seq_steps} sequence batches; the "
        "cases' blocks alternate. wall = elapsed time, cpu = this process's CPU time (less "
        "distorted on a busy machine). Synthetic full ring: episodes of 100..2000 steps + a "
        "final row. Full runs (both clocks) in `benchmarks/results/sampling.json`.",
    ])
    import torch

    write_section("Sampling", body, extra={
        "note": "run with a torch whose ABI matches torchrl's C++ extension (here "
                f"{torch.__version__}); expstore itself needs no torchrl",
        "load average (1 min) at start": round(load, 2)})


if __name__ == "__main__":
    main()
