"""DQN on CartPole-v1, CleanRL style, with its replay in an expstore store.

    python scripts/dqn_cartpole.py                            # double DQN, uniform replay
    python scripts/dqn_cartpole.py --prioritized --n-step 3   # + PER and 3-step returns
    python scripts/dqn_cartpole.py --num-workers 0            # read batches in this process

Every env step goes into the store (``store.add``); every training batch comes out of
``expstore.make_loader``: the sampler plans batches here, DataLoader worker processes read
and decode them. Hyper-parameters start from RL-Zoo's for DQN on CartPole-v1 (256x256 MLP,
learning starts at 1,000, epsilon 1 -> final over 8,000 steps), with double DQN, re-tuned
on a 2-core CPU for fewer updates: 16 updates of 128 samples every 64 env steps (RL-Zoo:
128 of 64 every 256), lr 1e-3, the target network copied every 256 env steps (copying it
every 16 updates diverged, Q-values past 1e5) and final epsilon 0.01
(benchmarks/RESULTS.md, "DQN examples"). Training stops once the last 10 episodes average
>= 475 (solved); the greedy policy is then evaluated on 10 episodes. The last line printed
is a JSON summary (solved, steps, seconds, loader stats, how long the learner waited for
batches).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections import deque
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import expstore as es


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-steps", type=int, default=100_000, help="env steps at most")
    p.add_argument("--solve-return", type=float, default=475.0,
                   help="stop once the last 10 episodes average this (<= 0: never stop)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--buffer", type=int, default=100_000, help="store capacity (rows)")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--learning-starts", type=int, default=1_000)
    p.add_argument("--train-freq", type=int, default=64, help="env steps between updates")
    p.add_argument("--gradient-steps", type=int, default=16, help="updates per train phase")
    p.add_argument("--target-update", type=int, default=256,
                   help="env steps between target network copies")
    p.add_argument("--exploration-steps", type=int, default=8_000,
                   help="env steps over which epsilon falls from 1 to --final-eps")
    p.add_argument("--final-eps", type=float, default=0.01)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--no-double", dest="double", action="store_false",
                   help="plain DQN targets instead of double DQN")
    p.add_argument("--n-step", type=int, default=1, help="n-step returns (from the loader)")
    p.add_argument("--prioritized", action="store_true", help="prioritized replay (PER)")
    p.add_argument("--alpha", type=float, default=0.6, help="PER priority exponent")
    p.add_argument("--beta", type=float, default=0.4, help="PER IS exponent, annealed to 1")
    p.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--flush-every", type=int, default=256, help="env steps between flushes")
    p.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    p.add_argument("--url", default=None, help="store path/URL (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the store afterwards")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing store at --url (without it, one is refused)")
    p.add_argument("--resume", action="store_true",
                   help="go on writing the store at --url: its rows, and with --prioritized "
                        "the priorities saved with it")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--log-every", type=int, default=5_000, help="env steps between logs")
    args = p.parse_args()
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite: pass one (continue the store, or replace it)")
    if args.resume and not args.url:
        p.error("--resume: needs --url (the store to continue)")
    return args


class QNetwork(nn.Module):
    def __init__(self, n_obs: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_obs, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, n_actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def epsilon(step: int, args: argparse.Namespace) -> float:
    frac = min(1.0, step / max(1, args.exploration_steps))
    return 1.0 + frac * (args.final_eps - 1.0)


def evaluate(q: QNetwork, env_id: str, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` greedy episodes."""
    env = gym.make(env_id)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs).unsqueeze(0)).argmax())
            obs, r, term, trunc, _ = env.step(action)
            total += float(r)
            done = term or trunc
        returns.append(total)
    env.close()
    return returns


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    work = None if args.url else Path(tempfile.mkdtemp(prefix="dqn-cartpole-"))
    url = args.url or str(work / "replay.zarr")

    env = gym.make(args.env_id)
    env.action_space.seed(args.seed)
    n_actions = int(env.action_space.n)

    # -- replay: a store on local disk (open_replay: a new one, --overwrite or --resume)
    spec = es.Spec.from_spaces(env.observation_space, env.action_space)
    store = open_replay(url, spec, args)
    resumed_rows = len(store)
    # --resume --prioritized: the sampler starts from the priorities saved with the store
    priorities_resumed = bool(args.resume and args.prioritized
                              and store.load_priorities("priorities") is not None)
    common = dict(n_step=args.n_step, gamma=args.gamma, seed=args.seed)
    # PER priorities are saved with a store that outlives the run (--url), at every flush,
    # and reloaded by --resume; a temporary store keeps them in RAM (persist=False)
    if args.prioritized:
        updates = (args.total_steps - args.learning_starts) // args.train_freq
        sampler: es.Sampler = es.PrioritizedSampler(
            store, alpha=args.alpha, beta=args.beta, beta_final=1.0,
            beta_steps=max(1, updates * args.gradient_steps), persist=bool(args.url),
            **common)
    else:
        sampler = es.UniformSampler(store, **common)
    # Workers read rows as soon as they are added (a local store's writer publishes its
    # staged rows in shared memory); flushing every 256 steps only makes them durable.

    q = QNetwork(int(np.prod(env.observation_space.shape)), n_actions, args.hidden)
    target = QNetwork(int(np.prod(env.observation_space.shape)), n_actions, args.hidden)
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=args.lr)

    loader = None
    batches = None
    grad_steps = priority_rows = 0
    wait_s = compute_s = env_s = flush_s = 0.0
    returns: deque[float] = deque(maxlen=10)
    episodes, ep_return, solved, mean10 = 0, 0.0, False, None
    obs, _ = env.reset(seed=args.seed)
    t_start = time.perf_counter()
    last_log = (t_start, 0, 0)
    step = 0
    try:
        for step in range(1, args.total_steps + 1):
            # -- act and store --------------------------------------------------------
            t0 = time.perf_counter()
            if rng.random() < epsilon(step, args):
                action = int(env.action_space.sample())
            else:
                with torch.no_grad():
                    action = int(q(torch.as_tensor(obs).unsqueeze(0)).argmax())
            next_obs, reward, term, trunc, _ = env.step(action)
            store.add(obs, action, reward, next_obs, term, trunc)
            ep_return += float(reward)
            obs = next_obs
            if term or trunc:
                episodes += 1
                returns.append(ep_return)
                ep_return = 0.0
                obs, _ = env.reset()
                mean10 = float(np.mean(returns))
                if args.solve_return > 0 and len(returns) == 10 and mean10 >= args.solve_return:
                    solved = True
            env_s += time.perf_counter() - t0
            if solved:
                break

            # -- learn ------------------------------------------------------------------
            if step % args.flush_every == 0:
                t0 = time.perf_counter()
                store.flush()
                flush_s += time.perf_counter() - t0
            if step + resumed_rows > args.learning_starts and step % args.train_freq == 0:
                if loader is None:  # first train phase: rows exist, start the workers
                    loader = es.make_loader(store, sampler, batch_size=args.batch_size,
                                            num_workers=args.num_workers)
                    batches = iter(loader)
                for _ in range(args.gradient_steps):
                    t0 = time.perf_counter()
                    batch = next(batches)
                    t1 = time.perf_counter()
                    td = update(q, target, opt, batch, args)
                    if args.prioritized:
                        priority_rows += sampler.update_priorities(
                            batch["index"], td, step_id=batch["step_id"])
                    t2 = time.perf_counter()
                    wait_s += t1 - t0
                    compute_s += t2 - t1
                    grad_steps += 1
            if step % args.target_update == 0:
                target.load_state_dict(q.state_dict())

            if step % args.log_every == 0:
                now = time.perf_counter()
                t_prev, s_prev, g_prev = last_log
                mean = "   n/a" if mean10 is None else f"{mean10:6.1f}"
                print(f"step {step:>7,}  episodes {episodes:>4}  mean10 {mean}  "
                      f"eps {epsilon(step, args):.3f}  SPS {(step - s_prev) / (now - t_prev):6.0f}"
                      f"  grad/s {(grad_steps - g_prev) / (now - t_prev):5.0f}  learner wait "
                      f"{100 * wait_s / max(wait_s + compute_s, 1e-9):4.1f}%", flush=True)
                last_log = (now, step, grad_steps)
    finally:
        if loader is not None:
            loader.close()
        store.close()
    wall = time.perf_counter() - t_start

    eval_returns = evaluate(q, args.env_id, args.eval_episodes, args.seed + 10_000)
    learner_s = wait_s + compute_s
    result = dict(
        solved=solved, seed=args.seed, env_steps=step, episodes=episodes,
        wall_seconds=round(wall, 1), mean_last10=mean10,
        eval_mean=float(np.mean(eval_returns)) if eval_returns else None,
        eval_returns=eval_returns,
        double=args.double, prioritized=args.prioritized, n_step=args.n_step,
        num_workers=args.num_workers, gradient_steps=grad_steps,
        grad_steps_per_s=round(grad_steps / learner_s, 1) if learner_s else 0.0,
        learner_wait_s=round(wait_s, 2), learner_compute_s=round(compute_s, 2),
        learner_wait_frac=round(wait_s / learner_s, 3) if learner_s else 0.0,
        env_seconds=round(env_s, 2), flush_seconds=round(flush_s, 2),
        priority_rows_updated=priority_rows, store_rows=len(store), resumed_rows=resumed_rows,
        priorities_resumed=priorities_resumed,
        store=url if args.keep or work is None else None,
        loader=loader.stats.as_dict() if loader is not None else None,
    )
    if work is not None and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


