"""Larger than RAM, cold: ``make_loader`` against the disk's own random-read limit, one run.

Usage (from the repository root)::

    python benchmarks/bench_cold.py                       # ~490k rows of Pong frames
    python benchmarks/bench_cold.py --rows 983040 --seconds 5 --depths 1,4,16

A stacked-Atari store (4 x 84x84 uint8 frames, one frame per inner chunk) is built from
one encoded template shard of real Pong frames (as ``bench_rss.py`` builds its stores),
and its pages are kept out of the page cache (``benchmarks/cold_cache.py``): by default
the benchmark joins a memory cgroup of its own, used as a meter of its page cache, and a
governor process outside it drops the store's pages whenever that passes ``--cache-mib``
(16 MiB, a tenth of the store); where no cgroup can be made, ``--cold evictor`` drops
them all in a loop (under which the loader fetched twice the bytes per sample). The bytes
the kernel fetched from the block device for the readers are counted (``/proc/PID/io``),
so each figure shows how cold it was. Cold, the same run measures

* the disk's random-read limit: threads issuing ``os.pread`` at queue depths 1-64 at
  random offsets within the ``obs`` shard files, of 4 KiB and of the store's typical
  frame-stack read (a stack of 4 frames and the next frame: 5 chunks lying one after
  another, read as one request); buffered (evicted pages) and ``O_DIRECT`` where the
  filesystem allows it;
* ``make_loader`` (2 workers, batch 32, uniform) cold at read depth 1 (one pread after
  another, as before the read pool) and at each ``--depths``, and warm (nothing dropped,
  the store read into the page cache first): transitions/s, reads per sample (index
  entries + chunk runs + shard opens the workers' kernels issued, per transition), the
  workers' frame-cache hit rate;
* the ratio of each cold rate to the limit: the best stack-size reads/s over the queue
  depths, one read per transition (target >= 0.7 at the default depth).

The default size (491,520 rows) is the largest whose ``obs`` index entries each worker's
kernel remembers all of (``FdTable`` keeps 512k, 32 B each): one read per sample. A
larger store also pays an index-page read for rows whose remembered entry was evicted.
Writes section "Larger than RAM, cold" of benchmarks/RESULTS.md and results/cold.json,
then deletes the store (``--keep`` keeps it).
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import expstore as es  # noqa: E402
from benchmarks.bench_rss import build  # noqa: E402
from benchmarks.cold_cache import (  # noqa: E402
    CacheBudget,
    Evictor,
    cgroup_available,
    disk_read_bytes,
    store_files,
)
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402
from expstore.storage.native import READ_DEPTH_ENV, native, set_read_depth  # noqa: E402

QUEUE_DEPTHS = (1, 2, 4, 8, 16, 32, 64)
PAGE = 4096


def stack_read_bytes(path: Path, store: es.Store, samples: int = 2000) -> int:
    """Median bytes of 5 chunks lying one after another in an ``obs`` shard (a stack of 4
    frames and the next frame: what one sample's read covers)."""
    L = store.layout
    n_chunks = L.chunks_per_shard("obs")
    raw = (path / L.shard_key("obs", 0)).read_bytes()
    ent = np.frombuffer(raw[: 16 * n_chunks], np.uint64).reshape(-1, 2)
    rng = np.random.default_rng(0)
    at = rng.integers(0, n_chunks - 5, samples)
    ends = ent[at + 4, 0] + ent[at + 4, 1]
    return int(np.median(ends - ent[at, 0]))


def disk_rate(files: list[Path], size: int, depth: int, seconds: float,
              direct: bool) -> tuple[float, float]:
    """Random reads/s of ``size`` bytes, ``depth`` threads each issuing one pread after
    another at random offsets within ``files`` (pages kept out of the page cache by the
    caller; ``direct``: ``O_DIRECT``, offsets and sizes rounded to 4 KiB), and the bytes
    fetched from the disk per read."""
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fds = [os.open(p, flags) for p in files]
    sizes = np.array([os.fstat(fd).st_size for fd in fds], np.int64)
    want = -(-size // PAGE) * PAGE if direct else size
    counts = [0] * depth
    deadline = time.perf_counter() + seconds

    def reader(k: int) -> None:
        rng = np.random.default_rng(k)
        buf = mmap.mmap(-1, want + PAGE) if direct else None
        view = memoryview(buf)[:want] if direct else None
        while time.perf_counter() < deadline:
            which = rng.integers(0, len(fds), 256)
            offs = (rng.random(256) * np.maximum(sizes[which] - want, 1)).astype(np.int64)
            if direct:
                offs -= offs % PAGE
            for f, o in zip(which.tolist(), offs.tolist()):
                if direct:
                    os.preadv(fds[f], [view], o)
                else:
                    os.pread(fds[f], size, o)
                counts[k] += 1
            if time.perf_counter() >= deadline:
                break

    disk0, t0 = disk_read_bytes([os.getpid()]), time.perf_counter()
    threads = [threading.Thread(target=reader, args=(k,)) for k in range(depth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    disk = disk_read_bytes([os.getpid()]) - disk0
    for fd in fds:
        os.close(fd)
    return sum(counts) / dt, disk / max(sum(counts), 1)


def o_direct_allowed(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        buf = mmap.mmap(-1, PAGE)
        os.preadv(fd, [buf], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid`` (all its threads: the read pool's too), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def warmup_batches(rows: int, batch: int, workers: int = 2) -> int:
    """Batches after which each worker has most likely read every 4 KiB page of ``obs``
    index entries once (``rows / 256`` pages, drawn at random: ~P ln P samples), so that
    the timed window sees the steady state (one read per sample) whatever the load."""
    pages = max(rows // 256, 2)
    return int(1.5 * workers * pages * np.log(pages) / batch) + 20


def loader_rate(path: Path, depth: int, seconds: float, warmup: int,
                batch: int, cold: CacheBudget | Evictor | None) -> dict[str, Any]:
    """``make_loader`` (2 workers, uniform) at read ``depth``: transitions/s over
    ``seconds`` after ``warmup`` batches (workers started, their caches filled), with
    ``cold`` holding the store's pages out of the page cache from the end of the warm-up
    (``None``: warm)."""
    os.environ[READ_DEPTH_ENV] = str(depth)
    set_read_depth(depth)
    store = es.open(path)
    loader = es.make_loader(store, batch_size=batch, num_workers=2, prefetch_factor=4,
                            multiprocessing_context="fork")
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    pids = [os.getpid()] + [w.pid for w in loader._iterator._workers]
    if cold is not None:
        cold.hold()
        for _ in range(warmup // 4):  # settle: the frame caches hold what cold reads bring
            next(it)
    cpu0 = sum(_cpu_seconds(p) for p in pids)
    disk0 = disk_read_bytes(pids)
    s0 = dict(loader.stats.as_dict())
    n, t0 = 0, time.perf_counter()
    while (dt := time.perf_counter() - t0) < seconds:
        b = next(it)
        float(b["obs"].reshape(-1)[0]), float(b["next_obs"].reshape(-1)[0])
        n += 1
    s1 = loader.stats.as_dict()
    cpu = sum(_cpu_seconds(p) for p in pids) - cpu0
    disk = disk_read_bytes(pids) - disk0
    if cold is not None:
        cold.release()
    loader.close()
    store.close()
    samples = max(s1["batches"] - s0["batches"], 1) * batch
    hits = s1.get("cache_hits", 0) - s0.get("cache_hits", 0)
    misses = s1.get("cache_misses", 0) - s0.get("cache_misses", 0)
    return {"depth": depth, "tps": n * batch / dt, "batches_per_s": n / dt,
            "reads_per_sample": (s1["requests"] - s0["requests"]) / samples,
            "bytes_per_sample": (s1["bytes_read"] - s0["bytes_read"]) / samples,
            "disk_bytes_per_sample": disk / samples,
            "frame_cache_hit_rate": hits / max(hits + misses, 1),
            "cpu_us_per_sample": 1e6 * cpu / max(n * batch, 1)}


def kernel_rates(path: Path, depths: list[int], seconds: float,
                 cold: CacheBudget | Evictor, repeats: int = 3) -> list[dict[str, Any]]:
    """The frame kernel alone, in this process (one ``ShardReader``, no frame cache, no
    loader): batches of 32 random stacks (4 frames and the next: one run each) read cold
    at each depth, interleaved; medians of ``repeats``. What the pool gains without the
    loader's CPU around it."""
    from expstore.storage import backend_for
    from expstore.storage.read import ShardReader

    store = es.open(path)
    rows = store.capacity
    # (map_bytes=0, the default: pages this process mapped would stay out of the
    # governor's reach)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0,
                         map_bytes=0)
    every = np.arange(rows)
    steps = store.index.steps(every)
    rng = np.random.default_rng(0)
    out = np.zeros((160, *store.layout.fields["obs"].shape), np.uint8)

    def one_batch() -> None:
        pick = (rng.integers(0, rows - 5, 32)[:, None] + np.arange(5)).reshape(-1)
        reader.read("obs", every[pick], steps[pick], out)

    cold.hold()
    set_read_depth(1)
    for _ in range(warmup_batches(rows, 32, workers=1)):  # every index page remembered
        one_batch()
    got: dict[int, list[tuple[float, float, float]]] = {d: [] for d in depths}
    for _ in range(repeats):
        for d in depths:
            set_read_depth(d)
            r0, n, t0 = reader.stats.requests, 0, time.perf_counter()
            disk0 = disk_read_bytes([os.getpid()])
            while (dt := time.perf_counter() - t0) < seconds:
                one_batch()
                n += 1
            got[d].append((n * 32 / dt, (reader.stats.requests - r0) / (n * 32),
                           (disk_read_bytes([os.getpid()]) - disk0) / (n * 32)))
    cold.release()
    reader.close()
    store.close()
    return [{"depth": d, "tps": statistics.median(x[0] for x in v),
             "reads_per_sample": statistics.median(x[1] for x in v),
             "disk_bytes_per_sample": statistics.median(x[2] for x in v)}
            for d, v in got.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=120 * 4096,
                    help="store capacity (rows; a multiple of 4096)")
    ap.add_argument("--root", default=".bench_cold", help="where the store is built")
    ap.add_argument("--seconds", type=float, default=4.0, help="each timed window")
    ap.add_argument("--warmup", type=int, default=None,
                    help="loader warm-up (batches; default: every index page read once)")
    ap.add_argument("--disk-seconds", type=float, default=2.0, help="each disk probe (s)")
    ap.add_argument("--depths", default="2,4,8",
                    help="read depths to compare with depth 1 (cold)")
    ap.add_argument("--cold", choices=("cgroup", "evictor"), default=None,
                    help="how pages are kept out of the page cache (default: a memory "
                         "cgroup where one can be made, else the evictor)")
    ap.add_argument("--cache-mib", type=float, default=16.0,
                    help="cgroup: page cache left to the readers (MiB)")
    ap.add_argument("--evict-interval", type=float, default=0.002,
                    help="evictor: sleep between eviction passes (s)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--keep", action="store_true", help="keep the store afterwards")
    ap.add_argument("--no-write", action="store_true", help="print, do not write RESULTS")
    a = ap.parse_args()
    default_depth = int(native.read_depth())
    warmup = a.warmup if a.warmup is not None else warmup_batches(a.rows, a.batch)
    depths = sorted({1, default_depth, *(int(d) for d in a.depths.split(",") if d)})
    root = Path(a.root).resolve()
    path = root / "cold.zarr"
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    store = build(path, a.rows)
    store.close()
    store = es.open(path)
    files = store_files(path)
    obs_files = [p for p in files if "/obs/" in str(p)]
    on_disk = sum(p.stat().st_size for p in files)
    stack_bytes = stack_read_bytes(path, store)
    store.close()
    print(f"built {a.rows} rows, {on_disk / 2**20:.0f} MiB in {len(files)} files "
          f"({time.perf_counter() - t0:.0f} s); a stack read: {stack_bytes} B", flush=True)
    direct = o_direct_allowed(obs_files[0])
    disk: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    how = a.cold or ("cgroup" if cgroup_available() else "evictor")
    holder = (CacheBudget(path, int(a.cache_mib * 2**20)) if how == "cgroup"
              else Evictor(path, a.evict_interval))
    with holder:
        holder.hold()
        for qd in QUEUE_DEPTHS:
            row: dict[str, Any] = {"queue_depth": qd}
            for label, size in (("4k", PAGE), ("stack", stack_bytes)):
                rate, from_disk = disk_rate(obs_files, size, qd, a.disk_seconds, False)
                row[f"reads_per_s_{label}"] = rate
                row[f"disk_bytes_per_read_{label}"] = from_disk
                if direct:
                    row[f"direct_reads_per_s_{label}"] = disk_rate(
                        obs_files, size, qd, a.disk_seconds, True)[0]
            disk.append(row)
            print(row, flush=True)
        holder.release()
        kernel = kernel_rates(path, depths, a.seconds / 2, holder)
        print("kernel", kernel, flush=True)
        for d in depths:
            r = loader_rate(path, d, a.seconds, warmup, a.batch, holder)
            cold.append(r)
            print("cold", r, flush=True)
        for p in files:  # warm: every page of the store in the page cache
            p.read_bytes()
        warm = loader_rate(path, default_depth, a.seconds, warmup, a.batch, None)
    print("warm", warm, flush=True)
    limit = max(r["reads_per_s_stack"] for r in disk)
    limit_qd = max(disk, key=lambda r: r["reads_per_s_stack"])["queue_depth"]
    for r in cold:
        r["x_limit"] = r["tps"] / limit
        r["x_depth1"] = r["tps"] / cold[0]["tps"]
        r["x_warm"] = r["tps"] / warm["tps"]
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    rows_out = [{"case": f"cold, read depth {r['depth']}"
                 + (" (default)" if r["depth"] == default_depth else ""), **r} for r in cold]
    rows_out.append({"case": f"warm, read depth {default_depth}", **warm,
                     "x_limit": warm["tps"] / limit})
    result = {"rows": a.rows, "bytes_on_disk": on_disk, "files": len(files),
              "stack_read_bytes": stack_bytes, "o_direct": direct, "disk": disk,
              "loader": rows_out, "kernel": kernel, "limit_reads_per_s": limit,
              "limit_queue_depth": limit_qd,
              "cold": how, "cache_budget_bytes": int(a.cache_mib * 2**20),
              "drops_per_s": holder.rate, "load_start": load,
              "load_end": os.getloadavg()[0]}
    if how == "cgroup":
        cold_text = (
            f"Cold: the benchmark and the processes it forks run in a memory cgroup of "
            f"their own; a governor process outside it reads the group's page cache every "
            f"2 ms and, while it is past {a.cache_mib:g} MiB ({a.cache_mib * 2**20 / on_disk:.0%}"
            f" of the store), drops the pages of a sixteenth of the store's files "
            f"(`posix_fadvise(DONTNEED)`, round robin; {holder.rate:,.1f} drops/s; page "
            f"cache seen: {holder.cache_mean / 2**20:.1f} MiB on average, "
            f"{holder.cache_peak / 2**20:.1f} MiB at most); disk_bytes = bytes the kernel "
            f"read from the block device for the readers (`/proc/PID/io`), per read or per "
            f"sample")
    else:
        cold_text = (
            f"Cold: an evictor process calls `posix_fadvise(DONTNEED)` over every file of "
            f"the store, {holder.rate:,.0f} passes/s")
    disk_cols = ["queue_depth", "reads_per_s_4k", "disk_bytes_per_read_4k",
                 "reads_per_s_stack", "disk_bytes_per_read_stack"] + (
        ["direct_reads_per_s_4k", "direct_reads_per_s_stack"] if direct else [])
    body = (
        f"Store: {a.rows:,} rows of Pong frames (4 x 84x84 stacks, one frame per inner chunk, "
        f"blosc-lz4; one template shard of 4096 real frames repeated), {on_disk / 2**20:,.0f} "
        f"MiB in {len(files):,} files; a sample's read (4 frames + the next, 5 chunks one "
        f"after another) is {stack_bytes:,} B (median). {cold_text}. Load average (1 min) "
        f"{load:.2f} at the start, {result['load_end']:.2f} at the end.\n\n"
        "Disk random-read limit (reads/s; threads issuing `os.pread` one after another at "
        "random offsets within the `obs` shard files; `direct`: `O_DIRECT`, "
        f"{'allowed' if direct else 'refused'} by this filesystem):\n\n"
        + markdown_table(disk, disk_cols)
        + f"\n\nLimit: {limit:,.0f} stack reads/s (queue depth {limit_qd}), i.e. "
        f"{limit:,.0f} transitions/s at one read per sample.\n\n"
        "`make_loader` (2 workers, batch 32, uniform; tps = transitions/s over "
        f"{a.seconds:g} s after {warmup:,} batches of warm-up; reads_per_sample = index-entry "
        "reads + chunk runs + shard opens of the workers' kernels per transition; read "
        f"depth = `{READ_DEPTH_ENV}`, preads in flight per worker batch; x_limit = tps / the "
        "limit; x_warm = tps / the warm rate (what the CPU allows with no disk wait); "
        "cpu_us_per_sample: CPU time of the main process and both workers (all threads) per "
        "transition; target "
        "x_limit >= 0.7 at the default depth):\n\n"
        + markdown_table(rows_out, ["case", "tps", "batches_per_s", "x_limit", "x_depth1",
                                    "x_warm",
                                    "reads_per_sample", "bytes_per_sample",
                                    "disk_bytes_per_sample", "frame_cache_hit_rate",
                                    "cpu_us_per_sample"])
        + "\n\nThe frame kernel alone, cold, in one process (a `ShardReader` without frame "
        "cache, batches of 32 random stacks, each 4 frames and the next; medians of 3 "
        f"interleaved runs of {a.seconds / 2:g} s; tps = transitions/s):\n\n"
        + markdown_table(kernel, ["depth", "tps", "reads_per_sample",
                                  "disk_bytes_per_sample"]))
    print(body)
    if not a.no_write:
        save_json("cold", result)
        write_section("Larger than RAM, cold", body, command=command_line(),
                      source=f"ale Pong template shard, {a.rows} rows")


if __name__ == "__main__":
    main()
