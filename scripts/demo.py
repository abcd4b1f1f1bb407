"""The main job on an embedded default: record Atari frames into a local store, reopen it,
stream prioritized batches through a PyTorch DataLoader, and print what it cost.

    python scripts/demo.py                       # ALE Pong (CartPole if ALE is missing)
    python scripts/demo.py --steps 50000 --url runs/pong.zarr

Read top to bottom: collect -> reopen -> stream -> report.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

import numpy as np
from tqdm import tqdm

import expstore as es


def make_env(seed: int):
    """Preprocessed Atari Pong (84x84 gray, 4 stacked) or CartPole when ALE is missing."""
    import gymnasium as gym

    try:
        import ale_py

        gym.register_envs(ale_py)
        env = gym.make("ALE/Pong-v5", frameskip=1)
        env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84,
                                              grayscale_obs=True, noop_max=30)
        env = gym.wrappers.FrameStackObservation(env, 4)
        return env, "ALE/Pong-v5 (84x84 gray, frame stack 4)"
    except Exception as e:  # no ALE or no ROMs: still show the whole path
        print(f"ALE unavailable ({type(e).__name__}: {e}); using CartPole-v1")
        return gym.make("CartPole-v1"), "CartPole-v1"


def collect(url: str, steps: int, seed: int) -> tuple[es.Store, str, float]:
    env, name = make_env(seed)
    stack = 4 if len(env.observation_space.shape) == 3 else None
    spec = es.Spec.from_spaces(env.observation_space, env.action_space, frame_stack=stack)
    capacity = steps + steps // 100 + 4096  # rounded up to whole shards by create()
    store = es.create(url, spec, capacity=capacity, overwrite=True)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    t0 = time.perf_counter()
    # a bar on a terminal; in a log (stderr not a terminal) no bar: the summary says it all
    for _ in tqdm(range(steps), desc=f"recording {name}", unit="step", mininterval=2,
                  disable=not sys.stderr.isatty()):
        action = int(rng.integers(env.action_space.n))
        nxt, reward, term, trunc, _ = env.step(action)
        store.add(obs, action, reward, nxt, term, trunc)
        obs = env.reset()[0] if term or trunc else nxt
    store.close()
    return store, name, time.perf_counter() - t0


def stream(url: str, batches: int, batch_size: int, workers: int) -> tuple[float, es.Store, dict]:
    store = es.open(url)
    sampler = make_sampler(store)
    loader = es.make_loader(store, sampler, batch_size=batch_size, num_workers=workers,
                            num_batches=batches + 5)
    it = iter(loader)
    for _ in range(5):  # start the workers before timing
        next(it)
    t0 = time.perf_counter()
    n = 0
    for batch in it:
        td_error = batch["reward"].float().abs() + 0.1  # a stand-in for a learner's TD errors
        sampler.update_priorities(batch["index"], td_error)
        n += 1
    rate = n / (time.perf_counter() - t0)
    return rate, store, loader.stats.as_dict()


def make_sampler(store: es.Store) -> es.Sampler:
    return es.PrioritizedSampler(store, alpha=0.6, beta=0.4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="runs/demo.zarr", help="store path or fsspec URL")
    p.add_argument("--steps", type=int, default=20_000, help="env steps to record")
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the store afterwards")
    a = p.parse_args()

    store, env_name, seconds = collect(a.url, a.steps, a.seed)
    rate, store, stats = stream(a.url, a.batches, a.batch_size, a.workers)
    on_disk = store.backend.total_bytes()
    transitions = len(store) - store.episodes_written
    obs_fields = [store.spec.fields[n] for n in store.spec.obs_names]
    raw = sum(f.row_nbytes * (f.stack or 1) * 2 for f in obs_fields)  # obs + next_obs, stacked
    rows = [
        ("environment", env_name),
        ("rows written", f"{len(store):,} ({transitions:,} transitions, "
                         f"{store.episodes_written} episodes)"),
        ("record rate", f"{a.steps / seconds:,.0f} steps/s (env included)"),
        ("bytes on disk / transition", f"{on_disk / max(transitions, 1):,.0f} B"),
        ("raw stacked obs+next_obs / transition", f"{raw:,} B "
                                                  f"({raw * transitions / on_disk:,.0f}x more)"),
        ("sampler", "PrioritizedSampler (alpha 0.6, beta 0.4)"),
        ("DataLoader", f"{a.workers} workers, batch {a.batch_size}"),
        ("batches/s", f"{rate:,.0f} ({rate * a.batch_size:,.0f} transitions/s)"),
        ("stale rows replaced", f"{stats['stale_replaced']:.0f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if not a.keep and "://" not in a.url:
        shutil.rmtree(a.url, ignore_errors=True)


if __name__ == "__main__":
    main()
