"""A store -> a LeRobot v3 dataset that ``LeRobotDataset(repo_id, root=dst)`` loads:
:func:`export_lerobot` (episodes streamed in blocks; cameras as PNG in parquet, or MP4)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...api import open as open_store
from ...errors import DatasetFormatError
from ..episodes import ExportReader, store_episodes
from ..progress import Progress, ProgressArg
from ..streaming import blocks, check_block_rows
from ..summary import ImportSummary
from .frames import encode_png
from .layout import (
    CODEBASE_VERSION,
    DATA_FILE_MB,
    DATA_PATH,
    DEFAULT_FEATURES,
    EPISODES_PATH,
    FINAL_ROWS_PATH,
    IMAGE_NAMES,
    INFO_PATH,
    SIDECAR_PATH,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_FILE_MB,
    VIDEO_PATH,
)
from .mapping import FRAME_COLUMNS
from .tables import FeatureWriter, Stats, arrow_column, image_struct_type, write_tasks


def export_lerobot(url: str | os.PathLike, dst: str | os.PathLike, *, fps: float | None = None,
                   video: bool = False, video_codec: str = "libsvtav1", crf: int = 30,
                   gop: int = 2, png_level: int = 6, task: str = "expstore",
                   robot_type: str | None = None, block_rows: int = 512,
                   data_file_mb: int = DATA_FILE_MB, video_file_mb: int = VIDEO_FILE_MB,
                   storage_options: dict[str, Any] | None = None,
                   progress: ProgressArg = None) -> ImportSummary:
    """Write the complete episodes of the store at ``url`` as a LeRobot v3 dataset root
    ``dst`` (a new folder).

    Fields -> features: ``obs`` / ``obs.<k>`` -> ``observation.state`` /
    ``observation.<k>`` (or the names a LeRobot import recorded), ``action`` -> ``action``,
    ``reward`` -> ``next.reward``, ``terminated`` -> ``next.done``, other fields -> their
    name; fields of shape ``()`` become LeRobot's shape ``[1]``. uint8 fields of 2-3 dims
    are cameras: PNG structs in the parquet files (``png_level`` zlib 0..9; lossless), or
    with ``video=True`` MP4 files (``video_codec`` via PyAV, LeRobot's defaults: libsvtav1,
    yuv420p, ``crf`` 30, ``gop`` 2; lossy). ``fps``: default the store's LeRobot fps, else
    30. ``task``: the task of every frame when the store has no ``task_index``.

    Open episodes (no final row) are not written. The final observation of each episode,
    which LeRobot has no place for, goes to ``meta/expstore_final_rows.parquet`` with the
    store's spec in ``meta/expstore.json``, so ``import_lerobot`` rebuilds the store
    exactly (PNG) -- LeRobot ignores both files.
    """
    t0 = time.perf_counter()
    block_rows = check_block_rows(block_rows)
    dst = Path(dst)
    if dst.exists() and any(dst.iterdir()):
        raise FileExistsError(f"{dst}: exists and is not empty; give a new folder")
    store = open_store(url, "r", storage_options=storage_options)
    summary = ImportSummary(str(url), str(dst), kind="lerobot export")
    reader = None
    try:
        spec = store.spec
        origin = spec.structure.get("lerobot") or {}
        fps = float(fps or origin.get("fps") or 30)
        cols = _columns(spec, origin, video)
        eps = store_episodes(store)
        tasks = list(origin.get("tasks") or []) if "task_index" in spec.fields else [task]
        dst.mkdir(parents=True, exist_ok=True)
        reader = ExportReader(store)
        total = sum(T for _, _, T in eps)
        prog = Progress(total, f"lerobot export {dst.name}", progress)
        writer = FeatureWriter(dst, cols, fps, png_level, data_file_mb, video_file_mb,
                               (video_codec, crf, gop))
        stats = Stats(cols)
        finals: dict[str, list] = {"episode_index": [], "@terminated": []}
        finals.update({n: [] for n in _final_fields(spec)})
        try:
            index = 0
            for e, (lane, first, T) in enumerate(eps):
                steps = np.arange(first, first + T + 1, dtype=np.int64)
                rows = store.index.lane_rows(lane, steps)
                ep_index = e
                writer.start_episode(ep_index)
                ep_tasks: set[int] = set()
                for a, b in blocks(0, T, block_rows):
                    vals = {n: reader.read(n, rows[a:b], steps[a:b]) for n in cols.fields}
                    frame = _frame_columns(spec, vals, a, b, T, e, index + a, fps)
                    done = np.zeros(b - a, bool)
                    if b == T:
                        done[-1] = bool(reader.read("terminated", rows[T - 1:T],
                                                    steps[T - 1:T])[0])
                    frame["next.done"] = done
                    ep_index = int(frame["episode_index"][0])
                    ep_tasks.update(np.unique(frame["task_index"]).tolist())
                    writer.write(vals, frame)
                    stats.update(vals, frame)
                    prog.update(b - a)
                fin = {n: reader.read(n, rows[T:], steps[T:])[0] for n in finals
                       if n not in ("episode_index", "@terminated")}
                for n, v in fin.items():
                    finals[n].append(v)
                finals["episode_index"].append(ep_index)
                finals["@terminated"].append(bool(reader.read(
                    "terminated", rows[T - 1:T], steps[T - 1:T])[0]))
                tasks += [f"task {i}" for i in range(len(tasks), max(ep_tasks) + 1)]
                names = [tasks[i] for i in sorted(ep_tasks)]
                writer.end_episode(ep_index, T, index, names)
                index += T
        finally:
            prog.close()
            writer.close()
        _write_meta(dst, spec, cols, writer, stats, finals, tasks, fps, index,
                    robot_type or origin.get("robot_type"), video)
        summary.steps = summary.rows = index
        summary.episodes = len(eps)
        summary.lanes = store.lanes
        held = store.num_transitions
        if held > index:
            summary.notes.append(f"{held - index:,} steps of open episodes (no final row) "
                                 "are not written")
        summary.notes += cols.notes
        summary.outputs = [str(dst)]
        summary.bytes_out = sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
    finally:
        if reader is not None:
            reader.close()
        store.close()
    summary.seconds = time.perf_counter() - t0
    return summary


class Columns:
    """Store field -> LeRobot feature (``features``: info.json entries, in order)."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}  # store field -> feature key
        self.features: dict[str, dict[str, Any]] = {}
        self.cameras: dict[str, str] = {}  # feature key -> "image" | "video"
        self.notes: list[str] = []


