"""Whole-run Dopamine import (several checkpoints): frames/s and peak RSS of the process
tree, against ``np.load(gzip.open)`` of the same files in the same run.

Usage (from the repository root)::

    python benchmarks/bench_dopamine_run.py                  # 4 x 100k frames, 3 repeats
    python benchmarks/bench_dopamine_run.py --checkpoints 2 --frames 50000 --repeats 1
    python benchmarks/bench_dopamine_run.py --s3             # also from a bucket (moto)

Builds one Dopamine run: checkpoints ``0..N-1`` in Dopamine's layout
(``$store$_observation_ckpt.N.gz`` + siblings, gzip level 9 like Dopamine's ``save()``) of
real preprocessed ALE frames (``benchmarks/frames.py``, laid out with Dopamine's zero
padding by ``bench_datasets.build_checkpoint``). Checkpoint 0 is exactly full; the later
ones are wrapped rings (``add_count > capacity``, oldest row at ``3000 * N``) as in a real
run, so their import reads the rows before the cursor twice. Then, each case in a fresh
process started through ``/bin/sh`` (so it does not inherit this process's RSS
high-water mark):

* ``np.load(gzip.open)``: Dopamine's own ``load()`` of each observation file, in turn
  (the baseline: what TorchRL's importer and every gunzip-to-memmap script do);
* ``import_dopamine``: the whole run into one store (one lane per checkpoint), with
  ``workers`` processes (default: one per core) and isal, then without isal (zlib),
  then in one process;
* with ``--s3``: ``import_dopamine`` from ``s3://atari-replay-datasets/dqn/Pong/1/
  replay_logs`` on a local moto server (the bucket's real key layout).

Peak RSS of the process tree: the sum of ``VmRSS`` of the child and all its descendants
(worker processes), sampled every 20 ms, highest sum seen.

Writes section "Datasets: Dopamine run import" of benchmarks/RESULTS.md and
benchmarks/results/dopamine_run.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks.bench_datasets import build_checkpoint  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STACK = 4
WRAP_STEP = 3000  # rows: checkpoint N's oldest row sits at WRAP_STEP * N (N >= 1)
BUCKET, RUN = "atari-replay-datasets", "dqn/Pong/1/replay_logs"

CHILD = {  # each body sets t0 after its imports and `frames` (rows processed)
    "np.load(gzip.open)": """
        import gzip, numpy as np
        t0, cpu0 = time.perf_counter(), cpu_now()
        frames = 0
        for s in SUFFIXES:
            with open(f"{DIR}/$store$_observation_ckpt.{s}.gz", "rb") as f, \\
                    gzip.GzipFile(fileobj=f) as g:
                arr = np.load(g, allow_pickle=False)
            frames += len(arr)
            del arr
    """,
    "import_dopamine": """
        if NO_ISAL:
            import sys
            sys.modules["isal"] = None  # the zlib fallback
        from expstore.datasets import import_dopamine
        t0, cpu0 = time.perf_counter(), cpu_now()
        s = import_dopamine(SRC, URL, workers=WORKERS, source_options=SOURCE_OPTIONS)
        frames = FRAMES
        extra = {"steps": s.steps, "rows": s.rows}
    """,
}


def _tree_rss(pid: int) -> int:
    """Bytes resident in ``pid`` and all its descendants now."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def run_child(case: str, env: dict[str, Any]) -> dict[str, float]:
    """One case in a fresh interpreter: seconds, frames/s, peak RSS of its process tree."""
    body = textwrap.dedent(CHILD[case])
    head = "".join(f"{k} = {v!r}\n" for k, v in env.items())
    code = (f"import json, resource, time\nextra = {{}}\n{head}"
            "def cpu_now():\n"
            "    r = resource.getrusage(resource.RUSAGE_SELF)\n"
            "    return r.ru_utime + r.ru_stime\n"
            f"{body}\n"
            "dt = time.perf_counter() - t0\n"
            "me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, "
            "resource.RUSAGE_CHILDREN))\n"
            "cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime - cpu0\n"
            "print(json.dumps({'seconds': dt, 'frames': frames, 'cpu_seconds': cpu, "
            "'main_maxrss_mb': me.ru_maxrss / 1024, **extra}))\n")
    out = run_tree(case, code)
    out["fps"] = out["frames"] / out["seconds"]
    out["frames_per_cpu_s"] = out["frames"] / out["cpu_seconds"]
    return out


