"""How a store maps onto zarr v3 arrays: one array per field, rows along axis 0.

Rows ``[lane * lane_capacity, (lane + 1) * lane_capacity)`` belong to one lane; lane
capacity is a multiple of ``shard_rows``, so no shard object is shared by two lanes.
Three metadata arrays (``_step_id``, ``_episode_step``, ``_flags``) sit beside the fields.
The spec, capacity, lanes and format version are the group's ``expstore`` attribute.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import SpecError, StoreCorruptError, StoreNotFoundError
from ...field import Field
from ...spec import Spec
from ..backends import Backend
from .shard import SMALL_BLOCK_BYTES, Checked, make_codec, zarr_codec

FORMAT_VERSION = 1
#: array attribute holding a copy of the group's ``expstore`` attribute (the layout)
BACKUP_ATTR = "expstore_layout"

META_FIELDS: dict[str, Field] = {
    "_step_id": Field((), np.int64, codec={"name": "blosc", "cname": "lz4", "clevel": 5}),
    "_episode_step": Field((), np.int32, codec={"name": "blosc", "cname": "lz4", "clevel": 5}),
    "_flags": Field((), np.uint8, codec={"name": "blosc", "cname": "lz4", "clevel": 5}),
}
#: bytes per row of the metadata fields
META_ROW_BYTES = sum(f.row_nbytes for f in META_FIELDS.values())


def stored_row_bytes(spec: Spec) -> int:
    """Bytes one row of a store of ``spec`` takes, raw, in all its arrays (the spec's
    fields and the store's own): what :func:`auto_shard_rows` weighs a shard by."""
    return sum(f.row_nbytes for f in spec.fields.values()) + META_ROW_BYTES


@dataclass(frozen=True)
class Layout:
    """Geometry of a store: capacity (rows), lanes, rows per shard, and the spec."""

    spec: Spec
    capacity: int
    lanes: int = 1
    shard_rows: int = 4096
    #: inner chunks end with a crc32c and shard headers carry one (stores made before this
    #: option existed have none: their attributes lack ``checksum``)
    checksum: bool = True
    #: the capacity ``create`` was asked for, before rounding up to whole shards (rows)
    requested_capacity: int | None = field(default=None, compare=False)
    #: a random id (uuid4 hex) ``create`` gives the store, so that objects a store wrote
    #: (index snapshot blocks) are never taken for another's, e.g. one re-created in its
    #: place; stores made before it existed have none (``expstore upgrade`` gives one)
    store_id: str | None = field(default=None, compare=False)
    #: inner chunk size (bytes, about) of vector fields (several values per row, under
    #: 1 KiB: state observations, continuous actions) whose ``Field.chunk_rows`` is unset
    #: (:func:`vector_chunk_rows`); ``None``: one chunk per shard, as stores made before
    #: this existed were written
    vector_chunk_bytes: int | None = field(default=None, compare=False)
    #: most rows of an inner chunk of the fields otherwise stored one chunk per shard
    #: (scalars: :func:`scalar_chunk_rows`), so that shards of more rows (stores of
    #: more than ~268M rows) keep chunks a row's read and a flush can afford; ``None``: one
    #: chunk per shard, as stores made before this existed were written
    scalar_chunk_rows: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.lanes < 1:
            raise SpecError(f"lanes: expected >= 1, got {self.lanes}")
        if self.shard_rows < 1:
            raise SpecError(f"shard_rows: expected >= 1, got {self.shard_rows}")
        if self.capacity < self.lanes * self.shard_rows * 2 or self.capacity % (
            self.lanes * self.shard_rows
        ):
            raise SpecError(
                f"capacity: expected a multiple of lanes*shard_rows = "
                f"{self.lanes * self.shard_rows} holding >= 2 shards per lane, got "
                f"{self.capacity} (use expstore.round_capacity or a smaller shard_rows)"
            )
        for name in self.fields:
            cr = self.chunk_rows(name)
            if self.shard_rows % cr:
                raise SpecError(f"{name}.chunk_rows: {cr} must divide shard_rows "
                                f"{self.shard_rows}")

    @property
    def lane_capacity(self) -> int:
        """Rows per lane ring."""
        return self.capacity // self.lanes

    @property
    def shards_per_lane(self) -> int:
        return self.lane_capacity // self.shard_rows

    def lane_rows(self, lane: int, steps: np.ndarray) -> np.ndarray:
        """Ring rows (int64) holding lane steps ``steps`` of ``lane`` (``RowIndex.lane_rows``
        for code of the storage layer, which has no index)."""
        L = self.lane_capacity
        return lane * L + np.asarray(steps, np.int64) % L

    @property
    def fields(self) -> dict[str, Field]:
        """User fields and metadata arrays, all stored alike."""
        return {**self.spec.fields, **META_FIELDS}

    def chunk_rows(self, name: str) -> int:
        """Rows per inner chunk of field ``name``: ``Field.chunk_rows`` where set, else 1
        for image-sized fields, :func:`vector_chunk_rows` for vector fields of stores that
        record a ``vector_chunk_bytes``, else the whole shard (within
        ``scalar_chunk_rows`` where the store records one: :func:`scalar_chunk_rows`)."""
        f = self.fields[name]
        if f.chunk_rows:
            return int(f.chunk_rows)
        if f.is_image:
            return 1
        if self.vector_chunk_bytes and name not in META_FIELDS and f.shape and int(
                np.prod(f.shape, dtype=np.int64)) > 1:
            return vector_chunk_rows(f.row_nbytes, self.shard_rows, self.vector_chunk_bytes)
        return scalar_chunk_rows(self.shard_rows, self.scalar_chunk_rows)

    def chunks_per_shard(self, name: str) -> int:
        return self.shard_rows // self.chunk_rows(name)

    def shard_key(self, name: str, shard: int) -> str:
        """zarr v3 default chunk key of shard ``shard`` of array ``name``."""
        return f"{name}/c/{shard}" + "/0" * len(self.fields[name].shape)

    def codec(self, name: str) -> Any:
        """numcodecs codec of one inner chunk of ``name`` (crc32c appended if ``checksum``)."""
        f = self.fields[name]
        codec = make_codec(f.resolved_codec(), f.dtype.itemsize,
                           0 if self.chunk_rows(name) == 1 else SMALL_BLOCK_BYTES)
        return Checked(codec) if self.checksum else codec

    def to_attrs(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "capacity": self.capacity,
            "lanes": self.lanes,
            "shard_rows": self.shard_rows,
            "checksum": self.checksum,
            "spec": self.spec.to_json(),
            **({} if self.requested_capacity is None
               else {"requested_capacity": self.requested_capacity}),
            **({} if self.store_id is None else {"store_id": self.store_id}),
            **({} if self.vector_chunk_bytes is None
               else {"vector_chunk_bytes": self.vector_chunk_bytes}),
            **({} if self.scalar_chunk_rows is None
               else {"scalar_chunk_rows": self.scalar_chunk_rows}),
        }

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any], where: str) -> Layout:
        version = attrs.get("format_version")
        if version is None or version > FORMAT_VERSION:
            raise StoreCorruptError(f"{where}: store format version {version!r} is not one "
                                    f"this expstore reads (<= {FORMAT_VERSION})")
        vector = attrs.get("vector_chunk_bytes")
        scalar = attrs.get("scalar_chunk_rows")
        for key, value, unit in (("vector_chunk_bytes", vector, "bytes"),
                                 ("scalar_chunk_rows", scalar, "rows")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise StoreCorruptError(f"{where}: {key}: expected an int >= 1 ({unit}) or "
                                        f"none, got {value!r}")
        return cls(Spec.from_json(attrs["spec"]), int(attrs["capacity"]), int(attrs["lanes"]),
                   int(attrs["shard_rows"]), bool(attrs.get("checksum", False)),
                   attrs.get("requested_capacity"), attrs.get("store_id"), vector, scalar)


#: inner chunk size new stores give vector fields (bytes, at most; a power of two of rows):
#: a row missed by the hot set reads and checks this much, not its shard's whole chunk
#: (issue 26). 2 KiB (17 float32s: 16 rows, 1,088 B): past the hot set, `sample(256)` of
#: a 2M-row low-dim store took 17% less time than with the 8 KiB stores made before
#: (4,352 B chunks), within 1-2% of 1 KiB; a store 2% larger where vectors compress
VECTOR_CHUNK_BYTES = 2048


def vector_chunk_rows(row_bytes: int, shard_rows: int, chunk_bytes: int) -> int:
    """Rows per inner chunk of a vector field of ``row_bytes`` per row: the largest power
    of two whose chunk stays within ``chunk_bytes`` (at least 1 row), dividing
    ``shard_rows``."""
    rows = 1 << max(0, (max(1, chunk_bytes // max(1, row_bytes))).bit_length() - 1)
    return math.gcd(rows, shard_rows)


#: most rows of a scalar field's inner chunk in new stores (``Layout.scalar_chunk_rows``):
#: every shard :func:`auto_shard_rows` picks up to :data:`MAX_SHARD_ROWS` is one chunk, as
#: before; larger shards are cut into chunks of this many rows (128 KiB of int64), so a row
#: read past the hot set reads and checks one of them, and a flush of a partly filled
#: shard encodes the last one again, not the whole shard so far
SCALAR_CHUNK_ROWS = 16384


def scalar_chunk_rows(shard_rows: int, most: int | None) -> int:
    """Rows per inner chunk of a field stored one chunk per shard where chunks may hold at
    most ``most`` rows (``None``: no limit): the whole shard where it fits, else the
    largest divisor of ``shard_rows`` within ``most`` (the whole shard again where that
    is under 64 rows: a shard size of few divisors, given by hand)."""
    if not most or shard_rows <= most:
        return shard_rows
    k = -(-shard_rows // most)
    while shard_rows % k:
        k += 1
    rows = shard_rows // k
    return rows if rows >= min(64, most) else shard_rows


#: shards per field above which a store of small rows gets larger shards (a reader holds
#: a descriptor per shard it reads; 100M rows in 4096-row shards are 24,415 per field)
MAX_SHARDS = 4096
#: the largest shard :func:`auto_shard_rows` picks, and the most bytes of one shard's rows
#: (all fields) it lets a lane writer stage for it
MAX_SHARD_ROWS, MAX_SHARD_BYTES = 16384, 8 << 20
#: stores that :data:`MAX_SHARD_ROWS`-row shards would cut into more than this many shards
#: per field (more than ~268M rows) get shards of up to :data:`HUGE_SHARD_BYTES` (all
#: fields), as few as :data:`HUGE_SHARDS` per field: a 1B-row store of tiny rows (29 B a
#: row) 1,908 shards of 524,288 rows, where 16,384-row shards were 61,036 per field and a
#: batch of 32 opened ~73 shards (three fields read past the hot set, within the ~9,000
#: descriptors a reader holds where the process may open 20,000)
HUGE_AT, HUGE_SHARDS, HUGE_SHARD_BYTES = 16384, 2048, 16 << 20


def auto_shard_rows(capacity: int, lanes: int = 1, row_bytes: int | None = None) -> int:
    """Default rows per shard: a power of two near 1/32 of a lane, within 64..4096; for
    stores of more than :data:`MAX_SHARDS` such shards per field whose rows (``row_bytes``,
    all fields) are small, up to 16,384, so that a reader holds every shard open (a
    100M-row store of small frames: 6,104 shards per field, not 24,415); for stores of
    more than :data:`HUGE_AT` 16,384-row shards per field, up to
    :data:`HUGE_SHARD_BYTES` a shard, :data:`HUGE_SHARDS` shards per field at the fewest
    (their scalars then stored in chunks of :data:`SCALAR_CHUNK_ROWS` rows).

    4096-row shards keep per-object costs (open, index, fsync: ~4 ms each here) small per
    row; smaller stores get smaller shards so that a shard (the unit the writer invalidates
    ahead of itself, and the loader's guard band) stays ~3% of a lane. A larger shard costs
    the writer RAM (a lane stages a shard's rows: at most ``MAX_SHARD_BYTES`` here, or
    ``HUGE_SHARD_BYTES``).
    """
    per_lane = max(1, capacity // max(1, lanes))
    near = 1 << max(0, (per_lane // 32).bit_length() - 1)
    rows = int(min(4096, max(64, near)))

    def pow2_within(shards: int, nbytes: int) -> int:  # fewest rows for <= shards, <= nbytes
        enough = 1 << (-(-capacity // shards) - 1).bit_length()
        fits = 1 << max(0, (nbytes // max(1, row_bytes)).bit_length() - 1)
        return min(enough, fits, near)

    if row_bytes and capacity > MAX_SHARDS * rows:
        rows = max(rows, min(MAX_SHARD_ROWS, pow2_within(MAX_SHARDS, MAX_SHARD_BYTES)))
        if capacity > HUGE_AT * MAX_SHARD_ROWS:
            rows = max(rows, pow2_within(HUGE_SHARDS, HUGE_SHARD_BYTES))
    return rows


def round_capacity(capacity: int, lanes: int = 1, shard_rows: int | None = None) -> int:
    """Smallest valid capacity >= ``capacity`` for these lanes and shard size (rows)."""
    shard_rows = shard_rows or auto_shard_rows(capacity, lanes)
    unit = lanes * shard_rows
    return max(2 * unit, -(-capacity // unit) * unit)


def write_metadata(url: str, layout: Layout, storage_options: dict[str, Any] | None,
                   overwrite: bool) -> None:
    """Create the zarr group and arrays (metadata only; expstore writes the shards)."""
    import zarr
    from zarr.codecs import Crc32cCodec

    if url.startswith("file://"):
        url = url[len("file://"):]  # zarr's LocalStore creates folders; fsspec's does not
    from ..backends import fsspec_options

    storage_options = fsspec_options(storage_options)
    kwargs = {"storage_options": storage_options} if storage_options and "://" in url else {}
    group = zarr.open_group(url, mode="w" if overwrite else "w-", zarr_format=3, **kwargs)
    for name, f in layout.fields.items():
        codec = zarr_codec(f.resolved_codec(), f.dtype.itemsize)
        codecs = [c for c in (codec, Crc32cCodec() if layout.checksum else None) if c is not None]
        fill = -1 if name == "_step_id" else (False if f.dtype == np.bool_ else 0)
        group.create_array(
            name,
            shape=(layout.capacity, *f.shape),
            dtype=f.dtype,
            chunks=(layout.chunk_rows(name), *f.shape),
            shards={"shape": (layout.shard_rows, *f.shape), "index_location": "start"},
            compressors=codecs or None,
            fill_value=fill,
            dimension_names=["row", *(f"{name}_{i}" for i in range(len(f.shape)))],
            attributes={BACKUP_ATTR: layout.to_attrs()},  # repair rebuilds zarr.json from it
        )
    # Written last: a store without this attribute is not an expstore store.
    group.attrs["expstore"] = layout.to_attrs()


def read_layout(backend: Backend) -> Layout:
    """Layout from the group's ``zarr.json``. Nothing there, or something that is not an
    expstore store: :class:`StoreNotFoundError` saying what is there; a store whose
    ``zarr.json`` is lost or damaged (its lane states or metadata arrays are there):
    :class:`StoreCorruptError` (``expstore repair`` rebuilds it)."""
    try:
        raw = backend.get("zarr.json")
    except NotADirectoryError:  # a file where the store's folder would be
        raw = None
    where = f"{backend.url}/zarr.json"
    if raw is None:
        if not _is_an_expstore_store(backend):
            raise StoreNotFoundError(f"no store at {backend.url}: {_what_is_there(backend)}")
        raise StoreCorruptError(f"{where}: missing (the rest of an expstore store is there)",
                                url=backend.url)
    try:
        meta = json.loads(raw)
    except ValueError as e:
        raise StoreCorruptError(f"{where}: not valid JSON ({e})", url=backend.url) from e
    attrs = meta.get("attributes", {}).get("expstore") if isinstance(meta, dict) else None
    if attrs is None:
        if not _is_an_expstore_store(backend):
            raise StoreNotFoundError(f"no store at {backend.url}: a zarr group without "
                                     "expstore attributes (not an expstore store)")
        raise StoreCorruptError(f"{where}: zarr group without expstore attributes",
                                url=backend.url)
    return Layout.from_attrs(attrs, where)


def _is_an_expstore_store(backend: Backend) -> bool:
    """Whether what is there is (what is left of) an expstore store: lane state files, or
    the zarr.json of one of the metadata arrays every store has (with the layout's copy)."""
    try:
        if any(k.rsplit("/", 1)[-1].startswith("lane_") for k in backend.list("_state")):
            return True
        return any(raw is not None and BACKUP_ATTR.encode() in raw
                   for raw in (backend.get(f"{name}/zarr.json") for name in META_FIELDS))
    except OSError:
        return False


def _what_is_there(backend: Backend) -> str:
    """What is at a store's URL that is not a store, in a few words."""
    root = getattr(backend, "root", None)
    if backend.is_local and root is not None:
        if not os.path.exists(root):
            return "the path does not exist"
        if not os.path.isdir(root):
            return "it is a file, not a store folder"
        found = sorted(os.listdir(root))
    else:
        try:
            found = sorted({k.split("/", 1)[0] for k in backend.list("")})
        except OSError as e:
            return f"cannot list it ({e})"
    if not found:
        return "the folder is empty" if backend.is_local else "nothing is stored under it"
    shown = ", ".join(found[:5]) + (f", ... ({len(found)} entries)" if len(found) > 5 else "")
    return f"not an expstore store (no zarr.json; found {shown})"