def is_camera(f: Any) -> bool:
    return np.dtype(f.dtype) == np.uint8 and (len(f.shape) == 2 or (
        len(f.shape) == 3 and f.shape[2] in (1, 3, 4)))


def _columns(spec: Any, origin: dict[str, Any], video: bool) -> Columns:
    named = dict(origin.get("columns") or {})
    feats = origin.get("features") or {}
    out = Columns()
    for name, f in spec.fields.items():
        if name in ("terminated", "truncated"):
            continue
        if name in named:
            key = named[name]
        elif name == "reward":
            key = "next.reward"
        elif name == "obs":
            key = "observation.image" if is_camera(f) else "observation.state"
        elif name.startswith("obs."):
            key = "observation." + name[4:]
        else:
            key = name
        if key in ("index",) or key in out.features:
            raise DatasetFormatError(f"field {name!r}: LeRobot feature {key!r} is taken")
        if is_camera(f):
            h, w = f.shape[:2]
            c = f.shape[2] if len(f.shape) == 3 else 1
            kind = "video" if video else "image"
            if video and c not in (1, 3):
                raise DatasetFormatError(f"field {name!r}: video takes 1 or 3 channels, "
                                         f"not {c}; export without video=True")
            ft: dict[str, Any] = {"dtype": kind, "shape": [h, w, c], "names": IMAGE_NAMES}
            out.cameras[key] = kind
        elif len(f.shape) >= 2:
            raise DatasetFormatError(f"field {name!r}: shape {list(f.shape)} of {f.dtype}; "
                                     "LeRobot features here are scalars, vectors or uint8 "
                                     "images")
        else:
            old = feats.get(key) or {}
            ft = {"dtype": str(np.dtype(f.dtype)), "shape": list(f.shape) or [1],
                  "names": old.get("names")}
        out.fields[name] = key
        out.features[key] = ft
    out.features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
    for key, ft in DEFAULT_FEATURES.items():
        out.features.setdefault(key, dict(ft))
    for key in FRAME_COLUMNS:
        if key in spec.fields and spec.fields[key].shape != ():
            raise DatasetFormatError(f"field {key!r}: LeRobot's {key} is a scalar per frame, "
                                     f"the store's has shape {list(spec.fields[key].shape)}")
    return out


