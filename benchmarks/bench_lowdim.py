"""Low-dimensional observations (MuJoCo/DMC state vectors): in-process ``sample`` of
expstore against TorchRL ``LazyMemmapStorage`` and an in-RAM numpy ring, one run.

Usage (from the repository root)::

    python benchmarks/bench_lowdim.py                 # 200k transitions, all cases
    python benchmarks/bench_lowdim.py --n 1000000
    python benchmarks/bench_lowdim.py --no-write --stages --profile 256

Data: seeded random 17-dim float32 observations (``--obs-dim``) and 6-dim float32 actions
(``--act-dim``) in [-1, 1], episodes of 200-1000 steps (half of them cut at 1000 steps:
truncated, as a time limit; the rest terminated), ``--n`` transitions in all. Every case
holds the same transitions (checked on one batch of each store):

- ``expstore``: a local store (default layout: 4096-row shards, scalars one chunk per
  shard, vectors chunks of at most 2 KiB: 16 rows of obs, 64 of actions) filled with
  ``extend`` in batches of 1000, flushed, its files read once, then
  opened read-only (``es.open``) and sampled with ``store.sample(B)``;
- ``expstore-writer``: the same ``Store`` object that wrote it (all rows flushed);
- ``expstore-one-chunk`` (only when named): the same data in a store laid out as before
  vector chunks (one chunk per shard for obs and action), read-only, same ``--hot-bytes``;
- ``expstore-bridge``: the read-only store through ``integrations.torchrl.replay_buffer``
  (``rb.sample()``, TensorDict out);
- ``torchrl``: ``ReplayBuffer(LazyMemmapStorage(n), RandomSampler())``, rows ``observation``,
  ``action``, ``next: {observation, reward, done, terminated, truncated}``, pages warm;
- ``torchrl-tensor``: the same on ``LazyTensorStorage`` (in RAM);
- ``numpy``: an in-RAM ring (obs, next_obs, action, reward, terminated, truncated arrays,
  as SB3's ``ReplayBuffer``): ``rng.integers`` and one fancy index per array.

Each case is sampled warm (``sample(B)``, B = 32 and 256): every repeat times a loop of
about ``--seconds`` per case, the cases alternating, and µs per batch is the median over
repeats; ratios are taken against the same run's TorchRL memmap and numpy ring.
``--stages``: where an expstore batch's time goes (plan, read from the hot set, the same
plans read without it, the whole call).
``--profile B``: cProfile of ``store.sample(B)``, the top functions by own time.
``--loader``: ``make_loader(num_workers=2, prefetch_factor=4)`` batches/s (on this
read-only low-dim store it reads in a prefetch thread, see ``loading/prefetch.py``) against
TorchRL ``ReplayBuffer(LazyMemmapStorage, prefetch=2)``, same data, batch 256.
``--hot-bytes N``: the read-only store's hot set (``es.open(hot_bytes=N)``; default the
store's, 512 MiB); past it (e.g. ``--n 2000000 --hot-bytes 100000000``) shards are
admitted, never evicted.
Writes section "Low-dim sample" of benchmarks/RESULTS.md (not with ``--no-write``) and
results/lowdim.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.baselines import warm_page_cache  # noqa: E402
from benchmarks.report import (  # noqa: E402
    command_line,
    markdown_table,
    save_json,
    work_dir,
    write_section,
)

OBS_DIM, ACT_DIM = 17, 6


def lowdim_data(n: int, seed: int = 0, obs_dim: int = OBS_DIM, act_dim: int = ACT_DIM
                ) -> dict[str, Any]:
    """``n`` transitions in episodes: per transition ``obs``, ``next_obs`` (the next obs of
    the episode), ``action``, ``reward``, ``terminated``, ``truncated``; ``episodes``."""
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < n:  # half the episodes hit the 1000-step limit (truncated)
        lengths.append(1000 if rng.random() < 0.5 else int(rng.integers(200, 1000)))
    lengths[-1] -= sum(lengths) - n
    lengths_a = np.array(lengths, np.int64)
    ends = np.cumsum(lengths_a) - 1
    episode = np.repeat(np.arange(len(lengths_a)), lengths_a)
    stream = rng.standard_normal((n + len(lengths_a), obs_dim), dtype=np.float32)
    at = np.arange(n, dtype=np.int64) + episode  # each episode has one more obs than steps
    terminated = np.zeros(n, bool)
    truncated = np.zeros(n, bool)
    terminated[ends[lengths_a < 1000]] = True
    truncated[ends[lengths_a >= 1000]] = True
    terminated[ends[-1]], truncated[ends[-1]] = False, True  # cut by the data's end
    return {"obs": stream[at], "next_obs": stream[at + 1],
            "action": rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
            "reward": rng.standard_normal(n, dtype=np.float32),
            "terminated": terminated, "truncated": truncated, "episodes": len(lengths_a)}


# -- cases ---------------------------------------------------------------------------------
class NumpyLowDimRing:
    """In-RAM ring of transitions (SB3 ``ReplayBuffer`` layout: obs and next_obs kept)."""

    def __init__(self, data: dict[str, Any]) -> None:
        n = len(data["obs"])
        self.cols = {k: np.empty_like(data[k]) for k in
                     ("obs", "next_obs", "action", "reward", "terminated", "truncated")}
        for lo in range(0, n, 1000):  # filled as a ring is: chunk by chunk
            for k, v in self.cols.items():
                v[lo:lo + 1000] = data[k][lo:lo + 1000]
        self.size = n
        self.rng = np.random.default_rng(0)

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        idx = self.rng.integers(0, self.size, batch_size)
        return {k: v[idx] for k, v in self.cols.items()}


def _tensordicts(data: dict[str, Any], chunk: int = 1000):
    import torch
    from tensordict import TensorDict

    n = len(data["obs"])
    for lo in range(0, n, chunk):
        s = slice(lo, lo + chunk)
        term = torch.from_numpy(data["terminated"][s]).unsqueeze(-1)
        trunc = torch.from_numpy(data["truncated"][s]).unsqueeze(-1)
        yield TensorDict({
            "observation": torch.from_numpy(data["obs"][s]),
            "action": torch.from_numpy(data["action"][s]),
            "next": {"observation": torch.from_numpy(data["next_obs"][s]),
                     "reward": torch.from_numpy(data["reward"][s]).unsqueeze(-1),
                     "done": term | trunc, "terminated": term, "truncated": trunc},
        }, batch_size=[len(term)])


def torchrl_buffer(data: dict[str, Any], scratch: Path | None) -> tuple[Any, float]:
    """A TorchRL ``ReplayBuffer`` (LazyMemmapStorage in ``scratch``, else LazyTensorStorage)
    holding every transition; seconds spent in ``rb.extend``."""
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers import RandomSampler

    n = len(data["obs"])
    storage = (LazyMemmapStorage(n, scratch_dir=str(scratch)) if scratch is not None
               else LazyTensorStorage(n))
    rb = ReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=32)
    spent = 0.0
    for td in _tensordicts(data):
        t0 = time.perf_counter()
        rb.extend(td)
        spent += time.perf_counter() - t0
    if scratch is not None:  # pages warm: read the files, touch the mapped tensors
        os.sync()
        for p in scratch.rglob("*"):
            if p.is_file():
                p.read_bytes()
        for x in rb.storage._storage.values(True, True):
            x.sum()
    return rb, spent


def torchrl_sampler(rb: Any, batch_size: int) -> Callable[[], Any]:
    """``rb.sample()`` of a buffer on ``rb``'s storage with ``batch_size`` fixed."""
    from torchrl.data import ReplayBuffer
    from torchrl.data.replay_buffers import RandomSampler

    other = ReplayBuffer(storage=rb.storage, sampler=RandomSampler(), batch_size=batch_size)
    return other.sample


