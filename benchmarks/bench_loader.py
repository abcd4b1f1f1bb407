"""Streaming stacked Atari batches: ``make_loader`` against TorchRL ``prefetch=2``, one run.

Usage (from the repository root)::

    python benchmarks/bench_loader.py                    # 50k Pong transitions
    python benchmarks/bench_loader.py --repeats 7 --seconds 3

Both sides hold the same transitions (obs/next_obs stacks of 4 84x84 frames) and feed a
consumer that only touches the tensors (one element of obs and next_obs per batch), so
per-batch overhead is what is measured. expstore: ``make_loader(num_workers=2,
prefetch_factor=4)``; TorchRL: ``ReplayBuffer(LazyMemmapStorage, RandomSampler,
prefetch=2)``. Repeats alternate between the two; medians are reported, with CPU time per
batch (all processes of a side) as a second, load-independent figure.

*Cold* runs TorchRL in a memory cgroup limited to ``--cold-limit-mb`` (2 GB; its page cache
included) after dropping its files from the page cache, so its storage, 2.8 GB here,
does not fit in the memory it may use, while expstore's 17 MB do. It needs a writable
cgroup-v1 memory controller (root in this sandbox); elsewhere it is skipped and says so.
Writes section "Loader" of benchmarks/RESULTS.md and results/loader.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.baselines import drop_page_cache, torchrl_memmap_case  # noqa: E402
from benchmarks.expstore_case import ExpstoreCase  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import (  # noqa: E402
    command_line,
    markdown_table,
    save_json,
    work_dir,
    write_section,
)

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _consume(batch: Any, keys: tuple) -> None:
    for k in keys:
        v = batch
        for part in k:
            v = v[part]
        float(v.reshape(-1)[0])


def _timed(next_batch, keys: tuple, seconds: float, pids: list[int]) -> dict[str, float]:
    """Batches/s and CPU ms per batch (``pids``: every process doing the work)."""
    cpu0 = [_cpu_seconds(p) for p in pids]
    n, t0 = 0, time.perf_counter()
    while (dt := time.perf_counter() - t0) < seconds:
        _consume(next_batch(), keys)
        n += 1
    cpu = sum(_cpu_seconds(p) - c for p, c in zip(pids, cpu0))
    return {"batches_per_s": n / dt, "cpu_ms_per_batch": 1e3 * cpu / max(n, 1)}


def expstore_rate(case: ExpstoreCase, batch_size: int, seconds: float) -> dict[str, float]:
    import expstore as es

    loader = es.make_loader(case.reader_store, batch_size=batch_size, num_workers=2,
                            prefetch_factor=4)
    it = iter(loader)
    for _ in range(20):  # workers started, slots and caches filled
        next(it)
    pids = [os.getpid()] + [w.pid for w in loader._iterator._workers]
    r = _timed(it.__next__, (("obs",), ("next_obs",)), seconds, pids)
    r["cache_hit_rate"] = loader.stats.cache_hit_rate
    loader.close()
    return r


def torchrl_rate(case: Any, batch_size: int, seconds: float) -> dict[str, float]:
    rb = case._buffer(batch_size, prefetch=2)
    it = iter(rb)
    for _ in range(5):
        next(it)
    r = _timed(it.__next__, (("observation",), ("next", "observation")), seconds,
               [os.getpid()])
    getattr(rb, "_prefetch_executor", None) and rb._prefetch_executor.shutdown(wait=True)
    return r


def torchrl_child(args: argparse.Namespace) -> None:
    """Cold TorchRL, run inside the limited cgroup: fill, drop the cache, measure."""
    import torch

    torch.set_num_threads(1)
    data = load_atari_frames(args.n, game=args.game)
    out = {}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        case = torchrl_memmap_case(data, None, tmp)
        case.extend_rate()
        os.sync()
        out["storage_bytes"] = sum(p.stat().st_size for p in case.scratch.rglob("*")
                                   if p.is_file())
        for bs in (32, 256):
            runs = []
            for _ in range(args.repeats):
                drop_page_cache(case.scratch)
                runs.append(torchrl_rate(case, bs, args.seconds))
            out[bs] = runs
        case.close()
    print("RESULT " + json.dumps(out), flush=True)


def _cgroup(limit_mb: int) -> Path | None:
    """A child memory cgroup limited to ``limit_mb``, or None where that is not allowed."""
    try:
        mine = next(line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup")
                    if line.split(":")[1] == "memory")
        path = CGROUP_ROOT / mine.lstrip("/") / f"expstore-bench-{os.getpid()}"
        path.mkdir(exist_ok=True)
        (path / "memory.limit_in_bytes").write_text(str(limit_mb << 20))
        return path
    except (OSError, StopIteration):
        return None


def cold_torchrl(a: argparse.Namespace, tmp: str) -> dict[str, Any] | None:
    cg = _cgroup(a.cold_limit_mb)
    if cg is None:
        print("cold case skipped: no writable memory cgroup", flush=True)
        return None
    cmd = [sys.executable, __file__, "--torchrl-child", "--n", str(a.n), "--game", a.game,
           "--repeats", str(a.repeats), "--seconds", str(a.seconds), "--tmp", tmp]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, check=True,
            preexec_fn=lambda: (cg / "tasks").write_text(str(os.getpid())))
    finally:
        try:
            cg.rmdir()
        except OSError:
            pass
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=50_000, help="frames of Atari data")
    p.add_argument("--game", default="Pong")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--cold-limit-mb", type=int, default=2048)
    p.add_argument("--no-cold", action="store_true")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    p.add_argument("--torchrl-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tmp", default=".", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.torchrl_child:
        return torchrl_child(a)

    import torch

    torch.set_num_threads(1)
    data = load_atari_frames(a.n, game=a.game)
    runs: dict[str, dict[int, list]] = {"expstore": {}, "torchrl": {}}
    with tempfile.TemporaryDirectory(dir=work_dir()) as tmp:
        ours = ExpstoreCase(data, None, tmp)
        ours.extend_rate()
        ours.warm_cache()
        theirs = torchrl_memmap_case(data, None, tmp)
        theirs.extend_rate()
        theirs.warm_cache()
        for bs in (32, 256):
            runs["expstore"][bs], runs["torchrl"][bs] = [], []
            for i in range(a.repeats):
                runs["expstore"][bs].append(expstore_rate(ours, bs, a.seconds))
                runs["torchrl"][bs].append(torchrl_rate(theirs, bs, a.seconds))
                print(bs, i, runs["expstore"][bs][-1], runs["torchrl"][bs][-1], flush=True)
        theirs.close()
        cold = None if a.no_cold else cold_torchrl(a, tmp)
        if cold is not None:  # expstore again, alternating in time with the cold runs
            runs["expstore_cold_side"] = {
                bs: [expstore_rate(ours, bs, a.seconds) for _ in range(a.repeats)]
                for bs in (32, 256)}
        ours.close()

    def med(rs: list[dict], k: str = "batches_per_s") -> float:
        return statistics.median(r[k] for r in rs)

    rows = []
    for bs in (32, 256):
        e, t = runs["expstore"][bs], runs["torchrl"][bs]
        rows.append({"case": "warm page cache", "batch": bs,
                     "expstore_batches_per_s": med(e), "torchrl_batches_per_s": med(t),
                     "ratio": med(e) / med(t),
                     "expstore_cpu_ms_per_batch": med(e, "cpu_ms_per_batch"),
                     "torchrl_cpu_ms_per_batch": med(t, "cpu_ms_per_batch"),
                     "expstore_cache_hit_rate": med(e, "cache_hit_rate")})
        if cold is not None:
            e, t = runs["expstore_cold_side"][bs], cold[str(bs)]
            rows.append({"case": f"TorchRL limited to {a.cold_limit_mb} MB", "batch": bs,
                         "expstore_batches_per_s": med(e), "torchrl_batches_per_s": med(t),
                         "ratio": med(e) / med(t),
                         "expstore_cpu_ms_per_batch": med(e, "cpu_ms_per_batch"),
                         "torchrl_cpu_ms_per_batch": med(t, "cpu_ms_per_batch"),
                         "expstore_cache_hit_rate": med(e, "cache_hit_rate")})
    body = markdown_table(rows, list(rows[0]))
    body += (f"\n\n{a.n:,} frames of ALE {a.game}; consumer touches one element of obs and "
             f"next_obs per batch; medians of {a.repeats} runs of {a.seconds:g} s, the two "
             "sides alternating. CPU ms/batch sums the main process and both workers "
             "(expstore) or the one process with its prefetch threads (TorchRL). "
             "expstore cache hit rate: decoded-frame cache of the workers (256 MB each).")
    if cold is not None:
        body += (f"\n\nCold: TorchRL's {cold['storage_bytes'] / 2**30:.2f} GiB of memmap files, "
                 f"run in a memory cgroup of {a.cold_limit_mb} MB (page cache included) after "
                 "`posix_fadvise(DONTNEED)` on its files; expstore's store stays in the page "
                 "cache.")
    print(body)
    save_json("loader", {"rows": rows, "runs": runs, "cold": cold, "n": a.n, "game": a.game})
    if not a.no_write:
        write_section("Loader", body, command=command_line(),
                      source=f"{data['source']} {a.game}, {a.n} frames")


if __name__ == "__main__":
    main()
