"""LeRobot v3 import/export on a 100k-frame camera dataset: import rate and peak RSS (from
the dataset's MP4s and from PNG-in-parquet), sizes (store vs the MP4 and PNG datasets), and
``make_loader`` batches/s against LeRobot's own ``LeRobotDataset`` + ``DataLoader`` on the
same data, in one run.

Usage (from the repository root, with the python of ``scripts/lerobot_env.sh``, which has
``lerobot`` 0.4.4, torchcodec and PyAV)::

    "$(bash scripts/lerobot_env.sh)" benchmarks/bench_lerobot.py               # 100k frames
    "$(bash scripts/lerobot_env.sh)" benchmarks/bench_lerobot.py --frames 20000 --no-write

Data: real ALE Pong frames (``benchmarks/frames.py``, random policy, 84x84 gray), each
padded to 96x96 and colored through a fixed palette into an RGB camera frame, with the
episodes, actions and rewards of the run. They are written as a store, then exported
twice: with MP4 cameras (LeRobot's own settings: libsvtav1, yuv420p, crf 30, g 2) -- the
source -- and with PNG cameras. Each import runs in a fresh process (peak RSS of its
process tree sampled every 20 ms). Loaders: ``make_loader(store, batch_size, num_workers)``
(uniform transitions: obs and next_obs frames) against ``DataLoader(LeRobotDataset(root),
batch_size, shuffle=True, num_workers)`` (one frame an item; video decoded by torchcodec).

Writes section "Datasets: LeRobot import, sizes and loaders" of benchmarks/RESULTS.md
(unless ``--no-write``) and benchmarks/results/lerobot.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks.bench_dopamine_run import run_sampled  # noqa: E402
from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIDE = 96


def palette() -> np.ndarray:
    """gray level -> RGB (256, 3) uint8: three different curves, so channels differ."""
    g = np.arange(256) / 255.0
    return np.stack([g ** 0.8, g ** 1.3 * 0.9, 0.25 + 0.6 * g], -1).__mul__(255).astype(
        np.uint8)


def camera(gray: np.ndarray, pal: np.ndarray) -> np.ndarray:
    """(n, 84, 84) gray -> (n, 96, 96, 3) RGB camera frames."""
    pad = (SIDE - gray.shape[1]) // 2
    out = np.zeros((len(gray), SIDE, SIDE, 3), np.uint8)
    out[:, pad:pad + gray.shape[1], pad:pad + gray.shape[2]] = pal[gray]
    return out


def build_store(url: Path, n: int, data: dict[str, Any]) -> dict[str, Any]:
    """The first ``n`` frames of whole episodes as a store (episodes cut at ``n`` end
    truncated)."""
    import expstore as es

    frames = data["frames"]
    starts = np.flatnonzero(data["episode_start"][:n]).tolist() + [n]
    spec = es.Spec.create({"image": es.Field((SIDE, SIDE, 3), np.uint8)},
                          es.Field((), np.int64, low=0, high=5))
    store = es.create(url, spec, n + len(starts))
    pal = palette()
    steps = 0
    for a, b in zip(starts[:-1], starts[1:]):
        if b - a < 2:
            continue
        T = b - a - 1
        for lo in range(0, T, 2048):
            hi = min(lo + 2048, T)
            cam = camera(np.asarray(frames[a + lo:a + hi + 1]), pal)
            last = hi == T
            term = np.zeros(hi - lo, bool)
            trunc = np.zeros(hi - lo, bool)
            if last:
                ended = bool(data["terminated"][a + T - 1])
                term[-1], trunc[-1] = ended, not ended
            batch = {"obs": {"image": cam[:-1]},
                     "action": data["actions"][a + lo:a + hi],
                     "reward": data["rewards"][a + lo:a + hi],
                     "terminated": term, "truncated": trunc}
            if last:
                batch["next_obs"] = {"image": cam[1:]}
            store.extend(batch, check_next_obs=False)
        steps += T
    store.close()
    return {"steps": steps, "episodes": len(starts) - 1}


CHILD = """
import json, resource, time
from expstore.datasets import import_lerobot
t0 = time.perf_counter()
s = import_lerobot(SRC, URL, codec=CODEC)
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "frames": s.steps, "episodes": s.episodes,
                  "main_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


#: blosc zstd level 5: half the store of decoded video frames (their codec noise defeats lz4)
ZSTD = {"name": "blosc", "cname": "zstd", "clevel": 5}


def run_import(src: Path, url: Path, codec: dict | None = None) -> dict[str, float]:
    """``import_lerobot`` in a fresh process: seconds, frames/s, peak RSS of its tree."""
    code = (f"SRC, URL, CODEC = {str(src)!r}, {str(url)!r}, {codec!r}\n"
            + textwrap.dedent(CHILD))
    r, peak = run_sampled(code, f"import of {src}", {**os.environ, "SVT_LOG": "1"})
    r["fps"] = r["frames"] / r["seconds"]
    r["tree_peak_rss_mb"] = peak / 2**20
    return r


def folder_bytes(p: Path, sub: str = "") -> int:
    return sum(f.stat().st_size for f in (p / sub).rglob("*") if f.is_file())


