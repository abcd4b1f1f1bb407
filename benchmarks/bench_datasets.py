"""Dopamine checkpoint import: frames/s and peak RSS, against loading the file with numpy.

Usage (from the repository root)::

    python benchmarks/bench_datasets.py                     # 1M frames, 3 repeats
    python benchmarks/bench_datasets.py --frames 200000 --repeats 1
    python benchmarks/bench_datasets.py --profile --frames 100000   # where the time goes

Builds a Dopamine checkpoint (``$store$_*_ckpt.0.gz`` + siblings, gzip level 9 like
Dopamine's ``save()``) from real preprocessed ALE frames (``benchmarks/frames.py``; the
source episodes are laid out with Dopamine's zero padding and repeated to ``--frames``
rows; the observation file repeats one compressed gzip member). Then, each in a fresh
child process (peak RSS = the child's ``ru_maxrss``):

* ``np.load(gzip.open(...))``: Dopamine's own ``load()`` of the observation file (baseline);
* ``inflate only``: the streamed reader alone (:class:`NpyGzipReader`, 1024-row blocks);
* ``store append only``: ``Store.extend`` of frames already in RAM (no gzip), per codec;
* ``import_dopamine``: the full import, per codec (lz4hc-5 is the store's image default).

Peak RSS is the child's ``ru_maxrss``; children are started through ``/bin/sh`` so that it
does not inherit this process's high-water mark (Linux keeps it across ``exec``).

Writes section "Datasets: Dopamine import" of benchmarks/RESULTS.md and
benchmarks/results/datasets.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CODECS = {"lz4hc-5": {"name": "blosc", "cname": "lz4hc", "clevel": 5},
          "lz4-1": {"name": "blosc", "cname": "lz4", "clevel": 1}}
STACK = 4

CHILD = {  # each body sets t0 after its imports and `frames` (rows processed)
    "np.load(gzip.open)": """
        import gzip, numpy as np
        t0 = time.perf_counter()
        with open(PATH, "rb") as f, gzip.GzipFile(fileobj=f) as g:
            arr = np.load(g, allow_pickle=False)
        frames = len(arr)
    """,
    "inflate only": """
        import numpy as np
        from expstore.datasets.npy_gzip import NpyGzipReader  # internals: the .npy.gz reader
        t0 = time.perf_counter()
        with NpyGzipReader(PATH) as r:
            while r.pos < r.rows:
                r.read(1024)
            r.check_end()
            frames = r.rows
    """,
    "store append only": """
        import numpy as np, expstore as es
        from expstore.datasets.dopamine import inspect_checkpoint, dopamine_spec  # dopamine's face
        spec = dopamine_spec(inspect_checkpoint(DIR, 0), 4, None, CODEC)
        src = np.load(DIR + "/frames.npy", mmap_mode="r")  # raw frames (page cache)
        t0 = time.perf_counter()
        st = es.create(URL, spec, capacity=len(src) + 8192, fsync=False)
        for a in range(0, len(src), 1024):
            T = min(a + 1024, len(src)) - a
            st.extend({"obs": np.array(src[a:a + T]), "action": np.zeros(T, np.int64),
                       "reward": np.zeros(T, np.float32), "terminated": np.zeros(T, bool),
                       "truncated": np.zeros(T, bool)})
        st.close()
        frames = len(src)
    """,
    "import_dopamine": """
        from expstore.datasets import import_dopamine
        t0 = time.perf_counter()
        import_dopamine(DIR, URL, codec=CODEC)
        frames = json.loads(open(DIR + "/meta.json").read())["frames"]
    """,
}


def run_child(case: str, env: dict[str, Any]) -> dict[str, float]:
    """Run one case in a fresh interpreter; returns seconds, frames/s, peak RSS (MB)."""
    body = textwrap.dedent(CHILD[case])
    head = "".join(f"{k} = {v!r}\n" for k, v in env.items())
    code = (f"import json, resource, time\n{head}{body}\n"
            "dt = time.perf_counter() - t0\n"
            "print(json.dumps({'seconds': dt, 'frames': frames, 'maxrss_mb': "
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))\n")
    # via sh: a child forked straight from this (large) process would inherit its RSS
    # high-water mark in ru_maxrss across exec
    res = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", sys.executable, "-c", code],
                         capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        raise RuntimeError(f"{case}: {res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["fps"] = out["frames"] / out["seconds"]
    return out


def build_checkpoint(d: Path, frames: int, source: dict[str, Any], level: int) -> dict:
    """A Dopamine checkpoint of exactly ``frames`` rows built from real episodes."""
    f = source["frames"]
    start = np.flatnonzero(source["episode_start"])
    ends = np.append(start[1:], len(f))
    rows, acts, rews, terms = [], [], [], []
    for s, e in zip(start, ends):
        steps = np.arange(s, e - 1)  # frame e-1 is the final observation: not stored
        if len(steps) == 0:
            continue
        rows += [-1] * (STACK - 1) + steps.tolist()
        acts += [0] * (STACK - 1) + source["actions"][steps].tolist()
        rews += [0.0] * (STACK - 1) + source["rewards"][steps].tolist()
        terms += [0] * (STACK - 1 + len(steps) - 1) + [1]
    block = len(rows)
    reps = max(1, -(-frames // block))
    cap = block * reps
    idx = np.asarray(rows)
    base = np.zeros((block, 84, 84), np.uint8)
    base[idx >= 0] = f[idx[idx >= 0]]
    from expstore.datasets.npy_gzip import npy_header  # internals: the .npy.gz codec

    member = gzip.compress(base.tobytes(), level)
    with open(d / "$store$_observation_ckpt.0.gz", "wb") as out:
        out.write(gzip.compress(npy_header((cap, 84, 84), np.uint8), level))
        for _ in range(reps):
            out.write(member)
    np.save(d / "frames.npy", np.tile(base, (min(reps, max(1, 200_000 // block)), 1, 1)))
    arrays = {"$store$_action": np.tile(np.asarray(acts, np.int32), reps),
              "$store$_reward": np.tile(np.asarray(rews, np.float32), reps),
              "$store$_terminal": np.tile(np.asarray(terms, np.uint8), reps),
              "add_count": np.array(cap),
              "invalid_range": np.array([(0 - 1 + i) % cap for i in range(STACK + 1)])}
    for name, arr in arrays.items():
        with open(d / f"{name}_ckpt.0.gz", "wb") as fh, \
                gzip.GzipFile(fileobj=fh, mode="wb", compresslevel=level) as g:
            np.save(g, arr, allow_pickle=False)
    meta = {"frames": cap, "block": block, "repeats": reps,
            "gz_bytes": os.path.getsize(d / "$store$_observation_ckpt.0.gz")}
    (d / "meta.json").write_text(json.dumps(meta))
    return meta


PROFILE_CHILD = """
import cProfile, io, json, pstats, time
import numpy as np
from numcodecs import blosc
import expstore as es
from expstore.datasets import import_dopamine
from expstore.storage.format import Layout
out = {"encode_us": {}, "top": []}
frames = np.ascontiguousarray(np.load(DIR + "/frames.npy", mmap_mode="r")[:2048])
for name, cfg in CODECS.items():  # one frame per call, as the writer encodes image rows
    spec = es.Spec.create(obs=es.Field((84, 84), np.uint8, codec=cfg), action=es.Field(()))
    codec = Layout(spec, 8192, 1, 4096).codec("obs")
    cn = cfg["cname"].encode()
    def wrapped():
        for i in range(len(frames)):
            codec.encode(np.ascontiguousarray(frames[i:i + 1]))
    def direct():
        for i in range(len(frames)):
            blosc.compress(frames[i], cn, cfg["clevel"], 0, 0)
    for fn in (wrapped, direct):
        ts = []
        for _ in range(5):
            t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
        out["encode_us"][f"{name} {fn.__name__}"] = min(ts) / len(frames) * 1e6
