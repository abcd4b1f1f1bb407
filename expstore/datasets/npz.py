"""A store as one ``.npz`` file and back, streamed in blocks of rows (memory ~ one block).

Layout (``expstore-npz/1``): one array per field, named like the field (``obs``,
``obs.pixels``, ``action``, ``reward``, ``terminated``, ``truncated``, user fields), holding
every intact row of every lane in write order — final rows included, so each episode of
``T`` steps is ``T + 1`` consecutive rows and the final observation is kept. Beside them:
``lane`` (int32), ``episode_step`` (int32: position in the episode), ``flags`` (uint8:
FIRST=1, LAST=2, TERMINATED=4, TRUNCATED=8), ``__spec__`` (the spec as JSON, so frame
stacking and codecs come back) and ``__format__``. ``np.load`` reads the file as usual.
Export writes each array into the zip member by member, a block of rows at a time; import
reads every member side by side, a block at a time. Import rebuilds the same rows, lanes
and episode structure.

:func:`import_npz` also reads a D4RL-style npz (``observations``, ``actions``, ``rewards``,
``terminals``, ``timeouts``, optional ``next_observations``) with the D4RL rules, streamed
the same way (each array read forward on demand).
"""

from __future__ import annotations

import json
import os
import time
import zipfile
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import DatasetFormatError
from ..rows import FLAG_FIRST, FLAG_LAST
from ..spec import Spec
from .episodes import ExportReader, capacity_for, lane_rows
from .progress import Progress, ProgressArg, interruptible
from .streaming import check_block_rows
from .summary import ImportSummary, store_bytes

FORMAT = "expstore-npz/1"
_META = ("lane", "episode_step", "flags", "__spec__", "__format__")
_ROW_META = _META[:3]
_META_DTYPES = {"lane": np.int32, "episode_step": np.int32, "flags": np.uint8}


# -- npy members of a zip, streamed ---------------------------------------------------------
def _write_member(zf: zipfile.ZipFile, name: str, shape: tuple[int, ...], dtype: np.dtype,
                  parts: Iterator[np.ndarray]) -> None:
    """Write ``name.npy`` of ``shape``/``dtype`` from ``parts`` (row blocks, in order)."""
    with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
        np.lib.format.write_array_header_1_0(fh, {
            "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
            "shape": tuple(int(x) for x in shape)})
        written = 0
        for part in parts:
            part = np.ascontiguousarray(part, dtype)
            fh.write(memoryview(part).cast("B"))
            written += len(part)
        if written != shape[0]:  # pragma: no cover - a bug, not bad input
            raise AssertionError(f"{name}: wrote {written} rows, header says {shape[0]}")


class _Member:
    """One ``.npy`` member of an open zip, read forward a block of rows at a time."""

    def __init__(self, zf: zipfile.ZipFile, name: str, where: str) -> None:
        self.name = name
        self._fh = zf.open(f"{name}.npy")
        try:
            version = np.lib.format.read_magic(self._fh)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read(self._fh)
        except ValueError as e:
            raise DatasetFormatError(f"{where}: array {name!r} is not a valid .npy ({e})"
                                     ) from e
        if fortran or dtype.hasobject or not shape:
            raise DatasetFormatError(f"{where}: array {name!r} must be a C-order numeric "
                                     f"array with rows, got shape {shape} dtype {dtype}"
                                     f"{' (Fortran order)' if fortran else ''}")
        self.shape, self.dtype = tuple(shape), dtype
        self._row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        self._where = where

    def read(self, n: int) -> np.ndarray:
        raw = self._fh.read(n * self._row_bytes)
        if len(raw) != n * self._row_bytes:
            raise DatasetFormatError(f"{self._where}: array {self.name!r} ends early")
        return np.frombuffer(raw, self.dtype).reshape(n, *self.shape[1:])

    def close(self) -> None:
        self._fh.close()


