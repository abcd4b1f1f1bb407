"""LeRobot v3.0's files, as LeRobot 0.4 writes them (``lerobot/datasets/utils.py``):

* ``meta/info.json``: ``codebase_version`` ("v3.0"), ``fps``, ``robot_type``, ``features``
  (key -> ``{"dtype", "shape", "names"}``; dtype ``image``/``video`` for cameras),
  ``data_path``/``video_path`` templates, ``chunks_size``, ``data_files_size_in_mb``,
  ``video_files_size_in_mb``, ``total_episodes``/``total_frames``/``total_tasks``, ``splits``;
* ``meta/tasks.parquet``: a pandas frame whose index is the task text, column ``task_index``;
* ``meta/episodes/chunk-XXX/file-XXX.parquet``: one row per episode: ``episode_index``,
  ``tasks``, ``length``, ``data/chunk_index``, ``data/file_index``, ``dataset_from_index``,
  ``dataset_to_index``, ``videos/<key>/{chunk_index,file_index,from_timestamp,to_timestamp}``,
  ``meta/episodes/{chunk_index,file_index}`` (and ``stats/...``, not read);
* ``data/chunk-XXX/file-XXX.parquet``: one row per frame, one column per non-video feature
  (shape ``[1]``: a scalar column; ``[n]``: a fixed-size list; images: PNG structs
  ``{"bytes", "path"}``); an episode's frames lie in one file, in order;
* ``videos/<key>/chunk-XXX/file-XXX.mp4``: episodes one after another in one stream; a frame
  is at ``from_timestamp + timestamp`` s;
* ``meta/stats.json``: per-feature ``min``/``max``/``mean``/``std``/``count``.

expstore adds ``meta/expstore.json`` to what it exports (the store's spec and the final
observation of each episode, which LeRobot has no place for); LeRobot ignores it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import DatasetFormatError
from ..source import SourceFolder

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
EPISODES_PATH = EPISODES_DIR + "/" + CHUNK_FILE + ".parquet"
SIDECAR_PATH = "meta/expstore.json"
FINAL_ROWS_PATH = "meta/expstore_final_rows.parquet"
CHUNKS_SIZE = 1000  #: files per chunk folder (LeRobot's DEFAULT_CHUNK_SIZE)
DATA_FILE_MB = 100  #: LeRobot's DEFAULT_DATA_FILE_SIZE_IN_MB
VIDEO_FILE_MB = 200  #: LeRobot's DEFAULT_VIDEO_FILE_SIZE_IN_MB
#: per-frame columns every v3 dataset has (LeRobot's DEFAULT_FEATURES)
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
IMAGE_NAMES = ["height", "width", "channels"]
NUMERIC = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64")


def chunk_file(i: int) -> tuple[int, int]:
    """``(chunk_index, file_index)`` of the ``i``-th file (``CHUNKS_SIZE`` files a chunk)."""
    return i // CHUNKS_SIZE, i % CHUNKS_SIZE


@dataclass
class Episode:
    """One row of ``meta/episodes``: frames ``[start, stop)`` of the dataset."""

    index: int
    length: int
    tasks: list[str]
    data_file: tuple[int, int]
    start: int
    stop: int
    videos: dict[str, tuple[tuple[int, int], float]] = field(default_factory=dict)


@dataclass
class Meta:
    """A v3 dataset's metadata: info, tasks (by ``task_index``), episodes (in order)."""

    info: dict[str, Any]
    tasks: list[str]
    episodes: list[Episode]
    sidecar: dict[str, Any] | None = None

    @property
    def fps(self) -> float:
        return float(self.info["fps"])

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.info["features"]

    def data_path(self, chunk_file: tuple[int, int]) -> str:
        return self.info.get("data_path", DATA_PATH).format(chunk_index=chunk_file[0],
                                                            file_index=chunk_file[1])

    def video_path(self, key: str, chunk_file: tuple[int, int]) -> str:
        tpl = self.info.get("video_path") or VIDEO_PATH
        return tpl.format(video_key=key, chunk_index=chunk_file[0], file_index=chunk_file[1])


class Source:
    """A dataset root: a local folder or any fsspec URL (``hf://datasets/<repo>`` with
    ``huggingface_hub`` installed), files opened for streaming, never copied."""

    def __init__(self, url: str | os.PathLike, storage_options: dict[str, Any] | None = None):
        self.folder = SourceFolder(url, storage_options)
        self.url = self.folder.url

    def location(self, path: str) -> str:
        return self.folder.location(path)

    def open(self, path: str) -> Any:
        return self.folder.open(path)

    def exists(self, path: str) -> bool:
        if self.folder.remote:
            return bool(self.folder.fs.exists(f"{self.folder.root}/{path}"))
        return os.path.exists(os.path.join(self.folder.root, path))

    def read_json(self, path: str) -> Any:
        with self.open(path) as f:
            try:
                return json.loads(f.read())
            except ValueError as e:
                raise DatasetFormatError(f"{self.location(path)}: not JSON ({e})") from None

    def glob_parquet(self, folder: str) -> list[str]:
        """``folder/*/*.parquet`` relative to the root, sorted (LeRobot's order)."""
        if self.folder.remote:
            root = self.folder.root
            hits = self.folder.fs.glob(f"{root}/{folder}/*/*.parquet")
            return sorted(h[len(root) + 1:] for h in hits)
        base = os.path.join(self.folder.root, folder)
        out = []
        for sub in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            d = os.path.join(base, sub)
            if os.path.isdir(d):
                out += [f"{folder}/{sub}/{n}" for n in sorted(os.listdir(d))
                        if n.endswith(".parquet")]
        return out


