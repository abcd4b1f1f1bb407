"""Memory of a process sampling from a 10M-row image store (target: RSS < 1.5 GB).

Usage (from the repository root)::

    python benchmarks/bench_rss.py                 # 10M rows, ~3 GB on disk under ./.bench_rss
    python benchmarks/bench_rss.py --rows 2000000 --keep

Filling 10M rows through ``store.extend`` takes minutes of encoding, so the store is built
shard by shard from one template: 4096 real Atari frames are encoded once and every shard
reuses those chunk bytes with its own header, step ids and episode metadata; the result is a
complete, valid store (``expstore verify`` and plain zarr read it) whose content repeats every
4096 rows. The measured processes then open it as users do and sample stacked batches;
each reports its peak RSS (``ru_maxrss``). Section "Memory (10M rows)" of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import expstore as es  # noqa: E402
from benchmarks.expstore_case import spec_for_frames  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402
from expstore.rows import FLAG_FIRST, FLAG_LAST  # noqa: E402
from expstore.storage import LaneState, write_state  # noqa: E402
from expstore.storage.shard import assemble  # noqa: E402  (internals: shard bytes by hand)


def build(path: Path, rows: int, episode_len: int = 800) -> es.Store:
    """A ``rows``-row store filled from one encoded template shard (see module doc)."""
    store = es.create(path, spec_for_frames(), capacity=rows, overwrite=True, fsync=False)
    L = store.layout
    S = L.shard_rows
    frames = load_atari_frames(S)["frames"]
    enc = {n: L.codec(n) for n in L.fields}
    obs_chunks = [enc["obs"].encode(np.ascontiguousarray(frames[i : i + 1])) for i in range(S)]

    def one_chunk(name: str, values: np.ndarray) -> list[bytes]:
        return [enc[name].encode(np.ascontiguousarray(values.astype(L.fields[name].dtype)))]

    pos = np.arange(S) % episode_len
    flags = np.where(pos == 0, FLAG_FIRST, 0).astype(np.uint8)
    flags[pos == episode_len - 1] |= FLAG_LAST
    statics = {
        "action": one_chunk("action", np.arange(S) % 6),
        "reward": one_chunk("reward", (np.arange(S) % 21 == 0).astype(np.float32)),
        "terminated": one_chunk("terminated", pos == episode_len - 2),
        "truncated": one_chunk("truncated", np.zeros(S, bool)),
        "_episode_step": one_chunk("_episode_step", pos),
        "_flags": one_chunk("_flags", flags),
    }
    t0 = time.perf_counter()
    n_shards = L.capacity // S
    for shard in range(n_shards):
        first = shard * S
        store.backend.put(L.shard_key("obs", shard), assemble(obs_chunks, first, S))
        for name, chunks in statics.items():
            store.backend.put(L.shard_key(name, shard), assemble(chunks, first, S))
        steps = one_chunk("_step_id", np.arange(first, first + S))
        store.backend.put(L.shard_key("_step_id", shard), assemble(steps, first, S))
        if shard % 200 == 0:
            print(f"  shard {shard}/{n_shards} ({time.perf_counter() - t0:.0f} s)", flush=True)
    write_state(store.backend, LaneState(0, count=L.capacity, valid_from=0,
                                         episodes=L.capacity // episode_len))
    return store


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
    a = p.parse_args()
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
