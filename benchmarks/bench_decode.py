"""Frame decode: the read kernel's blosc/LZ4 decoder against numcodecs, on Atari frames.

Usage (from the repository root)::

    python benchmarks/bench_decode.py --games Pong,Breakout,MsPacman --frames 2000 --repeats 15
    python benchmarks/bench_decode.py --against /tmp/old/_kernels.so   # A/B two builds

Each game's frames (``benchmarks/frames.py``: ALE where installed, else its synthetic
stand-in) are coded as a store codes ``obs`` (blosc, LZ4, level 5, no shuffle: zarr's
codec for uint8 frames) and decoded whole: all of them with one ``decode_blobs`` call of
the kernel (what a batch's frame reads end in), and one by one with numcodecs'
``Blosc.decode`` (what zarr would call), alternating, in one process. ``--against``
loads another build of ``_kernels`` from a path and times it in the same alternation
(``ab_x``: this build's time over that one's). Every decode is compared with the frames.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from numcodecs import Blosc  # noqa: E402

from benchmarks.frames import load_atari_frames  # noqa: E402
from benchmarks.report import command_line, markdown_table, save_json, write_section  # noqa: E402
from expstore.storage.native import _kernels  # noqa: E402


def load_build(path: str) -> Any:
    """Another build of the kernel extension, loaded from ``path`` beside this one."""
    name = "expstore.storage.native._kernels"  # (its init function's name: one file each)
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def kernel_us(kernel: Any, blobs: list[bytes], out: np.ndarray) -> float:
    """µs per frame of one ``decode_blobs`` call over every blob."""
    dst = np.arange(len(blobs), dtype=np.int64)
    t = time.perf_counter()
    status, _ = kernel.decode_blobs(blobs, dst, out, out.shape[1], False)
    dt = time.perf_counter() - t
    assert status == 0, status
    return dt / len(blobs) * 1e6


def numcodecs_us(codec: Blosc, blobs: list[bytes], out: np.ndarray) -> float:
    """µs per frame of numcodecs' decode, one call per frame, into ``out``."""
    t = time.perf_counter()
    for i, b in enumerate(blobs):
        codec.decode(b, out=out[i])
    return (time.perf_counter() - t) / len(blobs) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--games", default="Pong,Breakout,MsPacman")
    ap.add_argument("--frames", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--against", help="path of another _kernels build to time beside this one")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    other = load_build(a.against) if a.against else None
    codec = Blosc(cname="lz4", clevel=5, shuffle=Blosc.NOSHUFFLE)
    rows, runs = [], {}
    for game in a.games.split(","):
        frames = load_atari_frames(a.frames, game)["frames"].reshape(a.frames, -1)
        blobs = [codec.encode(np.ascontiguousarray(f)) for f in frames]
        out = np.zeros_like(frames)
        cases = {"kernel": (kernel_us, _kernels), "numcodecs": (numcodecs_us, codec)}
        if other is not None:
            cases["other"] = (kernel_us, other)
        got: dict[str, list[float]] = {k: [] for k in cases}
        for r in range(a.repeats):
            for name in (list(cases) if r % 2 == 0 else list(cases)[::-1]):
                out[:] = 0
                timer, decoder = cases[name]
                got[name].append(timer(decoder, blobs, out))
                assert np.array_equal(out, frames), (game, name)
        med = {k: statistics.median(v) for k, v in got.items()}
        row = {"game": game, "frames": a.frames,
               "bytes_per_frame": round(sum(map(len, blobs)) / len(blobs)),
               "kernel_us": med["kernel"], "numcodecs_us": med["numcodecs"],
               "x_numcodecs": med["kernel"] / med["numcodecs"]}
        if other is not None:
            row.update(other_us=med["other"], ab_x=med["kernel"] / med["other"])
        rows.append(row)
        runs[game] = got
        print(row, flush=True)
    table = markdown_table(rows)
    print(table)
    if a.no_write:
        return
    save_json("decode", {"args": vars(a), "runs": runs, "rows": rows})
    body = (table + f"\n\nMedians of {a.repeats} alternated repeats, one process, warm: "
            "µs per 84x84 frame decoded whole (blosc, LZ4 level 5, no shuffle, as a store "
            "codes `obs`); `kernel_us`: the read kernel's `decode_blobs`, all frames in one "
            "call; `numcodecs_us`: numcodecs' `Blosc.decode`, a call per frame; "
            "x_numcodecs: kernel / numcodecs (below 1: the kernel is faster)."
            + (" other_us / ab_x: the build at `--against`, and this build's time over "
               "it." if other is not None else ""))
    write_section("Frame decode", body, command=command_line(),
                  extra={"load average (1 min) start/end":
                         f"{load0:.2f} / {os.getloadavg()[0]:.2f}"})


if __name__ == "__main__":
    main()