def _final_fields(spec: Any) -> list[str]:
    return [n for n in spec.fields if n not in ("reward", "terminated", "truncated")
            and n not in spec.action_names]


def _frame_columns(spec: Any, vals: dict[str, np.ndarray], a: int, b: int, T: int, e: int,
                   index0: int, fps: float) -> dict[str, np.ndarray]:
    """LeRobot's per-frame columns: the store's fields of those names, else derived."""
    n = b - a
    out = {"index": np.arange(index0, index0 + n, dtype=np.int64)}
    derived = {"frame_index": np.arange(a, b, dtype=np.int64),
               "episode_index": np.full(n, e, np.int64),
               "task_index": np.zeros(n, np.int64)}
    derived["timestamp"] = (derived["frame_index"] / fps).astype(np.float32)
    for k in FRAME_COLUMNS:  # episode_index: LeRobot looks episodes up by it, so 0, 1, ...
        kept = vals.pop(k, None)
        out[k] = kept if kept is not None and k != "episode_index" else derived[k]
    return out


def _write_meta(dst: Path, spec: Any, cols: Columns, writer: FeatureWriter, stats: Stats,
                finals: dict[str, list], tasks: list[str], fps: float, frames: int,
                robot_type: str | None, video: bool) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    info = {"codebase_version": CODEBASE_VERSION, "robot_type": robot_type,
            "total_episodes": len(writer.episodes), "total_frames": frames,
            "total_tasks": len(tasks), "chunks_size": 1000,
            "data_files_size_in_mb": writer.data_file_mb,
            "video_files_size_in_mb": writer.video_file_mb,
            "fps": int(fps) if float(fps).is_integer() else fps,
            "splits": {"train": f"0:{len(writer.episodes)}"}, "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if video and cols.cameras else None,
            "features": writer.info_features()}
    (dst / "meta").mkdir(parents=True, exist_ok=True)
    (dst / INFO_PATH).write_text(json.dumps(info, indent=4))
    (dst / STATS_PATH).write_text(json.dumps(stats.result(), indent=4))
    write_tasks(dst / TASKS_PATH, tasks)
    path = dst / EPISODES_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(writer.episodes_table(), path)
    # what LeRobot has no place for: the spec and each episode's final row
    side = {"spec": spec.to_json(), "columns": cols.fields, "final_rows": FINAL_ROWS_PATH}
    (dst / SIDECAR_PATH).write_text(json.dumps(side, indent=1))
    arrays = {"episode_index": pa.array(finals["episode_index"], pa.int64()),
              "@terminated": pa.array(finals["@terminated"], pa.bool_())}
    for n in finals:
        if n in arrays:
            continue
        f = spec.fields[n]
        vals = np.asarray(finals[n], f.dtype).reshape(-1, *f.shape)
        arrays[n] = (pa.array([{"bytes": encode_png(v, 6), "path": None} for v in vals],
                               image_struct_type()) if is_camera(f)
                     else arrow_column(vals))
    pq.write_table(pa.table(arrays), dst / FINAL_ROWS_PATH)

