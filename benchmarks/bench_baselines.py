"""Measure the baselines (TorchRL LazyMemmapStorage, in-RAM numpy ring) on Atari frames.

Usage (from the repository root)::

    python benchmarks/bench_baselines.py            # 50k Pong transitions
    python benchmarks/bench_baselines.py --n 200000 --game mix

Writes section "Baselines" of benchmarks/RESULTS.md and
benchmarks/results/baselines.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.baselines import measure_case, numpy_ring_case, torchrl_memmap_case  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import (  # noqa: E402
    RESULTS_MD,
    command_line,
    markdown_table,
    save_json,
    write_section,
)

COLUMNS = ["case", "extend_tps", "extend_MBps", "bytes_per_transition",
           "sample_tps_bs32", "sample_tps_bs256", "prefetch_batches_per_s_bs32"]
HEADERS = {"extend_tps": "extend (tr/s)", "extend_MBps": "extend (MB/s)",
           "bytes_per_transition": "bytes/transition",
           "sample_tps_bs32": "sample bs32 (tr/s)", "sample_tps_bs256": "sample bs256 (tr/s)",
           "prefetch_batches_per_s_bs32": "prefetch=2 iter bs32 (batches/s)"}


def data_summary(data: dict[str, Any]) -> str:
    """One line describing the frame stream (source, games, counts)."""
    return (f"{data['source']} ({data['env_id']}, random policy, seed {data['seed']}): "
            f"{len(data['frames']):,} frames, {int(data['valid'].sum()):,} transitions, "
            f"{int(data['episode_start'].sum())} episodes; frame stack 4")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=50_000, help="frames to generate (~transitions)")
    p.add_argument("--game", default="Pong", help='ALE game name or "mix"')
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5, help="sampling repeats (median)")
    p.add_argument("--extend-repeats", type=int, default=3, help="fills per case (median)")
    p.add_argument("--seconds", type=float, default=1.0, help="length of one sampling repeat (s)")
    p.add_argument("--chunk", type=int, default=1000, help="transitions per extend call")
    p.add_argument("--out", type=Path, default=RESULTS_MD, help="markdown file to update")
    p.add_argument("--json-name", default="baselines", help="benchmarks/results/<name>.json")
    p.add_argument("--section", default="Baselines")
    p.add_argument("--tmpdir", default=None, help="parent dir for memmap scratch (disk)")
    p.add_argument("--synthetic", action="store_true", help="force the synthetic frames")
    p.add_argument("--cases", default="numpy,torchrl", help="comma list: numpy,torchrl")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch.set_num_threads (0 = leave default); >1 collapses under load")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    data = load_atari_frames(args.n, game=args.game, seed=args.seed,
                             synthetic=True if args.synthetic else None)
    print(f"data: {data_summary(data)} ({time.perf_counter() - t0:.1f} s)", flush=True)
    kw = dict(extend_repeats=args.extend_repeats, sample_repeats=args.repeats,
              seconds=args.seconds, chunk=args.chunk)
    results: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="expstore_bench_", dir=args.tmpdir))
    try:
        for name in args.cases.split(","):
            if name == "numpy":
                case = numpy_ring_case(data)
            elif name == "torchrl":
                case = torchrl_memmap_case(data, None, tmp)
            else:
                raise SystemExit(f"unknown case {name!r}")
            t1 = time.perf_counter()
            r = measure_case(case, **kw)
            r["extend_MBps"] = r["extend_tps"] * r["bytes_per_transition"] / 1e6
            if hasattr(case, "close"):
                case.close()
            print(f"{name}: {time.perf_counter() - t1:.1f} s", flush=True)
            results.append(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table = markdown_table(results, COLUMNS, HEADERS)
    print(table)
    notes = (
        "Medians of repeats (extend: fills of a fresh buffer; sampling: repeats of "
        f">= {args.seconds} s after warm-up, warm page cache). tr/s = transitions/s.\n"
        f"- torchrl_memmap: `ReplayBuffer(LazyMemmapStorage(n), RandomSampler())`, one row "
        "per transition with stacked `observation` and `next.observation` (4,84,84) uint8; "
        f"extend = `rb.extend` of {args.chunk}-row TensorDicts (building them untimed; first "
        "extend includes lazy memmap creation; page cache, no fsync); bytes = file sizes "
        "under scratch_dir; prefetch = iterating `ReplayBuffer(..., prefetch=2)`, consumer "
        "reads one element of obs and next obs.\n"
        "- numpy_ring: in-RAM ring of single frames (N,84,84) + scalars; sample gathers "
        "(B,5,84,84) with episode-start clamping, obs/next_obs are views of it; extend "
        "copies the stream into pre-faulted arrays; bytes = RAM of all arrays.\n"
        f"- extend (MB/s) = extend tr/s x bytes/transition. Full runs in "
        f"`benchmarks/results/{args.json_name}.json`.")
    cmd = command_line()
    import torch

    extra = {"torch threads": torch.get_num_threads(),
             "load average (1 min) start/end": f"{load0:.1f} / {os.getloadavg()[0]:.1f}"}
    write_section(args.section, table + "\n\n" + notes, command=cmd,
                  source=data_summary(data), extra=extra, path=args.out)
    meta = {k: data[k] for k in ("source", "env_id", "games", "seed")}
    meta.update(n_frames=len(data["frames"]), n_transitions=int(data["valid"].sum()),
                n_episodes=int(data["episode_start"].sum()))
    out = {"command": cmd, "args": {k: str(v) for k, v in vars(args).items()}, "env": extra,
           "data": meta, "results": results}
    print(f"wrote section {args.section!r} to {args.out}; json {save_json(args.json_name, out)}"
          f" ({time.perf_counter() - t0:.0f} s total)")
    return out


if __name__ == "__main__":
    main()
