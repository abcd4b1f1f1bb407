"""Dataset formats by name, for the CLI and ``expstore.datasets.get_format``.

Each format names a module and its ``import_<fmt>(src, url, **options)`` /
``export_<fmt>(url_or_store, dst, **options)`` functions; modules are imported only when a
format is used, so optional dependencies (h5py, minari) stay optional. Register more with
:func:`register`.
"""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import json
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: options the CLI sets itself (flags), not listed as ``-o`` options
CLI_FLAGS = ("progress", "overwrite", "storage_options")


@dataclass(frozen=True)
class Format:
    name: str
    module: str
    importer: str
    exporter: str
    help: str = ""
    #: ``-o`` option -> one line of help, for the importer and the exporter
    import_help: dict[str, str] = field(default_factory=dict)
    export_help: dict[str, str] = field(default_factory=dict)
    src_help: str = "the dataset to read"
    dst_help: str = "where to write the dataset"

    def options(self, which: str) -> list[tuple[str, Any, str]]:
        """``(name, default, help)`` of the ``-o`` options of the ``"import"`` or
        ``"export"`` function (read from its signature; help from the registry)."""
        fn = self.functions()[0 if which == "import" else 1]
        helps = self.import_help if which == "import" else self.export_help
        out = []
        for name, p in inspect.signature(fn).parameters.items():
            if p.kind != p.KEYWORD_ONLY or name in CLI_FLAGS:
                continue
            out.append((name, p.default, helps.get(name, "see the function's docstring")))
        return out

    def functions(self) -> tuple[Callable, Callable]:
        """``(import_fn, export_fn)``; a clear ``ImportError`` if the module is missing."""
        try:
            mod = importlib.import_module(self.module)
        except ModuleNotFoundError as e:
            if e.name and self.module.startswith(e.name):
                raise ImportError(f"format {self.name!r}: module {self.module} is not "
                                  "available in this expstore") from e
            raise ImportError(f"format {self.name!r} needs {e.name} (not installed)") from e
        return getattr(mod, self.importer), getattr(mod, self.exporter)


FORMATS: dict[str, Format] = {}


