"""Memory of a process sampling from a 10M-row image store (target: RSS < 1.5 GB), the
peak RSS of opening stores of 1M to 100M rows, and sampling cost against store size.

Usage (from the repository root)::

    python benchmarks/bench_rss.py                 # 10M rows, ~3 GB on disk under ./.bench_rss
    python benchmarks/bench_rss.py --rows 2000000 --keep
    python benchmarks/bench_rss.py --open 1000000,10000000,100000000   # "Memory: open"
    python benchmarks/bench_rss.py --open 100000000 --cold   # page cache dropped per open
    python benchmarks/bench_rss.py --flat 1000000,10000000              # "Sampling vs size"

Filling 10M rows through ``store.extend`` takes minutes of encoding, so the store is built
shard by shard from one template: 4096 real Atari frames are encoded once and every shard
reuses those chunk bytes with its own header, step ids and episode metadata; the result is a
complete, valid store (``expstore verify`` and plain zarr read it) whose content repeats every
4096 rows. The measured processes then open it as users do and sample stacked batches;
each reports its peak RSS (``ru_maxrss``). Section "Memory (10M rows)" of RESULTS.md.

``--open``: stores holding only what opening reads (the per-row metadata shards
``_episode_step`` and ``_flags``, written from one template shard; no frame shards; and the
index snapshot blocks a writer leaves, ``_index/lane_0/block_<j>``, written with the
writer's encoder from the same template), opened in a fresh process that reports its peak
RSS above what imports took: with the snapshot (``open`` as users get it), scanning the
metadata shards as a store without a snapshot does (streamed), and loading each lane in one
pass (the old baseline; skipped above ``--one-pass-max`` rows). ``--cold``: before each
open, ``os.sync()`` and ``posix_fadvise(DONTNEED)`` on every file of the store drop it from
the page cache; ``mincore`` on a sample of its files checks they left (``resident`` in the
table: the fraction of their pages still cached, before the open). ``--keep`` keeps the
stores (a later run reuses them). Building one holds only the template shard and one block
in RAM (tens of MB whatever its size); on disk it takes ~5.1 bytes per row of snapshot
plus the metadata shards (measured: see the report of issue 26), so 1B rows need ~6 GB of
disk and, to open, 5 GB of RAM for the index. ``--flat``: stores of small frames (Atari frames
subsampled to 17x17, stacked 4, same template scheme) sampled in this process at each
size: batch cost should not grow with rows. How warm "warm" was is measured, not assumed
(``benchmarks/page_cache.py``): the share of the store's pages in the page cache before
and after, and what the sampling process fetched from the disk per batch.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import expstore as es  # noqa: E402
from benchmarks.baselines import drop_page_cache, warm_page_cache  # noqa: E402
from benchmarks.expstore_case import spec_for_frames  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.page_cache import (  # noqa: E402
    DiskMeter,
    resident_fraction,
    resident_pages,
    resident_pct,
    status_mb,
    warmth_note,
)
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402
from expstore.rows import FLAG_FIRST, FLAG_LAST  # noqa: E402
from expstore.storage import backend_for  # noqa: E402
from expstore.storage.format import (  # noqa: E402
    LaneState,
    block_key,
    block_rows,
    blocks_per_lane,
    encode_block,
    write_state,
)
from expstore.storage.format.shard import assemble  # noqa: E402  (internals: shard bytes by hand)

#: the repository's root (the children import ``benchmarks``)
REPO = Path(__file__).resolve().parent.parent
#: --flat: seconds of batches at least before a store's timed loops (see flat_child)
WARM_SECONDS = 5.0


def build(path: Path, rows: int, episode_len: int = 800, subsample: int = 1,
          metadata_only: bool = False, shard_rows: int | None = None) -> es.Store:
    """A ``rows``-row store filled from one encoded template shard (see module doc).

    ``subsample``: keep every k-th pixel of each frame (small frames); ``metadata_only``:
    write only the shards opening a store reads (``_episode_step``, ``_flags``).
    """
    spec = spec_for_frames()
    if subsample > 1:
        side = len(range(0, 84, subsample))
        spec = es.Spec.create(obs=es.Field((side, side), np.uint8, stack=4, chunk_rows=1),
                              action=es.Field((), np.int64, low=0, high=17))
    store = es.create(path, spec, capacity=rows, overwrite=True, fsync=False,
                      shard_rows=shard_rows)
    L = store.layout
    S = L.shard_rows
    frames = load_atari_frames(S)["frames"][:, ::subsample, ::subsample]
    obs_chunks = [L.codec("obs").encode(np.ascontiguousarray(frames[i : i + 1]))
                  for i in range(S)]

    statics, pos, flags = template_scalars(store, episode_len)
    if metadata_only:
        statics = {k: statics[k] for k in ("_episode_step", "_flags")}
    else:
        statics = {"obs": obs_chunks, **statics}
    write_template_shards(store, statics, pos, flags, episode_len,
                          step_ids=not metadata_only, every=2000 if metadata_only else 200)
    return store


def template_scalars(store: es.Store, episode_len: int
                     ) -> tuple[dict[str, list[bytes]], np.ndarray, np.ndarray]:
    """One shard's encoded chunks of each scalar and metadata field, as Atari's compress
    (random actions 0-5, rewards of +-1 at 3% of steps, episodes of ``episode_len``), and
    its episode steps and flags."""
    L, S = store.layout, store.layout.shard_rows
    pos = np.arange(S) % episode_len
    flags = np.where(pos == 0, FLAG_FIRST, 0).astype(np.uint8)
    flags[pos == episode_len - 1] |= FLAG_LAST
    rng = np.random.default_rng(0)
    rewards = np.where(rng.random(S) < 0.03, rng.choice([-1.0, 1.0], S), 0.0)
    values = {"action": rng.integers(0, 6, S), "reward": rewards,
              "terminated": pos == episode_len - 2, "truncated": np.zeros(S, bool),
              "_episode_step": pos, "_flags": flags}
    return {n: chunks_of(L, n, v) for n, v in values.items()}, pos, flags


def one_chunk(layout, name: str, values: np.ndarray) -> bytes:
    """``values`` encoded as one chunk of field ``name``."""
    f = layout.fields[name]
    return layout.codec(name).encode(np.ascontiguousarray(values.astype(f.dtype)))


def chunks_of(layout, name: str, values: np.ndarray) -> list[bytes]:
    """A shard's ``values`` of field ``name`` encoded as its inner chunks, in order."""
    R = layout.chunk_rows(name)
    return [one_chunk(layout, name, values[i: i + R]) for i in range(0, len(values), R)]


