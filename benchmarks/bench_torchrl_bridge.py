"""TorchRL bridge against TorchRL's own storages: ``rb.extend`` of 100 collector steps and
``rb.sample()`` (B = 32 and 256) on CartPole and 17-dim low-dim data, one run.

Usage (from the repository root)::

    python benchmarks/bench_torchrl_bridge.py                   # CartPole + low-dim
    python benchmarks/bench_torchrl_bridge.py --steps 20000 --repeats 3 --no-write
    python benchmarks/bench_torchrl_bridge.py --shard-rows 4096 --no-fsync --no-write
    python benchmarks/bench_torchrl_bridge.py --atari           # Atari rb.sample vs memmap

Every buffer is a ``TensorDictReplayBuffer`` (the class ``replay_buffer`` returns, so each
batch also gets its ``index``), CPU, torch threads 1:

- ``tensor``: TorchRL ``LazyTensorStorage`` (RAM), its default ``RandomSampler``;
  ``tensor_rb``: a plain ``ReplayBuffer`` on the same storage (sample only);
- ``memmap``: TorchRL ``LazyMemmapStorage`` (files in a scratch folder);
- ``bridge``: ``expstore.integrations.torchrl.replay_buffer(url, spec=..., capacity=...)``,
  a new store with the bridge's defaults (fsync on, shards of at most 1024 rows; else
  ``--shard-rows``, ``--no-fsync``); ``store``: ``store.sample(B)`` on that same store
  (numpy out), so ``bridge - store`` is what the bridge adds to the store's own sample.

Data: ``cartpole``: gymnasium CartPole-v1 under random actions, as TorchRL's ``GymEnv``
emits it (float32 observation (4,), one-hot int64 action (2,), reward and flags (1,));
``lowdim``: ``bench_lowdim.lowdim_data`` (17-dim float32 obs, 6-dim action in [-1, 1]).
``--steps`` transitions each, fed as TensorDicts of 100 steps. Extend: each repeat feeds
every buffer the next ``1/repeats`` of the batches (cases alternating), µs per
``rb.extend``; ``bridge_drained`` adds the wait, after the calls, for the shard writes they
filled (the bridge writes full shards behind ``extend``; the wait also keeps its background
writer from falling behind into the next repeat). Sample: every repeat times a
loop of about ``--seconds`` per case, cases alternating; medians over repeats. Writes
section "TorchRL bridge vs TorchRL storages" of RESULTS.md (not with ``--no-write``) and
results/torchrl_bridge.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_lowdim import (  # noqa: E402
    _tensordicts,
    check_batch,
    lowdim_data,
    lowdim_spec,
    per_batch_us,
)
from benchmarks.report import (  # noqa: E402
    command_line,
    markdown_table,
    ratio,
    save_json,
    work_dir,
    write_section,
)

CHUNK = 100  # steps per rb.extend


def cartpole_data(n: int, seed: int = 0) -> dict[str, Any]:
    """``n`` CartPole-v1 steps under uniform random actions (episodes reset as they end),
    in ``lowdim_data``'s layout; the action one-hot (int64), as TorchRL's ``GymEnv``."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs = np.empty((n, 4), np.float32)
    nxt = np.empty((n, 4), np.float32)
    act = rng.integers(0, 2, n)
    reward = np.empty(n, np.float32)
    term = np.zeros(n, bool)
    trunc = np.zeros(n, bool)
    o, _ = env.reset(seed=seed)
    episodes = 1
    for t in range(n):
        obs[t] = o
        o, reward[t], term[t], trunc[t], _ = env.step(int(act[t]))
        nxt[t] = o
        if term[t] or trunc[t]:
            o, _ = env.reset()
            episodes += 1
    return {"obs": obs, "next_obs": nxt, "action": np.eye(2, dtype=np.int64)[act],
            "reward": reward, "terminated": term, "truncated": trunc, "episodes": episodes}


def buffers(name: str, data: dict[str, Any], work: Path, **bridge: Any) -> dict[str, Any]:
    """The empty buffers under test for one data set (``batch_size`` given per sample);
    ``bridge``: ``replay_buffer`` options (``shard_rows``, ``fsync``)."""
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer

    import expstore as es
    from expstore.integrations.torchrl import replay_buffer

    n = len(data["obs"])
    spec = (lowdim_spec(data["obs"].shape[1], data["action"].shape[1]) if name == "lowdim"
            else es.Spec.create(obs=es.Field((4,), np.float32),
                                action=es.Field((2,), np.int64)))
    return {"tensor": TensorDictReplayBuffer(storage=LazyTensorStorage(n)),
            "memmap": TensorDictReplayBuffer(storage=LazyMemmapStorage(
                n, scratch_dir=str(work / f"{name}-memmap"))),
            "bridge": replay_buffer(work / f"{name}.zarr", spec=spec,
                                    capacity=n + data["episodes"] + 1, **bridge)}


