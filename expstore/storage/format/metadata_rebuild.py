"""Per-row metadata that survives a bad metadata chunk: derive it, or mark the rows lost.

The index of a store is built from two metadata arrays, ``_episode_step`` and ``_flags``
(``rows.py``, docs/architecture.md §2). Both follow from other bytes of the store:

* ``_flags``: FIRST where the episode position is 0; LAST on the row right after a step
  that ended its episode (a row with position > 0 whose previous step had ``terminated``
  or ``truncated`` set); TERMINATED / TRUNCATED from the row's ``terminated`` /
  ``truncated`` fields (step rows only). A row with position > 0 after a step that did
  not end, followed by a first row, is either the final row of an episode the stream
  broke off or the last step of an interrupted one: that row cannot be told and is lost.
* ``_episode_step``: 0 on FIRST rows, else the previous row's position + 1.
* ``_step_id``: the shard header's ``first_step`` + the row's slot in the shard.

:func:`read_metadata` reads the metadata of some rows of one lane; a metadata chunk that
fails its checks (``StoreCorruptError``) is rebuilt in RAM from the rules above, reading
neighbouring rows of the lane where needed. Rows nothing can rebuild (both metadata chunks
bad, or the data they derive from bad too) come back in ``lost``: the caller indexes them
like quarantined rows (``FLAG_BAD``), never failing the whole store.
:func:`derive_step_ids` gives a shard's ``_step_id`` values from its header.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import StoreCorruptError, error_detail
from ...rows import FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED
from .layout import Layout

log = logging.getLogger("expstore")

ENDS = FLAG_TERMINATED | FLAG_TRUNCATED


@dataclass
class MetaRead:
    """Metadata of the rows asked for (arrays aligned with them)."""

    episode_step: np.ndarray  # int32
    flags: np.ndarray  # uint8
    ok: np.ndarray  # bool: delivered (``False``: the shard does not hold that step)
    lost: np.ndarray  # bool: held, but nothing could rebuild its metadata
    rebuilt: np.ndarray  # bool: read from a bad chunk's neighbours, not from its own bytes


def read_field(reader: Any, layout: Layout, name: str, rows: np.ndarray, steps: np.ndarray,
               out: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Read ``name`` at ``rows``; a chunk that raises ``StoreCorruptError`` is skipped.

    Returns ``(ok, bad, errors)``: ``ok`` rows delivered, ``bad`` rows of chunks that
    failed their checks, ``errors`` their messages. After a failure the rows are read again
    chunk by chunk (``Layout.chunk_rows``: a shard's, or part of one where its scalars are
    chunked), so one bad chunk costs its own rows. A reader's ``read_run`` (consecutive
    rows, read chunk by chunk) is used where it has one."""
    read = getattr(reader, "read_run", reader.read)
    try:
        return read(name, rows, steps, out), np.zeros(len(rows), bool), []
    except StoreCorruptError:
        pass
    ok = np.zeros(len(rows), bool)
    bad = np.zeros(len(rows), bool)
    errors = []
    chunk = rows // layout.chunk_rows(name)  # chunks divide shards: never two shards' rows
    for c in np.unique(chunk).tolist():
        sel = np.flatnonzero(chunk == c)
        part = np.empty((len(sel), *out.shape[1:]), out.dtype)
        try:
            ok[sel] = read(name, rows[sel], steps[sel], part)
            out[sel] = part
        except StoreCorruptError as e:
            bad[sel] = True
            errors.append(error_detail(e))
    return ok, bad, errors