def write_template_shards(store: es.Store, chunks: dict[str, list[bytes]], pos: np.ndarray,
                          flags: np.ndarray, episode_len: int, step_ids: bool = True,
                          every: int = 200) -> None:
    """Every shard of ``store``: each field's template ``chunks`` with the shard's own
    header (and its own ``_step_id`` chunk), then lane 0's index snapshot and state."""
    L, S = store.layout, store.layout.shard_rows
    n_shards, t0 = L.capacity // S, time.perf_counter()
    for shard in range(n_shards):
        first = shard * S
        for name, field_chunks in chunks.items():
            store.backend.put(L.shard_key(name, shard), assemble(field_chunks, first, S))
        if step_ids:
            steps = chunks_of(L, "_step_id", np.arange(first, first + S))
            store.backend.put(L.shard_key("_step_id", shard), assemble(steps, first, S))
        if shard % every == 0:
            print(f"  shard {shard}/{n_shards} ({time.perf_counter() - t0:.0f} s)", flush=True)
    if L.store_id is not None:
        write_snapshot(store.backend, L, pos.astype(np.int32), flags)
    write_state(store.backend, LaneState(0, count=L.capacity, valid_from=0,
                                         episodes=L.capacity // episode_len))


def write_snapshot(backend, layout, shard_pos: np.ndarray, shard_flags: np.ndarray) -> None:
    """Lane 0's index snapshot blocks, as its writer leaves them after one lap: every shard
    holds the template metadata (``shard_pos``, ``shard_flags``), so a block is it tiled."""
    B, S = block_rows(layout), layout.shard_rows
    ep, fl = np.tile(shard_pos, B // S), np.tile(shard_flags, B // S)
    for j in range(blocks_per_lane(layout)):
        rows = min(B, layout.lane_capacity - j * B)
        backend.put(block_key(0, j), encode_block(layout.store_id, 0, j, j * B,
                                                  ep[:rows], fl[:rows]))


CHILD = r"""
import json, resource, sys, time
import numpy as np
import expstore as es
path, mode, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
store = es.open(path)
opened = time.perf_counter() - t0
if mode == "per" and hasattr(es, "PrioritizedSampler"):
    sampler = es.PrioritizedSampler(store, alpha=0.6, beta=0.4)
else:
    sampler = es.UniformSampler(store)
t0 = time.perf_counter()
if mode == "loader":
    loader = es.make_loader(store, sampler, batch_size=256, num_workers=2, num_batches=batches,
                            persistent_workers=False)
    for b in loader:
        sampler.update_priorities(b["index"], b["reward"].abs() + 0.1)
    del loader, b
    import gc; gc.collect(); time.sleep(1)
else:
    for _ in range(batches):
        b = sampler.sample(256)
        sampler.update_priorities(b["index"], np.abs(b["reward"]) + 0.1)
rate = batches * 256 / (time.perf_counter() - t0)
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"mode": mode, "rows": len(store), "open_s": opened, "tps": rate,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "largest_child_rss_mb": kids,
                  "index_mb": store.index.nbytes / 2**20}))
"""


OPEN_CHILD = r"""
import json, resource, sys, time
import expstore as es
import expstore.index_loader as loader_mod
path, block, load = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if block:
    loader_mod.LOAD_BLOCK_ROWS = block
if load != "snapshot":  # the scan a store without snapshot blocks gets
    class NoSnapshot(loader_mod.SnapshotRanges):
        def __init__(self, backend, layout, st, start):
            super().__init__(backend, layout, st, st.count)
    loader_mod.SnapshotRanges = NoSnapshot
from benchmarks.page_cache import status_mb
import gc; gc.collect()
with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the RSS now
    f.write("5")
base = status_mb("VmRSS")
t0 = time.perf_counter()
store = es.open(path)
opened = time.perf_counter() - t0
peak = status_mb("VmHWM")
print(json.dumps({"rows": len(store), "load": load, "open_s": opened,
                  "snapshot_rows": store._loader.snapshot_rows, "before_mb": base, "peak_mb": peak,
                  "open_peak_mb": peak - base, "open_peak_b_per_row": (peak - base) * 2**20
                  / len(store), "settled_mb": status_mb("VmRSS") - base,
                  "index_mb": store.index.nbytes / 2**20}))
"""


PLAN_CHILD = r"""
import json, statistics, sys, time
import expstore as es
path, repeats = sys.argv[1], int(sys.argv[2])
store = es.open(path)
sampler = es.UniformSampler(store, seed=0)
out = {"rows": len(store)}
for bs in (32, 256):
    for _ in range(200):
        sampler.plan(bs)
    runs = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.5:
            sampler.plan(bs)
            n += 1
        runs.append(1e6 * (time.perf_counter() - t0) / n)
    out[f"plan_us_bs{bs}"] = statistics.median(runs)
print(json.dumps(out))
"""


def plan_cost(sizes: list[int], root: Path, repeats: int) -> list[dict]:
    """The index side of a batch (``UniformSampler.plan``: rows drawn, checked valid,
    stacks and next rows found) on the metadata-only stores :func:`open_rss` keeps, each
    opened in a fresh process with its snapshot, warm page cache."""
    results = []
    for rows in sizes:
        path = root / f"meta_{rows}.zarr"
        if not (path / "_index").is_dir() or _capacity(path) < rows:
            raise SystemExit(f"{path}: build it first (--open {rows} --keep)")
        out = subprocess.run([sys.executable, "-c", PLAN_CHILD, str(path), str(repeats)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(r, flush=True)
        results.append(r)
    for r in results:
        for bs in (32, 256):
            r[f"bs{bs}_x_smallest"] = r[f"plan_us_bs{bs}"] / results[0][f"plan_us_bs{bs}"]
    return results


def _capacity(path: Path) -> int:
    return json.loads((path / "zarr.json").read_text())["attributes"]["expstore"]["capacity"]


def measure_open(path: Path, load: str, cold: bool) -> dict:
    """One open of ``path`` in a fresh process: ``load`` = "snapshot", "streamed" (the
    scan) or "one pass"; ``cold``: the store's files dropped from the page cache first."""
    resident = evict(path) if cold else None
    block = 1 << 40 if load == "one pass" else 0
    out = subprocess.run([sys.executable, "-c", OPEN_CHILD, str(path), str(block), load],
                         capture_output=True, text=True, check=True, cwd=REPO)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["cache"] = "cold" if cold else "warm"
    r["resident"] = resident
    return r


def evict(path: Path, sample: int = 256) -> float:
    """Drop every file under ``path`` from the page cache (``os.sync``, then
    ``posix_fadvise(DONTNEED)`` per file); the fraction of the pages of ``sample`` of its
    files (spread over the store) still resident afterwards, by ``mincore``."""
    os.sync()
    files = drop_page_cache(path)
    picked = files[:: max(1, len(files) // sample)]
    cached = total = 0
    for name in picked:
        c, t = resident_pages(name)
        cached, total = cached + c, total + t
    return cached / max(1, total)


def open_rss(sizes: list[int], root: Path, one_pass_max: int, cold: bool,
             keep: bool = False) -> list[dict]:
    """Open time and peak RSS of ``es.open`` on metadata-only stores of each size, with
    the index snapshot and scanning (see module doc)."""
    results = []
    for rows in sizes:
        path = root / f"meta_{rows}.zarr"
        if not (path / "_index").is_dir() or _capacity(path) < rows:
            print(f"building a {rows:,}-row metadata store at {path} ...", flush=True)
            t0 = time.perf_counter()
            build(path, rows, metadata_only=True)
            print(f"  built in {time.perf_counter() - t0:.0f} s; "
                  f"{backend_for(str(path)).total_bytes() / 2**20:,.0f} MiB on disk",
                  flush=True)
        for load in ("snapshot", "streamed", "one pass"):
            if load == "one pass" and rows > one_pass_max:
                continue
            r = measure_open(path, load, cold)
            print(r, flush=True)
            results.append(r)
        if not keep:
            shutil.rmtree(path, ignore_errors=True)
    return results


def sample_cost(sizes: list[int], root: Path, repeats: int, seconds: float,
                subsample: int = 5, keep: bool = False,
                shard_rows: int | None = None, map_bytes: int | None = None) -> list[dict]:
    """Uniform stacked batches sampled from small-frame stores of each size (Atari frames,
    every ``subsample``-th pixel), each size measured in a fresh process (its peak RSS is
    its own): median µs per batch of 32 and 256 (see module doc). ``keep``: keep the
    stores, and reuse one already there. ``map_bytes``: ``es.open(map_bytes=...)``
    (default: the store's)."""
    results = []
    for rows in sizes:
        path = root / (f"small_{rows}.zarr" if shard_rows is None
                       else f"small_{rows}_s{shard_rows}.zarr")
        built = None
        if not (keep and (path / "_index").is_dir() and _capacity(path) >= rows):
            print(f"building a {rows:,}-row small-frame store at {path} ...", flush=True)
            t0 = time.perf_counter()
            build(path, rows, subsample=subsample, shard_rows=shard_rows).close()
            built = time.perf_counter() - t0
        warm_page_cache(path)  # the measurement is of warm reads
        before = resident_fraction(path)
        extra = [] if map_bytes is None else ["--map-bytes", str(map_bytes)]
        out = subprocess.run([sys.executable, __file__, "--flat-child", str(path),
                              "--repeats", str(repeats), "--seconds", str(seconds), *extra],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["build_s"] = built
        r["resident_pct"] = resident_pct(before, path)
        print(r, flush=True)
        results.append(r)
        if not keep:
            shutil.rmtree(path, ignore_errors=True)
    return results


def flat_child(path: Path, repeats: int, seconds: float,
               map_bytes: int | None = None) -> dict:
    """The measurement of :func:`sample_cost` on one store, in this (fresh) process: the
    store as opened by default, then (closed first, so it has the process's descriptors
    to itself) opened again with no decoded-frame cache."""
    from benchmarks.baselines import timed_loop

    store = es.open(path, map_bytes=map_bytes)
    rows = len(store)
    side = store.layout.spec.fields["obs"].shape[0]
    r: dict = {"rows": rows, "shards": rows // store.layout.shard_rows,
               "shard_rows": store.layout.shard_rows, "frame": f"{side}x{side}",
               "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
    for tag in ("", "_nocache"):
        if tag:  # the read path alone
            store = es.open(path, cache_bytes=0, map_bytes=map_bytes)
        for bs in (32, 256):
            step = DiskMeter(functools.partial(store.sample, bs))
            warm_up(step, bs, r["shards"])
            timed_loop(step, bs, seconds)
            step.start()
            runs = [timed_loop(step, bs, seconds) for _ in range(repeats)]
            step.stop()
            r[f"us_per_batch_bs{bs}{tag}"] = 1e6 * bs / statistics.median(runs)
            r[f"disk_kb_per_batch_bs{bs}{tag}"] = step.kb_per_call
            if not tag:
                r[f"tps_bs{bs}"] = statistics.median(runs)
        if not tag:
            r.update(_read_counters(store))
        store.close()
    r["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    r.update(_rss_parts())
    return r


def warm_up(step: Callable[[], object], batch_size: int, shards: int) -> None:
    """``step()`` (a batch of ``batch_size``) until every one of ``shards`` was drawn ~8
    times (caches and held chunks as a long run has them) and ``WARM_SECONDS`` passed (a
    1M-row store's frame cache takes seconds to fill: timed before it is full, the
    smallest store's figure swung 2x)."""
    t0 = time.perf_counter()
    for k in itertools.count():
        if k >= max(1, 8 * shards // batch_size) and time.perf_counter() - t0 >= WARM_SECONDS:
            break
        step()


def _rss_parts() -> dict:
    """This process's RSS now, split: anonymous memory (heap, arrays) and file pages
    mapped (shard files read through mappings: the page cache's own pages), MiB."""
    return {"anon_mb_end": status_mb("RssAnon"), "file_mb_end": status_mb("RssFile")}


def _read_counters(store: es.Store) -> dict:
    """Reads, shard opens and descriptors per batch of 32 of ``store`` (warm)."""
    st = store.reader.stats
    tables = store.reader.tables
    scalars = [n for n in ("action", "reward", "terminated", "truncated")
               if tables[n].fds is not None]
    req0, bound0 = st.requests, tables["obs"].fds.opened
    scalar0 = sum(tables[n].fds.opened for n in scalars)
    heads0 = sum(t.opened for t in tables.values())
    hits0, misses0 = st.row_cache_hits, st.row_cache_misses
    cache = store.reader.row_caches["obs"]
    used0, passed0 = cache.reads, st.row_cache_bypassed
    for _ in range(20):
        store.sample(32)
    hits, misses = st.row_cache_hits - hits0, st.row_cache_misses - misses0
    used, passed = cache.reads - used0, st.row_cache_bypassed - passed0
    return {"requests_per_batch_bs32": (st.requests - req0) / 20,
            "shard_opens_per_batch_bs32": (tables["obs"].fds.opened - bound0) / 20,
            "scalar_opens_per_batch_bs32": (sum(tables[n].fds.opened for n in scalars)
                                            - scalar0) / 20,
            "index_opens_per_batch_bs32": (sum(t.opened for t in tables.values()) - heads0)
            / 20,
            "open_fds": len(os.listdir("/proc/self/fd")),
            "frame_cache_hit_rate": hits / max(1, hits + misses),
            "frame_cache_passed_by": passed / max(1, passed + used)}


def measure(path: Path, mode: str, batches: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), mode, str(batches)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--path", default=".bench_rss/store.zarr")
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--open", default="", help="comma-separated row counts: open RSS only")
    p.add_argument("--cold", action="store_true",
                   help="--open: drop the store's files from the page cache before each open")
    p.add_argument("--one-pass-max", type=int, default=10_000_000,
                   help="largest store also opened with the one-pass baseline")
    p.add_argument("--flat", default="", help="comma-separated row counts: sampling cost")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--flat-child", default="", help=argparse.SUPPRESS)
    p.add_argument("--map-bytes", type=int, default=None,
                   help="--flat: es.open(map_bytes=...) (default: the store's; 0: no mapped "
                        "frame reads)")
    p.add_argument("--shard-rows", type=int, default=None,
                   help="--flat: rows per shard of the stores built (default: auto)")
    p.add_argument("--plan", default="",
                   help="comma-separated row counts: the index side of a batch on the kept "
                        "metadata-only stores (--open N --keep builds them)")
    p.add_argument("--subsample", type=int, default=5,
                   help="--flat: keep every k-th pixel of the 84x84 frames (21: 4x4)")
    a = p.parse_args()
    load0 = os.getloadavg()[0]

    def load() -> dict[str, str]:
        return {"load average (1 min) start/end": f"{load0:.2f} / {os.getloadavg()[0]:.2f}"}

    if a.flat_child:
        print(json.dumps(flat_child(Path(a.flat_child), a.repeats, a.seconds, a.map_bytes)))
        return
    if a.plan:
        root = Path(a.path).parent
        res = plan_cost([int(x) for x in a.plan.split(",")], root, a.repeats)
        body = markdown_table(res, ["rows", "plan_us_bs32", "bs32_x_smallest",
                                    "plan_us_bs256", "bs256_x_smallest"])
        body += ("\n\nThe index side of a batch: `UniformSampler.plan(B)` (rows drawn "
                 "uniformly, checked valid, frame stacks of 4 and next rows found) on the "
                 "metadata-only stores of \"Memory: open\" (no frame shards: their frames "
                 "would take ~60 GB of disk at 1B rows), each opened with its snapshot in a "
                 "fresh process, warm page cache; medians of repeats of 0.5 s.")
        save_json("rss_plan", {"results": res})
        if not a.no_write:
            write_section("Index side of a batch vs store size", body,
                          command=command_line(), extra=load())
        print(body)
        return
    if a.open or a.flat:
        root = Path(a.path).parent
        root.mkdir(parents=True, exist_ok=True)
        if a.open:
            sizes = [int(x) for x in a.open.split(",")]
            res = open_rss(sizes, root, a.one_pass_max, a.cold, a.keep)
            body = markdown_table(res, ["rows", "load", "cache", "resident", "open_s",
                                        "snapshot_rows", "before_mb", "peak_mb",
                                        "open_peak_mb", "open_peak_b_per_row", "settled_mb",
                                        "index_mb"])
            body += ("\n\nStores holding only the metadata shards opening reads "
                     "(`_episode_step`, `_flags`; one template shard of 4096 rows written "
                     "per shard with its own header, no frame shards). Each open runs in a "
                     "fresh process: before_mb = its RSS just before `es.open` (MiB; "
                     "imports done), when its peak (VmHWM) is reset (`/proc/self/clear_refs`);"
                     " peak_mb = VmHWM after open; open_peak = the difference; settled_mb = "
                     "RSS after open minus before_mb; index_mb = the row index "
                     "(5 B/row). load 'snapshot': `es.open` as it is (the writer's index "
                     "snapshot blocks, `_index/lane_0/block_<j>`, 65,536 rows each; "
                     "snapshot_rows = rows it gave); 'streamed': the same store opened "
                     "without them (metadata shards scanned, as a store without a snapshot"
                     "); cache 'cold': os.sync + posix_fadvise(DONTNEED) on every file of "
                     "the store before each open, resident = fraction of the pages of 256 "
                     "of its files still cached after that (mincore). load 'one pass' sets "
                     "`expstore.index_loader.LOAD_BLOCK_ROWS` above the lane size: every "
                     "row of a lane indexed at once, as before streaming.")
            save_json("rss_open", {"results": res})
            if not a.no_write:
                write_section("Memory: open", body, command=command_line())
            print(body)
        if a.flat:
            sizes = [int(x) for x in a.flat.split(",")]
            res = sample_cost(sizes, root, a.repeats, a.seconds, a.subsample, a.keep,
                              a.shard_rows, a.map_bytes)
            base = res[0]
            for r in res:
                for bs in (32, 256):
                    for tag in ("", "_nocache"):
                        r[f"bs{bs}{tag}_x_smallest"] = (r[f"us_per_batch_bs{bs}{tag}"]
                                                        / base[f"us_per_batch_bs{bs}{tag}"])
            body = markdown_table(res, ["rows", "shards", "frame", "tps_bs32",
                                        "us_per_batch_bs32", "bs32_x_smallest",
                                        "us_per_batch_bs32_nocache", "bs32_nocache_x_smallest",
                                        "tps_bs256", "us_per_batch_bs256", "bs256_x_smallest",
                                        "us_per_batch_bs256_nocache",
                                        "bs256_nocache_x_smallest", "frame_cache_hit_rate",
                                        "frame_cache_passed_by", "requests_per_batch_bs32",
                                        "shard_opens_per_batch_bs32",
                                        "scalar_opens_per_batch_bs32",
                                        "index_opens_per_batch_bs32", "open_fds",
                                        "resident_pct", "disk_kb_per_batch_bs256",
                                        "disk_kb_per_batch_bs256_nocache", "rss_mb",
                                        "anon_mb_end", "file_mb_end"])
            body += ("\n\n"
                     "`store.sample(B)` in this process, warm page cache (uniform, stacked 4"
                     " x frame uint8: Atari frames subsampled, one row per inner chunk as "
                     "Atari frames are, blosc-lz4, one template shard (of the default size, "
                     "`auto_shard_rows`: 4096 rows, 16,384 at 100M) repeated "
                     "with each shard's own header; its scalars as Atari's compress: random "
                     "actions 0-5, rewards of +-1 at 3% of steps), after a warm-up drawing "
                     "every shard ~8 times and lasting at least 5 s (decoded and held "
                     "caches as a long run has them; a 1M-row store's frame cache takes "
                     "seconds to fill), medians of repeats, tr/s = "
                     "transitions/s; default frame cache (256 MiB); _nocache: the same store"
                     " opened again with `cache_bytes=0` (every frame read and decoded), "
                     "the first closed. "
                     "x_smallest = µs per batch / the smallest store's (target: flat). "
                     "frame_cache_hit_rate: share of the frame lookups served, over the reads "
                     "that used the cache; frame_cache_passed_by: share of frame reads that "
                     "passed it by (its judged hit rate below `read_cache.BYPASS_BELOW`; one "
                     "read in `PROBE_EVERY` still uses it), both over 20 batches of 32. "
                     "requests = reads the reader issued per batch of 32 (index entries + "
                     "chunks the kernel read, shard opens); shard_opens = `obs` shards the "
                     "kernel opened (header read) per batch of 32; scalar_opens: the same "
                     "for action, reward, terminated and truncated together; index_opens = shard "
                     "versions the general path opened (header + whole index) per batch of "
                     "32, all fields; open_fds = descriptors the process holds; rss_mb = its"
                     " peak RSS (MiB, `ru_maxrss`; each size is measured in a fresh "
                     "process); anon_mb_end / file_mb_end: its RSS at the end (stores "
                     "closed), split into anonymous memory and mapped file pages "
                     "(`RssAnon` / `RssFile`: shard "
                     "files read through mappings, `open(map_bytes=...)`, are the page "
                     "cache's own pages; the first reader's, closed, are unmapped). How "
                     "warm it was: " + warmth_note())
            save_json("rss_flat", {"results": res})
            if not a.no_write:
                write_section("Sampling vs store size", body, command=command_line(),
                              extra=load())
            print(body)
        return
    path = Path(a.path)
    if not (path / "zarr.json").exists() or es.open(path).capacity < a.rows:
        print(f"building a {a.rows:,}-row store at {path} ...", flush=True)
        build(path, a.rows)
    disk = es.open(path).backend.total_bytes()
    results = [measure(path, m, a.batches) for m in ("uniform", "per", "loader")]
    for r in results:
        print(r, flush=True)
    body = markdown_table(results, ["mode", "rows", "open_s", "tps", "rss_mb",
                                    "largest_child_rss_mb", "index_mb"])
    body += (f"\n\nStore: {a.rows:,} rows of 84x84 uint8 frames (stack 4 on read), "
             f"{disk / 2**30:.2f} GiB on disk. rss_mb = peak RSS of the sampling process "
             "(MiB, `ru_maxrss`); largest_child_rss_mb = the largest DataLoader worker; "
             "tps = stacked transitions/s while sampling batches of 256 (uniform or PER with "
             "priority updates) over the whole store, cold-ish page cache.")
    save_json("rss", {"results": results, "rows": a.rows, "disk_bytes": disk})
    if not a.no_write:
        write_section("Memory (10M rows)", body, command=command_line())
    print(body)
    if not a.keep:
        shutil.rmtree(path.parent if path.parent.name == ".bench_rss" else path,
                      ignore_errors=True)


if __name__ == "__main__":
    main()
