"""RLDS import: steps/s and peak RSS, store size against the source, and ``make_loader``
batches/s from the imported store against TFDS's own ``as_dataset`` on the same data.

Usage (from the repository root; TFDS needs the interop venv of ``scripts/test.sh -m
interop``, else that row is left out)::

    .venv-interop/bin/python benchmarks/bench_rlds.py                 # 100k steps
    .venv-interop/bin/python benchmarks/bench_rlds.py --steps 20000 --no-write

The source is an RLDS dataset of ``--steps`` steps of 84x84 frames of real Atari episodes
(``benchmarks/frames.py``; ``observation/image`` (84, 84, 1) uint8 PNG-encoded, as RLDS
datasets hold images, plus action, reward, discount and the flags) in episodes of
``--episode`` steps, written by ``export_rlds`` (TFDS reads it: tests/test_rlds_interop.py)
as shards of ``--shard-mb`` (16 MB: 3 shards at 100k steps). Then, each in a fresh process
started through ``/bin/sh``:

* ``import_rlds`` with one worker process per core, and with one process: steps/s and the
  peak RSS of the process tree (``VmRSS`` of the child and its workers summed, every 20 ms);
* ``make_loader`` (2 workers, uniform transitions, batch ``--batch``) on the imported store,
  against TFDS ``as_dataset(split="train")`` flattened to steps
  (``flat_map(steps)``, ``shuffle(10k)``, ``batch``, ``prefetch(AUTOTUNE)``, 2 parallel
  reads), the same number of batches, as numpy.

Writes section "Datasets: RLDS import" of benchmarks/RESULTS.md and
benchmarks/results/rlds.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks.bench_dopamine_run import _load, run_tree  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402

CHILD = {
    "import_rlds": """
        from expstore.datasets import import_rlds
        t0 = time.perf_counter()
        s = import_rlds(SRC, URL, workers=WORKERS)
        extra = {"steps": s.steps, "rows": s.rows}
    """,
    "make_loader": """
        import expstore as es
        store = es.open(URL, "r")
        loader = es.make_loader(store, batch_size=BATCH, num_workers=2, num_batches=BATCHES + 20)
        it = iter(loader)
        for _ in range(20):
            next(it)  # workers started, caches warm
        t0 = time.perf_counter()
        for _ in range(BATCHES):
            b = next(it)
        extra = {"batches": BATCHES}
    """,
    "tfds_as_dataset": """
        import tensorflow as tf, tensorflow_datasets as tfds
        ds = tfds.builder_from_directory(SRC).as_dataset(
            split="train", read_config=tfds.ReadConfig(interleave_cycle_length=2))
        ds = ds.flat_map(lambda ep: ep["steps"]).shuffle(10_000).batch(BATCH)
        it = iter(tfds.as_numpy(ds.repeat().prefetch(tf.data.AUTOTUNE)))
        for _ in range(20):
            next(it)
        t0 = time.perf_counter()
        for _ in range(BATCHES):
            b = next(it)
        extra = {"batches": BATCHES}
    """,
}


def run_child(case: str, env: dict[str, Any]) -> dict[str, float]:
    """One case in a fresh interpreter: seconds of its timed part, peak RSS of its tree."""
    head = "".join(f"{k} = {v!r}\n" for k, v in env.items())
    code = (f"import json, time\nextra = {{}}\n{head}{textwrap.dedent(CHILD[case])}\n"
            "dt = time.perf_counter() - t0\n"
            "print(json.dumps({'seconds': dt, **extra}))\n")
    return run_tree(case, code)


def build_source(d: Path, steps: int, episode: int, source_frames: int,
                 shard_mb: float = 16) -> dict[str, Any]:
    """An RLDS dataset of ``steps`` steps (episodes of ``episode`` steps) in ``d``."""
    import expstore as es
    from expstore.datasets import export_rlds
    from expstore.field import Field
    from expstore.spec import Spec

    src = load_atari_frames(source_frames)
    frames, actions, rewards = src["frames"], src["actions"], src["rewards"]
    spec = Spec.create(obs={"image": Field((84, 84, 1), np.uint8)}, action=Field((), np.int64),
                       extras={"discount": Field((), np.float32)})
    n_ep = max(1, steps // episode)
    store = es.create(d / "src.zarr", spec, n_ep * (episode + 1))
    T = episode - 1  # an RLDS episode of `episode` steps: T transitions + the final step
    for e in range(n_ep):
        at = (e * episode) % max(1, len(frames) - episode)
        idx = np.arange(at, at + episode)
        obs = frames[idx][..., None]
        term = np.zeros(T, bool)
        term[-1] = True
        store.extend({"obs": {"image": obs[:-1]}, "next_obs": {"image": obs[1:]},
                      "action": actions[idx[:-1]], "reward": rewards[idx[:-1]],
                      "discount": np.ones(T, np.float32), "next_discount": np.ones(T, np.float32),
                      "terminated": term, "truncated": np.zeros(T, bool)})
    store.flush()
    store.close()
    s = export_rlds(d / "src.zarr", d / "rlds", name="atari", shard_bytes=int(shard_mb * 1e6))
    shutil.rmtree(d / "src.zarr")
    return {"steps": n_ep * episode, "episodes": n_ep, "shards": len(s.outputs),
            "bytes": s.bytes_out, "source": src.get("source"), "env_id": src.get("env_id")}


def _du(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--episode", type=int, default=500, help="steps per episode")
    p.add_argument("--source-frames", type=int, default=20_000, help="real ALE frames used")
    p.add_argument("--shard-mb", type=float, default=16, help="MB per TFRecord shard "
                   "(one lane, one worker each)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--scratch", default=None, help="folder for the files (default: tmp)")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    load0 = _load()
    scratch = Path(tempfile.mkdtemp(prefix="bench_rlds_", dir=args.scratch))
    try:
        meta = build_source(scratch, args.steps, args.episode, args.source_frames,
                            args.shard_mb)
        print(f"source: {meta}", flush=True)
        env = {"SRC": str(scratch / "rlds"), "URL": str(scratch / "s.zarr"),
               "BATCH": args.batch, "BATCHES": args.batches}
        rows = []
        for how, workers in (("workers per core", None), ("1 process", 1)):
            shutil.rmtree(scratch / "s.zarr", ignore_errors=True)
            r = run_child("import_rlds", {**env, "WORKERS": workers})
            rows.append({"case": "import_rlds", "how": how, "steps/s": r["steps"] / r["seconds"],
                         "tree_peak_rss_mb": r["tree_peak_rss_mb"], "seconds": r["seconds"]})
            print(rows[-1], flush=True)
        store_bytes = _du(scratch / "s.zarr")
        loads = []
        for case in ("make_loader", "tfds_as_dataset"):
            try:
                r = run_child(case, env)
            except RuntimeError as e:
                if case == "tfds_as_dataset" and "No module named" in str(e):
                    print("tensorflow_datasets not installed: TFDS row left out")
                    continue
                raise
            loads.append({"case": case, "batches/s": r["batches"] / r["seconds"],
                          "tree_peak_rss_mb": r["tree_peak_rss_mb"]})
            print(loads[-1], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if len(loads) == 2:
        loads[0]["vs TFDS"] = loads[0]["batches/s"] / loads[1]["batches/s"]
    sizes = {"source_bytes": meta["bytes"], "store_bytes": store_bytes,
             "store_vs_source": store_bytes / meta["bytes"]}
    out = {"args": vars(args), "source": meta, "import": rows, "loaders": loads,
           "sizes": sizes, "cpus": os.cpu_count(), "load": [load0, _load()]}
    save_json("rlds", out)
    body = (markdown_table(rows, ["case", "how", "steps/s", "tree_peak_rss_mb", "seconds"],
                           {"tree_peak_rss_mb": "peak RSS, process tree (MB)"})
            + "\n\n" + markdown_table(loads, ["case", "batches/s", "vs TFDS",
                                              "tree_peak_rss_mb"],
                                      {"tree_peak_rss_mb": "peak RSS, process tree (MB)"})
            + f"\n\nSource: {meta['steps']:,} steps in {meta['episodes']} episodes, "
              f"{meta['shards']} TFRecord shard(s) (a lane and a worker each), "
              f"{meta['bytes'] / 1e6:,.1f} MB "
              f"(84x84x1 frames of {meta['env_id'] or meta['source']} as PNG, as RLDS "
              f"datasets hold images). Imported store: {store_bytes / 1e6:,.1f} MB on disk "
              f"({sizes['store_vs_source']:.2f}x the source; default frame codec lz4-5). "
              f"Loaders: batches of {args.batch} transitions, {args.batches} timed after 20 "
              f"warm-up; make_loader: uniform transitions (obs, next_obs, action, reward, "
              f"flags), 2 workers; TFDS: flat_map(steps), shuffle(10k), batch, prefetch, "
              f"steps only (no next observation). {os.cpu_count()} CPU cores.")
    if not args.no_write:
        write_section("Datasets: RLDS import", body, command=command_line(),
                      extra={"load average (1 min) at start / end": f"{load0} / {_load()}"})
    print(body)
    return out


if __name__ == "__main__":
    main()