def read_metadata(reader: Any, layout: Layout, lane: int, rows: np.ndarray,
                  steps: np.ndarray, bounds: tuple[int, int] | None = None,
                  warn: bool = True) -> MetaRead:
    """``_episode_step`` and ``_flags`` of ``rows`` (lane steps ``steps``, consecutive and
    ascending) of ``lane``, rebuilt where a chunk of them is bad (module docstring).

    ``reader``: ``read(name, rows, steps, out) -> ok`` raising ``StoreCorruptError`` for a
    bad shard (a ``ShardReader``). ``bounds``: the lane steps ``[lo, hi)`` held, which may
    be read as neighbours (default: ``steps`` only). ``warn``: log each bad chunk (logger
    ``expstore``)."""
    rows = np.asarray(rows, np.int64)
    steps = np.asarray(steps, np.int64)
    n = len(rows)
    ep = np.zeros(n, np.int32)
    fl = np.zeros(n, np.uint8)
    ok_ep, bad_ep, err_ep = read_field(reader, layout, "_episode_step", rows, steps, ep)
    ok_fl, bad_fl, err_fl = read_field(reader, layout, "_flags", rows, steps, fl)
    lost = bad_ep & bad_fl
    rebuilt = bad_ep ^ bad_fl
    if not (bad_ep.any() or bad_fl.any()):
        return MetaRead(ep, fl, ok_ep & ok_fl, lost, rebuilt)
    ctx = _Context(reader, layout, lane, rows, steps, bounds)
    if (bad_fl & ~bad_ep).any():
        lost |= _derive_flags(ctx, ep, fl, bad_fl & ~bad_ep, ok_ep, lost)
    if (bad_ep & ~bad_fl).any():
        lost |= _derive_positions(ctx, ep, fl, bad_ep & ~bad_fl, ok_fl, lost)
    ok = np.where(bad_fl, ok_ep, ok_fl) & np.where(bad_ep, ok_fl, ok_ep)
    ok |= lost
    rebuilt &= ~lost
    ep[lost], fl[lost] = 0, 0
    for e in err_ep + err_fl if warn else []:
        log.warning("expstore: %s; lane %d: %d row(s) rebuilt from their neighbours, %d "
                    "lost (run 'expstore repair' to rewrite the chunk)", e, lane,
                    int(rebuilt.sum()), int(lost.sum()))
    return MetaRead(ep, fl, ok, lost, rebuilt)


class _Context:
    """Rows of the lane beside the ones asked for, read one at a time when needed."""

    def __init__(self, reader: Any, layout: Layout, lane: int, rows: np.ndarray,
                 steps: np.ndarray, bounds: tuple[int, int] | None) -> None:
        self.reader, self.layout, self.lane = reader, layout, lane
        self.steps = steps
        lo, hi = (int(steps[0]), int(steps[-1]) + 1) if bounds is None else bounds
        self.lo, self.hi = lo, hi

    def held(self, step: int) -> bool:
        return self.lo <= step < self.hi

    def value(self, name: str, step: int) -> int | None:
        """``name`` at lane ``step`` (``None``: not held, or unreadable)."""
        if not self.held(step):
            return None
        f = self.layout.fields[name]
        lay = self.layout
        row = lay.lane_rows(self.lane, np.array([step], np.int64))
        out = np.zeros(1, f.dtype)
        try:
            got = self.reader.read(name, row, np.array([step], np.int64), out)
        except StoreCorruptError:
            return None
        return int(out[0]) if got[0] else None


