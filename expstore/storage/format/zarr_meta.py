"""The zarr metadata of a store (``zarr.json`` of the group and of every array): what it
should be, whether plain zarr can read what is there, and the layout it still tells.

* :func:`expected_metadata` — the exact ``zarr.json`` bytes ``create`` writes for a layout.
* :func:`check_arrays` — per array, what is wrong with its ``zarr.json`` (missing, not
  JSON, not zarr v3 array metadata plain zarr parses, or another shape, dtype, chunking or
  codec than the layout's).
* :func:`layout_from_arrays` — the layout from the copy every array's ``zarr.json`` keeps
  in its ``expstore_layout`` attribute, for a store whose group ``zarr.json`` is lost.
* :func:`with_store_id` — a ``zarr.json`` whose layout attribute carries a store id
  (``expstore upgrade``), everything else kept.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from ...errors import StoreCorruptError
from ..backends import Backend
from .layout import BACKUP_ATTR, META_FIELDS, Layout, write_metadata

ROOT_KEY = "zarr.json"


def array_key(name: str) -> str:
    return f"{name}/zarr.json"


def expected_metadata(layout: Layout) -> dict[str, bytes]:
    """``{key: bytes}`` of the group's and every array's ``zarr.json`` for ``layout``
    (written by zarr itself into memory, so byte-identical to what ``create`` wrote)."""
    import fsspec

    root = f"memory://expstore-meta-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    try:
        write_metadata(root, layout, None, overwrite=True)
        base = root[len("memory://"):]
        return {key: bytes(fs.cat(f"/{base}/{key}"))
                for key in [ROOT_KEY, *(array_key(n) for n in layout.fields)]}
    finally:
        fs.rm(f"/{root[len('memory://'):]}", recursive=True)


def _without_attrs(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "attributes"}


def check_array(raw: bytes | None, expected: bytes, where: str) -> str | None:
    """What is wrong with one array's ``zarr.json`` (``None``: plain zarr reads it as the
    array the layout describes; its attributes are not compared)."""
    from zarr.core.metadata.v3 import ArrayV3Metadata

    if raw is None:
        return f"{where}: missing (plain zarr no longer sees this array)"
    try:
        doc = json.loads(raw)
        ArrayV3Metadata.from_dict(dict(doc))
    except Exception as e:  # zarr raises several types for bad metadata
        return f"{where}: plain zarr cannot read it ({type(e).__name__}: {e})"
    if _without_attrs(doc) != _without_attrs(json.loads(expected)):
        want = json.loads(expected)
        diff = sorted(k for k in set(doc) | set(want) if k != "attributes"
                      and doc.get(k) != want.get(k))
        return f"{where}: differs from the store's layout in {', '.join(diff)}"
    return None


def check_arrays(backend: Backend, layout: Layout) -> list[tuple[str, str]]:
    """``(key, problem)`` for every array ``zarr.json`` plain zarr cannot use as the layout
    says."""
    want = expected_metadata(layout)
    keys = [array_key(n) for n in layout.fields]
    out = []
    for key, raw in zip(keys, backend.get_many(keys), strict=True):
        problem = check_array(raw, want[key], f"{backend.url}/{key}")
        if problem:
            out.append((key, problem))
    return out


def layout_from_arrays(backend: Backend) -> Layout:
    """The layout an array's ``zarr.json`` keeps a copy of (the metadata arrays first, then
    every other ``*/zarr.json``); :class:`StoreCorruptError` when none holds one."""
    keys = [array_key(n) for n in META_FIELDS]
    tried = set()
    for batch in (keys, None):
        if batch is None:
            batch = [k for k in backend.list("") if k.count("/") == 1
                     and k.endswith("/zarr.json") and k not in tried]
        for key in batch:
            tried.add(key)
            raw = backend.get(key)
            try:
                attrs = json.loads(raw)["attributes"][BACKUP_ATTR] if raw else None
            except (ValueError, KeyError, TypeError):
                attrs = None
            if attrs is not None:
                try:
                    return Layout.from_attrs(attrs, f"{backend.url}/{key}")
                except (StoreCorruptError, ValueError, KeyError, TypeError):
                    continue
    raise StoreCorruptError(f"{backend.url}: no array zarr.json holds a copy of the store's "
                            "layout (they are missing or damaged too, or the store was made "
                            "by an expstore that kept none), so the group zarr.json cannot "
                            "be rebuilt", url=backend.url)


def with_store_id(raw: bytes, store_id: str, where: str) -> bytes | None:
    """``zarr.json`` bytes whose layout attribute (the group's ``expstore``, an array's
    ``expstore_layout`` copy) carries ``store_id``, everything else as it was; ``None``
    when it holds no layout attribute. :class:`StoreCorruptError` when it is not JSON."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise StoreCorruptError(f"{where}: not valid JSON ({e}); run expstore repair first"
                                ) from e
    attrs = doc.get("attributes", {}) if isinstance(doc, dict) else {}
    key = "expstore" if "expstore" in attrs else BACKUP_ATTR if BACKUP_ATTR in attrs else None
    if key is None:
        return None
    attrs[key] = {**attrs[key], "store_id": store_id}
    return json.dumps(doc, indent=2).encode()