def open_replay(url: str, spec: es.Spec, args: argparse.Namespace) -> es.Store:
    """The replay store at ``url``: a new one (an existing store is refused unless
    ``--overwrite``), or with ``--resume`` the one there, reopened for writing.
    fsync=False: a scratch replay need not survive a power cut (with fsync every flush
    would pay ~4 ms per object (9 objects) written)."""
    prog = Path(__file__).name
    if args.resume:
        try:
            return es.open(url, mode="r+", spec=spec, fsync=False)
        except FileNotFoundError:
            raise SystemExit(f"{prog}: error: --resume: no store at {url}; run without "
                             "--resume to create one") from None
    try:
        return es.create(url, spec, capacity=args.buffer, overwrite=args.overwrite,
                         fsync=False)
    except FileExistsError as e:
        if args.overwrite:
            raise
        raise SystemExit(f"{prog}: error: {url}: a store exists there; pass --overwrite to "
                         "replace it or --resume to continue it") from e


def update(q: QNetwork, target: QNetwork, opt: torch.optim.Optimizer,
           batch: dict[str, torch.Tensor], args: argparse.Namespace) -> torch.Tensor:
    """One (double) DQN step on ``batch``; returns |TD error| per sample (for PER)."""
    obs, next_obs = batch["obs"].float(), batch["next_obs"].float()
    action = batch["action"].long()
    reward = batch["reward"].float()
    # n-step batches carry discount = gamma^m (0 if the episode terminated inside the
    # horizon); 1-step batches leave it to us. A truncated episode bootstraps either way.
    if "discount" in batch:
        discount = batch["discount"].float()
    else:
        discount = args.gamma * (1.0 - batch["terminated"].float())
    with torch.no_grad():
        if args.double:
            best = q(next_obs).argmax(dim=1, keepdim=True)
            next_q = target(next_obs).gather(1, best).squeeze(1)
        else:
            next_q = target(next_obs).max(dim=1).values
        y = reward + discount * next_q
    pred = q(obs).gather(1, action.unsqueeze(1)).squeeze(1)
    # Huber loss (as SB3, for which RL-Zoo tuned these settings), importance-weighted
    # (weights are all 1 without PER).
    loss = (batch["weight"].float() * F.smooth_l1_loss(pred, y, reduction="none")).mean()
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q.parameters(), 10.0)
    opt.step()
    return (pred - y).detach().abs()


if __name__ == "__main__":
    main()