def lowdim_spec(obs_dim: int = OBS_DIM, act_dim: int = ACT_DIM) -> Any:
    import expstore as es

    return es.Spec.create(obs=es.Field((obs_dim,), np.float32),
                          action=es.Field((act_dim,), np.float32, low=-1, high=1))


def expstore_store(data: dict[str, Any], path: Path) -> tuple[Any, float]:
    """A local store holding every transition (``extend`` of 1000, flushed); seconds the
    fill took (flush included)."""
    import expstore as es

    n = len(data["obs"])
    spec = lowdim_spec(data["obs"].shape[1], data["action"].shape[1])
    store = es.create(path, spec, capacity=n + data["episodes"])
    keys = ("obs", "action", "reward", "terminated", "truncated", "next_obs")
    t0 = time.perf_counter()
    for lo in range(0, n, 1000):
        store.extend({k: data[k][lo:lo + 1000] for k in keys})
    store.flush()
    spent = time.perf_counter() - t0
    warm_page_cache(path)
    return store, spent


def obs_keys(obs: np.ndarray) -> np.ndarray:
    """An int64 per observation (its first two float32s' bits)."""
    return np.ascontiguousarray(obs[:, :2]).view(np.int64).ravel()


def check_batch(batch: dict[str, Any], data: dict[str, Any]) -> None:
    """Each sampled (obs, next_obs, action, reward, flags) is one stored transition."""
    if "order" not in data:  # transitions sorted by obs key, for lookups
        keys = obs_keys(data["obs"])
        data["order"] = np.argsort(keys, kind="stable")
        data["sorted_keys"] = keys[data["order"]]
    got = obs_keys(np.asarray(batch["obs"]))
    at = np.minimum(np.searchsorted(data["sorted_keys"], got), len(data["order"]) - 1)
    t = data["order"][at]
    for k in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
        if not np.array_equal(np.asarray(batch[k]).reshape(data[k][t].shape), data[k][t]):
            raise AssertionError(f"sampled {k} differs from the stored transition")