def check_option_types(fn: Callable, options: dict[str, Any]) -> None:
    """``ValueError`` naming the first option whose value does not fit the type ``fn``
    declares for it (``-o capacity=abc``: ``capacity`` wants an int); options ``fn`` does
    not annotate, or annotates with types no JSON value has, pass."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: nothing to check against
        return
    for name, value in options.items():
        tp = hints.get(name)
        if tp is None or _fits(value, tp):
            continue
        shown = value if isinstance(value, str) else json.dumps(value)
        raise ValueError(f"-o {name}={shown}: expected {_describe(tp)}")


def _args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) \
        else (tp,)


def _fits(value: Any, tp: Any) -> bool:
    """Whether a JSON value (or string) fits the annotation ``tp``."""
    for t in _args(tp):
        origin = typing.get_origin(t) or t
        if t is Any or t is type(None) and value is None:
            return True
        if t is bool or t is int or t is float:
            if isinstance(value, bool):
                if t is bool:
                    return True
            elif isinstance(value, (int, float) if t is float else int):
                return True
        elif t is str or t is os.PathLike:
            if isinstance(value, str):
                return True
        elif origin in (dict, collections.abc.Mapping):
            if isinstance(value, dict):
                return True
        elif origin in (list, tuple, collections.abc.Sequence):
            item = typing.get_args(t)[:1]
            if isinstance(value, list) and (not item or all(_fits(v, item[0]) for v in value)):
                return True
        elif not isinstance(origin, type) or origin in (range, type(None)) \
                or issubclass(origin, collections.abc.Callable):  # no JSON value is one
            continue
        elif isinstance(value, origin):
            return True
    return False


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
          type(None): "null"}
_PLURAL = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def _describe(tp: Any) -> str:
    """What values fit ``tp``, for a message: ``"an integer or null"``."""
    out: list[str] = []
    for t in _args(tp):
        origin = typing.get_origin(t) or t
        if t in _NAMES:
            text = _NAMES[t]
        elif t is os.PathLike:
            text = "a path"
        elif origin in (dict, collections.abc.Mapping):
            text = "a JSON object"
        elif origin in (list, tuple, collections.abc.Sequence):
            item = typing.get_args(t)[:1]
            text = "a JSON list" + (f" of {_PLURAL[item[0]]}" if item and item[0] in _PLURAL
                                    else "")
        else:
            continue
        if text not in out:
            out.append(text)
    return " or ".join(out) or "a JSON value"


def register(name: str, module: str, importer: str, exporter: str, help: str = "",
             **details: Any) -> None:
    """Add (or replace) a format (``details``: the other :class:`Format` fields)."""
    FORMATS[name] = Format(name, module, importer, exporter, help, **details)


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise KeyError(f"unknown dataset format {name!r}; known: {', '.join(sorted(FORMATS))}")
    return FORMATS[name]


_STORE = {
    "capacity": "store capacity in rows (default: what the data needs; rounded up to "
                "whole shards)",
    "shard_rows": "rows per shard object (default: automatic, 64..4096; for large stores of "
                  "small rows up to 16384, and up to 16 MiB a shard past ~268M rows)",
    "fsync": "fsync every object written (survives power loss; slower)",
    "reject_nonfinite": "refuse NaN/inf values (false: store them)",
    "block_rows": "rows read and written at a time (memory ~ one block)",
}

register("dopamine", "expstore.datasets.dopamine", "import_dopamine", "export_dopamine",
         "Dopamine replay checkpoints / DQN Replay Dataset (local or fsspec folder, *_ckpt.N.gz)",
         import_help={**_STORE,
                      "stack": "frames per stacked observation (Dopamine's is 4)",
                      "num_actions": "action count, for the action field's bounds "
                                     "(default: max action + 1)",
                      "codec": "codec of the observation field, e.g. "
                               '\'{"name":"blosc","cname":"lz4"}\'',
                      "suffixes": "checkpoints to import, one lane each: '0-9,12' "
                                  "(default: every checkpoint found)",
                      "workers": "processes decoding checkpoints in parallel (default: one "
                                 "per CPU core; 1: in this process)",
                      "source_options": "fsspec options for the source URL, as JSON, e.g. "
                                        '\'{"token":"anon"}\''},
         export_help={"stack": "frames per stack written (default: the store's)",
                      "capacity": "replay capacity written (default: the rows exported)",
                      "update_horizon": "Dopamine's n-step update horizon",
                      "compresslevel": "gzip level 1..9 of the .gz files",
                      "block_rows": _STORE["block_rows"]},
         src_help="folder (local or fsspec URL) of Dopamine *_ckpt.N.gz checkpoints",
         dst_help="folder to write the checkpoints into")
register("d4rl", "expstore.datasets.d4rl", "import_d4rl", "export_d4rl",
         "D4RL HDF5 file (observations, actions, rewards, terminals, timeouts, ...)",
         import_help={**_STORE,
                      "stack": "frames per stacked observation: 'auto' (what the file's "
                               "expstore_spec says), null or an int",
                      "padding": "frame-stack padding at episode start: reset or zero "
                                 "(default: the file's, else reset)",
                      "where": "how messages name the source (default: SRC)"},
         export_help={"block_rows": _STORE["block_rows"],
                      "compression": "gzip (default), lzf or null (uncompressed)",
                      "compression_level": "gzip level 0..9 (default 4)"},
         src_help="D4RL HDF5 file", dst_help="HDF5 file to write")
register("npz", "expstore.datasets.npz", "import_npz", "export_npz",
         "one .npz file with every row, read and written in blocks",
         import_help={**_STORE},
         export_help={"compressed": "deflate the arrays (false: stored)",
                      "block_rows": _STORE["block_rows"]},
         src_help=".npz file (expstore's, or D4RL-style arrays)", dst_help=".npz file to write")
register("minari", "expstore.datasets.minari", "import_minari", "export_minari",
         "Minari dataset (id or directory)",
         import_help={**_STORE,
                      "root": "Minari datasets folder (default: MINARI_DATASETS_PATH or "
                              "~/.minari/datasets)",
                      "frame_stack": "'auto' (what the dataset's metadata says), null, or k: "
                                     "observations of shape (k, ...) stored one frame a row",
                      "padding": "frame-stack padding at episode start: reset or zero",
                      "infos": "import per-step infos as fields",
                      "episode_indices": "episodes to import, e.g. [0,1,2] (default all)",
                      "reward_dtype": "reward dtype (default: the dataset's)",
                      "truncate_unfinished": "mark an unflagged last step truncated "
                                             "instead of failing"},
         export_help={"root": "Minari datasets folder (default: MINARI_DATASETS_PATH or "
                              "~/.minari/datasets)",
                      "data_format": "hdf5 or arrow",
                      "compression": "auto, gzip/lzf (hdf5), zstd/lz4 (arrow), or null",
                      "compression_level": "compression level (default: the codec's)",
                      "jpeg_encoding": "Minari's own lossy JPEG writer for images",
                      "stacked": "write frame-stacked fields as (k, ...) stacks",
                      "infos": "write user fields as per-step infos",
                      "env": "Gymnasium id recorded as the dataset's env_spec",
                      "metadata": "extra dataset metadata, a JSON object",
                      "compare_jpeg": "also report Minari's JPEG size of the images"},
         src_help="Minari dataset id (e.g. mujoco/pusher/expert-v0) or its data folder",
         dst_help="Minari dataset id to write (under root)")
register("rlds", "expstore.datasets.rlds", "import_rlds", "export_rlds",
         "RLDS / TFDS dataset directory (Open X-Embodiment; local or fsspec URL), no TensorFlow",
         import_help={**_STORE,
                      "split": "split to import (default: every split)",
                      "codec": "codec of the image fields, e.g. '{\"name\":\"zstd\",\"level\":3}'",
                      "workers": "processes decoding shards (one lane each) in parallel "
                                 "(default: one per CPU core; 1: in this process)",
                      "source_options": FORMATS["dopamine"].import_help["source_options"]},
         export_help={"name": "dataset name in the shard file names (default: rlds)",
                      "split": "split written (default: train)", "png_level": "PNG level 0..9",
                      "image_format": "png (lossless, default) or jpeg",
                      "shard_bytes": "bytes per TFRecord shard before a new one starts"},
         src_help="TFDS dataset directory (dataset_info.json, features.json, *.tfrecord-*)",
         dst_help="directory to write the TFDS dataset into")
_LEROBOT_IMPORT = {**_STORE,
                   "codec": "codec of the camera fields, e.g. "
                            '\'{"name":"blosc","cname":"lz4"}\'',
                   "tolerance_s": "how far (s) a decoded video frame may lie from "
                                  "from_timestamp + timestamp",
                   "source_options": "fsspec options for SRC, as JSON"}
_LEROBOT_EXPORT = {"video": "cameras as MP4 files (lossy) instead of PNG in parquet",
                   "video_codec": "PyAV encoder of video=true: libsvtav1 (LeRobot's), "
                                  "libx264, ...",
                   "crf": "video quality (lower: better, larger)",
                   "gop": "frames between keyframes (LeRobot's: 2)",
                   "png_level": "zlib level 0..9 of the PNG frames",
                   "fps": "frames per second (default: the imported dataset's, else 30)",
                   "task": "task text of every frame when the store has no task_index",
                   "robot_type": "info.json robot_type",
                   "data_file_mb": "MiB of frames per data/*.parquet file",
                   "video_file_mb": "MiB per videos/*.mp4 file",
                   "block_rows": _STORE["block_rows"]}
register("lerobot", "expstore.datasets.lerobot", "import_lerobot", "export_lerobot",
         "LeRobot v3.0 dataset root (meta/info.json, data/*.parquet, videos/*.mp4)",
         import_help=_LEROBOT_IMPORT, export_help=_LEROBOT_EXPORT,
         src_help="LeRobot v3 dataset root (folder or fsspec URL, e.g. hf://datasets/...)",
         dst_help="new folder for the LeRobot v3 dataset root")
