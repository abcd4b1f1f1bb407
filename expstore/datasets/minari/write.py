"""Episode writers for Minari datasets: compressed hdf5, compressed arrow, and Minari's own.

All three write the directory layout ``minari`` 0.5 reads (``main_data.hdf5`` with one
``episode_<id>`` group per episode, or one arrow file per episode under ``<id>/``).
The compressed writers keep every value exact:

* hdf5: chunked datasets with the gzip (deflate) filter, which every HDF5 build and
  h5py read transparently, or lzf (h5py only). Image chunks are slabs of a few pixel
  rows across many frames, so deflate finds the previous frames' pixels (see
  :func:`chunk_shape`); readers see plain arrays.
* arrow: Arrow IPC files with zstd/lz4 buffer compression, which ``pyarrow`` reads
  transparently. One episode is one record batch, so zstd sees the whole episode.

``MinariNativeWriter`` hands episodes to Minari's own ``update_episodes`` (uncompressed,
or JPEG for image spaces): Minari's default output, used as the baseline.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import SpecError

CHUNK_BYTES = 1 << 20  #: target bytes per hdf5 chunk (rows of one dataset)
SMALL_BYTES = 4096  #: hdf5 datasets up to this size are stored contiguous, unfiltered
SLAB_BYTES = 512  #: bytes of one frame's part of an image chunk (see ``chunk_shape``)
HDF5_COMPRESSION = ("gzip", "lzf")
ARROW_COMPRESSION = ("zstd", "lz4")


@dataclass
class Episode:
    """One episode as Minari holds it: ``T`` steps, ``T + 1`` observations and infos."""

    id: int
    observations: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: dict[str, Any] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        """What Minari's DataCollector records per episode (id, steps, reward stats)."""
        r = np.asarray(self.rewards, np.float64)
        return {"id": int(self.id), "total_steps": int(len(r)),
                "rewards_sum": float(r.sum()), "rewards_mean": float(r.mean()),
                "rewards_std": float(r.std()), "rewards_max": float(r.max()),
                "rewards_min": float(r.min())}


def tree_nbytes(tree: Any) -> int:
    if isinstance(tree, dict):
        return sum(tree_nbytes(v) for v in tree.values())
    if isinstance(tree, tuple):
        return sum(tree_nbytes(v) for v in tree)
    return int(np.asarray(tree).nbytes)


class Hdf5Writer:
    """Episodes into ``main_data.hdf5`` with a lossless filter on every dataset."""

    def __init__(self, data_path: pathlib.Path, compression: str, level: int | None) -> None:
        import h5py

        if compression not in HDF5_COMPRESSION:
            raise ValueError(f"compression: hdf5 supports {HDF5_COMPRESSION} (or None), "
                             f"got {compression!r}")
        self.compression = compression
        self.opts = (6 if level is None else int(level)) if compression == "gzip" else None
        if self.opts is not None and not 0 <= self.opts <= 9:
            raise ValueError(f"compression_level: gzip takes 0..9, got {level}")
        # minari's storage created (touched) the file; open it the way minari does
        # minari created (touched) the file; "latest" object headers and chunk indexes are
        # ~10 KiB smaller per episode than HDF5 1.8's B-trees (read by HDF5 >= 1.10)
        self.file = h5py.File(data_path / "main_data.hdf5", "a", track_order=True,
                              libver="latest")

    def write(self, ep: Episode) -> None:
        g = self.file.create_group(f"episode_{ep.id}")
        g.attrs.update(ep.metadata())
        self._put(g, "observations", ep.observations)
        self._put(g, "actions", ep.actions)
        self._put(g, "rewards", np.asarray(ep.rewards))
        self._put(g, "terminations", np.asarray(ep.terminations, bool))
        self._put(g, "truncations", np.asarray(ep.truncations, bool))
        self._put(g, "infos", ep.infos or {})

    def _put(self, group: Any, key: str, value: Any) -> None:
        if isinstance(value, dict):
            sub = group.create_group(key)
            for k, v in value.items():
                self._put(sub, str(k), v)
            return
        if isinstance(value, tuple):
            sub = group.create_group(key)
            for i, v in enumerate(value):
                self._put(sub, f"_index_{i}", v)
            return
        arr = np.ascontiguousarray(value)
        if arr.nbytes <= SMALL_BYTES:  # contiguous: no chunk index, filters gain nothing
            group.create_dataset(key, data=arr)
            return
        group.create_dataset(key, data=arr, chunks=chunk_shape(arr.shape, arr.itemsize),
                             compression=self.compression, compression_opts=self.opts)

    def close(self) -> None:
        self.file.close()


