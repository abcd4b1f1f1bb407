"""What switching SB3's ReplayBuffer to ExpstoreReplayBuffer costs: add / sample per call
and bytes per transition, against SB3's own buffer measured in the same run.

    python benchmarks/bench_sb3.py [--pong 10000] [--cartpole 20000] [--repeats 3]

Cases: CartPole-v1 (real random-policy steps, SB3 defaults) and ALE Pong frames
(``frames.load_atari_frames``) as SB3 sees them after ``VecFrameStack(4)`` +
``VecTransposeImage``: SB3 with ``optimize_memory_usage=True`` (its most compact mode,
which needs ``handle_timeout_termination=False``) vs expstore with ``frame_stack=4``.
Times are medians over repeats; add = one ``add`` call of one env step (building the
observations is not timed); sample = one ``sample(B)`` call returning torch tensors.
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

from expstore.integrations import ExpstoreReplayBuffer  # noqa: E402


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


def run_case(name, make_sb3, make_es, stream_fn, n, repeats, batches, work):
    rows = []
    for kind, make in (("sb3", make_sb3), ("expstore", make_es)):
        adds, samples, nbytes = [], {b: [] for b in batches}, None
        for rep in range(repeats):
            url = work / f"{name}-{kind}-{rep}.zarr"
            buf = make(n, url)
            t_add = 0.0
            for args in stream_fn():
                t0 = time.perf_counter()
                buf.add(*args)
                t_add += time.perf_counter() - t0
            adds.append(t_add / n * 1e6)
            for b in batches:
                buf.sample(b)
                calls, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < 1.0:
                    buf.sample(b)
                    calls += 1
                samples[b].append((time.perf_counter() - t0) / calls * 1e6)
            if kind == "sb3":
                nbytes = sum(getattr(buf, a).nbytes for a in
                             ("observations", "next_observations", "actions", "rewards",
                              "dones", "timeouts") if hasattr(buf, a)) / n
            else:
                buf.flush()
                nbytes = du(url) / n
                buf.close()
            del buf
        row = {"case": name, "buffer": kind, "add_us": statistics.median(adds),
               "bytes_per_transition": round(nbytes)}
        for b in batches:
            row[f"sample{b}_us"] = statistics.median(samples[b])
        rows.append(row)
    base, new = rows
    new["add_ratio"] = ratio(new["add_us"], base["add_us"])
    for b in batches:
        new[f"sample{b}_ratio"] = ratio(new[f"sample{b}_us"], base[f"sample{b}_us"])
    new["bytes_ratio"] = ratio(new["bytes_per_transition"], base["bytes_per_transition"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cartpole", type=int, default=20_000)
    ap.add_argument("--pong", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from stable_baselines3.common.buffers import ReplayBuffer

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
        source = f"CartPole-v1 random policy ({args.cartpole} steps); {data['source']} " \
                 f"Pong frames ({n} transitions)"
    else:
        source = f"CartPole-v1 random policy ({args.cartpole} steps)"
    for r in results:
        print(r)
    body = markdown_table(results, ["case", "buffer", "add_us", "add_ratio", "sample64_us",
                                    "sample32_us", "sample256_us", "sample64_ratio",
                                    "sample32_ratio", "sample256_ratio",
                                    "bytes_per_transition", "bytes_ratio"])
    body += ("\n\nMedians of repeats (fresh buffer each); ratios are expstore / sb3 from "
             "this run. add_us: one `add` call (1 env); sampleB_us: one `sample(B)` call "
             "(torch tensors, CPU). bytes: sb3 = its numpy arrays; expstore = files of the "
             "store after flush (fsync off, the buffer default). CartPole: SB3 defaults. "
             "Pong: SB3 `optimize_memory_usage=True, handle_timeout_termination=False` vs "
             "expstore `frame_stack=4` (one compressed 84x84 frame per row). torch threads 1.")
    write_section("SB3 buffer", body, source=source,
                  extra={"load average (1 min) start/end":
                         f"{load0:.1f} / {os.getloadavg()[0]:.1f}"})
    save_json("sb3", results)


if __name__ == "__main__":
    main()
