"""Ape-X topology on Ray: N Ray actors each own one lane of one store, a learner samples
prioritized batches across all lanes and feeds priorities back; actors are killed and
restarted by Ray mid-run, and nothing committed is lost.

Run on a local Ray cluster with a local S3 server it starts itself (moto)::

    python scripts/apex_ray.py                              # 4 actors, S3 (moto)
    python scripts/apex_ray.py --actors 2 --store local     # one store on local disk
    python scripts/apex_ray.py --url s3://bucket/run.zarr --endpoint https://...  # real S3

Actors (``expstore.testing.ray_actors.LaneActor``) write deterministic rows (every byte
derives from lane, step and writer session) so the learner checks each sample it draws.
Every ``--kill-every`` seconds one actor is killed (``ray.kill(..., no_restart=False)``);
Ray restarts it, its new process takes the lane's lease over and resumes at the lane's
last committed row. At the end every committed row of every lane is checked byte for
byte, and each lane must hold at least the rows the learner saw committed before any
kill. Prints one JSON line: rows per lane, samples checked, kills, restarts, rates.
On a real cluster, pass ``--address auto`` and an S3 URL every host can reach.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import expstore as es  # noqa: E402
from expstore.storage.format import read_state  # noqa: E402
from expstore.testing import data  # noqa: E402
from expstore.testing.ray_actors import LaneActor, learn  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--store", choices=("s3", "local"), default="s3")
    ap.add_argument("--url", help="store URL (default: a moto bucket or a temp folder)")
    ap.add_argument("--endpoint", help="S3 endpoint URL for --url")
    ap.add_argument("--address", help="Ray cluster address (default: a local cluster)")
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0, help="run time")
    ap.add_argument("--kill-every", type=float, default=6.0, help="seconds between kills")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lane-capacity", type=int, default=4096)
    args = ap.parse_args(argv)

    import ray

    moto = None
    tmp = tempfile.mkdtemp(prefix="apex-ray-")
    so: dict | None = None
    if args.url:
        url = args.url
        so = {"endpoint_url": args.endpoint} if args.endpoint else None
    elif args.store == "s3":
        from expstore.testing import MotoServer

        moto = MotoServer().start()
        moto.create_bucket("apex")
        url, so = "s3://apex/run.zarr", moto.storage_options
    else:
        url = os.path.join(tmp, "run.zarr")
    lanes = args.actors
    es.create(url, data.spec(), capacity=lanes * args.lane_capacity, lanes=lanes,
              shard_rows=min(512, args.lane_capacity // 4), storage_options=so,
              overwrite=True).close()
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    Actor = ray.remote(num_cpus=args.num_cpus / (lanes + 1), max_restarts=-1,
                       max_task_retries=0)(LaneActor)
    actors = [Actor.remote(url, lane, so) for lane in range(lanes)]
    t0 = time.monotonic()
    running = {lane: actors[lane].write.remote(10**9, per=20, flush_every=1, pause=0.01)
               for lane in range(lanes)}
    reader = es.open(url, storage_options=so)
    starts: dict[int, set[int]] = {lane: {0} for lane in range(lanes)}
    floor = [0] * lanes  # rows seen committed before the latest kill of each lane
    kills = samples = 0
    next_kill = t0 + args.kill_every
    while time.monotonic() - t0 < args.seconds:
        got = learn(url, so, batches=5, batch_size=args.batch, seed=kills)
        samples += got["samples"]
        if time.monotonic() >= next_kill:
            lane = kills % lanes
            floor[lane] = read_state(reader.backend, lane).count  # committed (not staged)
            ray.kill(actors[lane], no_restart=False)
            kills += 1
            next_kill += args.kill_every
            while True:  # Ray restarts it; its __init__ resumes at the last commit
                try:
                    info = ray.get(actors[lane].info.remote(), timeout=120)
                    break
                except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
                    time.sleep(0.5)
            if info["start"] < floor[lane]:
                raise AssertionError(f"lane {lane}: restarted at {info['start']} but "
                                     f"{floor[lane]} rows were committed before the kill")
            starts[lane].add(info["start"])
            running[lane] = actors[lane].write.remote(10**9, per=20, flush_every=1,
                                                      pause=0.01)
    for a in actors:
        ray.kill(a, no_restart=True)
    elapsed = time.monotonic() - t0
    reader.close()
    store = es.open(url, storage_options=so)
    rows = [data.check_lane(store, lane, starts=starts[lane]) for lane in range(lanes)]
    counts = [int(c) for c in store.index.count]
    store.close()
    for lane in range(lanes):
        if counts[lane] < floor[lane]:
            raise AssertionError(f"lane {lane}: {floor[lane]} rows committed before a kill, "
                                 f"{counts[lane]} now: data lost")
    ray.shutdown()
    if moto is not None:
        moto.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    out = {"url": url, "actors": lanes, "seconds": round(elapsed, 1), "kills": kills,
           "rows_checked": rows, "committed": counts, "samples_checked": samples,
           "rows_per_s": round(sum(counts) / elapsed, 1)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
