"""expstore on S3 (a local moto server) against the same store on local disk, one run.

Usage (from the repository root)::

    python benchmarks/bench_s3.py                     # 20k real Pong frames, bs 32 and 256
    python benchmarks/bench_s3.py --n 50000 --seconds 3 --repeats 5

Both stores hold the same transitions (84x84 frames, stack 4, default codec). Every S3
request goes through a counting loopback proxy in front of ``python -m moto.server``, so
"requests" are HTTP requests seen on the wire. Per uniform batch it reports the requests,
the distinct shard objects the batch touched (fields x shards) and the frame shards among
them, bytes received, and transitions/s (warm: shard headers and scalar chunks cached,
which is the steady state of a learner), with ranged reads coalesced per object (the
default) and without (``max_gap=-1``: one GET per frame). Writes section
"S3 object storage" of benchmarks/RESULTS.md and results/s3.json.
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
from expstore.testing import MotoServer, TcpProxy  # noqa: E402


def fill(url: str, data: dict, shard_rows: int, so: dict | None) -> tuple[es.Store, float]:
    store = es.create(url, spec_for_frames(), capacity=len(data["frames"]),
                      shard_rows=shard_rows, storage_options=so, overwrite=True)
    n = 0
    t0 = time.perf_counter()
    for batch in extend_batches(data, 1000):
        store.extend(batch)
        n += len(batch["reward"])
    store.flush()
    dt = time.perf_counter() - t0
    store.close()
    return store, n / dt


class Spy:
    """Records the (field, shard) objects each read touches."""

    def __init__(self, store: es.Store) -> None:
        self.touched: set[tuple[str, int]] = set()
        reader = store.reader
        orig = reader.read
        S = store.layout.shard_rows

        def read(name, rows, steps, out):
            self.touched.update((name, int(s)) for s in np.unique(np.asarray(rows) // S))
            return orig(name, rows, steps, out)

        reader.read = read


def measure(url: str, so: dict | None, proxy: TcpProxy | None, bs: int, seconds: float,
            seed: int, max_gap: int | None = None) -> dict[str, Any]:
    """Cold first batch, then warm batches for ``seconds``: per-batch counters and rate."""
    store = es.open(url, storage_options=so)
    spy = Spy(store)
    sampler = es.UniformSampler(store, seed=seed)
    out: dict[str, Any] = {}
    if proxy is not None:
        proxy.reset_count()
    sampler.sample(bs)
    if proxy is not None and max_gap is None:
        out["cold_requests"] = proxy.requests
        out["cold_objects"] = len(spy.touched)
    sampler.sample(4096)  # warm-up: every shard header and scalar chunk cached
    if max_gap is not None:
        store.backend.max_gap = max_gap
    reqs, objs, frame_objs, nbytes, times = [], [], [], [], []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < 3:
        spy.touched.clear()
        if proxy is not None:
            proxy.reset_count()
        t0 = time.perf_counter()
        sampler.sample(bs)
        times.append(time.perf_counter() - t0)
        if proxy is not None:
            reqs.append(proxy.requests)
            nbytes.append(proxy.bytes_down)
        objs.append(len(spy.touched))
        frame_objs.append(sum(1 for n, _ in spy.touched if n == "obs"))
    out.update(batches=len(times), tps=bs * len(times) / sum(times),
               ms_per_batch=1e3 * statistics.median(times),
               objects=statistics.mean(objs), frame_shards=statistics.mean(frame_objs))
    if proxy is not None:
        out.update(requests=statistics.mean(reqs), max_requests=max(reqs),
                   over_objects=sum(r > o for r, o in zip(reqs, objs)),
                   kb_per_batch=statistics.mean(nbytes) / 1024)
    store.close()
    return out


def med(runs: list[dict], key: str) -> float:
    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals) if vals else float("nan")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="frames (default 20000)")
    ap.add_argument("--game", default="Pong")
    ap.add_argument("--shard-rows", type=int, default=1024)
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print, do not touch RESULTS.md")
    args = ap.parse_args(argv)

    load_before = os.getloadavg()[0]
    data = load_atari_frames(args.n, args.game)
    results: dict[str, Any] = {"args": vars(args), "source": data["source"],
                               "env_id": data.get("env_id")}
    with tempfile.TemporaryDirectory() as tmp, MotoServer() as moto:
        moto.create_bucket("bench")
        with TcpProxy(moto.port) as proxy:
            so = proxy.storage_options
            s3_url = "s3://bench/pong.zarr"
            local_url = str(Path(tmp) / "pong.zarr")
            _, results["write_tps_local"] = fill(local_url, data, args.shard_rows, None)
            proxy.reset_count()
            _, results["write_tps_s3"] = fill(s3_url, data, args.shard_rows, so)
            results["write_requests_s3"] = proxy.reset_count()
            rows = []
            for bs in args.batch:
                runs: dict[str, list[dict]] = {"local": [], "s3": [], "s3_uncoalesced": []}
                for rep in range(args.repeats):
                    runs["local"].append(measure(local_url, None, None, bs, args.seconds, rep))
                    runs["s3"].append(measure(s3_url, so, proxy, bs, args.seconds, rep))
                    runs["s3_uncoalesced"].append(
                        measure(s3_url, so, proxy, bs, args.seconds / 2, rep, max_gap=-1))
                results[f"bs{bs}"] = runs
                for case in ("local", "s3", "s3_uncoalesced"):
                    r = runs[case]
                    rows.append({
                        "case": case, "batch": bs,
                        "transitions/s": med(r, "tps"),
                        "vs local": med(r, "tps") / med(runs["local"], "tps"),
                        "ms/batch": med(r, "ms_per_batch"),
                        "requests/batch": med(r, "requests"),
                        "shard objects touched": med(r, "objects"),
                        "frame shards": med(r, "frame_shards"),
                        "batches with requests > objects": sum(x.get("over_objects", 0)
                                                               for x in r),
                        "KiB/batch": med(r, "kb_per_batch"),
                        "cold requests": med(r, "cold_requests"),
                        "cold objects": med(r, "cold_objects"),
                    })
    results["rows"] = rows
    cols = ["case", "batch", "transitions/s", "vs local", "ms/batch", "requests/batch",
            "shard objects touched", "frame shards", "batches with requests > objects",
            "KiB/batch", "cold requests", "cold objects"]
    table = markdown_table(rows, cols)
    body = (
        f"{table}\n\n"
        f"Writes (extend + flush, 1000-step batches): local {results['write_tps_local']:,.0f}"
        f" tr/s, S3 {results['write_tps_s3']:,.0f} tr/s "
        f"({results['write_requests_s3']} requests for {args.n:,} frames).\n\n"
        "Medians of repeats; requests/batch etc. are means over the batches of one repeat. "
        "S3 = `python -m moto.server` on loopback behind a counting TCP proxy (every HTTP "
        "request counted on the wire; moto closes each connection, so each request also "
        "pays a TCP connect). Local = the same store on local disk, warm page cache. "
        "Warm = after one 4096-sample batch: shard headers and the scalar fields' chunks "
        "are cached per reader, so a batch costs one ranged GET per frame shard touched "
        "(ranges of one object merged, `max_gap` 2 MiB); `s3_uncoalesced` sets "
        "`max_gap=-1` (one GET per frame). Cold = the first batch of a fresh reader "
        "(header GETs for every shard object touched, then data GETs). Absolute S3 rates "
        "measure moto (a Python server sharing the client's CPUs), not AWS; load average "
        "before/after the run is listed above (other jobs share this machine).")
    print(table)
    if not args.no_write:
        load = f"{load_before:.1f} / {os.getloadavg()[0]:.1f} (1-min, before / after)"
        results["load_average"] = load
        write_section("S3 object storage", body, command=command_line(),
                      source=f"{results['source']} ({results['env_id']}): {args.n:,} frames",
                      extra={"load average": load})
        save_json("s3", results)
    return results


if __name__ == "__main__":
    main()
