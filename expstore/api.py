"""The two ways in: :func:`create` makes a store, :func:`open` opens one; both give a
:class:`~expstore.store.Store`.

``create`` refuses to replace anything but an expstore store (or to fill anything but an
empty folder), and a store whose lanes another process is writing; ``open`` checks a given
spec against the stored one and sets the decoded-frame cache budget (bytes).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import numpy as np

from .errors import SpecError, StoreCorruptError, StoreLockedError
from .spec import Spec
from .storage.backends import Backend, backend_for
from .storage.format import (
    SCALAR_CHUNK_ROWS,
    VECTOR_CHUNK_BYTES,
    LaneState,
    Layout,
    auto_shard_rows,
    read_layout,
    round_capacity,
    stored_row_bytes,
    write_metadata,
    write_state,
)
from .storage.ownership import DEFAULT_TTL, live_holders, require_atomic_writes
from .store import Store
from .validate import check_bytes


def create(url: str | os.PathLike, spec: Spec, capacity: int, lanes: int = 1,
           shard_rows: int | None = None, overwrite: bool = False,
           storage_options: dict[str, Any] | None = None, fsync: bool = True,
           lease_ttl: float | None = DEFAULT_TTL, checksum: bool = True,
           strict: bool = False, mode: str = "r+", hot_bytes: int | None = None,
           headroom_rows: int = 0) -> Store:
    """Create a store of ``capacity`` rows (split into ``lanes`` rings) at a path or URL.

    ``capacity`` is rounded up to a whole number of shards per lane (``store.capacity`` says
    what was made); ``shard_rows`` defaults to ``auto_shard_rows`` (64..4096; up to 16,384
    for stores of more than 4,096 such shards of small rows, and up to 16 MiB a shard
    past ~268M rows of small rows, their scalars in 16,384-row chunks). ``fsync``: flushes survive
    power loss, not only process crashes (costs ~4 ms per object written).
    Fails if a store exists there unless ``overwrite=True`` (and, even then, while another
    process holds a lane's write lease). ``overwrite=True`` replaces only an expstore
    store, or fills an empty or missing folder (prefix): anything else there is refused
    with :class:`FileExistsError` naming what was found, never deleted. ``lease_ttl`` and
    ``strict``: see :func:`open`. ``checksum``: every inner chunk and shard header carries
    a crc32c, checked on every read, so a corrupted byte is an error naming the shard,
    never a wrong value (``expstore verify``). ``mode="r"``: the new store is returned
    read-only (no lane opened for writing, no lease, nothing staged in RAM).
    ``hot_bytes``: see :func:`open`. ``headroom_rows``: rows per lane added to ``capacity``
    before rounding. A lane's writer drops the old lap's rows of a whole shard when it
    enters it, so a ring holds ``capacity - shard_rows`` rows per lane at the least;
    ``headroom_rows=shard_rows`` keeps ``capacity`` rows held at every moment (the
    integrations do; ``layout.requested_capacity`` still records ``capacity``).
    """
    check_bytes("hot_bytes", hot_bytes)
    if isinstance(headroom_rows, bool) or not isinstance(headroom_rows, (int, np.integer)) \
            or headroom_rows < 0:
        raise ValueError(f"headroom_rows: expected an int >= 0, got {headroom_rows!r}")
    url = os.fspath(url)
    if mode not in ("r", "r+"):
        raise ValueError(f"mode: expected 'r' or 'r+', got {mode!r}")
    if isinstance(lanes, bool) or not isinstance(lanes, (int, np.integer)) or lanes < 1:
        raise SpecError(f"lanes: expected an int >= 1 (one lane per writer: lanes=num_envs "
                        f"for a vector env), got {lanes!r}")
    shard_rows = int(shard_rows or auto_shard_rows(int(capacity), int(lanes),
                                                   stored_row_bytes(spec)))
    asked = int(capacity)
    capacity = round_capacity(asked + int(lanes) * int(headroom_rows), int(lanes), shard_rows)
    layout = Layout(spec, capacity, int(lanes), shard_rows, bool(checksum), asked,
                    new_store_id(), VECTOR_CHUNK_BYTES, SCALAR_CHUNK_ROWS)
    backend = backend_for(url, storage_options, fsync)
    try:
        meta = backend.get("zarr.json")
    except NotADirectoryError:  # a file where the store's folder would be
        meta = None
    if meta is not None and not overwrite:
        raise FileExistsError(f"{backend.url}: a store exists here (pass overwrite=True to "
                              "replace it)")
    if overwrite:
        _refuse_unless_store_or_empty(backend, meta)
        if meta is not None:
            _refuse_if_leased(backend)
    if lease_ttl:  # refuse before writing anything, as opening for writing would
        require_atomic_writes(backend)
    write_metadata(url, layout, storage_options, overwrite=True)
    for lane in range(layout.lanes):
        write_state(backend, LaneState(lane))
    return Store(backend, layout, mode=mode, storage_options=storage_options,
                 lease_ttl=lease_ttl, strict=strict, hot_bytes=hot_bytes)


def new_store_id() -> str:
    """A new store's id (``Layout.store_id``): a random uuid4, hex."""
    return uuid.uuid4().hex


def _refuse_unless_store_or_empty(backend: Backend, meta: bytes | None) -> None:
    """``create(overwrite=True)`` deletes everything under the store's root: allowed for an
    expstore store (its ``zarr.json`` has the ``expstore`` attribute) or an empty / missing
    folder or prefix; anything else raises :class:`FileExistsError` naming what is there."""
    if meta is not None:
        try:
            if "expstore" in json.loads(meta).get("attributes", {}):
                return
        except (ValueError, AttributeError):
            pass
    root = getattr(backend, "root", None)
    if backend.is_local and root is not None:
        if not os.path.exists(root):
            return
        if not os.path.isdir(root):
            raise FileExistsError(f"{backend.url}: refusing to overwrite: it is a file, not a "
                                  "store (overwrite=True replaces only an expstore store)")
        found = sorted(os.listdir(root))
    else:
        found = sorted({key.split("/", 1)[0] for key in backend.list("")})
    if not found:
        return
    what = "a zarr.json without expstore attributes, " if meta is not None else ""
    shown = ", ".join(found[:5]) + (f", ... ({len(found)} entries)" if len(found) > 5 else "")
    raise FileExistsError(
        f"{backend.url}: refusing to overwrite: this is not an expstore store and not empty "
        f"(found {what}{shown}); overwrite=True replaces only an existing store or fills an "
        "empty folder. Choose a new or empty path, or delete this one yourself")


def _refuse_if_leased(backend: Backend) -> None:
    try:
        lanes = read_layout(backend).lanes
    except (StoreCorruptError, FileNotFoundError, ValueError):
        return
    held = live_holders(backend, lanes)
    if held:
        lane, owner, _ = held[0]
        raise StoreLockedError(f"{backend.url}: cannot overwrite: lane {lane} is being "
                               f"written by {owner.describe()}")


def open(url: str | os.PathLike, mode: str = "r", spec: Spec | None = None,  # noqa: A001
         lane: int | None = None, storage_options: dict[str, Any] | None = None,
         fsync: bool = True, lease_ttl: float | None = DEFAULT_TTL,
         strict: bool = False, cache_bytes: int | None = None,
         index_all: bool = True, hot_bytes: int | None = None,
         map_bytes: int | None = None, entry_bytes: int | None = None) -> Store:
    """Open a store. ``mode="r"`` reads; ``"r+"`` also writes (all lanes, or ``lane``).

    Passing ``spec`` checks it against the stored one and fails naming the differences.
    ``storage_options`` go to fsspec (``s3://``: ``endpoint_url``, ``key``/``secret``,
    ``anon``, ...). Writing takes a lease per lane (``_state/lane_<i>.lease``, renewed
    while writing, released by ``close()``): another process opening the same lane for
    writing gets :class:`StoreLockedError` until it is released or ``lease_ttl`` seconds
    pass without renewal. ``lease_ttl=None`` skips leases (only one writer may exist).
    Another ``Store`` object of this process opening a lane for writing takes it from the
    first one, which then fails at its next ``add``/``extend``/``flush``.

    ``strict``: a step whose ``obs`` is not the ``next_obs`` given with the lane's previous
    step (two envs interleaved into one lane, transitions added out of order) raises
    :class:`ValidationError` naming ``obs`` instead of being stored; by default the previous
    step is closed first with a final row holding its ``next_obs``, so a sampled
    ``next_obs`` is always the one given with its step.

    ``cache_bytes``: decoded frames this process keeps for ``sample`` / ``read_plan``
    (bytes, each frame slot's 16-byte key included; default :attr:`Store.cache_bytes`,
    256 MiB; 0: none). Frame pages are taken as frames are first read, so RAM grows to
    the budget only as rows are sampled. A cache serving under 60% of the lookups that
    find their slot taken (a store with many more rows than it has slots, sampled
    uniformly) is passed by, but for one read in 64 that judges it again.

    ``hot_bytes``: this process's hot set, decoded small fields (scalars, state vectors)
    held in RAM for ``sample`` / ``read_plan`` (bytes; default :attr:`Store.hot_bytes`,
    512 MiB, which holds every row of a ~5M-row store of 17-dim float32 obs and 6-dim
    actions; 0: none, every row decoded from its shard). Taken as shards are first read;
    where the small fields do not fit at their own widths, scalars are held as 1-8 bit
    codes (a flag 1 bit a row, a bounded discrete action 1-8, a reward of few values 8);
    past it, shards are admitted while there is room and never evicted.

    ``map_bytes``: bytes of frame shard files (local stores) this process's reader maps
    into memory at once, per frame field (default :attr:`Store.map_bytes`, 64 GiB; 0:
    none): a warm frame is then copied from the page cache's own pages, with no system
    call (a 100M-frame store's ``sample(256)`` took ~1.5x less time). Address space, not
    RAM: mapped pages are the page cache's, reclaimed like any cached page, but tools that
    read RSS count the ones touched (``RssFile`` in ``/proc/PID/status``; anonymous memory
    is unchanged).
    Set 0 where a job's RSS is policed. DataLoader workers map only what
    ``make_loader(map_bytes=...)`` asks (default none).

    ``entry_bytes``: bytes of frame shards' chunk offsets this process's reader holds, per
    frame field of more chunks than its entry cache (default :attr:`Store.entry_bytes`,
    256 MiB, ~117M frames' at 2.29 B a frame): a frame of a shard held costs one read,
    not two. Shards are held as first read and keep their place; past the budget, a frame's
    offset is read from its shard first. Raise it for a store of more frames (1B frames
    take ~2.3 GB); DataLoader workers hold the store's each.

    ``index_all=False`` (``mode="r+"``): index only the lanes opened for writing, for a
    writer that never samples (a dataset import's lane): the other lanes read as empty until
    :meth:`Store.refresh`, and opening spends nothing on them (indexing reads every row's
    metadata and keeps 5 bytes per row).
    """
    if mode not in ("r", "r+"):
        raise ValueError(f"mode: expected 'r' or 'r+', got {mode!r}")
    check_bytes("cache_bytes", cache_bytes)
    check_bytes("hot_bytes", hot_bytes)
    check_bytes("map_bytes", map_bytes)
    check_bytes("entry_bytes", entry_bytes)
    url = os.fspath(url)
    backend = backend_for(url, storage_options, fsync)
    layout = read_layout(backend)
    if spec is not None and not layout.spec.same_as(spec):
        raise SpecError(f"{backend.url}: store spec differs from the given spec: "
                        + "; ".join(layout.spec.diff(spec)))
    store = Store(backend, layout, mode=mode, lane=lane, storage_options=storage_options,
                  lease_ttl=lease_ttl, strict=strict, index_all=index_all,
                  hot_bytes=hot_bytes, map_bytes=map_bytes, entry_bytes=entry_bytes)
    if cache_bytes is not None:
        store.cache_bytes = int(cache_bytes)
        if store._reader is not None:
            store._reader.set_row_cache_bytes(store.cache_bytes)
    return store