def _ends(ctx: _Context, at: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TERMINATED / TRUNCATED bits of the rows ``at`` from their fields, and which failed."""
    rows = ctx.layout.lane_capacity * ctx.lane + steps[at] % ctx.layout.lane_capacity
    bits = np.zeros(len(at), np.uint8)
    bad = np.zeros(len(at), bool)
    for name, bit in (("terminated", FLAG_TERMINATED), ("truncated", FLAG_TRUNCATED)):
        v = np.zeros(len(at), bool)
        ok, b, _ = read_field(ctx.reader, ctx.layout, name, rows, steps[at], v)
        bits |= np.where(v, bit, 0).astype(np.uint8)
        bad |= b | ~ok
    return bits, bad


def _derive_flags(ctx: _Context, ep: np.ndarray, fl: np.ndarray, todo: np.ndarray,
                  ep_ok: np.ndarray, lost: np.ndarray) -> np.ndarray:
    """Rebuild ``fl`` at ``todo`` from positions and the ``terminated``/``truncated``
    fields; returns the rows that cannot be rebuilt."""
    steps = ctx.steps
    out = np.zeros(len(ep), bool)
    at = np.flatnonzero(todo)
    bits, bad = _ends(ctx, at, steps)
    out[at[bad]] = True
    end_bits = np.zeros(len(ep), np.uint8)
    end_bits[at] = bits
    n = len(ep)
    for i in at.tolist():
        if out[i] or not ep_ok[i]:
            continue
        if ep[i] == 0:
            fl[i] = FLAG_FIRST | end_bits[i]
            continue
        # the row before: did its step end the episode? (a final row never does)
        if i > 0 and not (lost[i - 1] or out[i - 1]):
            prev = int(fl[i - 1])
        else:
            prev = ctx.value("_flags", int(steps[i]) - 1)
        # the row after: a first row (position 0)?
        nxt = int(ep[i + 1]) if i + 1 < n and not lost[i + 1] else \
            ctx.value("_episode_step", int(steps[i]) + 1)
        newest = not ctx.held(int(steps[i]) + 1)
        if prev is not None and prev & ENDS and not prev & FLAG_LAST:
            fl[i] = FLAG_LAST
        elif nxt is not None and nxt != 0 or newest and prev is not None:
            fl[i] = end_bits[i]  # a step row: a final row is always followed by a first one
        else:
            out[i] = True  # a final row after a broken-off step, or an interrupted step
    return out


def _derive_positions(ctx: _Context, ep: np.ndarray, fl: np.ndarray, todo: np.ndarray,
                      fl_ok: np.ndarray, lost: np.ndarray) -> np.ndarray:
    """Rebuild ``ep`` at ``todo`` from the flags (0 on FIRST, else the previous row's + 1);
    returns the rows that cannot be rebuilt."""
    out = np.zeros(len(ep), bool)
    for i in np.flatnonzero(todo).tolist():
        if not fl_ok[i]:
            continue
        if fl[i] & FLAG_FIRST:
            ep[i] = 0
            continue
        if i > 0 and not (lost[i - 1] or out[i - 1]):
            prev, prev_fl = int(ep[i - 1]), int(fl[i - 1])
        else:
            step = int(ctx.steps[i]) - 1
            prev, prev_fl = ctx.value("_episode_step", step), ctx.value("_flags", step)
        if prev is None or prev_fl is None or prev_fl & FLAG_LAST:
            out[i] = True  # nothing to count from (or a row after a final row not FIRST)
            continue
        ep[i] = prev + 1
    return out


def derive_step_ids(first_step: int, n: int) -> np.ndarray:
    """``_step_id`` of the first ``n`` slots of a shard whose header says ``first_step``."""
    return np.arange(first_step, first_step + n, dtype=np.int64)


def lost_ranges(steps: np.ndarray, lost: np.ndarray) -> list[tuple[int, int]]:
    """Runs of ``steps`` (consecutive) where ``lost`` is set, as ``[start, stop)`` ranges."""
    if not lost.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], lost.astype(np.int8), [0]])))
    s0 = int(steps[0])
    return [(s0 + int(a), s0 + int(b)) for a, b in zip(edges[::2], edges[1::2])]


#: metadata arrays a bad chunk of which can be rebuilt (the rules in the module docstring)
DERIVED = ("_step_id", "_episode_step", "_flags")


def rewrite_chunks(backend: Any, layout: Layout, name: str, shard: int,
                   values: np.ndarray) -> list[int]:
    """Replace the inner chunks of shard ``shard`` of ``name`` that fail to decode by
    ``values`` (``shard_rows`` values, one per slot), keeping every other chunk's bytes;
    the object is replaced atomically. Returns the chunks rewritten (``[]``: none bad)."""
    from .shard import EMPTY, HEADER_SIZE, assemble, encoder, index_size, parse_head

    key = layout.shard_key(name, shard)
    raw = backend.get(key)
    if raw is None:
        raise StoreCorruptError(f"{backend.url}/{key}: missing, nothing to rewrite")
    n_chunks = layout.chunks_per_shard(name)
    head = parse_head(raw[: index_size(n_chunks) + HEADER_SIZE], n_chunks,
                      f"{backend.url}/{key}")
    R = layout.chunk_rows(name)
    codec = layout.codec(name)
    encode = encoder(codec)
    f = layout.fields[name]
    chunks: list[bytes | None] = []
    done = []
    for c in range(n_chunks):
        off, nb = head.offsets[c], head.nbytes[c]
        if off == EMPTY:
            chunks.append(None)
            continue
        blob = bytes(raw[int(off): int(off) + int(nb)])
        try:
            codec.decode(blob, out=np.zeros((R, *f.shape), f.dtype))
        except Exception:  # numcodecs raises several types
            blob = encode(np.ascontiguousarray(values[c * R:(c + 1) * R], f.dtype))
            done.append(c)
        chunks.append(blob)
    if done:
        backend.put(key, assemble(chunks, head.first_step, head.n_rows, layout.checksum))
    return done