def run_tree(case: str, code: str) -> dict[str, Any]:
    """:func:`run_sampled`, its peak in the JSON as ``tree_peak_rss_mb``."""
    out, peak = run_sampled(code, case)
    out["tree_peak_rss_mb"] = peak / 2**20
    return out


def run_sampled(code: str, what: str, env: dict[str, str] | None = None
                ) -> tuple[dict[str, Any], int]:
    """Python ``code`` in a fresh interpreter started through ``/bin/sh`` (so it does not
    inherit this process's RSS high-water mark): (the JSON its last line prints, peak
    bytes resident in its process tree, sampled every 20 ms)."""
    proc = subprocess.Popen(["/bin/sh", "-c", '"$@"; exit $?', "sh", sys.executable, "-c",
                             code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.02)
    out_text, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"{what}: {err[-2000:]}")
    return json.loads(out_text.strip().splitlines()[-1]), peak


def build_run(d: Path, checkpoints: int, frames: int, source: dict[str, Any],
              level: int) -> dict[str, Any]:
    """Checkpoints ``0..checkpoints-1``: one observation file (hard-linked), the later
    checkpoints wrapped at ``WRAP_STEP * N``."""
    meta = build_checkpoint(d, frames, source, level)
    cap = meta["frames"]
    from expstore.datasets.npy_gzip import save_gz  # internals: the .npy.gz codec

    for n in range(1, checkpoints):
        for name in ("observation", "action", "reward", "terminal"):
            os.link(d / f"$store$_{name}_ckpt.0.gz", d / f"$store$_{name}_ckpt.{n}.gz")
        cursor = (WRAP_STEP * n) % cap
        save_gz(d / f"add_count_ckpt.{n}.gz", np.array(cap * n + cursor, np.int64))
        save_gz(d / f"invalid_range_ckpt.{n}.gz",
                np.array([(cursor - 1 + i) % cap for i in range(STACK + 1)]))
    (d / "frames.npy").unlink(missing_ok=True)
    meta["checkpoints"] = checkpoints
    meta["total_frames"] = cap * checkpoints
    return meta


