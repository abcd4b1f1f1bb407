"""Scale: 1, 2, 4 and 8 writer processes appending into one store (one lane each) while a
learner samples it, on local disk and on S3 (moto behind a 20 ms-per-request proxy); and
the cost of a learner's ``refresh()`` as lanes grow.

Usage (from the repository root)::

    python benchmarks/bench_scale.py                                  # local + S3, 20 ms
    python benchmarks/bench_scale.py --writers 1 2 4 8 --seconds 6 --lanes 1 8 32 128 256

**Appends**: each writer process (spawned) opens its lane (``es.open(url, "r+",
lane=i)``) and calls ``store.add`` with real 84x84 Pong frames for ``--seconds``
seconds, then flushes; the rate is the rows all writers committed over the time from the
common start to the last writer's final flush. **Samples**: meanwhile the learner (this
process) draws uniform batches of 32 stacked transitions with ``store.sample`` and calls
``refresh()`` every 0.5 s. **refresh()**: a store of L lanes, each with a committed
shard; one learner's ``refresh()`` (reads every lane's state: one concurrent GET each on
S3) timed over ``--refresh-repeats`` calls, with the HTTP requests it sends.
Writes section "Scale" of benchmarks/RESULTS.md and results/scale.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import expstore as es  # noqa: E402
from benchmarks.expstore_case import spec_for_frames  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402
from expstore.errors import NotEnoughData  # noqa: E402
from expstore.testing import MotoServer, scratch_dir  # noqa: E402
from expstore.testing.latency_proxy import LatencyProxy  # noqa: E402

FRAMES = 20000


def writer(url: str, so: dict | None, lane: int, seconds: float, ready: Any, go: Any,
           out: Any) -> None:
    data = load_atari_frames(FRAMES, "Pong", workers=1, mmap=True)
    fr = np.asarray(data["frames"][:2001])
    act, rew = np.asarray(data["actions"][:2000]), np.asarray(data["rewards"][:2000])
    store = es.open(url, "r+", lane=lane, storage_options=so)
    ready.set()
    go.wait()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(100):
            i = n % 2000
            store.add(fr[i], act[i], rew[i], fr[i + 1], False, i == 1999, lane=lane)
            n += 1
    store.flush()
    out.put((lane, n, time.perf_counter()))
    store.close()


def run_writers(url: str, so: dict | None, procs: int, seconds: float, shard_rows: int,
                together: bool = True) -> dict[str, float]:
    """``procs`` writer processes and a learner sampling meanwhile; ``together``: the
    learner's reader opens a new shard's heads of all fields in one round trip."""
    es.create(url, spec_for_frames(), capacity=procs * 16 * shard_rows, lanes=procs,
              shard_rows=shard_rows, storage_options=so, overwrite=True).close()
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    readies = [ctx.Event() for _ in range(procs)]
    ps = [ctx.Process(target=writer, args=(url, so, i, seconds, readies[i], go, out))
          for i in range(procs)]
    for p in ps:
        p.start()
    for r in readies:
        if not r.wait(300):
            raise RuntimeError("a writer process did not start")
    learner = es.open(url, storage_options=so)
    learner.reader.open_fields_together = together
    go.set()
    t0 = time.perf_counter()
    batches, last = 0, 0.0
    sample_time = 0.0
    ends = []
    while len(ends) < procs:
        now = time.perf_counter()
        if now - last > 0.5:
            learner.refresh()
            last = now
        if int(learner.index.count.sum()) >= 64:
            s0 = time.perf_counter()
            try:
                learner.sample(32)
                batches += 1
                sample_time += time.perf_counter() - s0
            except NotEnoughData:
                time.sleep(0.01)
        else:
            time.sleep(0.05)
        while not out.empty():
            ends.append(out.get())
    for p in ps:
        p.join(60)
    rows = sum(n for _, n, _ in ends)
    dt = max(t for _, _, t in ends) - t0
    learner.close()
    requests = dict(learner.backend.requests) if so is not None else {}
    return {"append_tps": rows / dt, "rows": rows, "learner_requests": requests,
            "sample_bps": batches / max(dt, 1e-9), "batches": batches,
            "sample_ms": 1e3 * sample_time / max(batches, 1)}


def run_refresh(url: str, so: dict | None, lanes: int, repeats: int,
                proxy: LatencyProxy | None) -> dict[str, float]:
    """Median seconds and requests of ``refresh()`` on a store of ``lanes`` lanes."""
    shard = 64
    w = es.create(url, spec_for_frames(), capacity=lanes * 2 * shard, lanes=lanes,
                  shard_rows=shard, storage_options=so, overwrite=True, lease_ttl=None)
    frame = np.zeros((84, 84), np.uint8)
    for lane in range(lanes):
        for t in range(4):
            w.add(frame, 0, 0.0, frame, False, t == 3, lane=lane)
    w.flush()
    learner = es.open(url, storage_options=so)
    times, reqs = [], []
    for _ in range(repeats):
        if proxy is not None:
            proxy.reset_count()
        t0 = time.perf_counter()
        learner.refresh()
        times.append(time.perf_counter() - t0)
        if proxy is not None:
            reqs.append(proxy.requests)
    learner.close()
    w.close()
    out = {"refresh_ms": 1e3 * statistics.median(times)}
    if reqs:
        out["requests"] = statistics.median(reqs)
    return out


def heads_ab(args: argparse.Namespace, load_before: float) -> dict:
    """ms per ``sample(32)`` on S3 with one writer: field heads opened one field at a time
    (baseline) vs together, alternating, medians of ``args.heads_ab`` runs each."""
    ms: dict[bool, list[float]] = {False: [], True: []}
    with MotoServer() as moto:
        moto.create_bucket("scale")
        with LatencyProxy(moto.port, delay=args.delay, lifetime=3600) as proxy:
            for i in range(args.heads_ab):
                for together in (False, True):
                    r = run_writers(f"s3://scale/ab{i}{int(together)}.zarr",
                                    proxy.storage_options, 1, args.seconds, args.shard_rows,
                                    together)
                    ms[together].append(r["sample_ms"])
                    print(f"together={together}: {r['sample_ms']:.0f} ms per sample(32), "
                          f"{r['batches']} batches, learner requests {r['learner_requests']}")
    sep, tog = statistics.median(ms[False]), statistics.median(ms[True])
    out = {"separate_ms": sep, "together_ms": tog, "speedup": sep / tog, "runs": ms,
           "load_average": f"{load_before:.1f} / {os.getloadavg()[0]:.1f}"}
    print(f"median ms per sample(32): one field at a time {sep:.0f}, together {tog:.0f}, "
          f"x{sep / tog:.2f}; load average {out['load_average']} (1-min, before / after)")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    ap.add_argument("--seconds", type=float, default=5.0, help="append time per run")
    ap.add_argument("--shard-rows", type=int, default=1024)
    ap.add_argument("--delay", type=float, default=0.020, help="seconds per S3 request")
    ap.add_argument("--refresh-repeats", type=int, default=9)
    ap.add_argument("--skip-s3", action="store_true")
    ap.add_argument("--heads-ab", type=int, default=0, metavar="REPEATS",
                    help="only: S3, 1 writer, the learner opening a new shard's field heads "
                    "one field at a time vs together, alternating REPEATS times; prints "
                    "medians and their ratio")
    ap.add_argument("--no-write", action="store_true", help="print, do not touch RESULTS.md")
    args = ap.parse_args(argv)

    load_before = os.getloadavg()[0]
    load_atari_frames(FRAMES, "Pong", workers=1)  # cached for the writer processes
    if args.heads_ab:
        return heads_ab(args, load_before)
    results: dict[str, Any] = {"args": vars(args)}
    wrows, rrows = [], []
    with scratch_dir() as tmp, MotoServer() as moto:
        moto.create_bucket("scale")
        with LatencyProxy(moto.port, delay=args.delay, lifetime=3600) as proxy:
            targets = [("local", None, None)]
            if not args.skip_s3:
                targets.append(("s3", proxy.storage_options, proxy))
            for where, so, px in targets:
                for p in args.writers:
                    url = (os.path.join(tmp, f"w{p}.zarr") if so is None
                           else f"s3://scale/w{p}.zarr")
                    r = run_writers(url, so, p, args.seconds, args.shard_rows)
                    results[f"writers_{where}_{p}"] = r
                    wrows.append({"store": where, "writer processes": p,
                                  "append transitions/s": r["append_tps"],
                                  "per writer": r["append_tps"] / p,
                                  "learner batches/s": r["sample_bps"],
                                  "ms per sample(32)": r["sample_ms"]})
                for lanes in args.lanes:
                    url = (os.path.join(tmp, f"r{lanes}.zarr") if so is None
                           else f"s3://scale/r{lanes}.zarr")
                    r = run_refresh(url, so, lanes, args.refresh_repeats, px)
                    results[f"refresh_{where}_{lanes}"] = r
                    rrows.append({"store": where, "lanes": lanes,
                                  "refresh() ms": r["refresh_ms"],
                                  "requests": r.get("requests", float("nan"))})
    results["writer_rows"], results["refresh_rows"] = wrows, rrows
    wt, rt = markdown_table(wrows), markdown_table(rrows)
    ms = args.delay * 1e3
    body = (
        f"Writers (one lane each, `store.add` of 84x84 Pong frames, {args.seconds:g} s, "
        f"{args.shard_rows}-row shards) and a learner sampling uniform batches of 32 "
        f"meanwhile (refresh every 0.5 s). S3 = moto behind a {ms:.0f} ms-per-request "
        f"proxy; every process is on this machine, so the rates share its CPUs.\n\n{wt}\n\n"
        f"A learner's `refresh()` as lanes grow (one committed shard per lane):\n\n{rt}\n")
    print(wt)
    print(rt)
    if not args.no_write:
        load = f"{load_before:.1f} / {os.getloadavg()[0]:.1f} (1-min, before / after)"
        results["load_average"] = load
        write_section("Scale", body, command=command_line(),
                      source=f"Pong frames ({FRAMES:,} cached)", extra={"load average": load})
        save_json("scale", results)
    return results


if __name__ == "__main__":
    main()
