"""A store -> an RLDS dataset directory: :func:`export_rlds` (what
``tfds.builder_from_directory(dst).as_dataset(split=...)`` reads)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...api import open as open_store
from ..episodes import ExportReader, store_episodes
from ..progress import Progress, ProgressArg
from ..summary import ImportSummary
from .features import Leaf, encode, features_json
from .records import Example, frame
from .source import SPEC_FILE, TEMPLATE, shard_names

_BUILTIN = ("terminated", "truncated")


def rlds_leaves(spec: Any, image_format: str = "png") -> list[tuple[str | None, Leaf]]:
    """``(store field, leaf)`` of every feature an export writes (flags: no field)."""
    rlds = spec.structure.get("rlds", {})
    keys, episode = rlds.get("keys", {}), set(rlds.get("episode_fields", []))
    encodings = rlds.get("encodings", {})
    out: list[tuple[str | None, Leaf]] = []
    for name, f in spec.fields.items():
        if name in _BUILTIN:
            continue
        step = name not in episode
        key = keys.get(name) or _default_key(name, step)
        image = (encodings.get(name) in ("png", "jpeg") if name in encodings else
                 f.dtype == np.uint8 and len(f.shape) == 3 and f.shape[-1] in (1, 3, 4))
        if image and f.dtype == np.uint8 and len(f.shape) == 3:
            out.append((name, Leaf(key, "image", f.shape, f.dtype, image_format, step)))
            continue
        raw = f.dtype == np.float64 or f.row_nbytes >= 1024  # float_list would round / bloat
        enc = ("zlib" if f.row_nbytes >= 1024 else "bytes") if raw else "none"
        out.append((name, Leaf(key, "tensor", f.shape, f.dtype, enc, step)))
    for flag in ("is_first", "is_last", "is_terminal"):
        out.append((None, Leaf(f"steps/{flag}", "tensor", (), np.dtype(bool))))
    return out


def _default_key(name: str, step: bool) -> str:
    head, _, rest = name.partition(".")
    head = {"obs": "observation"}.get(head, head)
    path = "/".join([head, *rest.split(".")] if rest else [head])
    return f"steps/{path}" if step else path


def export_rlds(url: str | os.PathLike, dst: str | os.PathLike, *, name: str = "rlds",
                split: str = "train", image_format: str = "png", png_level: int = 6,
                shard_bytes: int = 256 << 20, storage_options: dict[str, Any] | None = None,
                progress: ProgressArg = None) -> ImportSummary:
    """Write the complete episodes of the store at ``url`` as an RLDS dataset in directory
    ``dst`` (``dataset_info.json``, ``features.json``, TFRecord shards of about
    ``shard_bytes``), one Example per episode: ``T`` transitions and the final row are
    ``T + 1`` steps (the last: the final observation, zero action and reward,
    ``is_last``, ``is_terminal`` when the episode terminated). Images are PNG
    (``image_format="jpeg"``: lossy); float64 fields are written as raw bytes (a
    ``float_list`` would round them), fields of 1 KiB a row and more zlib'd."""
    if image_format not in ("png", "jpeg"):
        raise ValueError(f"image_format: expected 'png' or 'jpeg', got {image_format!r}")
    if not name or not name.replace("_", "").isalnum():
        raise ValueError(f"name: expected a TFDS dataset name (letters, digits, _), got "
                         f"{name!r}")
    t0 = time.perf_counter()
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    store = open_store(url, "r", storage_options=storage_options)
    summary = ImportSummary(str(url), str(dst), kind="rlds export", lanes=store.lanes)
    tmp: list[Path] = []
    lengths: list[int] = []
    try:
        leaves = rlds_leaves(store.spec, image_format)
        spec_json = store.spec.to_json()
        episodes = store_episodes(store)
        reader = ExportReader(store)
        prog = Progress(sum(T + 1 for _, _, T in episodes), f"rlds export {dst.name}",
                        progress)
        out = None
        try:
            for lane, first, T in episodes:
                if out is None or out.tell() >= shard_bytes:
                    if out is not None:
                        out.close()
                    tmp.append(dst / f".{name}-{split}.part{len(tmp):05d}")
                    out = open(tmp[-1], "wb")  # noqa: SIM115 - closed above / below
                    lengths.append(0)
                data = _episode(store, reader, leaves, lane, first, T, png_level)
                out.write(frame(data))
                lengths[-1] += 1
                summary.steps += T
                summary.rows += T + 1
                summary.episodes += 1
                prog.update(T + 1, len(data))
        finally:
            if out is not None:
                out.close()
            reader.close()
            prog.close()
        held = sum(int(n) for n in store.index.held())
        if held > summary.rows:
            summary.notes.append(f"{held - summary.rows:,} row(s) of unfinished or partly "
                                 "overwritten episodes left out (RLDS episodes end with "
                                 "is_last)")
    finally:
        store.close()
    names = shard_names(name, split, len(tmp))
    for p, final in zip(tmp, names):
        os.replace(p, dst / final)
    summary.outputs = [str(dst / n) for n in names]
    summary.bytes_out = sum((dst / n).stat().st_size for n in names)
    (dst / "features.json").write_text(json.dumps(features_json([lf for _, lf in leaves]),
                                                  indent=2))
    info = {"name": name, "version": "1.0.0", "fileFormat": "tfrecord",
            "moduleName": "expstore.datasets.rlds",
            "description": f"exported by expstore from {store.url}",
            "splits": [{"name": split, "filepathTemplate": TEMPLATE,
                        "shardLengths": [str(n) for n in lengths],
                        "numBytes": str(summary.bytes_out)}]}
    (dst / "dataset_info.json").write_text(json.dumps(info, indent=2))
    # what TFDS has no place for (frame stacking, bounds, codecs): read back by import_rlds
    (dst / SPEC_FILE).write_text(json.dumps(spec_json, indent=2))
    summary.seconds = time.perf_counter() - t0
    return summary


def _episode(store: Any, reader: ExportReader, leaves: list[tuple[str | None, Leaf]],
             lane: int, first: int, T: int, png_level: int) -> bytes:
    """One episode (``T`` transitions, ``T + 1`` rows) as a serialized Example."""
    steps = np.arange(first, first + T + 1, dtype=np.int64)
    rows = store.index.lane_rows(lane, steps)
    terminated = bool(reader.read("terminated", rows[T - 1:T], steps[T - 1:T])[0])
    flags = {"steps/is_first": np.arange(T + 1) == 0, "steps/is_last": np.arange(T + 1) == T,
             "steps/is_terminal": (np.arange(T + 1) == T) & terminated}
    ex = Example()
    feats = ex.features.feature
    for field, leaf in leaves:
        if field is None:
            vals = flags[leaf.key]
        elif leaf.step:
            vals = reader.read(field, rows, steps)
        else:
            vals = reader.read(field, rows[:1], steps[:1])
        encode(leaf, vals, feats[leaf.key], png_level)
    return ex.SerializeToString()