def _upload(d: Path, server: Any) -> str:
    import s3fs

    server.create_bucket(BUCKET)
    fs = s3fs.S3FileSystem(**server.storage_options)
    for p in sorted(d.glob("*_ckpt.*.gz")):
        fs.put_file(str(p), f"{BUCKET}/{RUN}/{p.name}")
    return f"s3://{BUCKET}/{RUN}"


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoints", type=int, default=4)
    p.add_argument("--frames", type=int, default=100_000, help="rows per checkpoint")
    p.add_argument("--source-frames", type=int, default=20_000, help="real ALE frames used")
    p.add_argument("--game", default="Pong")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--level", type=int, default=9, help="gzip level of the checkpoints")
    p.add_argument("--workers", type=int, default=None, help="import processes (default: "
                   "one per core)")
    p.add_argument("--s3", action="store_true", help="also import from a moto bucket")
    p.add_argument("--scratch", default=None, help="folder for the files (default: tmp)")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    source = load_atari_frames(args.source_frames, game=args.game)
    load0 = _load()
    scratch = Path(tempfile.mkdtemp(prefix="bench_dopamine_run_", dir=args.scratch))
    server = None
    try:
        run = scratch / "replay_logs"
        run.mkdir()
        meta = build_run(run, args.checkpoints, args.frames, source, args.level)
        print(f"run: {meta}", flush=True)
        suffixes = list(range(args.checkpoints))
        base = {"DIR": str(run), "SUFFIXES": suffixes, "SRC": str(run), "NO_ISAL": False,
                "WORKERS": args.workers, "SOURCE_OPTIONS": None,
                "FRAMES": meta["total_frames"]}
        cases = [("np.load(gzip.open)", "1 process, zlib", {}),
                 ("import_dopamine", "workers per core, isal", {}),
                 ("import_dopamine", "workers per core, zlib", {"NO_ISAL": True}),
                 ("import_dopamine", "1 process, isal", {"WORKERS": 1})]
        if args.s3:
            from expstore.testing import MotoServer

            server = MotoServer().start()
            src = _upload(run, server)
            cases.append(("import_dopamine", "from s3 (moto), workers per core, isal",
                          {"SRC": src, "SOURCE_OPTIONS": server.storage_options}))
        runs: list[list[dict]] = [[] for _ in cases]
        for _ in range(args.repeats):  # round robin: a change of load hits every case
            for i, (case, how, extra) in enumerate(cases):
                url = scratch / "s.zarr"
                shutil.rmtree(url, ignore_errors=True)
                runs[i].append(run_child(case, {**base, **extra, "URL": str(url)}))
                print(f"{case} ({how}): {runs[i][-1]}", flush=True)
        results = [{"case": case, "how": how, "frames": int(rs[0]["frames"]),
                    "fps": statistics.median(r["fps"] for r in rs),
                    "seconds": statistics.median(r["seconds"] for r in rs),
                    "tree_peak_rss_mb": statistics.median(r["tree_peak_rss_mb"] for r in rs),
                    "frames_per_cpu_s": statistics.median(r["frames_per_cpu_s"] for r in rs),
                    "runs": rs} for (case, how, _), rs in zip(cases, runs)]
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    ref = results[0]
    for r in results:
        r["fps_vs_np_load"] = r["fps"] / ref["fps"]
    out = {"args": vars(args), "run": meta, "cpus": os.cpu_count(), "results": results}
    save_json("dopamine_run", out)
    table = markdown_table(results, ["case", "how", "frames", "fps", "tree_peak_rss_mb",
                                     "fps_vs_np_load", "frames_per_cpu_s"],
                           {"fps": "frames/s", "tree_peak_rss_mb": "peak RSS, process tree (MB)",
                            "fps_vs_np_load": "rate vs np.load",
                            "frames_per_cpu_s": "frames per CPU-s"})
    body = (f"{table}\n\nMedians of {args.repeats} run(s) (cases taken in turn), each a fresh "
            f"process tree on "
            f"{os.cpu_count()} CPU cores. Run: {args.checkpoints} checkpoints of "
            f"{meta['frames']:,} rows (84x84 uint8 frames of real {args.game} episodes with "
            f"Dopamine's padding; observation file {meta['gz_bytes'] / 1e6:,.1f} MB at gzip "
            f"level {args.level}); checkpoints 1.. are wrapped rings (oldest row at "
            f"{WRAP_STEP:,} x N). The store uses its default frame codec (lz4hc-5) and the "
            "import's defaults (2,048-row shards, 512-row blocks). Peak RSS "
            "is the highest sum of VmRSS over the process and its worker processes (sampled "
            "every 20 ms); np.load holds one whole inflated observation file. Frames per "
            "CPU-s: frames / (user + system CPU time of the process tree from the start of "
            "the timed part, worker start-up included), which the machine's other load "
            "changes less than the rate. Targets: rate "
            ">= 2x np.load(gzip.open), process tree < 500 MB.")
    if not args.no_write:
        write_section("Datasets: Dopamine run import", body, command=command_line(),
                      source=f"{source.get('env_id')} ({source.get('source')}), "
                             f"{args.source_frames:,} frames",
                      extra={"load average (1 min) at start / end": f"{load0} / {_load()}"})
    print(body)
    return out


if __name__ == "__main__":
    main()
