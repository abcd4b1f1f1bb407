"""A LeRobot v3.0 dataset written by hand from the published layout (LeRobot 0.4's
``lerobot/datasets/utils.py`` and ``lerobot_dataset.py``), with pyarrow and Pillow only, so the
layout tests do not depend on expstore's own writer nor on the ``lerobot`` package:

* ``meta/info.json`` with ``codebase_version: "v3.0"``, fps, features, path templates;
* ``meta/tasks.parquet`` as pandas writes it (task text in the index, ``task_index``);
* ``meta/episodes/chunk-000/file-000.parquet`` (episode_index, tasks, length, data/...,
  dataset_from/to_index, stats/..., meta/episodes/...);
* ``data/chunk-000/file-00N.parquet``: ``observation.state`` as a fixed-size list, the camera
  as ``{"bytes", "path"}`` PNG structs, scalars for shape-[1] features.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

INFO_KEYS = {"codebase_version", "robot_type", "total_episodes", "total_frames", "total_tasks",
             "chunks_size", "data_files_size_in_mb", "video_files_size_in_mb", "fps", "splits",
             "data_path", "video_path", "features"}
EPISODE_COLUMNS = {"episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
                   "dataset_from_index", "dataset_to_index", "meta/episodes/chunk_index",
                   "meta/episodes/file_index"}
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
TASKS = ["push the T", "stack the cube"]


def png(a: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def write_tasks(path: Path, tasks: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = {"index_columns": ["__index_level_0__"], "column_indexes": [],
            "columns": [{"name": "task_index", "field_name": "task_index",
                         "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
                        {"name": None, "field_name": "__index_level_0__",
                         "pandas_type": "unicode", "numpy_type": "object", "metadata": None}],
            "pandas_version": "2.2.3"}
    t = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()),
                  "__index_level_0__": pa.array(tasks)})
    pq.write_table(t.replace_schema_metadata({"pandas": json.dumps(meta)}), path)


def write_v3(root: Path, lengths: list[int], shape: tuple[int, int, int] = (24, 32, 3),
             state_dim: int = 6, per_file: int = 2, done: bool = True, seed: int = 0,
             string_feature: bool = True) -> dict[str, np.ndarray]:
    """Write the dataset; returns the per-frame values written (``done``: ``next.done`` on
    the last frame of even episodes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    n = sum(lengths)
    ep = np.repeat(np.arange(len(lengths)), lengths)
    fi = np.concatenate([np.arange(t) for t in lengths])
    vals = {"observation.state": rng.normal(size=(n, state_dim)).astype(np.float32),
            "observation.images.top": rng.integers(0, 256, (n, *shape), dtype=np.uint8),
            "action": rng.normal(size=(n, 2)).astype(np.float32),
            "next.reward": rng.normal(size=n).astype(np.float32),
            "next.done": np.zeros(n, bool), "timestamp": (fi / 10).astype(np.float32),
            "frame_index": fi.astype(np.int64), "episode_index": ep.astype(np.int64),
            "index": np.arange(n, dtype=np.int64), "task_index": (ep % 2).astype(np.int64)}
    ends = np.cumsum(lengths) - 1
    vals["next.done"][ends[::2]] = True
    features = {
        "observation.state": {"dtype": "float32", "shape": [state_dim], "names": None},
        "observation.images.top": {"dtype": "image", "shape": list(shape),
                                   "names": ["height", "width", "channels"]},
        "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None}}
    if done:
        features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
    else:
        del vals["next.done"]
    if string_feature:
        features["language_instruction"] = {"dtype": "string", "shape": [1], "names": None}
    (root / "meta").mkdir(parents=True)
    info = {"codebase_version": "v3.0", "robot_type": "koch", "total_episodes": len(lengths),
            "total_frames": n, "total_tasks": len(TASKS), "chunks_size": 1000,
            "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": 10,
            "splits": {"train": f"0:{len(lengths)}"}, "data_path": DATA_PATH,
            "video_path": None, "features": features}
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    write_tasks(root / "meta/tasks.parquet", TASKS)
    img_t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = {k: [] for k in sorted(EPISODE_COLUMNS | {"stats/action/mean"})}
    start = 0
    for e, t in enumerate(lengths):
        f = e // per_file
        sl = slice(start, start + t)
        path = root / DATA_PATH.format(chunk_index=0, file_index=f)
        path.parent.mkdir(parents=True, exist_ok=True)
        cols = {}
        for k, ft in features.items():
            if k == "language_instruction":
                cols[k] = pa.array([TASKS[e % 2]] * t)
            elif ft["dtype"] == "image":
                cols[k] = pa.array([{"bytes": png(a), "path": f"frame_{i:06d}.png"}
                                    for i, a in enumerate(vals[k][sl])], img_t)
            elif ft["shape"] == [1]:
                cols[k] = pa.array(vals[k][sl])
            else:
                cols[k] = pa.FixedSizeListArray.from_arrays(
                    pa.array(vals[k][sl].reshape(-1)), ft["shape"][0])
        table = pa.table(cols)
        if path.exists():  # episodes of one file: appended, as LeRobot's ParquetWriter does
            table = pa.concat_tables([pq.read_table(path), table])
        pq.write_table(table, path)
        for k, v in {"episode_index": e, "tasks": [TASKS[e % 2]], "length": t,
                     "data/chunk_index": 0, "data/file_index": f, "dataset_from_index": start,
                     "dataset_to_index": start + t, "meta/episodes/chunk_index": 0,
                     "meta/episodes/file_index": 0,
                     "stats/action/mean": vals["action"][sl].mean(0).tolist()}.items():
            rows[k].append(v)
        start += t
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table(rows), path)
    return vals