prof = cProfile.Profile()
t0 = time.perf_counter()
prof.runcall(import_dopamine, DIR, URL, codec=CODECS["lz4hc-5"])
out["seconds"] = time.perf_counter() - t0
st = pstats.Stats(prof)
total = sum(v[2] for v in st.stats.values())
rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:8]
for (f, line, fn), v in rows:
    out["top"].append({"function": f"{f.split('/')[-1]}:{line}({fn})", "calls": v[1],
                       "tottime_s": v[2], "share": v[2] / total})
print(json.dumps(out))
"""


def _load() -> str:
    """1-minute load average (this machine is shared: it explains noisy rates)."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def profile(args: argparse.Namespace, source: dict[str, Any]) -> None:
    """Where the main thread's time goes in an import (cProfile) + per-frame encode cost."""
    load0 = _load()
    scratch = Path(tempfile.mkdtemp(prefix="bench_datasets_", dir=args.scratch))
    try:
        ck = scratch / "ck"
        ck.mkdir()
        meta = build_checkpoint(ck, args.frames, source, args.level)
        code = f"DIR = {str(ck)!r}\nURL = {str(scratch / 's.zarr')!r}\nCODECS = {CODECS!r}\n"
        res = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", sys.executable, "-c",
                              code + PROFILE_CHILD], capture_output=True, text=True, cwd=ROOT)
        if res.returncode:
            raise RuntimeError(res.stderr[-2000:])
        out = json.loads(res.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    save_json("datasets_profile", {"args": vars(args), "checkpoint": meta, **out})
    enc = [{"codec": k.split()[0], "call": k.split()[1], "us_per_frame": v}
           for k, v in out["encode_us"].items()]
    body = (f"Main-thread cProfile of `import_dopamine` (lz4hc-5) of {meta['frames']:,} frames "
            f"({out['seconds']:.1f} s under the profiler; gzip inflate runs in the prefetch "
            "thread and is not in this profile), top functions by own time:\n\n"
            + markdown_table(out["top"], ["function", "calls", "tottime_s", "share"])
            + "\n\nPer-frame encode cost of one 84x84 frame (min of 5 x 2048 frames): "
            "`wrapped` = `Layout.codec(name).encode` (numcodecs Blosc + crc32c wrapper, what "
            "the writer called before `storage.format.shard.encoder`), `direct` = "
            "`numcodecs.blosc.compress` called directly (what `shard.encoder` does):\n\n"
            + markdown_table(enc, ["codec", "call", "us_per_frame"]))
    if not args.no_write:
        write_section("Datasets: Dopamine import profile", body, command=command_line(),
                      extra={"load average (1 min) at start / end": f"{load0} / {_load()}"})
    print(body)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=1_000_000, help="checkpoint rows")
    p.add_argument("--source-frames", type=int, default=50_000, help="real ALE frames used")
    p.add_argument("--game", default="Pong")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--level", type=int, default=9, help="gzip level of the checkpoint")
    p.add_argument("--codecs", nargs="+", default=list(CODECS), choices=list(CODECS))
    p.add_argument("--scratch", default=None, help="folder for the files (default: tmp)")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    p.add_argument("--profile", action="store_true",
                   help="profile the append path instead (own RESULTS.md section)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    source = load_atari_frames(args.source_frames, game=args.game)
    load0 = _load()
    if args.profile:
        profile(args, source)
        return {}
    scratch = Path(tempfile.mkdtemp(prefix="bench_datasets_", dir=args.scratch))
    try:
        ck = scratch / "ck"
        ck.mkdir()
        meta = build_checkpoint(ck, args.frames, source, args.level)
        print(f"checkpoint: {meta}", flush=True)
        env = {"PATH": str(ck / "$store$_observation_ckpt.0.gz"), "DIR": str(ck)}
        cases = [("np.load(gzip.open)", "", {})]
        cases += [("inflate only", "", {})]
        cases += [("store append only", name, {"CODEC": CODECS[name]}) for name in args.codecs]
        cases += [("import_dopamine", name, {"CODEC": CODECS[name]}) for name in args.codecs]
        results = []
        for case, codec, extra in cases:
            runs = []
            for _ in range(args.repeats):
                url = scratch / "s.zarr"
                shutil.rmtree(url, ignore_errors=True)
                runs.append(run_child(case, {**env, **extra, "URL": str(url)}))
                print(f"{case} {codec}: {runs[-1]}", flush=True)
            results.append({"case": case, "codec": codec,
                            "frames": int(runs[0]["frames"]),
                            "fps": statistics.median(r["fps"] for r in runs),
                            "seconds": statistics.median(r["seconds"] for r in runs),
                            "maxrss_mb": statistics.median(r["maxrss_mb"] for r in runs),
                            "runs": runs})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = results[0]
    for r in results:
        r["fps_vs_np_load"] = r["fps"] / base["fps"]
        r["rss_vs_np_load"] = r["maxrss_mb"] / base["maxrss_mb"]
    out = {"args": vars(args), "checkpoint": meta, "results": results}
    save_json("datasets", out)
    table = markdown_table(results, ["case", "codec", "frames", "fps", "maxrss_mb",
                                     "fps_vs_np_load", "rss_vs_np_load"],
                           {"fps": "frames/s", "maxrss_mb": "peak RSS (MB)",
                            "fps_vs_np_load": "rate vs np.load",
                            "rss_vs_np_load": "RSS vs np.load"})
    body = (f"{table}\n\nMedians of {args.repeats} run(s), each a fresh process (peak RSS = "
            "its ru_maxrss, incl. ~230 MB of imports: `import expstore` loads torch). "
            f"Checkpoint: {meta['frames']:,} rows (84x84 uint8), {meta['block']:,}-row block "
            f"of real episodes with Dopamine's padding repeated {meta['repeats']}x, "
            f"observation file {meta['gz_bytes'] / 1e6:,.1f} MB at gzip level {args.level}. "
            "'store append only' extends a store from frames already in RAM (up to 200k "
            "frames read from a memory-mapped .npy, whose pages count in its RSS), so it "
            "measures the store's append path without gzip; 'inflate only' streams the "
            "observation file through NpyGzipReader. Target was >= 50k frames/s at < 500 MB.")
    if not args.no_write:
        write_section("Datasets: Dopamine import", body, command=command_line(),
                      source=f"{source.get('env_id')} ({source.get('source')}), "
                             f"{args.source_frames:,} frames",
                      extra={"load average (1 min) at start / end": f"{load0} / {_load()}"})
    print(body)
    return out


if __name__ == "__main__":
    main()