def read_parquet(src: Source, path: str, columns: list[str] | None = None) -> Any:
    """A whole (small) parquet file as a pyarrow table."""
    import pyarrow.parquet as pq

    with src.open(path) as f:
        return pq.read_table(f, columns=columns)


def parquet_columns(src: Source, path: str) -> list[str]:
    """Column names of a parquet file (its footer only)."""
    import pyarrow.parquet as pq

    with src.open(path) as f:
        return pq.ParquetFile(f).schema_arrow.names


def task_texts(table: Any, where: str) -> list[str]:
    """Task text by ``task_index`` from ``meta/tasks.parquet`` (pandas writes the text as the
    frame's index: ``__index_level_0__`` or the column its metadata names)."""
    names = table.column_names
    text = "task" if "task" in names else None
    if text is None and table.schema.metadata and b"pandas" in table.schema.metadata:
        idx = json.loads(table.schema.metadata[b"pandas"]).get("index_columns") or []
        text = next((c for c in idx if isinstance(c, str) and c in names), None)
    if text is None and "__index_level_0__" in names:
        text = "__index_level_0__"
    if text is None or "task_index" not in names:
        raise DatasetFormatError(f"{where}: expected a task_index column and the task text "
                                 f"(the index), got columns {names}")
    ti = np.asarray(table.column("task_index").to_numpy(), np.int64)
    texts = table.column(text).to_pylist()
    out = [""] * (int(ti.max()) + 1 if len(ti) else 0)
    for i, t in zip(ti, texts):
        out[int(i)] = str(t)
    return out


def read_meta(src: Source) -> Meta:
    """Read ``info.json``, the tasks and the episodes of the dataset at ``src``."""
    if not src.exists(INFO_PATH):
        raise FileNotFoundError(f"{src.location(INFO_PATH)}: not found; is {src.url} a "
                                "LeRobot v3 dataset root?")
    info = src.read_json(INFO_PATH)
    where = src.location(INFO_PATH)
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3"):
        raise DatasetFormatError(f"{where}: codebase_version {version!r}; expected v3.x "
                                 "(convert v2.1 datasets with LeRobot's "
                                 "convert_dataset_v21_to_v30 first)")
    for key in ("fps", "features"):
        if key not in info:
            raise DatasetFormatError(f"{where}: missing {key!r}")
    tasks = (task_texts(read_parquet(src, TASKS_PATH), src.location(TASKS_PATH))
             if src.exists(TASKS_PATH) else [])
    files = src.glob_parquet(EPISODES_DIR)
    if not files:
        raise DatasetFormatError(f"{src.location(EPISODES_DIR)}: no chunk-*/file-*.parquet")
    video_keys = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
    episodes: list[Episode] = []
    need = ["episode_index", "length", "data/chunk_index", "data/file_index",
            "dataset_from_index", "dataset_to_index"]
    need += [f"videos/{k}/{c}" for k in video_keys
             for c in ("chunk_index", "file_index", "from_timestamp")]
    for path in files:
        cols = set(parquet_columns(src, path))
        missing = [c for c in need if c not in cols]
        if missing:
            raise DatasetFormatError(f"{src.location(path)}: missing column(s) {missing}")
        t = read_parquet(src, path, need + (["tasks"] if "tasks" in cols else []))
        d = {c: t.column(c).to_pylist() for c in need + (["tasks"] if "tasks" in cols else [])}
        for i in range(t.num_rows):
            ep = Episode(int(d["episode_index"][i]), int(d["length"][i]),
                         list(d["tasks"][i] or []) if "tasks" in d else [],
                         (int(d["data/chunk_index"][i]), int(d["data/file_index"][i])),
                         int(d["dataset_from_index"][i]), int(d["dataset_to_index"][i]))
            for k in video_keys:
                ep.videos[k] = ((int(d[f"videos/{k}/chunk_index"][i]),
                                 int(d[f"videos/{k}/file_index"][i])),
                                float(d[f"videos/{k}/from_timestamp"][i]))
            if ep.stop - ep.start != ep.length or ep.length < 1:
                raise DatasetFormatError(f"{src.location(path)}: episode {ep.index}: length "
                                         f"{ep.length} but frames [{ep.start}, {ep.stop})")
            episodes.append(ep)
    episodes.sort(key=lambda e: e.start)
    sidecar = src.read_json(SIDECAR_PATH) if src.exists(SIDECAR_PATH) else None
    return Meta(info, tasks, episodes, sidecar)


def feature_shape(name: str, ft: dict[str, Any]) -> tuple[int, ...]:
    """A feature's per-frame shape as expstore stores it: ``[1]`` -> ``()``, cameras in
    height-width-channels order whatever order ``names`` gives."""
    shape = tuple(int(s) for s in ft.get("shape") or ())
    if ft.get("dtype") in ("image", "video"):
        names = list(ft.get("names") or [])
        if len(shape) != 3:
            raise DatasetFormatError(f"feature {name!r}: camera shape {list(shape)}; expected "
                                     "3 dims (height, width, channels)")
        if names[:1] == ["channels"]:
            return shape[1], shape[2], shape[0]
        return shape
    return () if shape == (1,) else shape
