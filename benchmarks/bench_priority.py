"""PER priority index benchmark: expstore PriorityTree vs TorchRL's C++ segment trees.

One step = sample 256 indices (stratified, proportional to priority), then update those 256
indices with new random priorities. Reported: median over repeats of the mean time per step
(us), for

* ``expstore``: ``PriorityTree.sample(256, rng)`` + ``PriorityTree.update(idx, p)``;
* ``torchrl_sampler``: ``PrioritizedSampler(n, alpha=1, beta=1).sample(storage, 256)`` +
  ``update_priority(idx, p)`` (float32 C++ trees, storage = ``TensorStorage`` of n rows);
* ``torchrl_trees``: the same sampler's C++ trees driven directly: ``query`` for the total,
  stratified masses, ``scan_lower_bound``, then ``__setitem__`` on the sum and min trees.

Implementations are interleaved within each repeat so machine noise hits all alike.
TorchRL is optional: without a loadable ``torchrl._torchrl`` only expstore is measured. The
extension must match the installed torch: torchrl 0.14.1 loads with torch 2.14.x but fails
with an undefined symbol under torch 2.13, so run this from an environment with torch 2.14.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from expstore.index import PriorityTree  # noqa: E402

BATCH = 256


def _torchrl_error() -> str | None:
    try:
        import torch  # noqa: F401
        from torchrl._torchrl import MinSegmentTreeFp32, SumSegmentTreeFp32  # noqa: F401
    except Exception as err:  # ImportError, or OSError/undefined symbol on ABI mismatch
        return f"{type(err).__name__}: {str(err)[:160]}"
    return None


def expstore_case(p: np.ndarray, seed: int) -> Callable[[], None]:
    tree = PriorityTree.from_leaves(p)
    rng = np.random.default_rng(seed)

    def step() -> None:
        idx = tree.sample(BATCH, rng)
        tree.update(idx, rng.random(BATCH, dtype=np.float32) + np.float32(1e-3))

    return step


def torchrl_cases(p: np.ndarray, seed: int) -> dict[str, Callable[[], None]]:
    import torch
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler
    from torchrl.data.replay_buffers.storages import TensorStorage

    n = p.size
    sampler = PrioritizedSampler(max_capacity=n, alpha=1.0, beta=1.0)
    storage = TensorStorage(torch.zeros(n, dtype=torch.uint8), max_size=n)
    sampler.update_priority(torch.arange(n), torch.from_numpy(p))
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)

    def sampler_step() -> None:
        idx, _info = sampler.sample(storage, BATCH)
        pri = torch.from_numpy(rng.random(BATCH, dtype=np.float32) + np.float32(1e-3))
        sampler.update_priority(idx, pri)

    # a second sampler so the two TorchRL cases do not share state
    raw = PrioritizedSampler(max_capacity=n, alpha=1.0, beta=1.0)
    raw.update_priority(torch.arange(n), torch.from_numpy(p))
    sum_tree, min_tree = raw._sum_tree, raw._min_tree
    offsets = np.arange(BATCH, dtype=np.float64)

    def trees_step() -> None:
        total = sum_tree.query(0, n)
        mass = (offsets + rng.random(BATCH)) * (total / BATCH)
        idx = sum_tree.scan_lower_bound(torch.from_numpy(mass.astype(np.float32)))
        pri = torch.from_numpy(rng.random(BATCH, dtype=np.float32) + np.float32(1e-3))
        sum_tree[idx] = pri
        min_tree[idx] = pri

    return {"torchrl_sampler": sampler_step, "torchrl_trees": trees_step}


def _time(step: Callable[[], None], steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e6


def run_size(n: int, args: argparse.Namespace, with_torchrl: bool) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    p = (rng.random(n, dtype=np.float32) + np.float32(1e-3)).astype(np.float32)
    t0 = time.perf_counter()
    tree = PriorityTree.from_leaves(p)
    build_s = time.perf_counter() - t0
    row: dict[str, Any] = {"rows": n, "build_s": build_s, "bytes_per_row": tree.nbytes / n}
    del tree
    cases = {"expstore": expstore_case(p, args.seed)}
    if with_torchrl:
        cases.update(torchrl_cases(p, args.seed))
    for step in cases.values():  # warm-up
        _time(step, max(args.steps // 10, 5))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, step in cases.items():
            samples[name].append(_time(step, args.steps))
    for name, vals in samples.items():
        row[f"{name}_us"] = float(np.median(vals))
        row[f"{name}_us_min"] = float(np.min(vals))
        row[f"{name}_us_all"] = vals
    for base in ("torchrl_sampler", "torchrl_trees"):
        if f"{base}_us" in row:
            row[f"speedup_vs_{base}"] = row[f"{base}_us"] / row["expstore_us"]
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,1000000,10000000", help="comma list of rows")
    ap.add_argument("--repeats", type=int, default=7, help="repeats (median reported), >= 5")
    ap.add_argument("--steps", type=int, default=200, help="sample+update steps per repeat")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-torchrl", action="store_true", help="measure expstore only")
    ap.add_argument("--out", default="benchmarks/results/priority.json", help="JSON output path")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    err = "disabled by --no-torchrl" if args.no_torchrl else _torchrl_error()
    if err:
        print(f"torchrl C++ segment trees unavailable ({err}); measuring expstore only")
    rows = [run_size(int(s), args, err is None) for s in args.sizes.split(",")]
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    if err is None:
        import torch
        import torchrl

        versions.update(torch=torch.__version__, torchrl=torchrl.__version__)
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "batch": BATCH, "repeats": args.repeats, "steps": args.steps,
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}", "versions": versions,
        "load_avg_1m": os.getloadavg()[0], "torchrl_error": err, "results": rows,
    }
    by_n = {r["rows"]: r for r in rows}
    if 10_000 in by_n and 10_000_000 in by_n:
        ratio = by_n[10_000_000]["expstore_us"] / by_n[10_000]["expstore_us"]
        result["expstore_10M_over_10k"] = ratio

    cols = ["expstore", "torchrl_sampler", "torchrl_trees"]
    print(f"\nPER sample+update, batch {BATCH}: median us/step over {args.repeats} repeats "
          f"x {args.steps} steps (speedup = torchrl time / expstore time)")
    print(f"{'rows':>11} | {'B/row':>5} | {'build s':>7} | " + " | ".join(f"{c:>15}" for c in cols)
          + " | vs sampler | vs trees")
    for r in rows:
        vals = " | ".join(f"{r[c + '_us']:15.1f}" if c + "_us" in r else f"{'-':>15}" for c in cols)
        sp = [f"{r[k]:9.2f}x" if k in r else f"{'-':>10}"
              for k in ("speedup_vs_torchrl_sampler", "speedup_vs_torchrl_trees")]
        print(f"{r['rows']:>11,} | {r['bytes_per_row']:5.2f} | {r['build_s']:7.3f} | {vals} | "
              f"{sp[0]} | {sp[1]}")
    if "expstore_10M_over_10k" in result:
        print(f"expstore 10M / 10k time ratio: {result['expstore_10M_over_10k']:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