def extend_all(rbs: dict[str, Any], batches: list[Any], repeats: int) -> dict[str, list[float]]:
    """µs per ``rb.extend`` of each repeat's share of ``batches``, cases alternating (the
    first batch goes in untimed: lazy storages allocate there). ``bridge_drained``: the
    bridge's calls plus waiting, after them, for the shard writes they filled. Each case
    starts on a synced disk (``os.sync()``, untimed)."""
    for rb in rbs.values():
        rb.extend(batches[0])
    runs: dict[str, list[float]] = {c: [] for c in [*rbs, "bridge_drained"]}
    share = -(-(len(batches) - 1) // repeats)
    for r in range(repeats):
        part = batches[1 + r * share: 1 + (r + 1) * share]
        for case, rb in rbs.items():
            os.sync()  # (untimed) the memmap's dirty pages go now, not in the bridge's fsyncs
            t0 = time.perf_counter()
            for td in part:
                rb.extend(td)
            runs[case].append((time.perf_counter() - t0) / len(part) * 1e6)
            if case == "bridge":  # the shard writes these batches filled
                for w in rb.storage.store.writers.values():
                    w.wait()
                runs["bridge_drained"].append((time.perf_counter() - t0) / len(part) * 1e6)
    return runs


def sample_all(rbs: dict[str, Any], bs: int, repeats: int, seconds: float
               ) -> dict[str, list[float]]:
    """µs per ``sample(bs)`` of every case (and ``store``, ``tensor_rb``), alternating."""
    from torchrl.data import ReplayBuffer

    plain = ReplayBuffer(storage=rbs["tensor"].storage)
    store = rbs["bridge"].storage.store
    steps: dict[str, Callable[[], Any]] = {c: (lambda rb=rb: rb.sample(bs))
                                           for c, rb in rbs.items()}
    steps["tensor_rb"] = lambda: plain.sample(bs)
    steps["store"] = lambda: store.sample(bs)
    for step in steps.values():  # warm-up, not recorded
        per_batch_us(step, seconds / 2)
    runs: dict[str, list[float]] = {c: [] for c in steps}
    for _ in range(repeats):
        for c, step in steps.items():
            runs[c].append(per_batch_us(step, seconds))
    return runs


def check_bridge(rb: Any, data: dict[str, Any]) -> None:
    """A bridge batch holds stored transitions (values checked against the data)."""
    td = rb.sample(256)
    check_batch({"obs": td["observation"].numpy(), "action": td["action"].numpy(),
                 "next_obs": td["next", "observation"].numpy(),
                 "reward": td["next", "reward"].numpy(),
                 "terminated": td["next", "terminated"].numpy(),
                 "truncated": td["next", "truncated"].numpy()}, data)


def row(data: str, op: str, runs: dict[str, list[float]]) -> dict[str, Any]:
    r: dict[str, Any] = {"data": data, "op": op}
    r.update({f"{c}_us": statistics.median(v) for c, v in runs.items()})
    r["x_tensor"] = ratio(r["bridge_us"], r["tensor_us"])
    if "bridge_drained_us" in r:
        r["x_tensor_drained"] = ratio(r["bridge_drained_us"], r["tensor_us"])
    r["x_memmap"] = ratio(r["bridge_us"], r["memmap_us"])
    if "store_us" in r:
        r["bridge_minus_store_us"] = r["bridge_us"] - r["store_us"]
    r["runs"] = runs
    return r


def atari_sample(frames: int, repeats: int, seconds: float, write: bool) -> None:
    """The bridge's ``rb.sample()`` of Atari transitions (one compressed 84x84 frame per
    row, ``frame_stack=4`` rebuilt on read) against ``ReplayBuffer(LazyMemmapStorage)``
    holding the stacked (4, 84, 84) ``observation`` and ``next.observation`` per row
    (``baselines.py``); transitions/s, warm page cache; section "TorchRL bridge vs
    LazyMemmapStorage"."""
    from benchmarks.baselines import timed_loop, torchrl_memmap_case
    from benchmarks.expstore_case import ExpstoreCase
    from benchmarks.frames import load_atari_frames
    from expstore.integrations.torchrl import replay_buffer

    data = load_atari_frames(frames, game="Pong", seed=0)
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
        for _ in range(repeats):
            got["torchrl"].append(theirs.sample_rate(bs, seconds))
            got["expstore"].append(timed_loop(rb.sample, bs, seconds))
        r = {"batch": bs, "torchrl_memmap_tps": statistics.median(got["torchrl"]),
             "expstore_bridge_tps": statistics.median(got["expstore"])}
        r["ratio"] = ratio(r["expstore_bridge_tps"], r["torchrl_memmap_tps"])
        print(r, flush=True)
        rows.append(r)
    ours.close()
    theirs.close()
    body = markdown_table(rows, ["batch", "torchrl_memmap_tps", "expstore_bridge_tps", "ratio"])
    body += ("\n\nTransitions/s of `rb.sample()` (TensorDict out, CPU, torch threads 1); "
             "ratio = expstore / TorchRL (>= 1: the bridge is at least as fast). Medians of "
             "repeats, the two alternating.")
    save_json("torchrl_bridge_atari", rows)
    if write:
        write_section("TorchRL bridge vs LazyMemmapStorage", body, command=command_line(),
                      source=f"{data['source']} Pong frames ({frames})",
                      extra={"load average (1 min) start/end":
                             f"{load0:.1f} / {os.getloadavg()[0]:.1f}"})


COLUMNS = ["data", "op", "tensor_us", "tensor_rb_us", "memmap_us", "bridge_us", "store_us",
           "bridge_minus_store_us", "bridge_drained_us", "x_tensor", "x_memmap",
           "x_tensor_drained"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50_000, help="transitions per data set")
    ap.add_argument("--data", default="cartpole,lowdim")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.25, help="per sample case and repeat")
    ap.add_argument("--shard-rows", type=int, default=None, help="the bridge store's")
    ap.add_argument("--no-fsync", action="store_true", help="the bridge store without fsync")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    ap.add_argument("--atari", action="store_true",
                    help="only the Atari rb.sample case against LazyMemmapStorage")
    ap.add_argument("--frames", type=int, default=20_000, help="Atari frames (--atari)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.atari:
        atari_sample(a.frames, a.repeats, a.seconds, write=not a.no_write)
        return
    makers = {"cartpole": cartpole_data, "lowdim": lowdim_data}
    wanted = a.data.split(",")
    if set(wanted) - set(makers):
        raise SystemExit(f"--data: expected some of {sorted(makers)}, got {a.data}")
    work = Path(tempfile.mkdtemp(prefix="bench-trl-bridge-", dir=work_dir()))
    rows: list[dict[str, Any]] = []
    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    try:
        for name in wanted:
            data = makers[name](a.steps)
            batches = list(_tensordicts(data, CHUNK))
            rbs = buffers(name, data, work, shard_rows=a.shard_rows, fsync=not a.no_fsync)
            rows.append(row(name, f"extend({CHUNK})", extend_all(rbs, batches, a.repeats)))
            check_bridge(rbs["bridge"], data)
            for bs in (32, 256):
                rows.append(row(name, f"sample({bs})",
                                sample_all(rbs, bs, a.repeats, a.seconds)))
            store = rbs["bridge"].storage.store
            layout = f"{store.layout.shard_rows}-row shards, fsync {'off' if a.no_fsync else 'on'}"
            print(markdown_table(rows[-3:], COLUMNS), f"\n(bridge store: {layout})", flush=True)
            rbs["bridge"].storage.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()[0]
    table = markdown_table(rows, COLUMNS)
    print(f"\n{table}\n\ntotal {time.perf_counter() - t_start:.0f} s; load average (1 min) "
          f"{load0:.2f} / {load1:.2f}")
    body = table + (
        "\n\nµs per call (medians of repeats, cases alternating; CPU, torch threads 1). "
        "All buffers are `TensorDictReplayBuffer`s: `tensor` on TorchRL `LazyTensorStorage`, "
        "`memmap` on `LazyMemmapStorage`, `bridge` = `replay_buffer(...)` (a new store; "
        "`bridge_drained`: its extend calls plus waiting for the shard writes they filled, "
        "which otherwise overlap with what the caller does next). `tensor_rb`: plain "
        "`ReplayBuffer` on the tensor storage (no index added); `store`: `store.sample(B)` on "
        "the bridge's store, numpy out. x_tensor / x_memmap = bridge µs / TorchRL's (target "
        "x_tensor <= 1.5); bridge_minus_store_us: what the bridge adds to the store's own "
        "sample.")
    load = f"{load0:.2f} / {load1:.2f}"
    save_json("torchrl_bridge", {"steps": a.steps, "chunk": CHUNK, "load_average": load,
                                 "command": command_line(), "results": rows})
    if a.no_write:
        return
    source = (f"{', '.join(wanted)}: {a.steps:,} transitions each, TensorDicts of {CHUNK} "
              f"steps; bridge store: {layout}")
    write_section("TorchRL bridge vs TorchRL storages", body, command=command_line(),
                  source=source, extra={"load average (1 min) start/end": load})

if __name__ == "__main__":
    main()
