"""What switching SB3's ReplayBuffer to ExpstoreReplayBuffer costs: add / sample per call
and bytes per transition, against SB3's own buffer measured in the same run.

    python benchmarks/bench_sb3.py [--pong 10000] [--cartpole 20000] [--repeats 3]
        [--train-steps 10000] [--sac-steps 1500]

Cases: CartPole-v1 (real random-policy steps, SB3 defaults) and ALE Pong frames
(``frames.load_atari_frames``) as SB3 sees them after ``VecFrameStack(4)`` +
``VecTransposeImage``: SB3 with ``optimize_memory_usage=True`` (its most compact mode,
which needs ``handle_timeout_termination=False``) vs expstore with ``frame_stack=4``.
Times are medians over repeats; add = one ``add`` call of one env step (building the
observations is not timed; the store is written behind the RAM mirror by a background
thread, and ``add_flush_us`` also counts the final ``flush()``: every step in the store);
sample = one ``sample(B)`` call returning torch tensors.

Training pairs (``--train-steps``): SB3 DQN on CartPole-v1 (1 env, 4 envs, 3-step returns
against SB3's ``NStepReplayBuffer``, Dict observations against ``DictReplayBuffer``) and
SAC / TD3 on Pendulum-v1, each with SB3's buffer and with ours, same seed, alternating;
steps/s of ``learn()`` (model construction not timed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import markdown_table, ratio, save_json, write_section  # noqa: E402

from expstore.integrations import (  # noqa: E402
    ExpstoreReplayBuffer,
    PrioritizedExpstoreReplayBuffer,
)


class _SplitObs(gym.ObservationWrapper):
    """CartPole with a Dict observation (position / velocity halves)."""

    def __init__(self, env):
        super().__init__(env)
        box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"x": box, "v": box})

    def observation(self, o):
        return {"x": o[:2], "v": o[2:]}


def train_pairs(steps: int, sac_steps: int, repeats: int, only: str = "") -> list[dict]:
    """steps/s of SB3 learn() with SB3's buffer and with ours, per case (``only``: the cases
    whose name contains it)."""
    from stable_baselines3 import DQN, SAC, TD3
    from stable_baselines3.common.buffers import NStepReplayBuffer
    from stable_baselines3.common.env_util import make_vec_env

    dqn = dict(learning_starts=1000, buffer_size=50_000)
    small = dict(learning_starts=200, buffer_size=50_000, policy_kwargs={"net_arch": [64, 64]})
    cases = [
        ("DQN CartPole 1 env", DQN, "MlpPolicy", lambda: make_vec_env("CartPole-v1", 1, seed=0),
         dqn, None, {}, steps),
        ("DQN CartPole 4 envs", DQN, "MlpPolicy",
         lambda: make_vec_env("CartPole-v1", 4, seed=0), dqn, None, {}, steps),
        ("DQN CartPole n-step 3", DQN, "MlpPolicy",
         lambda: make_vec_env("CartPole-v1", 1, seed=0), dqn, NStepReplayBuffer,
         {"n_steps": 3}, steps),
        ("DQN CartPole Dict obs", DQN, "MultiInputPolicy",
         lambda: make_vec_env(lambda: _SplitObs(gym.make("CartPole-v1")), 1, seed=0), dqn,
         None, {}, steps),
        ("SAC Pendulum", SAC, "MlpPolicy", lambda: make_vec_env("Pendulum-v1", 1, seed=0),
         small, None, {}, sac_steps),
        ("TD3 Pendulum", TD3, "MlpPolicy", lambda: make_vec_env("Pendulum-v1", 1, seed=0),
         small, None, {}, sac_steps),
    ]
    rows = []
    for name, algo, policy, make_env, kw, sb3_cls, extra, n in cases:
        if only not in name:
            continue
        sps: dict[str, list[float]] = {"sb3": [], "expstore": []}
        cpu_sps: dict[str, list[float]] = {"sb3": [], "expstore": []}
        for rep in range(repeats):
            for kind in ("sb3", "expstore"):
                cls = sb3_cls if kind == "sb3" else ExpstoreReplayBuffer
                fresh = {k: dict(v) if isinstance(v, dict) else v for k, v in kw.items()}
                model = algo(policy, make_env(), seed=rep, replay_buffer_class=cls,
                             replay_buffer_kwargs=dict(extra) or None, **fresh)
                t0, c0 = time.perf_counter(), time.process_time()
                model.learn(n)
                sps[kind].append(n / (time.perf_counter() - t0))
                cpu_sps[kind].append(n / (time.process_time() - c0))
                if kind == "expstore":
                    model.replay_buffer.close()
                del model
        row = {"case": name, "sb3_sps": statistics.median(sps["sb3"]),
               "expstore_sps": statistics.median(sps["expstore"]), "steps": n,
               "repeats": repeats}
        row["sps_ratio"] = ratio(row["expstore_sps"], row["sb3_sps"])
        row["cpu_sps_ratio"] = ratio(statistics.median(cpu_sps["expstore"]),
                                     statistics.median(cpu_sps["sb3"]))
        print(row, flush=True)
        rows.append(row)
    return rows


def cartpole_stream(n: int, seed: int = 0):
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    for _ in range(n):
        a = int(rng.integers(2))
        nxt, r, term, trunc, _ = env.step(a)
        yield (obs[None], nxt[None], np.array([a]), np.array([r], np.float32),
               np.array([term or trunc]), [{"TimeLimit.truncated": trunc and not term}])
        obs = nxt if not (term or trunc) else env.reset()[0]


def pong_stream(data: dict, n: int):
    """SB3 VecFrameStack semantics: zero-padded (4, 84, 84) stacks, newest frame last."""
    frames, start = data["frames"], data["episode_start"]
    stack = np.zeros((4, 84, 84), np.uint8)
    made = 0
    for i in range(len(frames) - 1):
        if start[i]:
            stack = np.zeros((4, 84, 84), np.uint8)
            stack[-1] = frames[i]
        if not data["valid"][i]:
            continue
        nxt = np.concatenate([stack[1:], frames[i + 1][None]])
        term, trunc = bool(data["terminated"][i]), bool(data["truncated"][i])
        yield (stack[None], nxt[None], np.array([data["actions"][i]]),
               np.array([data["rewards"][i]], np.float32), np.array([term or trunc]),
               [{"TimeLimit.truncated": trunc}])
        stack = nxt
        made += 1
        if made == n:
            return


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def fill(buf, stream_fn, n, flush, pace_s=0.0):
    """Add the stream; (us per add, p50 us, the first add in ms, us per add with the final
    flush). The first add is not in the mean (expstore opens its store there: reported as
    ``first_add_ms``). ``pace_s``: seconds slept between adds (not timed; GIL released),
    as an env step and a gradient step would take."""
    times = []
    for args in stream_fn():
        if pace_s:
            time.sleep(pace_s)
        t0 = time.perf_counter()
        buf.add(*args)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    if flush:
        buf.flush()
    t_flush = time.perf_counter() - t0
    rest = times[1:]
    return (sum(rest) / len(rest) * 1e6, statistics.median(rest) * 1e6, times[0] * 1e3,
            (sum(rest) + t_flush) / len(rest) * 1e6)


def run_case(name, make_sb3, make_es, stream_fn, n, repeats, batches, work, pace_s=0.0):
    """Per repeat: fill both buffers (order alternating), then time ``sample(B)`` calls
    interleaved one by one (sb3, expstore, sb3, ...) for about a second per batch size, so
    load from elsewhere on the machine hits both alike."""
    got = {k: {"add": [], "p50": [], "first": [], "flush": [], **{b: [] for b in batches}}
           for k in ("sb3", "expstore")}
    nbytes = {}
    for rep in range(repeats):
        bufs = {}
        order = ("sb3", "expstore") if rep % 2 == 0 else ("expstore", "sb3")
        for kind in order:
            url = work / f"{name}-{kind}-{rep}.zarr"
            bufs[kind] = (make_sb3 if kind == "sb3" else make_es)(n, url)
            add_us, p50_us, first_ms, flush_us = fill(bufs[kind], stream_fn, n,
                                                      kind == "expstore", pace_s)
            got[kind]["add"].append(add_us)
            got[kind]["p50"].append(p50_us)
            got[kind]["first"].append(first_ms)
            got[kind]["flush"].append(flush_us)
        for b in batches:
            total = {"sb3": 0.0, "expstore": 0.0}
            calls, t_end = 0, time.perf_counter() + 1.0
            while time.perf_counter() < t_end or calls < 5:
                for kind in ("sb3", "expstore"):
                    t0 = time.perf_counter()
                    bufs[kind].sample(b)
                    total[kind] += time.perf_counter() - t0
                calls += 1
            for kind in total:
                got[kind][b].append(total[kind] / calls * 1e6)
        ref = bufs["sb3"]
        nbytes["sb3"] = sum(getattr(ref, a).nbytes for a in
                            ("observations", "next_observations", "actions", "rewards",
                             "dones", "timeouts") if hasattr(ref, a)) / n
        bufs["expstore"].flush()
        nbytes["expstore"] = du(Path(bufs["expstore"].url)) / n
        bufs["expstore"].close()
        del bufs
    rows = []
    for kind in ("sb3", "expstore"):
        g = got[kind]
        row = {"case": name, "buffer": kind, "add_us": statistics.median(g["add"]),
               "add_p50_us": statistics.median(g["p50"]),
               "first_add_ms": statistics.median(g["first"]),
               "add_flush_us": statistics.median(g["flush"]),
               "bytes_per_transition": round(nbytes[kind])}
        for b in batches:
            row[f"sample{b}_us"] = statistics.median(g[b])
        rows.append(row)
    base, new = rows
    new["add_ratio"] = ratio(new["add_us"], base["add_us"])
    new["add_p50_ratio"] = ratio(new["add_p50_us"], base["add_p50_us"])
    new["add_flush_ratio"] = ratio(new["add_flush_us"], base["add_flush_us"])
    for b in batches:
        new[f"sample{b}_ratio"] = ratio(new[f"sample{b}_us"], base[f"sample{b}_us"])
    new["bytes_ratio"] = ratio(new["bytes_per_transition"], base["bytes_per_transition"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cartpole", type=int, default=20_000)
    ap.add_argument("--pong", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=10_000)
    ap.add_argument("--sac-steps", type=int, default=1_500)
    ap.add_argument("--pace-us", type=float, default=100.0,
                    help="microseconds slept between adds in the paced pong-store case (0: "
                         "no such case)")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    ap.add_argument("--train-only", default="",
                    help="run only the training pairs whose name contains this (e.g. '4 envs'),"
                         " print their table and leave RESULTS.md alone")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.train_only:
        train = train_pairs(args.train_steps, args.sac_steps, args.repeats, args.train_only)
        print(markdown_table(train, ["case", "sb3_sps", "expstore_sps", "sps_ratio",
                                     "cpu_sps_ratio", "steps", "repeats"]))
        return
    from stable_baselines3.common.buffers import NStepReplayBuffer, ReplayBuffer

    work = Path(tempfile.mkdtemp(prefix="bench-sb3-"))
    load0 = os.getloadavg()[0]
    results = []
    cp = gym.make("CartPole-v1")
    n = args.cartpole
    results += run_case(
        "cartpole", lambda n, url: ReplayBuffer(n, cp.observation_space, cp.action_space,
                                                device="cpu"),
        lambda n, url: ExpstoreReplayBuffer(n, cp.observation_space, cp.action_space,
                                            device="cpu", url=url, seed=0),
        lambda: cartpole_stream(n), n, args.repeats, (64, 256), work)
    results += run_case(
        "cartpole-nstep3", lambda n, url: NStepReplayBuffer(n, cp.observation_space,
                                                           cp.action_space, device="cpu",
                                                           n_steps=3),
        lambda n, url: ExpstoreReplayBuffer(n, cp.observation_space, cp.action_space,
                                            device="cpu", url=url, n_steps=3),
        lambda: cartpole_stream(n), n, args.repeats, (64, 256), work)
    results += run_case(
        "cartpole-per", lambda n, url: ReplayBuffer(n, cp.observation_space, cp.action_space,
                                                    device="cpu"),
        lambda n, url: PrioritizedExpstoreReplayBuffer(n, cp.observation_space,
                                                       cp.action_space, device="cpu", url=url,
                                                       seed=0),
        lambda: cartpole_stream(n), n, args.repeats, (64, 256), work)
    if args.pong:
        from frames import load_atari_frames

        data = load_atari_frames(args.pong + 200, game="Pong", seed=0)
        n = min(args.pong, int(data["valid"].sum()))
        obs_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        act_space = gym.spaces.Discrete(6)
        results += run_case(
            "pong", lambda n, url: ReplayBuffer(n + 1, obs_space, act_space, device="cpu",
                                                optimize_memory_usage=True,
                                                handle_timeout_termination=False),
            lambda n, url: ExpstoreReplayBuffer(n, obs_space, act_space, device="cpu",
                                                url=url, frame_stack=4, seed=0),
            lambda: pong_stream(data, n), n, args.repeats, (32, 256), work)
        # sampling from the store (what buffers over the mirror's 1 GiB do: a 1M-step Pong
        # buffer), compared at a size SB3's RAM buffer also fits
        results += run_case(
            "pong-store", lambda n, url: ReplayBuffer(n + 1, obs_space, act_space,
                                                      device="cpu", optimize_memory_usage=True,
                                                      handle_timeout_termination=False),
            lambda n, url: ExpstoreReplayBuffer(n, obs_space, act_space, device="cpu",
                                                url=url, frame_stack=4, seed=0, mirror=False),
            lambda: pong_stream(data, n), n, args.repeats, (32, 256), work)
        if args.pace_us:  # the same with an env step's time between adds
            results += run_case(
                f"pong-store paced {args.pace_us:g} us",
                lambda n, url: ReplayBuffer(n + 1, obs_space, act_space, device="cpu",
                                            optimize_memory_usage=True,
                                            handle_timeout_termination=False),
                lambda n, url: ExpstoreReplayBuffer(n, obs_space, act_space, device="cpu",
                                                    url=url, frame_stack=4, seed=0,
                                                    mirror=False),
                lambda: pong_stream(data, n), n, args.repeats, (32,), work,
                pace_s=args.pace_us / 1e6)
        source = f"CartPole-v1 random policy ({args.cartpole} steps); {data['source']} " \
                 f"Pong frames ({n} transitions)"
    else:
        source = f"CartPole-v1 random policy ({args.cartpole} steps)"
    for r in results:
        print(r)
    train = train_pairs(args.train_steps, args.sac_steps, args.repeats) if args.train_steps \
        else []
    body = markdown_table(results, ["case", "buffer", "add_us", "add_ratio", "add_p50_us",
                                    "add_p50_ratio", "first_add_ms", "add_flush_us",
                                    "add_flush_ratio", "sample64_us",
                                    "sample32_us", "sample256_us", "sample64_ratio",
                                    "sample32_ratio", "sample256_ratio",
                                    "bytes_per_transition", "bytes_ratio"])
    body += ("\n\nMedians of repeats (fresh buffers each; sample calls interleaved one by "
             "one between the two buffers); ratios are expstore / sb3 from this run. "
             "add_us: one `add` call (1 env), mean over the adds after the first; "
             "add_p50_us: their median; first_add_ms: the first add (expstore opens its "
             "store there); sampleB_us: one `sample(B)` call "
             "(torch tensors, CPU). bytes: sb3 = its numpy arrays; expstore = files of the "
             "store after flush (fsync off, the buffer default). CartPole: SB3 defaults. "
             "Pong: SB3 `optimize_memory_usage=True, handle_timeout_termination=False` vs "
             "expstore `frame_stack=4` (the store holds one compressed 84x84 frame per row; "
             "at 10,000 steps the RAM mirror, 0.56 GB, is under its 1 GiB default and "
             "serves the samples); pong-store: the same with `mirror=False`, every add "
             "written to the store and batches read from it (drawn ahead on a thread, "
             "`prefetch=True`), as buffers over 1 GiB do; pong-store paced: the same with "
             f"{args.pace_us:g} us slept between adds (not timed; the GIL released, as an "
             "env step and a gradient step release it), so the store's writer threads keep "
             "up; CartPole: RAM mirror (default). "
             "cartpole-per: PrioritizedExpstoreReplayBuffer against SB3's uniform buffer. "
             "torch threads 1.")
    if train:
        body += "\n\n" + markdown_table(train, ["case", "sb3_sps", "expstore_sps",
                                                 "sps_ratio", "cpu_sps_ratio", "steps",
                                                 "repeats"])
        body += ("\n\nSteps/s of `model.learn(steps)` (medians of repeats, sb3 and expstore "
                 "alternating, same seed); cpu_sps_ratio: the same with process CPU time "
                 "(all threads) instead of wall time, robust to other load on the machine. "
                 "expstore buffer with its defaults (RAM mirror, temporary store).")
    print(body)
    save_json("sb3", {"buffers": results, "training": train})
    if args.no_write:
        return
    write_section("SB3 buffer", body, source=source,
                  extra={"load average (1 min) start/end":
                         f"{load0:.1f} / {os.getloadavg()[0]:.1f}"})


if __name__ == "__main__":
    main()