# -- measuring -----------------------------------------------------------------------------
def per_batch_us(step: Callable[[], Any], seconds: float) -> float:
    """µs per call of ``step`` over a loop of about ``seconds``."""
    step()
    t0 = time.perf_counter()
    step()
    once = max(time.perf_counter() - t0, 1e-6)
    k = max(10, int(seconds / once))
    t0 = time.perf_counter()
    for _ in range(k):
        step()
    return (time.perf_counter() - t0) / k * 1e6


def stage_costs(store: Any, bs: int, repeats: int, seconds: float) -> dict[str, Any]:
    """Median µs per batch of ``store.sample(bs)``'s stages: ``plan`` (sampler, index only),
    ``read`` (``store.read_plan``: the batch gathered from the hot set), ``general`` (the
    same plans read the way without the hot set: ``read_columns`` + ``finish_many``), and
    the whole call; Python function calls per batch."""
    from expstore.loading.columns import numpy_alloc
    from expstore.loading.transition_batch import finish_many, read_columns

    store.sample(bs)
    sampler, layout, source = store._sampler, store.layout, store.source
    n = max(50, int(seconds / 2 * 1e6 / (4 * bs + 200)))
    times: dict[str, list[float]] = {k: [] for k in ("plan", "read", "general", "sample")}
    for _ in range(repeats):
        t0 = time.perf_counter()
        plans = [sampler.plan(bs) for _ in range(n)]
        t1 = time.perf_counter()
        for p in plans:
            store.read_plan(p)
        t2 = time.perf_counter()
        for p in plans:
            finish_many(p, *read_columns(p, layout, source, lazy=True), numpy_alloc)
        t3 = time.perf_counter()
        for _ in range(n):
            store.sample(bs)
        t4 = time.perf_counter()
        for k, (a, b) in zip(times, ((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
            times[k].append((b - a) / n * 1e6)
    out: dict[str, Any] = {"batch": bs}
    out.update({f"{k}_us": statistics.median(v) for k, v in times.items()})
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        store.sample(bs)
    prof.disable()
    out["python_calls"] = pstats.Stats(prof).total_calls / 100
    return out


def read_counters(store: Any, bs: int, batches: int = 200) -> dict[str, float]:
    """Per ``store.sample(bs)``: chunks the reader decoded and kB it read from storage
    (after the timed runs: the caches as warm as they get)."""
    stats = store.reader.stats
    c0, b0 = stats.chunks, stats.bytes
    for _ in range(batches):
        store.sample(bs)
    return {"chunks_per_batch": (stats.chunks - c0) / batches,
            "kB_read_per_batch": (stats.bytes - b0) / batches / 1e3}


def profile_top(store: Any, bs: int, batches: int = 2000, top: int = 25) -> str:
    """cProfile of ``store.sample(bs)``: the ``top`` functions by own time."""
    store.sample(bs)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(batches):
        store.sample(bs)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return f"cProfile of {batches} x store.sample({bs}):\n" + s.getvalue()


def loader_rates(store: Any, rb: Any, bs: int, repeats: int, seconds: float
                 ) -> dict[str, Any]:
    """Batches/s of ``make_loader(num_workers=2, prefetch_factor=4)`` and of TorchRL
    ``ReplayBuffer(prefetch=2)`` on the same data, alternating, consumer touching obs;
    ``path``: which way the loader reads (prefetch thread or worker processes)."""
    from torchrl.data import ReplayBuffer
    from torchrl.data.replay_buffers import RandomSampler

    import expstore as es

    def rate(next_batch: Callable[[], Any], key: Any) -> float:
        for _ in range(8):
            next_batch()
        k, t0 = 0, time.perf_counter()
        while (dt := time.perf_counter() - t0) < seconds:
            float(next_batch()[key][0, 0])
            k += 1
        return k / dt

    loader = es.make_loader(store, batch_size=bs, num_workers=2, prefetch_factor=4)
    it = iter(loader)
    trl = ReplayBuffer(storage=rb.storage, sampler=RandomSampler(), batch_size=bs, prefetch=2)
    trl_it = iter(trl)
    got: dict[str, list[float]] = {"expstore": [], "torchrl": []}
    for _ in range(repeats):
        got["expstore"].append(rate(it.__next__, "obs"))
        got["torchrl"].append(rate(trl_it.__next__, "observation"))
    path = "thread" if loader.threaded is not None else "workers"
    loader.close()
    del it, loader
    getattr(trl, "_prefetch_executor", None) and trl._prefetch_executor.shutdown(wait=True)
    out = {"batch": bs, "path": path,
           "loader_batches_per_s": statistics.median(got["expstore"]),
           "torchrl_prefetch2_batches_per_s": statistics.median(got["torchrl"]),
           "runs": got}
    out["x_torchrl"] = out["loader_batches_per_s"] / out["torchrl_prefetch2_batches_per_s"]
    return out


ALL_CASES = "expstore,expstore-writer,expstore-bridge,torchrl,torchrl-tensor,numpy"
EXTRA_CASES = "expstore-one-chunk"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=200_000, help="transitions")
    p.add_argument("--obs-dim", type=int, default=OBS_DIM)
    p.add_argument("--act-dim", type=int, default=ACT_DIM)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--seconds", type=float, default=0.25, help="per case and repeat")
    p.add_argument("--cases", default=ALL_CASES)
    p.add_argument("--stages", action="store_true", help="time sample()'s stages too")
    p.add_argument("--profile", type=int, default=0, metavar="B",
                   help="print a cProfile of store.sample(B)")
    p.add_argument("--loader", action="store_true",
                   help="make_loader against TorchRL prefetch=2 too (bs 256)")
    p.add_argument("--hot-bytes", type=int, default=None,
                   help="es.open(hot_bytes=...) of the read-only store (default: 512 MiB)")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    a = p.parse_args()
    wanted = a.cases.split(",")
    unknown = set(wanted) - set(ALL_CASES.split(",")) - set(EXTRA_CASES.split(","))
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; expected some of {ALL_CASES},"
                         f"{EXTRA_CASES}")

    import torch

    import expstore as es

    torch.set_num_threads(1)  # as in bench_store: 2 threads collapse under load here
    t_start = time.perf_counter()
    data = lowdim_data(a.n, obs_dim=a.obs_dim, act_dim=a.act_dim)
    fill: dict[str, float] = {}
    samplers: dict[str, Callable[[int], Callable[[], Any]]] = {}
    work = Path(tempfile.mkdtemp(prefix="bench-lowdim-", dir=work_dir()))
    writer = reader = rb_mm = None
    try:
        if {"expstore", "expstore-writer", "expstore-bridge"} & set(wanted) or a.loader:
            writer, fill["expstore"] = expstore_store(data, work / "lowdim.zarr")
            reader = es.open(work / "lowdim.zarr", hot_bytes=a.hot_bytes)
            for name, st in (("expstore", reader), ("expstore-writer", writer)):
                check_batch(st.sample(256), data)
                check_batch(st.sample(256), data)  # (the first fills the hot set)
                samplers[name] = lambda bs, st=st: (lambda: st.sample(bs))
            if "expstore-one-chunk" in wanted:
                import expstore.api

                made, expstore.api.VECTOR_CHUNK_BYTES = expstore.api.VECTOR_CHUNK_BYTES, None
                try:  # laid out as stores made before vector chunks
                    old, _ = expstore_store(data, work / "one_chunk.zarr")
                finally:
                    expstore.api.VECTOR_CHUNK_BYTES = made
                old.close()
                one = es.open(work / "one_chunk.zarr", hot_bytes=a.hot_bytes)
                check_batch(one.sample(256), data)
                samplers["expstore-one-chunk"] = lambda bs: (lambda: one.sample(bs))
            if "expstore-bridge" in wanted:
                from expstore.integrations.torchrl import replay_buffer

                samplers["expstore-bridge"] = lambda bs: replay_buffer(
                    reader, batch_size=bs).sample
        if "torchrl" in wanted or a.loader:
            rb_mm, fill["torchrl"] = torchrl_buffer(data, work / "torchrl_memmap")
            samplers["torchrl"] = lambda bs: torchrl_sampler(rb_mm, bs)
        if "torchrl-tensor" in wanted:
            rb_t, fill["torchrl-tensor"] = torchrl_buffer(data, None)
            samplers["torchrl-tensor"] = lambda bs: torchrl_sampler(rb_t, bs)
        if "numpy" in wanted:
            t0 = time.perf_counter()
            ring = NumpyLowDimRing(data)
            fill["numpy"] = time.perf_counter() - t0
            samplers["numpy"] = lambda bs: (lambda: ring.sample(bs))
        td = samplers["torchrl"](256)() if "torchrl" in samplers else None
        if td is not None:  # the baseline returns the same transitions
            check_batch({"obs": td["observation"].numpy(), "action": td["action"].numpy(),
                         "next_obs": td["next", "observation"].numpy(),
                         "reward": td["next", "reward"].numpy(),
                         "terminated": td["next", "terminated"].numpy(),
                         "truncated": td["next", "truncated"].numpy()}, data)
        load0 = os.getloadavg()[0]
        names = [c for c in wanted if c in samplers]
        rows = []
        for bs in (32, 256):
            steps = {c: samplers[c](bs) for c in names}
            runs: dict[str, list[float]] = {c: [] for c in names}
            for c in names:  # warm-up: caches filled, not recorded
                per_batch_us(steps[c], a.seconds / 2)
            for _ in range(a.repeats):
                for c in names:
                    runs[c].append(per_batch_us(steps[c], a.seconds))
            for c in names:
                rows.append({"case": c, "batch": bs, "us_per_batch": statistics.median(runs[c]),
                             "runs": runs[c]})
                if c == "expstore":
                    rows[-1].update(read_counters(reader, bs))
                if c == "expstore-one-chunk":
                    rows[-1].update(read_counters(one, bs))
        load1 = os.getloadavg()[0]
        by = {(r["case"], r["batch"]): r for r in rows}
        for r in rows:
            base, ring_r = by.get(("torchrl", r["batch"])), by.get(("numpy", r["batch"]))
            if base is not None:
                r["x_faster_than_torchrl"] = base["us_per_batch"] / r["us_per_batch"]
            if ring_r is not None:
                r["x_ring"] = r["us_per_batch"] / ring_r["us_per_batch"]
            r["fill_s"] = fill.get("expstore" if r["case"].startswith("expstore")
                                   else r["case"])
        print(markdown_table(rows, ["case", "batch", "us_per_batch", "x_faster_than_torchrl",
                                    "x_ring", "chunks_per_batch", "kB_read_per_batch",
                                    "fill_s"]), flush=True)
        stages = [stage_costs(reader, bs, a.repeats, a.seconds) for bs in (32, 256)] \
            if a.stages and reader is not None else []
        if stages:
            print(markdown_table(stages, ["batch", "plan_us", "read_us", "general_us",
                                          "sample_us", "python_calls"]), flush=True)
        if a.profile and reader is not None:
            print(profile_top(reader, a.profile), flush=True)
        loader = loader_rates(reader, rb_mm, 256, a.repeats, max(1.0, 4 * a.seconds)) \
            if a.loader and reader is not None and rb_mm is not None else None
        if loader:
            print({k: v for k, v in loader.items() if k != "runs"}, flush=True)
    finally:
        for st in (reader, writer):
            if st is not None:
                st.close()
        shutil.rmtree(work, ignore_errors=True)

    body = markdown_table(rows, ["case", "batch", "us_per_batch", "x_faster_than_torchrl",
                                 "x_ring", "chunks_per_batch", "kB_read_per_batch"])
    body += ("\n\nµs per batch of a warm in-process `sample(B)` (medians of repeats, cases "
             "alternating; torch threads 1): `store.sample(B)` on the store opened read-only "
             "(`expstore`) and on the one that wrote it (`expstore-writer`); TorchRL "
             "`rb.sample()` on `LazyMemmapStorage` (`torchrl`, page cache warm) and "
             "`LazyTensorStorage` (`torchrl-tensor`); the bridge's `rb.sample()` "
             "(`expstore-bridge`); an SB3-style numpy ring's fancy index (`numpy`). "
             "x_faster_than_torchrl = TorchRL memmap's µs / the case's (target >= 1.5); "
             "x_ring = µs / the numpy ring's (target <= 2); chunks_per_batch, kB_read_per_batch: "
             "what the reader decoded and read per `expstore` batch, warm.")
    if stages:
        body += ("\n\nWhere an `expstore` batch's time goes (µs per batch, medians): plan = "
                 "`sampler.plan`, read = `store.read_plan` (gathered from the hot set), "
                 "general = the same plans read without it (`read_columns` + "
                 "`finish_many`), sample = the whole `store.sample`; python_calls = Python "
                 "function calls per `store.sample` (cProfile):\n\n" + markdown_table(
                     stages, ["batch", "plan_us", "read_us", "general_us", "sample_us",
                              "python_calls"]))
    if loader:
        body += ("\n\n" + markdown_table([loader], ["batch", "path", "loader_batches_per_s",
                                                    "torchrl_prefetch2_batches_per_s",
                                                    "x_torchrl"])
                 + "\n\n`make_loader(num_workers=2, prefetch_factor=4)` (path: a prefetch "
                 "thread of this process, or worker processes) against TorchRL "
                 "`ReplayBuffer(LazyMemmapStorage, prefetch=2)`, batches/s into a consumer "
                 "reading one obs value (target x_torchrl >= 2).")
    print(f"total {time.perf_counter() - t_start:.0f} s; load average (1 min) "
          f"{load0:.2f} / {load1:.2f}")
    save_json("lowdim", {"n": a.n, "obs_dim": a.obs_dim, "act_dim": a.act_dim,
                         "episodes": data["episodes"], "results": rows,
                         "stages": stages, "loader": loader, "fill_s": fill,
                         "load_average": [load0, load1], "command": command_line()})
    if not a.no_write:
        write_section("Low-dim sample", body, command=command_line(),
                      source=f"synthetic {a.obs_dim}-dim float32 obs, {a.act_dim}-dim "
                             f"actions, {a.n:,} transitions in {data['episodes']} episodes",
                      extra={"load average (1 min) start/end": f"{load0:.2f} / {load1:.2f}"})


if __name__ == "__main__":
    main()