class _LazyArray:
    """A row array of an npz read on demand: ``a[i:j]`` (forward reads stream; a request
    overlapping the last one reuses it; going back re-reads from the start) and ``a[()]``
    (all of it). Memory: the last request."""

    def __init__(self, zf: zipfile.ZipFile, name: str, where: str) -> None:
        self._zf, self.name, self._where = zf, name, where
        self._restart()
        self.shape, self.dtype = self._m.shape, self._m.dtype

    def _restart(self) -> None:
        if getattr(self, "_m", None) is not None:
            self._m.close()
        self._m = _Member(self._zf, self.name, self._where)
        self._pos = 0  # next row of the stream
        self._buf = self._m.read(0)  # rows [pos - len(buf), pos)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        if key == ():
            return self._rows(0, len(self))
        if isinstance(key, slice):
            a, b, step = key.indices(len(self))
            if step == 1:
                return self._rows(a, max(a, b))
        raise TypeError(f"{self.name}: only [start:stop] and [()] reads are supported")

    def _rows(self, a: int, b: int) -> np.ndarray:
        start = self._pos - len(self._buf)
        if start <= a and b <= self._pos:
            return self._buf[a - start : b - start]
        if a < start:
            self._restart()
            start = 0
        head = self._buf[a - start :] if a < self._pos else self._buf[:0]
        while self._pos < a:  # skip forward, a block at a time
            self._m.read(min(4096, a - self._pos))
            self._pos += min(4096, a - self._pos)
        new = self._m.read(b - self._pos)
        self._pos = b
        self._buf = np.concatenate([head, new]) if len(head) else new
        return self._buf


def _lazy_npz(zf: zipfile.ZipFile, where: str) -> dict[str, Any]:
    """Every array of an npz: row arrays as :class:`_LazyArray`, scalars loaded."""
    out: dict[str, Any] = {}
    for name in (n[:-4] for n in zf.namelist() if n.endswith(".npy")):
        with zf.open(f"{name}.npy") as fh:
            version = np.lib.format.read_magic(fh)
            shape = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                     else np.lib.format.read_array_header_2_0)(fh)[0]
        out[name] = _LazyArray(zf, name, where) if shape else _small(zf, name)
    return out


def _small(zf: zipfile.ZipFile, name: str) -> np.ndarray:
    with zf.open(f"{name}.npy") as fh:
        return np.lib.format.read_array(fh, allow_pickle=False)


# -- export -----------------------------------------------------------------------------------
def export_npz(url: str | os.PathLike, dst: str | os.PathLike, *, compressed: bool = True,
               block_rows: int = 1024, overwrite: bool = False,
               storage_options: dict[str, Any] | None = None,
               progress: ProgressArg = None) -> ImportSummary:
    """Write every intact row of the store at ``url`` to ``dst`` (``.npz``), a block of
    ``block_rows`` rows at a time (memory ~ one block of one field). ``compressed``:
    deflate each member (like ``np.savez_compressed``). Fails if ``dst`` exists unless
    ``overwrite=True``; the file appears at ``dst`` only when complete."""
    from ..api import open as open_store

    dst = os.fspath(dst)
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst}: exists (pass overwrite=True, or --overwrite, to "
                              "replace it)")
    t0 = time.perf_counter()
    block_rows = check_block_rows(block_rows)
    store = open_store(url, "r", storage_options=storage_options)
    summary = ImportSummary(str(url), dst, kind="npz export")
    tmp = f"{dst}.{os.getpid()}.tmp.npz"
    try:
        spec = store.spec
        lanes = [lane_rows(store, lane) for lane in range(store.lanes)]
        n = sum(len(lr.rows) for lr in lanes)
        names = [*spec.fields, *_ROW_META]
        reader = ExportReader(store)
        prog = Progress(n, f"npz export {os.path.basename(dst)}", progress)
        share = 1 / len(names)  # each array is written in turn: a row is done after all

        def blocks_of(name: str) -> Iterator[np.ndarray]:
            f = spec.fields.get(name)
            for lr in lanes:
                for a in range(0, len(lr.rows), block_rows):
                    b = min(a + block_rows, len(lr.rows))
                    if name == "lane":
                        part = np.full(b - a, lr.lane, np.int32)
                    elif name == "episode_step":
                        part = lr.episode_step[a:b]
                    elif name == "flags":
                        part = lr.flags[a:b]
                    else:
                        part = reader.read(name, lr.rows[a:b], lr.steps[a:b])
                    summary.bytes_in += part.nbytes if f is not None else 0
                    prog.update((b - a) * share, part.nbytes)
                    yield part

        mode = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
        try:
            with interruptible() as intr, zipfile.ZipFile(tmp, "w", mode, allowZip64=True) as zf:
                for name in names:
                    f = spec.fields.get(name)
                    shape = (n, *f.shape) if f is not None else (n,)
                    dtype = f.dtype if f is not None else np.dtype(_META_DTYPES[name])
                    _write_member(zf, name, shape, dtype, blocks_of(name))
                    intr.check()
                for name, value in (("__spec__", json.dumps(spec.to_json())),
                                    ("__format__", FORMAT)):
                    with zf.open(f"{name}.npy", "w") as fh:
                        np.lib.format.write_array(fh, np.array(value), allow_pickle=False)
        finally:
            prog.close()
            reader.close()
        os.replace(tmp, dst)
        summary.rows = n
        summary.steps = sum(int(((lr.flags & FLAG_LAST) == 0).sum()) for lr in lanes)
        summary.episodes = sum(int(((lr.flags & FLAG_LAST) != 0).sum()) for lr in lanes)
        summary.lanes = store.lanes
        summary.bytes_out = os.path.getsize(dst)
        summary.outputs.append(dst)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    finally:
        store.close()
    summary.seconds = time.perf_counter() - t0
    return summary


