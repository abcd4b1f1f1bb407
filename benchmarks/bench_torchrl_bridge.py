"""TorchRL bridge against TorchRL's own ``LazyMemmapStorage``: ``rb.sample()`` of the same
Atari transitions, both as TorchRL replay buffers returning TensorDicts.

    python benchmarks/bench_torchrl_bridge.py [--frames 20000] [--repeats 3] [--seconds 1]

expstore: ``expstore.integrations.torchrl.replay_buffer(store, batch_size=B)`` on a store
holding one compressed 84x84 frame per row (``frame_stack=4`` stacks rebuilt on read);
TorchRL: ``ReplayBuffer(LazyMemmapStorage(n), RandomSampler())`` holding the stacked
(4, 84, 84) ``observation`` and ``next.observation`` per row (``baselines.py``). Both on a
warm page cache; transitions/s, medians of repeats alternating the two.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.baselines import timed_loop, torchrl_memmap_case  # noqa: E402
from benchmarks.expstore_case import ExpstoreCase  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import markdown_table, ratio, save_json, write_section  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from expstore.integrations.torchrl import replay_buffer

    data = load_atari_frames(args.frames, game="Pong", seed=0)
    work = Path(tempfile.mkdtemp(prefix="bench-trl-bridge-"))
    ours = ExpstoreCase(data, None, work, fsync=False)
    ours.extend_rate()
    ours.warm_cache()
    theirs = torchrl_memmap_case(data, None, work)
    theirs.extend_rate()
    theirs.warm_cache()
    load0 = os.getloadavg()[0]
    rows = []
    for bs in (32, 256):
        rb = replay_buffer(ours.reader_store, batch_size=bs)
        rb.sample()
        got: dict[str, list[float]] = {"expstore": [], "torchrl": []}
        for _ in range(args.repeats):
            got["torchrl"].append(theirs.sample_rate(bs, args.seconds))
            got["expstore"].append(timed_loop(rb.sample, bs, args.seconds))
        row = {"batch": bs, "torchrl_memmap_tps": statistics.median(got["torchrl"]),
               "expstore_bridge_tps": statistics.median(got["expstore"])}
        row["ratio"] = ratio(row["expstore_bridge_tps"], row["torchrl_memmap_tps"])
        print(row, flush=True)
        rows.append(row)
    body = markdown_table(rows, ["batch", "torchrl_memmap_tps", "expstore_bridge_tps", "ratio"])
    body += ("\n\nTransitions/s of `rb.sample()` (TensorDict out, CPU, torch threads 1); "
             "ratio = expstore / TorchRL (>= 1: the bridge is at least as fast). Medians of "
             "repeats, the two alternating.")
    write_section("TorchRL bridge vs LazyMemmapStorage", body,
                  source=f"{data['source']} Pong frames ({args.frames})",
                  extra={"load average (1 min) start/end":
                         f"{load0:.1f} / {os.getloadavg()[0]:.1f}"})
    save_json("torchrl_bridge", rows)
    ours.close()
    theirs.close()


if __name__ == "__main__":
    main()
