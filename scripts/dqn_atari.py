"""DQN on Atari (ALE), CleanRL style, with its replay in an expstore store.

    python scripts/dqn_atari.py                         # Pong, 10M steps, defaults for a GPU
    python scripts/dqn_atari.py --prioritized --n-step 3
    python scripts/dqn_atari.py --total-steps 3000 --learning-starts 500 --buffer 5000  # CPU smoke

Frames are AtariPreprocessing's (84x84 gray, frame skip 4, up to 30 no-ops, no terminal on
life loss). The store keeps ONE 84x84 uint8 frame per row and a ``stack=4`` field; batches
come back as ``(B, 4, 84, 84)`` uint8 stacks built by DataLoader workers from
``expstore.make_loader`` and are turned into floats in [0, 1] on the device. The network is
Nature DQN's CNN; double DQN is on by default; ``--prioritized`` and ``--n-step`` use
expstore's PrioritizedSampler and n-step returns. Defaults follow CleanRL's dqn_atari.py
(lr 1e-4, buffer 1M, batch 32, target copied every 1,000 steps, epsilon 1 -> 0.01 over 10%
of 10M steps, learning starts at 80,000, an update every 4 steps).

Periodic lines report episodic return, env steps/s, loader batches/s and how long the
learner waited for batches (``next(loader)``) against computing updates. The last line
printed is a JSON summary.
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
    p.add_argument("--env-id", default="PongNoFrameskip-v4")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-steps", type=int, default=10_000_000, help="env steps (agent)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--buffer", type=int, default=1_000_000, help="store capacity (rows)")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-starts", type=int, default=80_000)
    p.add_argument("--train-freq", type=int, default=4, help="env steps between updates")
    p.add_argument("--gradient-steps", type=int, default=1, help="updates per train phase")
    p.add_argument("--target-update", type=int, default=1_000, help="env steps between copies")
    p.add_argument("--exploration-fraction", type=float, default=0.10,
                   help="fraction of --total-steps over which epsilon falls to --final-eps")
    p.add_argument("--final-eps", type=float, default=0.01)
    p.add_argument("--no-double", dest="double", action="store_false",
                   help="plain DQN targets instead of double DQN")
    p.add_argument("--n-step", type=int, default=1, help="n-step returns (from the loader)")
    p.add_argument("--prioritized", action="store_true", help="prioritized replay (PER)")
    p.add_argument("--alpha", type=float, default=0.6, help="PER priority exponent")
    p.add_argument("--beta", type=float, default=0.4, help="PER IS exponent, annealed to 1")
    p.add_argument("--no-clip-rewards", dest="clip_rewards", action="store_false",
                   help="store raw rewards instead of their sign")
    p.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--prefetch-factor", type=int, default=2, help="batches ahead per worker")
    p.add_argument("--flush-every", type=int, default=1_000, help="env steps between flushes")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads in this process")
    p.add_argument("--url", default=None, help="store path/URL (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the store afterwards")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing store at --url (without it, one is refused)")
    p.add_argument("--resume", action="store_true",
                   help="go on writing the store at --url: its rows, and with --prioritized "
                        "the priorities saved with it")
    p.add_argument("--log-every", type=int, default=10_000, help="env steps between logs")
    args = p.parse_args()
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite: pass one (continue the store, or replace it)")
    if args.resume and not args.url:
        p.error("--resume: needs --url (the store to continue)")
    return args


def make_env(env_id: str, seed: int) -> gym.Env:
    """AtariPreprocessing frames (one 84x84 uint8 frame) stacked 4 deep for acting."""
    import ale_py

    gym.register_envs(ale_py)
    # AtariPreprocessing skips frames itself: the v5 ids must not skip (or be sticky) too.
    kwargs = {} if "NoFrameskip" in env_id else dict(frameskip=1, repeat_action_probability=0.0)
    env = gym.make(env_id, **kwargs)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                          terminal_on_life_loss=False, grayscale_obs=True)
    # The agent acts on the last 4 frames, padded at reset with the first frame: what the
    # store's stack=4 field (padding="reset") returns for the same rows.
    env = gym.wrappers.FrameStackObservation(env, 4)
    env.action_space.seed(seed)
    return env


class QNetwork(nn.Module):
    """Nature DQN (Mnih et al. 2015): 3 conv layers, 512 hidden units."""

    def __init__(self, n_actions: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
            nn.Linear(512, n_actions))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """``frames``: (B, 4, 84, 84) uint8 -> Q-values (B, n_actions)."""
        return self.net(frames.float() / 255.0)


def epsilon(step: int, args: argparse.Namespace) -> float:
    frac = min(1.0, step / max(1.0, args.exploration_fraction * args.total_steps))
    return 1.0 + frac * (args.final_eps - 1.0)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    work = None if args.url else Path(tempfile.mkdtemp(prefix="dqn-atari-"))
    url = args.url or str(work / "replay.zarr")

    env = make_env(args.env_id, args.seed)
    n_actions = int(env.action_space.n)

    # -- replay: one 84x84 frame per row; stack=4 comes from frame_stack=4 on the (4, 84, 84)
    # space (open_replay: new, --overwrite or --resume).
    spec = es.Spec.from_spaces(env.observation_space, env.action_space, frame_stack=4)
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
    # staged rows in shared memory); flushing every 1,000 steps only makes them durable.

    q = QNetwork(n_actions).to(device)
    target = QNetwork(n_actions).to(device)
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=args.lr)

    loader = None
    batches = None
    grad_steps = priority_rows = 0
    wait_s = compute_s = env_s = flush_s = 0.0
    returns: deque[float] = deque(maxlen=10)
    episodes, ep_return, ep_len = 0, 0.0, 0
    obs, _ = env.reset(seed=args.seed)
    t_start = time.perf_counter()
    last = dict(t=t_start, step=0, grads=0, wait=0.0, compute=0.0)
    step = 0
    try:
        for step in range(1, args.total_steps + 1):
            # -- act and store --------------------------------------------------------
            t0 = time.perf_counter()
            if rng.random() < epsilon(step, args):
                action = int(env.action_space.sample())
            else:
                with torch.no_grad():
                    frames = torch.as_tensor(obs, device=device).unsqueeze(0)
                    action = int(q(frames).argmax())
            next_obs, reward, term, trunc, _ = env.step(action)
            stored_reward = float(np.sign(reward)) if args.clip_rewards else float(reward)
            store.add(obs[-1], action, stored_reward, next_obs[-1], term, trunc)
            ep_return += float(reward)
            ep_len += 1
            obs = next_obs
            if term or trunc:
                episodes += 1
                returns.append(ep_return)
                print(f"step {step:>9,}  episode {episodes:>5}  return {ep_return:6.1f}  "
                      f"length {ep_len}", flush=True)
                ep_return, ep_len = 0.0, 0
                obs, _ = env.reset()
            env_s += time.perf_counter() - t0

            # -- learn ------------------------------------------------------------------
            if step % args.flush_every == 0:
                t0 = time.perf_counter()
                store.flush()
                flush_s += time.perf_counter() - t0
            if step + resumed_rows > args.learning_starts and step % args.train_freq == 0:
                if loader is None:  # first update: rows exist, start the workers
                    loader = es.make_loader(
                        store, sampler, batch_size=args.batch_size,
                        num_workers=args.num_workers, prefetch_factor=args.prefetch_factor,
                        pin_memory=cuda, device=str(device) if cuda else None)
                    batches = iter(loader)
                for _ in range(args.gradient_steps):
                    t0 = time.perf_counter()
                    batch = next(batches)  # on the device already when it is a GPU
                    t1 = time.perf_counter()
                    td = update(q, target, opt, batch, args)
                    if args.prioritized:  # (.cpu() inside waits for the GPU)
                        priority_rows += sampler.update_priorities(
                            batch["index"], td, step_id=batch["step_id"])
                    elif cuda:
                        torch.cuda.synchronize()  # charge the GPU work to compute, not wait
                    t2 = time.perf_counter()
                    wait_s += t1 - t0
                    compute_s += t2 - t1
                    grad_steps += 1
            if step % args.target_update == 0:
                target.load_state_dict(q.state_dict())

            if step % args.log_every == 0:
                now = time.perf_counter()
                dt = now - last["t"]
                g = grad_steps - last["grads"]
                w, c = wait_s - last["wait"], compute_s - last["compute"]
                mean = f"{np.mean(returns):6.1f}" if returns else "   n/a"
                print(f"step {step:>9,}  episodes {episodes:>5}  mean return(10) {mean}  "
                      f"eps {epsilon(step, args):.3f}  SPS {(step - last['step']) / dt:5.0f}  "
                      f"batches/s {g / dt:6.1f}  learner wait {1e3 * w / max(g, 1):6.2f} ms"
                      f"/batch vs compute {1e3 * c / max(g, 1):6.2f} ms/batch "
                      f"({100 * w / max(w + c, 1e-9):4.1f}% waiting)", flush=True)
                last = dict(t=now, step=step, grads=grad_steps, wait=wait_s, compute=compute_s)
    finally:
        if loader is not None:
            loader.close()
        store.close()
    wall = time.perf_counter() - t_start

    learner_s = wait_s + compute_s
    result = dict(
        env_id=args.env_id, seed=args.seed, device=str(device), env_steps=step,
        episodes=episodes, wall_seconds=round(wall, 1), sps=round(step / wall, 1),
        mean_return_last10=float(np.mean(returns)) if returns else None,
        double=args.double, prioritized=args.prioritized, n_step=args.n_step,
        num_workers=args.num_workers, gradient_steps=grad_steps,
        grad_steps_per_s=round(grad_steps / learner_s, 1) if learner_s else 0.0,
        learner_wait_s=round(wait_s, 2), learner_compute_s=round(compute_s, 2),
        learner_wait_frac=round(wait_s / learner_s, 3) if learner_s else 0.0,
        wait_ms_per_batch=round(1e3 * wait_s / grad_steps, 3) if grad_steps else None,
        compute_ms_per_batch=round(1e3 * compute_s / grad_steps, 3) if grad_steps else None,
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
    would pay ~4 ms per object written)."""
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
            best = q(batch["next_obs"]).argmax(dim=1, keepdim=True)
            next_q = target(batch["next_obs"]).gather(1, best).squeeze(1)
        else:
            next_q = target(batch["next_obs"]).max(dim=1).values
        y = reward + discount * next_q
    pred = q(batch["obs"]).gather(1, action.unsqueeze(1)).squeeze(1)
    # Huber loss (Nature DQN's clipped error), importance-weighted (all 1 without PER).
    loss = (batch["weight"].float() * F.smooth_l1_loss(pred, y, reduction="none")).mean()
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q.parameters(), 10.0)
    opt.step()
    return (pred - y).detach().abs()


if __name__ == "__main__":
    main()
