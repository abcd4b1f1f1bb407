"""Solve CartPole-v1 with Stable-Baselines3 DQN on an expstore replay buffer.

    python scripts/sb3_cartpole.py [--url runs/sb3_cartpole.zarr] [--prioritized]

The only change from a plain SB3 script is ``replay_buffer_class``/``replay_buffer_kwargs``
(or ``PrioritizedDQN`` for prioritized replay). Hyperparameters are RL-Zoo's for DQN on
CartPole-v1. Every 2,000 steps the policy is evaluated on 20 episodes; training stops once
that mean reaches 495 (a margin over the 475 that counts as solved), and the best model is
then evaluated on 10 fresh episodes. Prints one JSON line with the result and timings.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from expstore.integrations import ExpstoreReplayBuffer, PrioritizedDQN


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="store path/URL (default: a temp dir)")
    ap.add_argument("--steps", type=int, default=100_000, help="max env steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prioritized", action="store_true", help="PrioritizedDQN (PER)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="sb3-cartpole-"))
    url = args.url or str(work / "replay.zarr")

    hyper = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                 learning_starts=1000, gamma=0.99, target_update_interval=10,
                 train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                 exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
                 seed=args.seed, verbose=0)
    env = make_vec_env("CartPole-v1", n_envs=1, seed=args.seed)
    if args.prioritized:
        model = PrioritizedDQN("MlpPolicy", env, replay_buffer_kwargs={"url": url}, **hyper)
    else:
        model = DQN("MlpPolicy", env, replay_buffer_class=ExpstoreReplayBuffer,
                    replay_buffer_kwargs={"url": url}, **hyper)

    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=args.seed + 1000)
    stop = StopTrainingOnRewardThreshold(reward_threshold=495, verbose=0)
    evals = EvalCallback(eval_env, callback_on_new_best=stop, eval_freq=2_000,
                         n_eval_episodes=20, best_model_save_path=str(work), verbose=0)
    t0 = time.perf_counter()
    model.learn(args.steps, callback=evals)
    train_s = time.perf_counter() - t0
    best = DQN.load(work / "best_model", device="cpu")
    test_env = make_vec_env("CartPole-v1", n_envs=1, seed=args.seed + 2000)
    mean, std = evaluate_policy(best, test_env, n_eval_episodes=10, deterministic=True)
    buf = model.replay_buffer
    result = dict(algo="PrioritizedDQN" if args.prioritized else "DQN",
                  env_steps=model.num_timesteps, train_seconds=round(train_s, 1),
                  eval_mean_return=float(mean), eval_std=float(std),
                  solved=bool(mean >= 475), store=buf.store.url, store_rows=len(buf.store),
                  episodes_stored=buf.store.episodes_written)
    buf.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
