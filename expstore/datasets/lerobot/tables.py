"""Writing a v3 dataset's files: per-frame parquet files and MP4s rotated by size
(:class:`FeatureWriter`), ``meta/stats.json`` (:class:`Stats`), ``meta/tasks.parquet``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .frames import VideoWriter, encode_png
from .layout import DATA_PATH, VIDEO_PATH, chunk_file


def image_struct_type() -> Any:
    """``{"bytes": binary, "path": string}``: how ``datasets.Image`` lies in parquet."""
    import pyarrow as pa

    return pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def arrow_column(vals: np.ndarray) -> Any:
    """``(n,)`` -> a scalar column, ``(n, k)`` -> a fixed-size list column (``datasets``'
    ``Sequence(length=k)``)."""
    import pyarrow as pa

    if vals.ndim == 1:
        return pa.array(vals)
    if vals.ndim != 2:
        raise ValueError(f"expected 1 or 2 dims, got shape {vals.shape}")
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(vals).reshape(-1)),
                                             vals.shape[1])


def write_tasks(path: Path, tasks: list[str]) -> None:
    """``meta/tasks.parquet`` as pandas writes LeRobot's frame (text index, ``task_index``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pandas_meta = {"index_columns": ["__index_level_0__"],
                   "column_indexes": [{"name": None, "field_name": None,
                                       "pandas_type": "unicode", "numpy_type": "object",
                                       "metadata": {"encoding": "UTF-8"}}],
                   "columns": [{"name": "task_index", "field_name": "task_index",
                                "pandas_type": "int64", "numpy_type": "int64",
                                "metadata": None},
                               {"name": None, "field_name": "__index_level_0__",
                                "pandas_type": "unicode", "numpy_type": "object",
                                "metadata": None}],
                   "creator": {"library": "pyarrow", "version": pa.__version__},
                   "pandas_version": "2.2.3"}
    t = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()),
                  "__index_level_0__": pa.array(tasks, pa.string())})
    t = t.replace_schema_metadata({"pandas": json.dumps(pandas_meta)})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path)


