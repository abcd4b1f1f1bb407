"""Feeding a real GPU training step: updates/s with batches from expstore, TorchRL and a ring.

Usage (from the repository root, on a machine with a CUDA GPU)::

    python benchmarks/bench_gpu_feed.py                       # low-dim SAC + Atari DQN
    python benchmarks/bench_gpu_feed.py --cases lowdim --n 1000000 --repeats 5

Each case trains the same model on the same data, one optimiser step per batch, with its
batches coming from:

- ``gpu-only``: one batch already on the GPU, reused (the step's own cost: the ceiling);
- ``expstore-loader``: ``es.make_loader(store, batch_size=B, pin_memory=True,
  device="cuda")`` on a local store opened read-only;
- ``expstore-sample``: ``store.sample(B)`` in the training process, copied to the GPU;
- ``torchrl-prefetch``: TorchRL ``ReplayBuffer(LazyMemmapStorage, RandomSampler,
  prefetch=2)``, ``.to("cuda")``;
- ``numpy-ring``: an in-RAM ring's fancy index, ``torch.as_tensor(..., device="cuda")``
  as SB3 does.

Models: ``lowdim`` = SAC's update (twin Q 256x256 MLPs, a tanh-Gaussian actor, target
networks, batch 256) on 17-dim observations and 6-dim actions; ``atari`` = DQN's update
(Nature CNN on 4x84x84 uint8 stacks, Huber loss, target network, batch 32) on synthetic
Pong-like frames (``benchmarks/frames.py``; real ALE frames where ``ale_py`` imports).
Repeats alternate between feeds; updates/s is the median over repeats, ``wait_frac`` the
share of a step's wall time spent waiting for its batch. Prints a JSON summary and, with
``--out``, writes it there. No RESULTS section is written: the lead copies the figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

Batch = dict[str, torch.Tensor]
Case = tuple[Path, Any, Any, Callable[[Batch], None], int]  # store, TorchRL rb, ring, step, B


# -- models --------------------------------------------------------------------------------
def mlp(i: int, o: int) -> nn.Module:
    return nn.Sequential(nn.Linear(i, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, o))


class SacUpdate:
    """One SAC update (critic then actor, soft target update) per call."""

    def __init__(self, obs_dim: int, act_dim: int, dev: torch.device) -> None:
        self.q = nn.ModuleList([mlp(obs_dim + act_dim, 1) for _ in range(2)]).to(dev)
        self.q_target = nn.ModuleList([mlp(obs_dim + act_dim, 1) for _ in range(2)]).to(dev)
        self.q_target.load_state_dict(self.q.state_dict())
        self.actor = mlp(obs_dim, 2 * act_dim).to(dev)
        self.q_opt = torch.optim.Adam(self.q.parameters(), 3e-4)
        self.pi_opt = torch.optim.Adam(self.actor.parameters(), 3e-4)
        self.act_dim = act_dim

    def _pi(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, log_std = self.actor(obs).chunk(2, -1)
        std = log_std.clamp(-5, 2).exp()
        u = mu + std * torch.randn_like(mu)
        a = torch.tanh(u)
        logp = (-0.5 * ((u - mu) / std) ** 2 - log_std.clamp(-5, 2)).sum(-1)
        return a, logp - torch.log1p(-a.pow(2) + 1e-6).sum(-1)

    def __call__(self, b: Batch) -> None:
        obs, act, nxt = b["obs"], b["action"], b["next_obs"]
        rew, done = b["reward"].float(), b["done"].float()
        with torch.no_grad():
            a2, logp2 = self._pi(nxt)
            x2 = torch.cat([nxt, a2], -1)
            q2 = torch.min(self.q_target[0](x2), self.q_target[1](x2)).squeeze(-1)
            target = rew + 0.99 * (1 - done) * (q2 - 0.2 * logp2)
        x = torch.cat([obs, act], -1)
        q_loss = sum(((q(x).squeeze(-1) - target) ** 2).mean() for q in self.q)
        self.q_opt.zero_grad(set_to_none=True)
        q_loss.backward()
        self.q_opt.step()
        a, logp = self._pi(obs)
        xa = torch.cat([obs, a], -1)
        pi_loss = (0.2 * logp - torch.min(self.q[0](xa), self.q[1](xa)).squeeze(-1)).mean()
        self.pi_opt.zero_grad(set_to_none=True)
        pi_loss.backward()
        self.pi_opt.step()
        with torch.no_grad():
            for p, t in zip(self.q.parameters(), self.q_target.parameters()):
                t.lerp_(p, 0.005)


class DqnUpdate:
    """One DQN update (Nature CNN, Huber loss, target network) per call."""

    def __init__(self, n_actions: int, dev: torch.device) -> None:
        def net() -> nn.Module:
            return nn.Sequential(
                nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten(),
                nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, n_actions)).to(dev)
        self.q, self.q_target = net(), net()
        self.q_target.load_state_dict(self.q.state_dict())
        self.opt = torch.optim.Adam(self.q.parameters(), 1e-4)

    def __call__(self, b: Batch) -> None:
        obs = b["obs"].float().div_(255)
        nxt = b["next_obs"].float().div_(255)
        with torch.no_grad():
            target = b["reward"].float() + 0.99 * (1 - b["done"].float()) * \
                self.q_target(nxt).max(-1).values
        q = self.q(obs).gather(1, b["action"].long().view(-1, 1)).squeeze(-1)
        loss = nn.functional.smooth_l1_loss(q, target)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


# -- feeds ---------------------------------------------------------------------------------
def _from_expstore(b: dict[str, Any], dev: torch.device) -> Batch:
    def t(x: Any) -> torch.Tensor:
        x = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))
        return x.to(dev, non_blocking=True)
    return {"obs": t(b["obs"]), "action": t(b["action"]), "reward": t(b["reward"]),
            "next_obs": t(b["next_obs"]), "done": t(b["terminated"])}


def _from_torchrl(td: Any, dev: torch.device) -> Batch:
    td = td.to(dev, non_blocking=True)
    return {"obs": td["observation"], "action": td["action"],
            "reward": td["next", "reward"].squeeze(-1), "next_obs": td["next", "observation"],
            "done": td["next", "terminated"].squeeze(-1)}


def _from_ring(b: dict[str, np.ndarray], dev: torch.device) -> Batch:
    return {"obs": torch.as_tensor(b["obs"], device=dev),
            "action": torch.as_tensor(b["action"], device=dev),
            "reward": torch.as_tensor(b["reward"], device=dev),
            "next_obs": torch.as_tensor(b["next_obs"], device=dev),
            "done": torch.as_tensor(b["terminated"], device=dev)}


def feeds(store_path: Path, rb: Any, ring: Any, bs: int, dev: torch.device
          ) -> dict[str, Callable[[], Iterator[Batch]]]:
    """Each feed as a function making an endless batch iterator (batches on ``dev``)."""
    import expstore as es

    def gpu_only() -> Iterator[Batch]:
        b = _from_ring(ring.sample(bs), dev)
        while True:
            yield b

    def loader() -> Iterator[Batch]:
        store = es.open(store_path)
        it = iter(es.make_loader(store, batch_size=bs, num_workers=2, prefetch_factor=4,
                                 pin_memory=True, device=str(dev)))
        for b in it:
            yield _from_expstore(b, dev)

    def sample() -> Iterator[Batch]:
        store = es.open(store_path)
        while True:
            yield _from_expstore(store.sample(bs), dev)

    def torchrl() -> Iterator[Batch]:
        from torchrl.data import ReplayBuffer
        from torchrl.data.replay_buffers import RandomSampler

        trl = ReplayBuffer(storage=rb.storage, sampler=RandomSampler(), batch_size=bs,
                           prefetch=2)
        for td in trl:
            yield _from_torchrl(td, dev)

    def ring_feed() -> Iterator[Batch]:
        while True:
            yield _from_ring(ring.sample(bs), dev)

    return {"gpu-only": gpu_only, "expstore-loader": loader, "expstore-sample": sample,
            "torchrl-prefetch": torchrl, "numpy-ring": ring_feed}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rate(it: Iterator[Batch], step: Callable[[Batch], None], seconds: float
         ) -> tuple[float, float]:
    """(updates/s, share of wall time waiting for batches) over ``seconds``."""
    for _ in range(10):
        step(next(it))
    _sync()
    k, waited, t0 = 0, 0.0, time.perf_counter()
    while (dt := time.perf_counter() - t0) < seconds:
        w = time.perf_counter()
        b = next(it)
        waited += time.perf_counter() - w
        step(b)
        k += 1
    _sync()
    dt = time.perf_counter() - t0
    return k / dt, waited / dt


# -- data ----------------------------------------------------------------------------------
def lowdim_case(n: int, tmp: Path, dev: torch.device) -> Case:
    from benchmarks.bench_lowdim import (
        NumpyLowDimRing,
        expstore_store,
        lowdim_data,
        torchrl_buffer,
    )

    data = lowdim_data(n)
    store, _ = expstore_store(data, tmp / "lowdim.zarr")
    store.close()
    rb, _ = torchrl_buffer(data, tmp / "trl_lowdim")
    ring = NumpyLowDimRing(data)
    return tmp / "lowdim.zarr", rb, ring, SacUpdate(data["obs"].shape[1],
                                                     data["action"].shape[1], dev), 256


def atari_case(n: int, tmp: Path, dev: torch.device) -> Case:
    from benchmarks.baselines import NumpyRingCase, torchrl_memmap_case
    from benchmarks.expstore_case import ExpstoreCase
    from benchmarks.frames import load_atari_frames

    data = load_atari_frames(n, cache_dir=tmp / "frames")
    case = ExpstoreCase(data, None, tmp)
    case.extend_rate()
    case.store.close()
    trl = torchrl_memmap_case(data, None, tmp / "trl_atari")
    trl.extend_rate()
    trl.warm_cache()
    ring = NumpyRingCase(data)
    ring.extend_rate()

    return case.path, trl._buffer(32), ring.ring, DqnUpdate(6, dev), 32


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="lowdim,atari")
    p.add_argument("--n", type=int, default=1_000_000, help="low-dim transitions")
    p.add_argument("--frames", type=int, default=100_000, help="Atari frames")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--feeds", default="gpu-only,expstore-loader,expstore-sample,"
                                       "torchrl-prefetch,numpy-ring")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    dev = torch.device(a.device)
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else "none"
    out: dict[str, Any] = {"command": " ".join(sys.argv), "gpu": gpu,
                           "torch": torch.__version__, "python": platform.python_version(),
                           "cases": {}}
    with tempfile.TemporaryDirectory(dir=".") as td:
        tmp = Path(td)
        for case in a.cases.split(","):
            t0 = time.perf_counter()
            path, rb, ring, step, bs = (lowdim_case(a.n, tmp, dev) if case == "lowdim"
                                        else atari_case(a.frames, tmp, dev))
            build_s = time.perf_counter() - t0
            makers = feeds(path, rb, ring, bs, dev)
            its = {name: makers[name]() for name in a.feeds.split(",")}
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in its}
            for _ in range(a.repeats):
                for name, it in its.items():
                    runs[name].append(rate(it, step, a.seconds))
            res = {name: {"updates_per_s": statistics.median(r[0] for r in rs),
                          "wait_frac": statistics.median(r[1] for r in rs), "runs": rs}
                   for name, rs in runs.items()}
            base = res.get("torchrl-prefetch", {}).get("updates_per_s")
            for r in res.values():
                r["x_torchrl"] = r["updates_per_s"] / base if base else None
            out["cases"][case] = {"batch": bs, "build_s": build_s, "feeds": res}
            print(case, json.dumps({k: (round(v["updates_per_s"], 1), round(v["wait_frac"], 3))
                                    for k, v in res.items()}), flush=True)
            its.clear()
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
