"""A Python env loop storing every step: the store's shard writes beside a loop that runs
Python, against the same loop writing an in-RAM ring.

Usage (from the repository root)::

    python benchmarks/bench_env_loop.py                  # 100,000 CartPole steps, 3 repeats
    python benchmarks/bench_env_loop.py --steps 200000 --repeats 5

The loop is what an SB3 or CleanRL collector runs: ``gymnasium`` ``CartPole-v1`` (pure
Python) stepped with a seeded random policy, every step stored as it comes, episodes
reset as they end. Cases, alternating in each repeat:

* ``ring``: the in-RAM ring of ``bench_add.py`` (obs, next_obs, action, reward, done).
* ``expstore``: ``store.add`` on a new local store (defaults: fsync on, shard rows by
  capacity: 2,048 at the default 100,000 steps), then ``store.flush()``, timed with the
  loop: full shards go to the store's background writing thread while the loop goes on,
  and that thread needs the GIL the loop holds.
* ``writer``: what each of those shard writes took on the writing thread, wall and CPU
  (median ms per shard; the benchmark wraps ``LaneWriter._background_write`` to time
  it), in the loop above and in a loop that lets the GIL go (1 ms slept every 100 adds of
  the same steps, not stepping the env): the writer's own cost.

``steps_per_s``: env steps stored per second (the loop and, for expstore, the final
flush); ``x_ring``: expstore's over the ring's (higher is better, 1 = free);
``loop_idle``: the share of the loop's wall time its thread did not run (waiting for the
GIL, a CPU or, for expstore, a free shard buffer while the writer is behind).
Writes section "Env loop: writing beside a Python loop" of benchmarks/RESULTS.md and
results/env_loop.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import expstore as es  # noqa: E402
from benchmarks.bench_add import Ring, cartpole_steps, spec_for  # noqa: E402
from benchmarks.report import (  # noqa: E402
    command_line,
    markdown_table,
    save_json,
    work_dir,
    write_section,
)
from expstore.storage.write.writer import LaneWriter  # noqa: E402


def env_loop(steps: int, add, seed: int = 0) -> tuple[float, float]:
    """Seconds to step ``CartPole-v1`` ``steps`` times, calling ``add`` with every step,
    and the share of them the loop's thread did not run (1 - its CPU time / wall time)."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        a = int(rng.integers(2))
        nxt, r, term, trunc, _ = env.step(a)
        add(obs, a, float(r), nxt, term, trunc)
        obs = env.reset()[0] if term or trunc else nxt
    wall = time.perf_counter() - t0
    return wall, max(0.0, 1 - (time.thread_time() - c0) / wall)


def ring_case(steps: int) -> tuple[float, float]:
    """Steps/s of the env loop writing the ring, and the share of its wall time the
    loop's thread did not run."""
    ring = Ring(steps, (4,), np.float32)
    wall, idle = env_loop(steps, ring.add)
    return steps / wall, idle


class WriterClock:
    """Wall and CPU seconds of each shard write on the writing thread (wraps
    ``LaneWriter._background_write`` while in use)."""

    def __enter__(self) -> WriterClock:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        real = self.real = LaneWriter._background_write

        def timed(writer, shard):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return real(writer, shard)
            finally:
                self.wall.append(time.perf_counter() - t0)
                self.cpu.append(time.thread_time() - c0)

        LaneWriter._background_write = timed
        return self

    def __exit__(self, *exc) -> None:
        LaneWriter._background_write = self.real

    def medians_ms(self) -> tuple[float, float]:
        return (1e3 * statistics.median(self.wall or [float("nan")]),
                1e3 * statistics.median(self.cpu or [float("nan")]))


def new_store(path: str, steps: int, shard_rows: int | None) -> es.Store:
    """A CartPole store for ``steps`` steps (shard rows by capacity unless given)."""
    return es.create(path, spec_for("cartpole"), capacity=max(steps, 65_536),
                     overwrite=True, **({"shard_rows": shard_rows} if shard_rows else {}))


def expstore_case(steps: int, path: str, shard_rows: int | None = None
                  ) -> tuple[float, float, float, float]:
    """Steps/s of the env loop storing into a new store, the share of the loop's wall
    time its thread did not run, and the shard writes' median wall / CPU ms."""
    store = new_store(path, steps, shard_rows)
    try:
        with WriterClock() as clock:
            looped, idle = env_loop(steps, store.add)
            t1 = time.perf_counter()
            store.flush()
            rate = steps / (looped + time.perf_counter() - t1)
        return (rate, idle, *clock.medians_ms())
    finally:
        store.close()


