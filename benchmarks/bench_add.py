"""The online write path: per-call ``add`` against an in-RAM numpy ring and TorchRL, one run.

Usage (from the repository root)::

    python benchmarks/bench_add.py                       # Atari (ALE Pong) + CartPole steps
    python benchmarks/bench_add.py --steps 20000 --repeats 5

Cases, each on the same steps given the same way (building the inputs is not timed):

* ``atari``: a ``FrameStackObservation``-style step, obs/next_obs ``(4, 84, 84)`` uint8
  stacks of real ALE Pong frames; expstore stores each frame once (``stack=4``).
* ``cartpole``: real ``CartPole-v1`` steps (random policy), obs ``(4,)`` float32.
* ``ring``: an in-RAM circular buffer as SB3/CleanRL keep one: ``obs``, ``next_obs``,
  ``action``, ``reward``, ``done`` arrays, one assignment each per ``add``.
* ``torchrl``: ``ReplayBuffer(LazyMemmapStorage).add(td)`` of a prebuilt one-transition
  TensorDict (TorchRL's layout: observation, action, next/{observation, reward, done,
  terminated, truncated}).
* ``expstore``: ``store.add(obs, action, reward, next_obs, terminated, truncated)`` on a local
  store (defaults: fsync on, shard_rows by capacity), per call timed with
  ``perf_counter``: mean (amortized: shard writes included), p50 and p99 in microseconds.
  Where the step kernel (``expstore/storage/native/_step.c``) is built, each ``add`` is one C call
  (the first ``add`` of a store also builds its plan and opens every lane's first shard).
* ``vector N``: one call adds one step in each of N lanes (N = 8, 64): expstore
  ``add`` with leading axis N into an N-lane store, the ring writing the same N rows. Lane
  ``j`` plays the ``j``-th contiguous part of the steps, as each env of a vector env
  continues its own episode (:func:`vector_steps`).
* ``shard_add_p50/p99``: the adds that completed a shard (it goes to a background
  writer), read from the store's writers between timed calls; ``shard_add_x``: their p50
  over the p50 of all adds, per run; ``open_add_p50`` / ``open_add_x``: the same for the
  adds right after them (they open the next shard).
* ``add+flush``: ``store.add`` then ``store.flush()`` every step, ``fsync=False``.
* ``paced``: the single-lane case with ``--pace-us`` (100 by default) slept between adds,
  as an env step would take: the background writer keeps up, so the shard-completing adds
  show the hand-off alone. Unpaced, an Atari store takes ~300k steps/s, faster than any
  writer compresses 7 KB frames, and those adds also wait for a free buffer (back-pressure).

Writes section "Online write path" of benchmarks/RESULTS.md and results/add.json.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import expstore as es  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import (  # noqa: E402
    command_line,
    markdown_table,
    save_json,
    work_dir,
    write_section,
)


# -- the steps --------------------------------------------------------------------------------
def atari_steps(n: int) -> list[tuple]:
    """``n`` env steps of ALE Pong as a ``FrameStackObservation(4)`` env gives them."""
    data = load_atari_frames(max(n + 1, 50_000), game="Pong")
    frames, start = data["frames"], data["episode_start"]
    out, stack = [], np.zeros((4, 84, 84), np.uint8)
    for i in range(len(frames) - 1):
        if start[i]:
            stack = np.repeat(frames[i][None], 4, 0)  # padding_type="reset"
        if not data["valid"][i]:
            continue
        nxt = np.concatenate([stack[1:], frames[i + 1][None]])
        term, trunc = bool(data["terminated"][i]), bool(data["truncated"][i])
        out.append((stack, int(data["actions"][i]), float(data["rewards"][i]), nxt, term,
                    trunc))
        stack = nxt
        if len(out) == n:
            break
    return out


def cartpole_steps(n: int, seed: int = 0) -> list[tuple]:
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out = []
    for _ in range(n):
        a = int(rng.integers(2))
        nxt, r, term, trunc, _ = env.step(a)
        out.append((obs, a, float(r), nxt, bool(term), bool(trunc)))
        obs = env.reset()[0] if term or trunc else nxt
    return out


def spec_for(kind: str) -> es.Spec:
    if kind == "atari":
        return es.Spec.create(obs=es.Field((84, 84), np.uint8, stack=4),
                              action=es.Field((), np.int64, low=0, high=5))
    return es.Spec.create(obs=es.Field((4,), np.float32),
                          action=es.Field((), np.int64, low=0, high=1))


# -- the buffers -------------------------------------------------------------------------------
class Ring:
    """An in-RAM ring as SB3/CleanRL keep one (``lanes`` rows per call for vector envs)."""

    def __init__(self, capacity: int, obs_shape: tuple, obs_dtype: Any, lanes: int = 1):
        self.cap, self.ptr, self.lanes = capacity, 0, lanes
        self.obs = np.zeros((capacity, *obs_shape), obs_dtype)
        self.next_obs = np.zeros((capacity, *obs_shape), obs_dtype)
        self.action = np.zeros(capacity, np.int64)
        self.reward = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, bool)
        for arr in (self.obs, self.next_obs, self.action, self.reward, self.done):
            arr.fill(0)  # touch every page now: no first-touch page faults in the timing

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        p = self.ptr
        k = self.lanes
        if k == 1:
            self.obs[p] = obs
            self.next_obs[p] = next_obs
            self.action[p] = action
            self.reward[p] = reward
            self.done[p] = terminated or truncated
        else:
            self.obs[p:p + k] = obs
            self.next_obs[p:p + k] = next_obs
            self.action[p:p + k] = action
            self.reward[p:p + k] = reward
            self.done[p:p + k] = terminated | truncated
        self.ptr = (p + k) % self.cap


def torchrl_buffer(capacity: int, tmp: str):
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    return ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=tmp), batch_size=32)


def torchrl_td(step: tuple):
    import torch
    from tensordict import TensorDict

    obs, a, r, nxt, term, trunc = step
    b = torch.tensor
    return TensorDict({"observation": torch.as_tensor(obs), "action": b(a),
                       "next": {"observation": torch.as_tensor(nxt), "reward": b([r]),
                                "done": b([term or trunc]), "terminated": b([term]),
                                "truncated": b([trunc])}}, batch_size=[])


# -- timing ------------------------------------------------------------------------------------
def per_call(fn, args: list[tuple], shards=None, pace_s: float = 0.0) -> dict[str, float]:
    """Call ``fn(*a)`` for every ``a``; mean / p50 / p99 microseconds per call.

    ``pace_s``: seconds slept between calls (not timed), as an env step would take; the
    sleep releases the GIL, as an emulator or a torch step does.

    ``shards``: a function giving the shards handed to the background writer so far, read
    between calls (not timed); then ``shard_p50_us`` / ``shard_p99_us`` are the p50 / p99
    of the calls that completed a shard (their staging swaps buffers and hands it over),
    ``shard_x`` their p50 over the p50 of all calls, and ``open_p50_us`` / ``open_x`` the
    same for the calls right after them (which open the next shard).
    """
    gc.collect()
    gc.disable()
    try:
        t = np.empty(len(args))
        handed = np.zeros(len(args), np.int64)
        clock = time.perf_counter
        before = shards() if shards else 0
        sleep = time.sleep
        for i, a in enumerate(args):
            if pace_s:
                sleep(pace_s)
            t0 = clock()
            fn(*a)
            t[i] = clock() - t0
            if shards:
                now = shards()
                handed[i], before = now - before, now
    finally:
        gc.enable()
    t *= 1e6
    out = {"mean_us": float(t.mean()), "p50_us": float(np.median(t)),
           "p99_us": float(np.percentile(t, 99)), "max_us": float(t.max())}
    if shards:
        done = t[handed > 0]
        opened = t[1:][handed[:-1] > 0]
        nan = float("nan")
        out["shard_adds"] = float(len(done))
        out["shard_p50_us"] = float(np.median(done)) if len(done) else nan
        out["shard_p99_us"] = float(np.percentile(done, 99)) if len(done) else nan
        out["shard_x"] = out["shard_p50_us"] / out["p50_us"]
        out["open_p50_us"] = float(np.median(opened)) if len(opened) else nan
        out["open_x"] = out["open_p50_us"] / out["p50_us"]
    return out


def shards_handed(store) -> Any:
    """Shards the store's writers have filled so far (each handed to the background)."""
    S = store.layout.shard_rows
    writers = list(store.writers.values())
    return lambda: sum(w.count // S for w in writers)


def expstore_single(kind: str, steps: list[tuple], tmp: str, i: int, fsync: bool = True,
                    flush: bool = False, pace_s: float = 0.0) -> dict[str, float]:
    store = es.create(f"{tmp}/{kind}-{i}-{int(flush)}.zarr", spec_for(kind),
                      capacity=max(4 * len(steps), 65_536), overwrite=True, fsync=fsync)
    add = store.add
    if flush:
        def fn(*a):
            add(*a)
            store.flush()
    else:
        fn = add
    try:
        return per_call(fn, steps, None if flush else shards_handed(store), pace_s)
    finally:
        store.close()


def vector_steps(steps: list[tuple], lanes: int) -> list[tuple]:
    """The steps as ``lanes`` envs stepped together give them: lane ``j`` plays the ``j``-th
    contiguous part of ``steps``, so each lane's next step continues its previous one (its
    ``obs`` is the previous ``next_obs``) except after an episode's end, as in a real
    vector env. Call ``i`` holds step ``i`` of every part, stacked on a leading axis."""
    per = len(steps) // lanes
    return [tuple(np.stack([np.asarray(steps[j * per + i][k]) for j in range(lanes)])
                  for k in range(6)) for i in range(per)]


def expstore_vector(kind: str, vsteps: list[tuple], lanes: int, tmp: str, i: int) -> dict:
    store = es.create(f"{tmp}/{kind}-v{lanes}-{i}.zarr", spec_for(kind),
                      capacity=max(4 * len(vsteps) * lanes, 65_536 * lanes // 8),
                      lanes=lanes, overwrite=True)
    try:
        return per_call(store.add, vsteps, shards_handed(store))
    finally:
        store.close()


#: a table row's columns from one expstore timing (``per_call``'s keys)
TIMING_COLS = {"expstore_us": "mean_us", "expstore_p50_us": "p50_us",
               "expstore_p99_us": "p99_us", "expstore_max_us": "max_us",
               "shard_add_p50_us": "shard_p50_us", "shard_add_p99_us": "shard_p99_us",
               "shard_add_x": "shard_x", "open_add_p50_us": "open_p50_us",
               "open_add_x": "open_x"}


def _row(case: str, timing: dict, shards: bool = True, **rest: float | None) -> dict:
    """A table row: ``case``, the :data:`TIMING_COLS` of ``timing`` (those of shard
    hand-offs ``None`` unless ``shards``), then ``rest`` in order."""
    row: dict = {"case": case}
    for col, key in TIMING_COLS.items():
        handoff = col.startswith(("shard_", "open_"))
        row[col] = timing[key] if shards or not handoff else None
    return {**row, **rest}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20_000, help="env steps per case")
    p.add_argument("--repeats", type=int, default=3, help="runs per case (medians reported)")
    p.add_argument("--pace-us", type=float, default=100.0,
                   help="microseconds slept between adds in the paced case")
    p.add_argument("--no-write", action="store_true", help="don't update RESULTS.md")
    a = p.parse_args()
    load0 = os.getloadavg()[0]
    cases: dict[str, list[tuple]] = {"atari": atari_steps(a.steps),
                                     "cartpole": cartpole_steps(a.steps)}
    runs: dict[str, dict[str, list[dict]]] = {}

    def run(key: str, fn, *args, **kwargs) -> None:
        runs.setdefault(key, {"r": []})["r"].append(fn(*args, **kwargs))
        print(key, {k: round(v, 2) for k, v in runs[key]["r"][-1].items()}, flush=True)

    with tempfile.TemporaryDirectory(dir=work_dir()) as tmp:
        for i in range(a.repeats):
            for kind, steps in cases.items():
                obs0 = np.asarray(steps[0][0])
                ring = Ring(len(steps), obs0.shape, obs0.dtype)
                run(f"{kind} ring", per_call, ring.add, steps)
                rb = torchrl_buffer(len(steps), f"{tmp}/trl-{kind}-{i}")
                tds = [(torchrl_td(s),) for s in steps]
                run(f"{kind} torchrl", per_call, rb.add, tds)
                del rb, tds
                run(f"{kind} expstore", expstore_single, kind, steps, tmp, i)
                run(f"{kind} expstore paced", expstore_single, kind, steps, tmp, i,
                    pace_s=a.pace_us / 1e6)
                n_flush = min(len(steps), 3_000)
                run(f"{kind} expstore add+flush (fsync off)", expstore_single,
                    kind, steps[:n_flush], tmp, i, fsync=False, flush=True)
                for lanes in (8, 64):
                    vs = vector_steps(steps, lanes)
                    vring = Ring(len(vs) * lanes, obs0.shape, obs0.dtype, lanes)
                    run(f"{kind} ring x{lanes}", per_call, vring.add, vs)
                    run(f"{kind} expstore x{lanes}", expstore_vector, kind, vs, lanes, tmp, i)

    med = {k: {m: statistics.median(r[m] for r in v["r"]) for m in v["r"][0]}
           for k, v in runs.items()}
    rows = []
    for kind in cases:
        ring, trl, ours = (med[f"{kind} {c}"] for c in ("ring", "torchrl", "expstore"))
        rows.append(_row(f"{kind}: one step per add", ours, ring_us=ring["mean_us"],
                         torchrl_us=trl["mean_us"], x_ring=ours["mean_us"] / ring["mean_us"],
                         x_torchrl=ours["mean_us"] / trl["mean_us"],
                         steps_per_s=1e6 / ours["mean_us"]))
        pc = med[f"{kind} expstore paced"]
        rows.append(_row(f"{kind}: one step per add, paced {a.pace_us:g} us", pc,
                         ring_us=ring["mean_us"], torchrl_us=trl["mean_us"],
                         x_ring=pc["mean_us"] / ring["mean_us"],
                         x_torchrl=pc["mean_us"] / trl["mean_us"], steps_per_s=None))
        for lanes in (8, 64):
            r, o = med[f"{kind} ring x{lanes}"], med[f"{kind} expstore x{lanes}"]
            rows.append(_row(f"{kind}: {lanes} lanes per add", o, ring_us=r["mean_us"],
                             torchrl_us=None, x_ring=o["mean_us"] / r["mean_us"],
                             x_torchrl=None, steps_per_s=lanes * 1e6 / o["mean_us"]))
        fl = med[f"{kind} expstore add+flush (fsync off)"]
        rows.append(_row(f"{kind}: add + flush every step (fsync off)", fl, shards=False,
                         ring_us=None, torchrl_us=None, x_ring=None, x_torchrl=None,
                         steps_per_s=1e6 / fl["mean_us"]))
    body = markdown_table(rows, list(rows[0]))
    body += (f"\n\n{a.steps:,} env steps per case (add+flush: 3,000), medians of {a.repeats} "
             "runs; microseconds per `add` call: mean (amortized, shard writes included), "
             "p50, p99, max; shard_add_p50/p99: p50 / p99 of the adds that completed a "
             "shard (handed to a background writer), shard_add_x: that p50 over the p50 of "
             "all adds (issue 12's target: <= 3); open_add_p50 / open_add_x: the same for "
             "the adds right after them, which open the next shard; paced: the same with "
             f"{a.pace_us:g} us slept between adds (not timed; the writer keeps up). "
             "x_ring / x_torchrl: expstore's mean over the baseline's mean (lower is better). "
             "Ring: obs, next_obs, action, reward, done arrays in RAM; "
             "TorchRL: `ReplayBuffer(LazyMemmapStorage).add` of a prebuilt TensorDict. "
             "steps_per_s: env steps stored per second by expstore.")
    print(body)
    save_json("add", {"rows": rows, "runs": runs, "steps": a.steps})
    if not a.no_write:
        write_section("Online write path", body, command=command_line(),
                      source=f"ALE Pong frames and CartPole-v1 steps, {a.steps} each",
                      extra={"load average (1 min) start/end":
                             f"{load0:.2f} / {os.getloadavg()[0]:.2f}"})


if __name__ == "__main__":
    main()