def chunk_shape(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """hdf5 chunks of ~``CHUNK_BYTES``. Images (``(n, H, W, ...)``, >= 1 KiB a frame) are
    cut into slabs of a few image rows (<= ``SLAB_BYTES``) over many frames, so deflate's
    32 KiB window holds the same slab of dozens of previous frames: 10-35% smaller than
    whole-frame chunks on 84x84 Atari frames, up to 35% on 210x160x3 ones."""
    n, row = shape[0], tuple(shape[1:])
    size = int(np.prod(row, dtype=np.int64)) * itemsize
    if len(row) < 2 or size < 1024:
        return (max(1, min(n, CHUNK_BYTES // max(1, size))), *row)
    for a in range(len(row)):  # cut at the first axis whose trailing block fits a slab
        line = int(np.prod(row[a + 1:], dtype=np.int64)) * itemsize
        if line <= SLAB_BYTES:
            break
    h = max(1, min(row[a], SLAB_BYTES // max(1, line)))
    return (max(1, min(n, CHUNK_BYTES // (h * line))), *(1,) * a, h, *row[a + 1:])


class ArrowWriter:
    """Episodes as Arrow IPC files (``<data>/<id>/part-0.arrow``), buffers compressed."""

    def __init__(self, data_path: pathlib.Path, observation_space: Any, action_space: Any,
                 compression: str, level: int | None) -> None:
        import pyarrow as pa
        import pyarrow.dataset as ds

        if compression not in ARROW_COMPRESSION:
            raise ValueError(f"compression: arrow supports {ARROW_COMPRESSION} (or None), "
                             f"got {compression!r}")
        name = "lz4_frame" if compression == "lz4" else compression
        if level is None and compression == "zstd":
            level = 9
        codec = pa.Codec(name) if level is None else pa.Codec(name, compression_level=level)
        self.options = ds.IpcFileFormat().make_write_options(compression=codec)
        self.path = data_path
        self.obs_space = observation_space
        self.act_space = action_space
        self.metadatas: list[dict[str, Any]] = []

    def write(self, ep: Episode) -> None:
        import pyarrow as pa
        import pyarrow.dataset as ds
        from minari.dataset._storages.arrow_storage import _encode_space

        n = len(ep.rewards) + 1
        batch = {
            "episode_id": np.full(n, ep.id, dtype=np.int32),
            "observations": _encode_space(self.obs_space, ep.observations,
                                          jpeg_encoding=False),
            "actions": _encode_space(self.act_space, ep.actions, pad=1, jpeg_encoding=False),
            "rewards": np.pad(np.asarray(ep.rewards), (0, 1)),
            "terminations": np.pad(np.asarray(ep.terminations, bool), (0, 1)),
            "truncations": np.pad(np.asarray(ep.truncations, bool), (0, 1)),
        }
        if ep.infos:
            batch["infos"] = arrow_infos(ep.infos)
        ds.write_dataset(pa.RecordBatch.from_pydict(batch), self.path, format="arrow",
                         partitioning=["episode_id"], file_options=self.options,
                         existing_data_behavior="overwrite_or_ignore")
        self.metadatas.append(ep.metadata())

    def close(self) -> None:
        import json

        for m in self.metadatas:
            (self.path / str(m["id"]) / "metadata.json").write_text(json.dumps(m))


def arrow_infos(infos: dict[str, Any]) -> Any:
    """Infos as the struct column Minari's arrow reader decodes (flat keys only).

    Minari 0.5.4 writes per-step scalars given as numpy arrays with an empty ``shape``
    tag its own reader cannot parse, and reads nested dicts back as arrays of dicts; here
    scalars carry no tag and nested dicts are refused.
    """
    import pyarrow as pa

    arrays, fields = [], []
    for k, v in infos.items():
        if isinstance(v, dict):
            raise SpecError(f"infos[{k!r}]: minari's arrow format reads nested info dicts "
                            "back as arrays of dicts; use data_format='hdf5' or infos=False")
        v = np.asarray(v)
        if v.ndim == 1:
            arr = pa.array(v)
            fields.append(pa.field(k, arr.type))
        else:
            flat = v.reshape(len(v), -1)
            t = pa.list_(pa.from_numpy_dtype(v.dtype), flat.shape[1])
            arr = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), type=t)
            fields.append(pa.field(k, t, metadata={"shape": ",".join(map(str, v.shape[1:]))}))
        arrays.append(arr)
    return pa.StructArray.from_arrays(arrays, fields=fields)


class MinariNativeWriter:
    """Minari's own ``storage.update_episodes`` (its default output; JPEG when asked)."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage
        self.metadatas: list[dict[str, Any]] = []

    def write(self, ep: Episode) -> None:
        from minari.data_collector import EpisodeBuffer

        infos = ep.infos or {}
        if self.storage.FORMAT != "hdf5":  # minari's arrow writer mis-tags 1-d numpy infos
            infos = _lists_for_scalars(infos)
        self.storage.update_episodes([EpisodeBuffer(
            id=ep.id, observations=ep.observations, actions=ep.actions,
            rewards=np.asarray(ep.rewards), terminations=np.asarray(ep.terminations, bool),
            truncations=np.asarray(ep.truncations, bool), infos=infos)])
        self.metadatas.append(ep.metadata())

    def close(self) -> None:
        if self.metadatas:
            self.storage.update_episode_metadata(self.metadatas,
                                                 [m["id"] for m in self.metadatas])


def _lists_for_scalars(infos: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in infos.items():
        if isinstance(v, dict):
            out[k] = _lists_for_scalars(v)
        else:
            a = np.asarray(v)
            out[k] = a.tolist() if a.ndim == 1 else a
    return out
