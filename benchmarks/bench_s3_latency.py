"""A learner and an actor on S3 with a same-region object store's latency: moto behind a
proxy that holds every HTTP request 20 ms (``expstore.testing.latency_proxy``).

Usage (from the repository root)::

    python benchmarks/bench_s3_latency.py                        # loader + actor, 20 ms
    python benchmarks/bench_s3_latency.py --n 20000 --seconds 4 --delay 0.02 --repeats 3

**Learner** (``make_loader``, 2 workers, batch 32, uniform, stacked 84x84 Pong frames):
batches/s, HTTP requests and bytes received per batch, for the same store on local disk
(the baseline, same run), on S3 without a cache, and on S3 with the local shard cache
(``storage_options["shard_cache"]``). *Cold*: the first ``--cold`` batches of a fresh
loader (fresh processes, an empty shard cache). *Warm*: batches after the first
``--warmup`` (workers' shard heads cached; with the shard cache, every shard copied to
local disk). Workers' decoded-row caches are limited to ``--cache-bytes`` each (default
16 MiB, about 2,300 frames, an eighth of this store) so that, as with a replay larger than
RAM, frames keep coming from storage: without a shard cache, each warm batch's frames are
ranged GETs.

**Actor** (one process, ``store.add`` per step, 48k steps of real frames, capacity 1M,
shards of 4,096 rows (the default there) and 8,192): transitions/s including the final
flush, with the shard objects of a flush uploaded one at a time (``max_uploads=1``) and
concurrently (16).
Writes section "S3 with latency" of benchmarks/RESULTS.md and results/s3_latency.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import expstore as es  # noqa: E402
from benchmarks.expstore_case import extend_batches, spec_for_frames  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402
from expstore.testing import MotoServer  # noqa: E402
from expstore.testing.latency_proxy import LatencyProxy  # noqa: E402


def fill(url: str, data: dict, so: dict | None) -> None:
    store = es.create(url, spec_for_frames(), capacity=len(data["frames"]),
                      storage_options=so, overwrite=True)
    for batch in extend_batches(data, 1000):
        store.extend(batch)
    store.close()


def run_loader(url: str, so: dict | None, proxy: LatencyProxy | None, args: Any
               ) -> dict[str, float]:
    """Cold and warm batches/s, requests and KiB per batch of one fresh loader."""
    store = es.open(url, storage_options=so)
    loader = es.make_loader(store, batch_size=args.batch, num_workers=2,
                            cache_bytes=args.cache_bytes)
    it = iter(loader)
    out: dict[str, float] = {}

    def phase(name: str, n: int) -> None:
        if proxy is not None:
            proxy.reset_count()
        t0 = time.perf_counter()
        for _ in range(n):
            next(it)
        dt = time.perf_counter() - t0
        out[f"{name}_bps"] = n / dt
        if proxy is not None:
            st = proxy.stats()
            out[f"{name}_requests"] = st["requests"] / n
            out[f"{name}_kib"] = st["bytes_down"] / n / 1024

    phase("cold", args.cold)
    for _ in range(args.warmup):
        next(it)
    # warm: as many batches as fit in ``seconds`` at the cold-free rate, at least 100
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.5:
        next(it)
        k += 1
    phase("warm", max(100, int(k / (time.perf_counter() - t0) * args.seconds)))
    loader.close()
    store.close()
    return out


def run_actor(url: str, so: dict, data: dict, steps: int, uploads: int,
              proxy: LatencyProxy, shard_rows: int | None) -> dict[str, float]:
    store = es.create(url, spec_for_frames(), capacity=1_000_000, storage_options=so,
                      shard_rows=shard_rows, overwrite=True)
    store.backend.max_uploads = uploads
    fr, valid = data["frames"], np.flatnonzero(data["valid"])
    act, rew = data["actions"], data["rewards"]
    term, trunc = data["terminated"], data["truncated"]
    proxy.reset_count()
    t0 = time.perf_counter()
    for k in range(steps):
        i = int(valid[k % len(valid)])
        store.add(fr[i], act[i], rew[i], fr[i + 1], bool(term[i]), bool(trunc[i]))
    store.flush()
    dt = time.perf_counter() - t0
    out = {"tps": steps / dt, "requests": proxy.requests,
           "shard_rows": store.layout.shard_rows}
    store.close()
    return out


def med(runs: list[dict], key: str) -> float:
    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals) if vals else float("nan")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="frames in the store")
    ap.add_argument("--game", default="Pong")
    ap.add_argument("--delay", type=float, default=0.020, help="seconds per request")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--cold", type=int, default=20, help="cold batches")
    ap.add_argument("--warmup", type=int, default=200, help="batches before warm ones")
    ap.add_argument("--seconds", type=float, default=3.0, help="warm batches to time (s)")
    ap.add_argument("--cache-bytes", type=int, default=16 << 20,
                    help="decoded-row cache per worker (bytes)")
    ap.add_argument("--actor-steps", type=int, default=48000)
    ap.add_argument("--actor-shard-rows", type=int, nargs="+", default=[4096, 8192],
                    help="shard rows of the actor's store (4096: the default at 1M rows)")
    ap.add_argument("--skip-loader", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-actor", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="print, do not touch RESULTS.md")
    args = ap.parse_args(argv)

    load_before = os.getloadavg()[0]
    data = load_atari_frames(args.n, args.game, workers=1)
    results: dict[str, Any] = {"args": vars(args), "source": data["source"],
                               "env_id": data.get("env_id")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, MotoServer() as moto:
        moto.create_bucket("bench")
        with LatencyProxy(moto.port, delay=args.delay, lifetime=3600) as proxy:
            so = proxy.storage_options
            local_url, s3_url = str(Path(tmp) / "pong.zarr"), "s3://bench/pong.zarr"
            fill(local_url, data, None)
            fill(s3_url, data, moto.storage_options)  # filled without the delay
            runs: dict[str, list[dict]] = {"local": [], "s3": [], "s3 + shard cache": []}
            for rep in range(0 if args.skip_loader else args.repeats):
                runs["local"].append(run_loader(local_url, None, None, args))
                runs["s3"].append(run_loader(s3_url, so, proxy, args))
                cache = {"path": str(Path(tmp) / f"cache{rep}"), "max_bytes": 4 << 30}
                runs["s3 + shard cache"].append(
                    run_loader(s3_url, {**so, "shard_cache": cache}, proxy, args))
            results["loader"] = runs
            base = med(runs["local"], "warm_bps")
            for case, r in runs.items() if not args.skip_loader else ():
                rows.append({
                    "case": case,
                    "cold batches/s": med(r, "cold_bps"),
                    "cold requests/batch": med(r, "cold_requests"),
                    "cold KiB/batch": med(r, "cold_kib"),
                    "warm batches/s": med(r, "warm_bps"),
                    "warm vs local": med(r, "warm_bps") / base,
                    "warm requests/batch": med(r, "warm_requests"),
                    "warm KiB/batch": med(r, "warm_kib"),
                })
            actor_rows = []
            if not args.skip_actor:
                actor: dict[str, list[dict]] = {}
                for rep in range(args.repeats):
                    for sr in args.actor_shard_rows:
                        for up in (1, 16):
                            actor.setdefault(f"{sr} {up}", []).append(run_actor(
                                f"s3://bench/actor{rep}-{sr}-{up}.zarr", so, data,
                                args.actor_steps, up, proxy, sr))
                results["actor"] = actor
                for key, r in actor.items():
                    sr, up = key.split()
                    actor_rows.append({"shard rows": int(sr), "uploads in flight": int(up),
                                       "transitions/s": med(r, "tps"),
                                       "vs one at a time": med(r, "tps") / med(
                                           actor[f"{sr} 1"], "tps"),
                                       "requests": med(r, "requests")})
    results["rows"], results["actor_rows"] = rows, actor_rows
    cols = ["case", "cold batches/s", "cold requests/batch", "cold KiB/batch", "warm batches/s",
            "warm vs local", "warm requests/batch", "warm KiB/batch"]
    table = markdown_table(rows, cols)
    atable = markdown_table(actor_rows) if actor_rows else ""
    ms = args.delay * 1e3
    body = (
        f"Learner: `make_loader`, 2 workers, batch {args.batch}, uniform, stacked 84x84 frames; "
        f"every S3 request held {ms:.0f} ms by the proxy.\n\n{table}\n\n"
        f"Actor: one process, `store.add` per step, {args.actor_steps:,} steps, capacity 1M "
        f"(4,096 shard rows is the default there), {ms:.0f} ms per request.\n\n{atable}\n\n"
        f"Medians of {args.repeats} repeats. Cold = the first {args.cold} batches of a fresh "
        f"loader (and an empty shard cache); warm = after {args.warmup} batches. Workers' "
        f"decoded-row caches are {args.cache_bytes >> 20} MiB each (an eighth of this store's "
        "frames), so frames keep coming from storage as with a replay larger than RAM. "
        "moto is a Python server sharing the client's CPUs: absolute S3 rates measure it, "
        "not AWS; local is the same store on local disk in the same run.")
    print(table)
    print(atable)
    if not (args.no_write or args.skip_loader or args.skip_actor):  # a whole section only
        load = f"{load_before:.1f} / {os.getloadavg()[0]:.1f} (1-min, before / after)"
        results["load_average"] = load
        write_section("S3 with latency", body, command=command_line(),
                      source=f"{results['source']} ({results['env_id']}): {args.n:,} frames",
                      extra={"load average": load})
        save_json("s3_latency", results)
    return results


if __name__ == "__main__":
    main()