def loader_rate(make: Any, batches: int, warmup: int) -> dict[str, float]:
    """batches/s and frames/s of the iterator ``make()`` returns, over ``batches`` batches
    after ``warmup`` (more than the workers prefetch, so the rate is the steady one)."""
    it = iter(make())
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    items = 0
    for _ in range(batches):
        b = next(it)
        items += len(b["index"]) if "index" in b else len(b["reward"])
    dt = time.perf_counter() - t0
    return {"batches_per_s": batches / dt, "items_per_s": items / dt}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=100, help="timed batches of make_loader")
    p.add_argument("--lerobot-batches", type=int, default=20,
                   help="timed batches of LeRobotDataset + DataLoader")
    p.add_argument("--cache", default="benchmarks/.cache", help="frames cache folder")
    p.add_argument("--scratch", default=None)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    import expstore as es
    from expstore.datasets import export_lerobot
    from expstore.datasets.summary import store_bytes

    os.environ.setdefault("SVT_LOG", "1")
    load0 = os.getloadavg()[0]
    data = load_atari_frames(max(args.frames, 50_000), cache_dir=args.cache, mmap=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench_lerobot_", dir=args.scratch))
    try:
        made = build_store(scratch / "orig.zarr", args.frames, data)
        t0 = time.perf_counter()
        export_lerobot(scratch / "orig.zarr", scratch / "mp4", video=True, fps=15)
        t_mp4 = time.perf_counter() - t0
        t0 = time.perf_counter()
        export_lerobot(scratch / "orig.zarr", scratch / "png", fps=15)
        t_png = time.perf_counter() - t0
        imports = []
        for kind, codec, how in [("mp4", None, ""), ("png", None, ""),
                                 ("mp4", ZSTD, ", -o codec=blosc zstd 5")]:
            url = scratch / f"from_{kind}{'_zstd' if codec else ''}.zarr"
            r = run_import(scratch / kind, url, codec)
            r.update(case=f"import_lerobot from {kind.upper()}{how}",
                     store_mb=store_bytes(url) / 1e6)
            imports.append(r)
            print(r, flush=True)
        n = made["steps"]
        sizes = {"raw_mb": n * SIDE * SIDE * 3 / 1e6,
                 "mp4_dataset_mb": folder_bytes(scratch / "mp4") / 1e6,
                 "mp4_videos_mb": folder_bytes(scratch / "mp4", "videos") / 1e6,
                 "png_dataset_mb": folder_bytes(scratch / "png") / 1e6,
                 "store_from_mp4_mb": imports[0]["store_mb"],
                 "store_from_png_mb": imports[1]["store_mb"],
                 "store_from_mp4_zstd_mb": imports[2]["store_mb"]}
        store = es.open(scratch / "from_mp4.zarr")
        orig = es.open(scratch / "orig.zarr")
        rows = np.arange(0, len(orig), 97)
        a = orig.read("obs.image", rows, rows).astype(np.int16)
        b = store.read("obs.image", rows, rows).astype(np.int16)
        video_err = {"max_abs": int(np.abs(a - b).max()), "mean_abs": float(np.abs(a - b).mean())}
        loaders = []
        ml = es.make_loader(store, batch_size=args.batch_size, num_workers=args.workers)
        r = loader_rate(lambda: ml, args.batches, 10)
        if hasattr(ml, "close"):
            ml.close()
        loaders.append({"loader": "expstore make_loader (store)", **r})
        for kind in ("mp4", "png"):
            ds = LeRobotDataset(f"local/{kind}", root=scratch / kind)
            dl = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                             num_workers=args.workers)
            r = loader_rate(lambda dl=dl: dl, args.lerobot_batches, 2 * args.workers + 1)
            loaders.append({"loader": f"LeRobotDataset + DataLoader ({kind.upper()})", **r})
            print(loaders[-1], flush=True)
        base = loaders[0]["batches_per_s"]
        for r in loaders:
            r["vs_make_loader"] = r["batches_per_s"] / base
        store.close()
        orig.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load1 = os.getloadavg()[0]
    out = {"args": vars(args), "made": made, "sizes": sizes, "imports": imports,
           "loaders": loaders, "video_error": video_err, "export_seconds":
           {"mp4": t_mp4, "png": t_png}, "load": [load0, load1]}
    save_json("lerobot", out)
    t1 = markdown_table(imports, ["case", "frames", "fps", "tree_peak_rss_mb", "store_mb"],
                        {"fps": "frames/s", "tree_peak_rss_mb": "peak RSS, process tree (MB)",
                         "store_mb": "store (MB)"})
    t2 = markdown_table([{"what": k, "MB": v} for k, v in sizes.items()], ["what", "MB"])
    t3 = markdown_table(loaders, ["loader", "batches_per_s", "items_per_s", "vs_make_loader"],
                        {"batches_per_s": "batches/s", "items_per_s": "frames/s",
                         "vs_make_loader": "vs make_loader"})
    body = (f"{t1}\n\n{t2}\n\n{t3}\n\n{n:,} frames ({made['episodes']} episodes) of 96x96x3 "
            f"uint8; batch {args.batch_size}, {args.workers} workers. MP4: libsvtav1 "
            f"yuv420p crf 30 g 2 (LeRobot's settings), max/mean abs pixel error after the "
            f"round trip {video_err['max_abs']} / {video_err['mean_abs']:.2f}; export took "
            f"{t_mp4:.0f} s (MP4) / {t_png:.0f} s (PNG). The store keeps pixels lossless: "
            f"{sizes['store_from_mp4_mb'] / sizes['mp4_videos_mb']:.1f}x the MP4s, "
            f"{sizes['store_from_png_mb'] / sizes['png_dataset_mb']:.2f}x the PNG dataset; "
            f"clean frames losslessly: {sizes['store_from_png_mb'] / sizes['mp4_videos_mb']:.1f}x "
            "the MP4s. "
            "make_loader batches hold obs and next_obs; LeRobot's one frame an item.")
    if not args.no_write:
        write_section("Datasets: LeRobot import, sizes and loaders", body,
                      command=command_line(),
                      source="ALE Pong frames (benchmarks/frames.py), colored to 96x96x3",
                      extra={"load average (1 min) at start / end": f"{load0} / {load1}"})
    print(body)
    return out


if __name__ == "__main__":
    main()