class FeatureWriter:
    """Frames -> ``data/chunk-*/file-*.parquet`` (a new file once one holds
    ``data_file_mb`` MiB, between episodes) and ``videos/<key>/chunk-*/file-*.mp4``."""

    def __init__(self, dst: Path, cols: Any, fps: float, png_level: int, data_file_mb: int,
                 video_file_mb: int, video: tuple[str, int, int]) -> None:
        self.dst = dst
        self.cols = cols
        self.fps = fps
        self.png_level = png_level
        self.data_file_mb = int(data_file_mb)
        self.video_file_mb = int(video_file_mb)
        self.video = video
        self.episodes: list[dict[str, Any]] = []
        self._file = -1
        self._pq: Any = None
        self._bytes = 0
        self._vid: dict[str, tuple[int, VideoWriter]] = {}
        self._ep: dict[str, Any] = {}
        self._schema: Any = None
        self.video_info: dict[str, dict[str, Any]] = {}

    def _order(self) -> list[str]:
        return [k for k in self.cols.features if self.cols.cameras.get(k) != "video"]

    def start_episode(self, ep_index: int) -> None:
        if self._pq is None or self._bytes >= self.data_file_mb << 20:
            self._next_data_file()
        ep: dict[str, Any] = {"data": chunk_file(self._file)}
        for key, kind in self.cols.cameras.items():
            if kind != "video":
                continue
            have = self._vid.get(key)
            if have is None or have[1].bytes >= self.video_file_mb << 20:
                self._next_video(key, -1 if have is None else have[0])
            i, w = self._vid[key]
            ep[key] = (chunk_file(i), w.frames / self.fps)
        self._ep = ep

    def _next_data_file(self) -> None:
        import pyarrow.parquet as pq

        if self._pq is not None:
            self._pq.close()
        self._file += 1
        c, f = chunk_file(self._file)
        path = self.dst / DATA_PATH.format(chunk_index=c, file_index=f)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._pq = None if self._schema is None else pq.ParquetWriter(path, self._schema,
                                                                      compression="snappy")
        self._bytes = 0

    def _next_video(self, key: str, last: int) -> None:
        if key in self._vid:
            self._vid[key][1].close()
        i = last + 1
        c, f = chunk_file(i)
        path = self.dst / VIDEO_PATH.format(video_key=key, chunk_index=c, file_index=f)
        path.parent.mkdir(parents=True, exist_ok=True)
        h, w, ch = self.cols.features[key]["shape"]
        codec, crf, gop = self.video
        self._vid[key] = (i, VideoWriter(str(path), self.fps, (h, w, ch), codec, crf, gop))
        self.video_info[key] = {"video.height": h, "video.width": w, "video.codec": codec,
                                "video.pix_fmt": "yuv420p", "video.is_depth_map": False,
                                "video.fps": self.fps, "video.channels": 3,
                                "has_audio": False}

    def write(self, vals: dict[str, np.ndarray], frame: dict[str, np.ndarray]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        by_key = {self.cols.fields[n]: v for n, v in vals.items()}
        by_key.update(frame)
        arrays = []
        for key in self._order():
            v = by_key[key]
            if self.cols.cameras.get(key) == "image":
                arrays.append(pa.array([{"bytes": encode_png(a, self.png_level), "path": None}
                                        for a in v], image_struct_type()))
            else:
                arrays.append(arrow_column(v.reshape(len(v), -1) if v.ndim > 1 else v))
        for key, kind in self.cols.cameras.items():
            if kind == "video":
                self._vid[key][1].write(by_key[key])
        table = pa.Table.from_arrays(arrays, names=self._order())
        if self._schema is None:
            self._schema = table.schema
        if self._pq is None:
            self._pq = pq.ParquetWriter(self._path, self._schema, compression="snappy")
        self._pq.write_table(table)
        self._bytes += table.nbytes

    def end_episode(self, ep_index: int, length: int, start: int, tasks: list[str]) -> None:
        c, f = self._ep["data"]
        row = {"episode_index": ep_index, "tasks": tasks, "length": length,
               "data/chunk_index": c, "data/file_index": f,
               "dataset_from_index": start, "dataset_to_index": start + length}
        for key, kind in self.cols.cameras.items():
            if kind == "video":
                (vc, vf), t0 = self._ep[key]
                row.update({f"videos/{key}/chunk_index": vc, f"videos/{key}/file_index": vf,
                            f"videos/{key}/from_timestamp": t0,
                            f"videos/{key}/to_timestamp": t0 + length / self.fps})
        row["meta/episodes/chunk_index"] = 0
        row["meta/episodes/file_index"] = 0
        self.episodes.append(row)

    def episodes_table(self) -> Any:
        import pyarrow as pa

        if not self.episodes:
            raise ValueError("the store holds no complete episode to export")
        cols = {k: [e[k] for e in self.episodes] for k in self.episodes[0]}
        types = {"tasks": pa.list_(pa.string())}
        return pa.table({k: pa.array(v, types.get(k, pa.float64() if "timestamp" in k
                                                   else pa.int64()))
                         for k, v in cols.items()})

    def info_features(self) -> dict[str, Any]:
        out = {}
        for key, ft in self.cols.features.items():
            ft = dict(ft)
            if key in self.video_info:
                ft["info"] = self.video_info[key]
            out[key] = ft
        return out

    def close(self) -> None:
        if self._pq is not None:
            self._pq.close()
            self._pq = None
        for _, w in self._vid.values():
            w.close()
        self._vid = {}


class Stats:
    """``meta/stats.json``: per feature ``min``/``max``/``mean``/``std``/``count`` (cameras:
    per channel, pixels / 255, shaped ``(C, 1, 1)`` as LeRobot's)."""

    def __init__(self, cols: Any) -> None:
        self.cols = cols
        self.acc: dict[str, list[Any]] = {}

    def update(self, vals: dict[str, np.ndarray], frame: dict[str, np.ndarray]) -> None:
        by_key = {self.cols.fields[n]: v for n, v in vals.items()}
        by_key.update(frame)
        for key, v in by_key.items():
            if key in self.cols.cameras:
                x = v.reshape(len(v), -1, v.shape[-1] if v.ndim == 4 else 1)
                x = x.astype(np.float64) / 255.0
                axes = (0, 1)
            else:
                x = v.reshape(len(v), -1).astype(np.float64)
                axes = (0,)
            s = [x.sum(axes), (x * x).sum(axes), x.min(axes), x.max(axes), len(v)]
            a = self.acc.get(key)
            if a is None:
                self.acc[key] = s
            else:
                self.acc[key] = [a[0] + s[0], a[1] + s[1], np.minimum(a[2], s[2]),
                                 np.maximum(a[3], s[3]), a[4] + s[4]]

    def result(self) -> dict[str, dict[str, Any]]:
        out = {}
        for key, (s, ss, lo, hi, n) in self.acc.items():
            if key in self.cols.cameras:
                px = n * int(np.prod(self.cols.features[key]["shape"][:2]))
                mean = s / px
                std = np.sqrt(np.maximum(ss / px - mean ** 2, 0))
                shape = (-1, 1, 1)
            else:
                mean = s / n
                std = np.sqrt(np.maximum(ss / n - mean ** 2, 0))
                shape = (-1,)
            out[key] = {"min": lo.reshape(shape).tolist(), "max": hi.reshape(shape).tolist(),
                        "mean": mean.reshape(shape).tolist(),
                        "std": std.reshape(shape).tolist(), "count": [int(n)]}
        return out