# -- import -----------------------------------------------------------------------------------
def import_npz(src: str | os.PathLike, url: str | os.PathLike, *, capacity: int | None = None,
               shard_rows: int | None = None, block_rows: int = 1024, overwrite: bool = False,
               storage_options: dict[str, Any] | None = None, fsync: bool = False,
               progress: ProgressArg = None) -> ImportSummary:
    """Create a store at ``url`` from an npz written by :func:`export_npz` (or D4RL-style),
    reading ``block_rows`` rows of every array at a time (memory ~ one block). Ctrl-C
    stops at a block boundary with every row so far flushed."""
    t0 = time.perf_counter()
    block_rows = check_block_rows(block_rows)
    where = os.fspath(src)
    try:
        zf = zipfile.ZipFile(where)
    except (OSError, zipfile.BadZipFile) as e:
        raise DatasetFormatError(f"{where}: not a readable .npz file ({e})") from e
    with zf:
        files = [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
        if "__spec__" not in files:
            if "observations" in files:
                from .d4rl import import_d4rl

                try:
                    lazy = _lazy_npz(zf, where)
                except ValueError as e:
                    raise DatasetFormatError(f"{where}: not a readable .npz file ({e})") from e
                return import_d4rl(lazy, url, capacity=capacity, shard_rows=shard_rows,
                                   block_rows=block_rows, overwrite=overwrite,
                                   storage_options=storage_options, fsync=fsync,
                                   progress=progress, where=where)
            raise DatasetFormatError(f"{where}: neither an expstore npz (no '__spec__') nor a "
                                     f"D4RL-style npz (no 'observations'); keys: {files}")
        try:
            fmt = str(_small(zf, "__format__")) if "__format__" in files else "?"
            spec_text = str(_small(zf, "__spec__"))
        except ValueError as e:
            raise DatasetFormatError(f"{where}: '__spec__'/'__format__' unreadable ({e})") from e
        if fmt != FORMAT:
            raise DatasetFormatError(f"{where}: format {fmt!r}, expected {FORMAT!r}")
        try:
            spec = Spec.from_json(json.loads(spec_text))
        except (ValueError, KeyError) as e:
            raise DatasetFormatError(f"{where}: '__spec__' is not a valid spec ({e})") from e
        names = [*spec.fields, *_ROW_META]
        missing = [k for k in names if k not in files]
        if missing:
            raise DatasetFormatError(f"{where}: missing arrays {missing}")
        return _import_members(zf, spec, names, where, url, capacity, shard_rows, block_rows,
                               overwrite, storage_options, fsync, progress, t0)


def _import_members(zf: zipfile.ZipFile, spec: Spec, names: list[str], where: str, url: Any,
                    capacity: int | None, shard_rows: int | None, block_rows: int,
                    overwrite: bool, storage_options: Any, fsync: bool, progress: ProgressArg,
                    t0: float) -> ImportSummary:
    from ..api import create

    members = {k: _Member(zf, k, where) for k in names}
    try:
        n = members["lane"].shape[0]
        for k, m in members.items():
            want = spec.fields[k].shape if k in spec.fields else ()
            if m.shape != (n, *want):
                raise DatasetFormatError(f"{where}: array {k!r} has shape {m.shape}, expected "
                                         f"({n}, *{want})")
        counts: dict[int, int] = {}  # first pass: rows per lane (4 bytes a row)
        lanes_m = members.pop("lane")
        for a in range(0, n, block_rows):
            lane = lanes_m.read(min(block_rows, n - a))
            if len(lane) and lane.min() < 0:
                raise DatasetFormatError(f"{where}: array 'lane' holds negative lanes")
            for k, c in zip(*np.unique(lane, return_counts=True), strict=True):
                counts[int(k)] = counts.get(int(k), 0) + int(c)
        lanes_m.close()
        members["lane"] = _Member(zf, "lane", where)
        lanes = max(counts) + 1 if counts else 1
        cap = capacity_for(max(counts.values(), default=1), lanes, capacity)
        summary = ImportSummary(where, str(url), lanes=lanes, kind="npz import")
        row_bytes = sum(m._row_bytes for m in members.values())
        store = create(url, spec, cap, lanes=lanes, shard_rows=shard_rows, overwrite=overwrite,
                       storage_options=storage_options, fsync=fsync)
        prog = Progress(n, f"npz import {os.path.basename(where)}", progress)
        try:
            with interruptible() as intr:
                carry: dict[str, np.ndarray] | None = None
                done_rows = 0
                while done_rows < n or carry is not None:
                    m = min(block_rows, n - done_rows)
                    try:
                        block = {k: mem.read(m) for k, mem in members.items()}
                    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
                        raise DatasetFormatError(f"{where}: damaged at rows {done_rows}.."
                                                 f"{done_rows + m - 1} ({e}); the store holds "
                                                 "the rows before") from e
                    done_rows += m
                    if carry is not None:
                        block = {k: np.concatenate([carry[k], block[k]]) for k in block}
                    carry = None
                    if done_rows < n:
                        block, carry = _split_carry(block)
                    _import_block(store, spec, block, where, summary)
                    prog.update(m, m * row_bytes)
                    summary.bytes_in += m * row_bytes
                    intr.check()
                    if carry is not None and not len(carry["lane"]):
                        carry = None
        finally:
            prog.close()
            store.close()
    finally:
        for mem in members.values():
            mem.close()
    summary.bytes_out = store_bytes(url, storage_options)
    summary.seconds = time.perf_counter() - t0
    return summary


def _split_carry(block: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Keep the block's last row for the next block when it ends an episode whose final row
    has not been read yet (a step and its final row are imported together)."""
    flags = block["flags"]
    n = len(flags)
    ends = (flags[-1] & FLAG_LAST) == 0 and bool(block["terminated"][-1] | block["truncated"][-1])
    cut = n - 1 if ends else n
    return ({k: v[:cut] for k, v in block.items()}, {k: v[cut:] for k, v in block.items()})


def _import_block(store: Any, spec: Spec, block: dict[str, np.ndarray], where: str,
                  summary: ImportSummary) -> None:
    """Rows of one block, lane by lane (each lane's rows are contiguous, in write order)."""
    lane = block["lane"]
    if not len(lane):
        return
    if lane.max() >= store.lanes:
        raise DatasetFormatError(f"{where}: lane {int(lane.max())} out of range")
    cuts = np.flatnonzero(np.diff(lane)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(lane)], strict=True):
        _import_lane(store, spec, int(lane[lo]), {k: v[lo:hi] for k, v in block.items()},
                     where, summary)


def _import_lane(store: Any, spec: Spec, lane: int, d: dict[str, np.ndarray], where: str,
                 summary: ImportSummary) -> None:
    flags, ep = d["flags"], d["episode_step"]
    n = len(flags)
    if n == 0:
        return
    last = (flags & FLAG_LAST) != 0
    first = (flags & FLAG_FIRST) != 0
    if last[0]:
        raise DatasetFormatError(f"{where}: lane {lane} starts with a final row")
    # pieces start at the lane start and where a new episode follows an unfinished one
    starts = np.flatnonzero(first & np.concatenate([[True], ~last[:-1]]))
    starts = np.union1d([0], starts)
    for lo, hi in zip(starts, np.append(starts[1:], n)):
        step = np.arange(lo, hi)[~last[lo:hi]]
        done = d["terminated"][step] | d["truncated"][step]
        fin = step[done] + 1
        if len(fin) and (fin.max() >= n or not last[fin].all()):
            raise DatasetFormatError(f"{where}: lane {lane}: an episode-ending row is not "
                                     "followed by its final row")
        batch = {name: d[name][step] for name in spec.fields if name not in spec.obs_names}
        for name in spec.obs_names:
            batch[name] = d[name][step]
            nxt = np.zeros_like(batch[name])
            nxt[done] = d[name][fin]
            batch["next_" + name] = nxt
        obs = {k[4:]: batch.pop(k) for k in list(batch) if k.startswith("obs.")}
        nxt_obs = {k[9:]: batch.pop(k) for k in list(batch) if k.startswith("next_obs.")}
        if obs:
            batch["obs"], batch["next_obs"] = obs, nxt_obs
        act = {k[7:]: batch.pop(k) for k in list(batch) if k.startswith("action.")}
        if act:
            batch["action"] = act
        store.set_episode_position(lane, int(ep[lo]))
        store.extend(batch, lane=lane, check_next_obs=False)
        summary.steps += len(step)
        summary.episodes += int(done.sum())
        summary.rows += len(step) + int(done.sum())