def writer_alone(recorded: list[tuple], path: str, shard_rows: int | None = None
                 ) -> tuple[float, float]:
    """The shard writes' median wall / CPU ms when the adding thread lets the GIL go (1 ms
    slept every 100 adds of ``recorded`` steps)."""
    store = new_store(path, len(recorded), shard_rows)
    try:
        with WriterClock() as clock:
            for i, step in enumerate(recorded):
                store.add(*step)
                if i % 100 == 99:
                    time.sleep(0.001)
            store.flush()
        return clock.medians_ms()
    finally:
        store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100_000, help="env steps per case and run")
    p.add_argument("--repeats", type=int, default=3, help="runs per case (medians reported)")
    p.add_argument("--shard-rows", type=int, default=None,
                   help="the store's rows per shard (default: by capacity)")
    p.add_argument("--no-write", action="store_true", help="don't update RESULTS.md")
    a = p.parse_args()
    load0 = os.getloadavg()[0]
    keys = ("ring", "ring_idle", "expstore", "expstore_idle", "writer_ms", "writer_cpu_ms",
            "alone_ms", "alone_cpu_ms")
    runs: dict[str, list[float]] = {k: [] for k in keys}
    recorded = cartpole_steps(a.steps)
    with tempfile.TemporaryDirectory(dir=work_dir()) as tmp:
        for i in range(a.repeats):
            rate, idle = ring_case(a.steps)
            runs["ring"].append(rate)
            runs["ring_idle"].append(idle)
            rate, idle, wall, cpu = expstore_case(a.steps, f"{tmp}/loop-{i}.zarr",
                                                  a.shard_rows)
            runs["expstore"].append(rate)
            runs["expstore_idle"].append(idle)
            runs["writer_ms"].append(wall)
            runs["writer_cpu_ms"].append(cpu)
            wall, cpu = writer_alone(recorded, f"{tmp}/alone-{i}.zarr", a.shard_rows)
            runs["alone_ms"].append(wall)
            runs["alone_cpu_ms"].append(cpu)
            print({k: round(v[-1], 2) for k, v in runs.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    shards = f"{a.shard_rows}-row shards" if a.shard_rows else "shards by capacity"
    rows = [{"case": f"cartpole: gymnasium loop, one add per step, {shards}",
             "ring_steps_per_s": med["ring"], "expstore_steps_per_s": med["expstore"],
             "x_ring": med["expstore"] / med["ring"],
             "ring_loop_idle": med["ring_idle"], "expstore_loop_idle": med["expstore_idle"],
             "writer_ms_per_shard": med["writer_ms"],
             "writer_cpu_ms_per_shard": med["writer_cpu_ms"],
             "writer_alone_ms_per_shard": med["alone_ms"],
             "writer_alone_cpu_ms_per_shard": med["alone_cpu_ms"],
             "expstore_runs": ", ".join(f"{v:,.0f}" for v in runs["expstore"]),
             "ring_runs": ", ".join(f"{v:,.0f}" for v in runs["ring"])}]
    body = markdown_table(rows, list(rows[0]))
    body += (f"\n\n{a.steps:,} env steps per run, medians of {a.repeats} runs, the cases "
             "alternating. The loop steps `gymnasium` `CartPole-v1` (pure Python) with a "
             "seeded random policy and stores every step; expstore's figure includes the "
             "final `flush()` (fsync on). x_ring: expstore's steps/s over the ring's. "
             "*_loop_idle: the share of the loop's wall time its thread did not run (1 - "
             "its CPU time / wall time): waiting for the GIL, a CPU or a free shard buffer. "
             "writer_*: median wall / CPU ms of one shard write on the store's writing "
             "thread, in that loop and alone (the adding thread sleeping 1 ms every 100 "
             "adds, so the GIL is free).")
    print(body)
    load1 = os.getloadavg()[0]
    save_json("env_loop", {"rows": rows, "runs": runs, "load": [load0, load1]})
    if not a.no_write:
        write_section("Env loop: writing beside a Python loop", body,
                      command=command_line(),
                      source=f"gymnasium CartPole-v1, {a.steps:,} steps per run",
                      extra={"load average (1 min) start/end": f"{load0:.2f} / {load1:.2f}"})


if __name__ == "__main__":
    main()
