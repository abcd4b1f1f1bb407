"""Ape-X style training on one expstore on S3: N actor processes, one learner.

Each actor runs a Gymnasium env with its own epsilon (Ape-X: eps_i = 0.4 ** (1 + 7 i /
(N - 1))) and writes its own lane of one store (``es.open(url, "r+", lane=i)``): lanes never
share objects, so actors need no locks, only a lease per lane. Actors pull the learner's
latest Q-network weights from the same bucket every ``--pull-every`` steps. The learner
samples with prioritized replay across all lanes through ``es.make_loader`` (DataLoader
workers read the shards from S3), trains a DQN (double Q, n-step returns, IS weights),
updates priorities, and its sampler refreshes lane states every ``--refresh`` seconds.

Run with a local S3 server it starts itself (moto), 3 actors on CartPole::

    python scripts/apex_actors.py
    python scripts/apex_actors.py --actors 4 --steps 5000 --learner-steps 1000

or against any S3 endpoint (credentials from the environment / ~/.aws as usual)::

    python scripts/apex_actors.py --url s3://my-bucket/apex.zarr --endpoint https://...

Actors are torch.multiprocessing processes; with ``--ray`` (and ``ray`` installed) they are
Ray actors instead (on a Ray cluster they may run on other hosts: the store is on S3).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import expstore as es  # noqa: E402


def qnet(obs_dim: int, n_actions: int) -> nn.Module:
    return nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, n_actions))


def _fs(url: str, so: dict | None):
    import fsspec

    return fsspec.core.url_to_fs(url, **(so or {}))


def publish(weights_url: str, so: dict | None, net: nn.Module, version: int) -> None:
    """Learner -> actors: the Q-network as one object (a single PUT)."""
    buf = io.BytesIO()
    torch.save({"version": version, "state": net.state_dict()}, buf)
    fs, path = _fs(weights_url, so)
    fs.pipe_file(path, buf.getvalue())


def pull(weights_url: str, so: dict | None, net: nn.Module) -> int:
    fs, path = _fs(weights_url, so)
    try:
        blob = fs.cat_file(path)
    except FileNotFoundError:
        return -1
    doc = torch.load(io.BytesIO(blob), weights_only=True)
    net.load_state_dict(doc["state"])
    return int(doc["version"])


def stop_requested(args: dict) -> bool:
    fs, path = _fs(args["weights_url"] + ".stop", args["so"])
    return fs.exists(path)


def actor(lane: int, n_actors: int, args: dict[str, Any]) -> dict[str, Any]:
    """Run the env, writing lane ``lane``, for at least ``steps`` steps and until the
    learner asks to stop (at most ``max_steps``); returns counters."""
    import gymnasium as gym

    torch.set_num_threads(1)
    env = gym.make(args["env"])
    eps = 0.4 ** (1 + 7 * lane / max(n_actors - 1, 1))
    rng = np.random.default_rng(args["seed"] + lane)
    store = es.open(args["url"], mode="r+", lane=lane, storage_options=args["so"])
    net = qnet(env.observation_space.shape[0], env.action_space.n)
    version, episodes, returns, ret, t = -1, 0, [], 0.0, 0
    obs, _ = env.reset(seed=args["seed"] + lane)
    t0 = time.monotonic()
    while t < args["max_steps"]:
        if args["sps"] and t > args["sps"] * (time.monotonic() - t0):
            time.sleep(0.01)  # an env this cheap would flood the learner's 2 cores
            continue
        if t % args["pull_every"] == 0:
            if t >= args["steps"] and stop_requested(args):
                break
            version = max(version, pull(args["weights_url"], args["so"], net))
        if rng.random() < eps or version < 0:
            a = int(env.action_space.sample())
        else:
            with torch.no_grad():
                a = int(net(torch.as_tensor(obs[None])).argmax())
        nxt, r, term, trunc, _ = env.step(a)
        store.add(obs, a, r, nxt, term, trunc, lane=lane)
        ret += float(r)
        obs = nxt
        if term or trunc:
            episodes += 1
            returns.append(ret)
            ret = 0.0
            obs, _ = env.reset()
        t += 1
        if t % args["flush_every"] == 0:
            store.flush()  # the learner sees rows once flushed
    store.close()
    return {"lane": lane, "eps": eps, "steps": t, "episodes": episodes,
            "mean_return": float(np.mean(returns[-20:])) if returns else 0.0,
            "weights_version": version}


def _mp_actor(lane: int, n: int, args: dict, out) -> None:
    out.put(actor(lane, n, args))


def start_actors(n: int, args: dict, use_ray: bool):
    """Start the actors; returns ``(alive() -> bool, results() -> list)``."""
    if use_ray:
        import ray

        ray.init(ignore_reinit_error=True)
        remote = ray.remote(num_cpus=1)(actor)
        refs = [remote.remote(i, n, args) for i in range(n)]
        return (lambda: len(ray.wait(refs, num_returns=n, timeout=0)[0]) < n,
                lambda: ray.get(refs))
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_mp_actor, args=(i, n, args, out), daemon=True)
             for i in range(n)]
    for p in procs:
        p.start()

    def results() -> list:
        res = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(60)
            if p.exitcode != 0:
                raise RuntimeError(f"actor process {p.pid} exited with {p.exitcode}")
        return sorted(res, key=lambda d: d["lane"])

    return (lambda: any(p.is_alive() for p in procs)), results


def learn(args: dict, n_actors: int, alive, learner_steps: int, batch_size: int,
          workers: int) -> dict[str, Any]:
    """PER + n-step double DQN on all lanes; returns counters."""
    import gymnasium as gym

    env = gym.make(args["env"])
    net = qnet(env.observation_space.shape[0], env.action_space.n)
    target = qnet(env.observation_space.shape[0], env.action_space.n)
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=5e-4)
    publish(args["weights_url"], args["so"], net, 0)
    store = es.open(args["url"], storage_options=args["so"])  # read-only: actors write
    sampler = es.PrioritizedSampler(store, alpha=0.6, beta=0.4, n_step=3, gamma=0.99,
                                    refresh_every=args["refresh"], seed=args["seed"],
                                    persist=False)
    while len(store) < 4 * batch_size:  # wait for the first flushed rows
        if not alive():
            raise RuntimeError("actors finished before writing enough rows")
        time.sleep(0.5)
        store.refresh()
    # forkserver: workers do not inherit this process's S3 client sessions
    loader = es.make_loader(store, sampler, batch_size=batch_size, num_workers=workers,
                            multiprocessing_context="forkserver" if workers else None)
    steps, losses, lanes_seen, t0 = 0, [], np.zeros(n_actors, np.int64), time.time()
    for batch in loader:
        q = net(batch["obs"].float()).gather(1, batch["action"].long()[:, None])[:, 0]
        with torch.no_grad():
            a2 = net(batch["next_obs"].float()).argmax(1, keepdim=True)
            q2 = target(batch["next_obs"].float()).gather(1, a2)[:, 0]
            y = batch["reward"].float() + batch["discount"].float() * q2
        td = y - q
        loss = (batch["weight"].float() * td.pow(2)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sampler.update_priorities(batch["index"], td.detach().abs().numpy(),
                                  batch["step_id"])
        lanes_seen += np.bincount(batch["index"].numpy() // store.layout.lane_capacity,
                                  minlength=n_actors)
        losses.append(float(loss.detach()))
        steps += 1
        if steps % 100 == 0:
            target.load_state_dict(net.state_dict())
            publish(args["weights_url"], args["so"], net, steps)
        if steps >= learner_steps:
            fs, path = _fs(args["weights_url"] + ".stop", args["so"])
            fs.pipe_file(path, b"stop")  # actors finish once they did their minimum steps
            break
    out = {"learner_steps": steps, "seconds": time.time() - t0,
           "loss_first_100": float(np.mean(losses[:100])),
           "loss_last_100": float(np.mean(losses[-100:])),
           "samples_per_lane": lanes_seen.tolist(), "rows_held": len(store),
           "stale_replaced": loader.stats.stale_replaced if hasattr(loader, "stats") else None}
    del loader
    store.close()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--actors", type=int, default=3)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--steps", type=int, default=1000, help="min env steps per actor")
    ap.add_argument("--max-steps", type=int, default=100_000, help="max env steps per actor")
    ap.add_argument("--learner-steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    ap.add_argument("--capacity", type=int, default=60_000)
    ap.add_argument("--flush-every", type=int, default=250)
    ap.add_argument("--pull-every", type=int, default=200)
    ap.add_argument("--actor-sps", type=float, default=300.0,
                    help="max env steps/s per actor (0: unlimited)")
    ap.add_argument("--refresh", type=float, default=1.0, help="lane state refresh, seconds")
    ap.add_argument("--url", default=None, help="s3://bucket/path.zarr (default: local moto)")
    ap.add_argument("--endpoint", default=None, help="S3 endpoint URL (MinIO, moto, ...)")
    ap.add_argument("--ray", action="store_true", help="Ray actors instead of processes")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    server = None
    if a.url is None:  # no endpoint given: a local S3 server, started and stopped here
        from expstore.testing import MotoServer

        server = MotoServer().start()
        server.create_bucket("apex")
        url, so = "s3://apex/replay.zarr", server.storage_options
    else:
        url, so = a.url, ({"endpoint_url": a.endpoint} if a.endpoint else {})
    try:
        import gymnasium as gym

        env = gym.make(a.env)
        spec = es.Spec.from_spaces(env.observation_space, env.action_space)
        store = es.create(url, spec, capacity=a.capacity, lanes=a.actors, overwrite=True,
                          shard_rows=256, storage_options=so)
        print(f"store {store.url}: {store.capacity} rows, {store.lanes} lanes")
        store.close()  # releases the lanes: each actor takes its own
        args = {"url": url, "so": so, "env": a.env, "steps": a.steps, "seed": a.seed,
                "max_steps": max(a.max_steps, a.steps), "sps": a.actor_sps,
                "flush_every": a.flush_every, "pull_every": a.pull_every,
                "weights_url": url.rstrip("/") + ".weights.pt", "refresh": a.refresh}
        for suffix in ("", ".stop"):  # objects of an earlier run
            fs, path = _fs(args["weights_url"] + suffix, so)
            if fs.exists(path):
                fs.rm_file(path)
        alive, results = start_actors(a.actors, args, a.ray)
        learner = learn(args, a.actors, alive, a.learner_steps, a.batch_size, a.workers)
        actors = results()
        final = es.open(url, storage_options=so)
        summary = {"actors": actors, "learner": learner, "rows_per_lane":
                   (final.index.count - final.index.valid_from).tolist()}
        for d in actors:
            print(f"actor {d['lane']}: eps {d['eps']:.3f}, {d['steps']} steps, "
                  f"{d['episodes']} episodes, mean return (last 20) {d['mean_return']:.1f}, "
                  f"weights v{d['weights_version']}")
        print(f"learner: {learner['learner_steps']} steps in {learner['seconds']:.1f} s, "
              f"loss {learner['loss_first_100']:.3f} -> {learner['loss_last_100']:.3f}, "
              f"samples per lane {learner['samples_per_lane']}")
        print(f"rows per lane on S3: {summary['rows_per_lane']}")
        return summary
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
