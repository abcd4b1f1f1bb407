"""npz and D4RL export/import: time and peak RSS against holding the arrays whole.

Usage (from the repository root)::

    python benchmarks/bench_exports.py                    # 20,000 Pong frames, 3 repeats
    python benchmarks/bench_exports.py --frames 5000 --repeats 1

Builds a store of real preprocessed ALE Pong frames (``benchmarks/frames.py``; a synthetic
Pong-like stream where ALE is missing) with ``stack=4``, then, each in a fresh child process
(its peak RSS is ``VmHWM`` of ``/proc/self/status``: its own, not the parent's ``ru_maxrss``
that Linux carries across ``exec``):

* ``npz export`` / ``npz import``: :func:`export_npz` / :func:`import_npz` (streamed, a
  block of rows at a time) against the same functions as of commit ``c4625ca`` (before
  they streamed: every array held whole), taken from git;
* ``d4rl export``: :func:`export_d4rl` with its default (gzip level 4) against
  ``compression=None`` (file bytes and time).

"RSS growth" is the child's peak RSS minus its RSS once the modules are imported. Figures
are medians of ``--repeats`` runs; ratios (baseline s / s) are taken within the same run. Writes
section "Datasets: npz and D4RL export/import" of benchmarks/RESULTS.md and
benchmarks/results/exports.json.
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
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from frames import load_atari_frames  # noqa: E402
from report import markdown_table, save_json, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

BEFORE = "c4625ca"  # the commit before issue 16's streaming npz (its export and import)

CHILD = r"""
import importlib.util, json, os, sys, time
import numpy as np
import expstore as es
from expstore.datasets import export_d4rl, export_npz, import_npz
kind, store, npz, out, before = sys.argv[1:6]
if before != "-":
    spec = importlib.util.spec_from_file_location("expstore.datasets.npz_before", before)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
start = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
t0 = time.perf_counter()
if kind == "npz export":
    export_npz(store, out, overwrite=True)
elif kind == "npz export (before)":
    if os.path.exists(out):
        os.remove(out)
    old.export_npz(store, out)
elif kind == "npz import":
    import_npz(npz, out, overwrite=True)
elif kind == "npz import (before)":
    old.import_npz(npz, out, overwrite=True)
elif kind.startswith("d4rl export"):
    kw = {} if kind == "d4rl export" else {"compression": None}
    export_d4rl(store, out, overwrite=True, **kw)
sec = time.perf_counter() - t0
peak = next(int(line.split()[1]) for line in open("/proc/self/status")
            if line.startswith("VmHWM:")) / 1024  # this process image's own peak (kB -> MB)
size = os.path.getsize(out) if os.path.isfile(out) else 0
print(json.dumps({"seconds": sec, "rss_growth_mb": peak - start, "bytes": size}))
"""


def build_store(url: str, n: int) -> dict:
    import expstore as es

    data = load_atari_frames(n, "Pong")
    frames = np.asarray(data["frames"])
    spec = es.Spec.create(obs=es.Field((84, 84), np.uint8, stack=4),
                          action=es.Field((), np.int64))
    with es.create(url, spec, capacity=n + 1000, overwrite=True, fsync=False) as s:
        valid = np.flatnonzero(np.asarray(data["valid"]))
        for a in range(0, len(valid), 4096):
            i = valid[a : a + 4096]
            s.extend({"obs": frames[i], "next_obs": frames[i + 1],
                      "action": np.asarray(data["actions"])[i],
                      "reward": np.asarray(data["rewards"])[i],
                      "terminated": np.asarray(data["terminated"])[i],
                      "truncated": np.asarray(data["truncated"])[i]})
        return {"rows": len(s), "steps": s.num_transitions, "episodes": s.num_episodes,
                "source": data.get("source", "?"),
                "store_bytes": int(s.backend.total_bytes())}


def child(kind: str, store: str, npz: str, out: str, before: str) -> dict:
    cmd = " ".join(["exec", sys.executable, "-c", '"$CHILD"', f"'{kind}'", store, npz, out,
                    before])
    env = {**os.environ, "CHILD": CHILD, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, env=env,
                         check=True, cwd=ROOT)
    return json.loads(res.stdout.strip().splitlines()[-1])


def before_module(tmp: Path) -> str:
    """The npz module as of :data:`BEFORE` (from git), or ``"-"`` when git cannot give it."""
    res = subprocess.run(["git", "show", f"{BEFORE}:expstore/datasets/npz.py"], cwd=ROOT,
                         capture_output=True, text=True)
    if res.returncode:
        return "-"
    path = tmp / "npz_before.py"
    path.write_text(res.stdout)
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench_exports_"))
    try:
        store = str(tmp / "s.zarr")
        facts = build_store(store, args.frames)
        npz = str(tmp / "in.npz")
        before = before_module(tmp)
        child("npz export", store, npz, npz, before)  # the import's input
        kinds = [("npz export", "npz export (before)", "x.npz"),
                 ("npz import", "npz import (before)", "x.zarr"),
                 ("d4rl export", "d4rl export (uncompressed)", "x.h5")]
        if before == "-":
            kinds = kinds[2:]
        rows, raw = [], {}
        for new, base, out in kinds:
            got: dict[str, list[dict]] = {new: [], base: []}
            for _ in range(args.repeats):
                for k in (new, base):
                    got[k].append(child(k, store, npz, str(tmp / out), before))
            med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]}
                   for k, v in got.items()}
            raw[new] = got
            rows.append({"what": new, "s": med[new]["seconds"], "baseline": base,
                         "baseline s": med[base]["seconds"],
                         "speed ratio": med[base]["seconds"] / med[new]["seconds"],
                         "RSS growth MB": med[new]["rss_growth_mb"],
                         "baseline RSS growth MB": med[base]["rss_growth_mb"],
                         "file MB": med[new]["bytes"] / 1e6,
                         "baseline file MB": med[base]["bytes"] / 1e6})
        table = markdown_table(rows)
        raw_mb = facts["rows"] * 84 * 84 / 1e6
        body = (f"{facts['rows']:,} rows ({facts['steps']:,} steps, {facts['episodes']:,} "
                f"episodes) of {facts['source']} Pong 84x84 frames, {raw_mb:.0f} MB of raw "
                f"pixels; the store holding them: {facts['store_bytes'] / 1e6:.1f} MB. "
                f"Medians of {args.repeats} runs, each in a fresh process; load average "
                f"(1 min) {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end."
                f"\n\n{table}\n")
        print(body)
        if not args.no_write:
            write_section("Datasets: npz and D4RL export/import", body)
            save_json("exports", {"facts": facts, "rows": rows, "raw": raw})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
