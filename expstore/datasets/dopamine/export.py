"""A store -> Dopamine checkpoints: :func:`export_dopamine` (format: the package docstring)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...api import open as open_store
from ...errors import DatasetFormatError
from ...rows import FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED
from ..episodes import lane_rows
from ..npy_gzip import NpyGzipWriter, save_gz
from ..progress import Progress, ProgressArg
from ..streaming import blocks, check_block_rows
from ..summary import ImportSummary
from .checkpoint import CORE, STORE_PREFIX, ckpt_path, dopamine_invalid_range


def _segments(lr: Any, stack: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Dopamine rows of one lane: ``(src, terminal)`` per checkpoint to write.

    ``src`` indexes ``lr`` rows (``-1`` = zero padding). Final rows are dropped; each
    episode starting in the lane gets ``stack - 1`` padding rows first (a continued
    oldest episode gets none); an episode without final row followed by a new one
    starts a new checkpoint (Dopamine cannot represent the cut); an episode that ended
    last gets trailing padding so Dopamine can sample its terminal transition.
    """
    n = len(lr.steps)
    if n == 0:
        return []
    last = (lr.flags & FLAG_LAST) != 0
    first = (lr.flags & FLAG_FIRST) != 0
    prev_open = np.concatenate([[False], ~last[:-1]])
    breaks = np.flatnonzero(first & prev_open)
    out = []
    for lo, hi in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [n]])):
        idx = np.arange(lo, hi)
        idx = idx[~last[lo:hi]]
        if len(idx) == 0:
            continue
        pads = np.where(first[idx], stack - 1, 0)
        counts = pads + 1
        total = int(counts.sum())
        group = np.repeat(np.arange(len(idx)), counts)
        within = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        is_pad = within < pads[group]
        src = np.where(is_pad, -1, idx[group])
        done = (lr.flags[idx] & (FLAG_TERMINATED | FLAG_TRUNCATED)) != 0
        term = np.where(is_pad, False, done[group])
        if last[hi - 1] and stack > 1:
            src = np.concatenate([src, np.full(stack - 1, -1)])
            term = np.concatenate([term, np.zeros(stack - 1, bool)])
        out.append((src.astype(np.int64), term))
    return out


def export_dopamine(url: str | os.PathLike, dst: str | os.PathLike, suffix: int = 0, *,
                    stack: int | None = None, capacity: int | None = None,
                    update_horizon: int = 1, compresslevel: int = 9, block_rows: int = 2048,
                    storage_options: dict[str, Any] | None = None,
                    progress: ProgressArg = None) -> ImportSummary:
    """Write the store at ``url`` as Dopamine checkpoints ``suffix, suffix+1, ...`` in ``dst``.

    One checkpoint per lane (more if a lane holds interrupted episodes). ``stack``:
    Dopamine's ``stack_size`` (default: the obs field's ``stack``); ``capacity``: rows per
    array (default rows written + 1; fewer than written keeps the newest, wrapped like
    Dopamine's ring). User fields become ``$store$_<name>`` extra storage arrays.
    """
    t0 = time.perf_counter()
    block_rows = check_block_rows(block_rows)
    dst = Path(dst)
    store = open_store(url, "r", storage_options=storage_options)
    summary = ImportSummary(str(url), str(dst))
    try:
        spec = store.spec
        if spec.obs_names != ["obs"] or spec.action_names != ["action"]:
            raise DatasetFormatError(f"{store.url}: Dopamine stores one observation and one action "
                                     f"array; this store has {spec.obs_names} and "
                                     f"{spec.action_names}")
        act = spec.fields["action"]
        if act.shape != () or act.dtype.kind not in "iu":
            raise DatasetFormatError(f"{store.url}: Dopamine actions are integer scalars; field "
                                     f"'action' is {act.dtype} of shape {act.shape}")
        extras = [n for n in spec.fields if n not in ("obs", "action", "reward", "terminated",
                                                      "truncated")]
        for n in extras:
            if n in CORE:
                raise DatasetFormatError(f"{store.url}: field {n!r} clashes with Dopamine's "
                                         f"{STORE_PREFIX}{n}")
        k = int(stack or spec.fields["obs"].stack or 1)
        dst.mkdir(parents=True, exist_ok=True)
        plans = []
        for lane in range(store.lanes):
            lr = lane_rows(store, lane)
            plans += [(lr, src, term) for src, term in _segments(lr, k)]
        sizes = [capacity or len(src) + 1 for _, src, _ in plans]
        prog = Progress(sum(sizes), f"dopamine export {dst.name}", progress)
        try:
            for i, (lr, src, term) in enumerate(plans):
                C = max(sizes[i], k + update_horizon)
                _write_checkpoint(store, dst, suffix + i, lr, src, term, C, k, update_horizon,
                                  extras, compresslevel, block_rows, prog)
                summary.outputs.append(str(ckpt_path(dst, STORE_PREFIX + "observation",
                                                     suffix + i)))
                summary.rows += min(len(src), C)
                summary.steps += int((src >= 0).sum())
                summary.episodes += int(term.sum())
        finally:
            prog.close()
        summary.lanes = store.lanes
    finally:
        store.close()
    summary.seconds = time.perf_counter() - t0
    return summary


def _write_checkpoint(store: Any, dst: Path, suffix: int, lr: Any, src: np.ndarray,
                      term: np.ndarray, C: int, k: int, horizon: int, extras: list[str],
                      level: int, block_rows: int, prog: Progress) -> None:
    m = len(src)
    spec = store.spec
    cols = {"observation": ("obs", spec.fields["obs"].shape, spec.fields["obs"].dtype),
            "action": ("action", (), np.int32), "reward": ("reward", (), np.float32),
            "terminal": (None, (), np.uint8)}
    cols.update({n: (n, spec.fields[n].shape, spec.fields[n].dtype) for n in extras})
    writers = {name: NpyGzipWriter(ckpt_path(dst, STORE_PREFIX + name, suffix),
                                   (C, *shape), dtype, level)
               for name, (_, shape, dtype) in cols.items()}
    try:
        wrap = m - m % C  # chronological index of file row 0 in the newest lap
        for a, b in blocks(0, C, block_rows):
            p = np.arange(a, b)
            q = p + wrap - np.where(p >= m % C, C, 0) if m > C else p
            have = (q >= 0) & (q < m)
            s = np.where(have, src[np.clip(q, 0, max(m - 1, 0))] if m else -1, -1)
            real = s >= 0
            for name, (field, shape, dtype) in cols.items():
                out = np.zeros((b - a, *shape), dtype)
                if field is None:
                    out[have] = term[q[have]]
                elif real.any():
                    vals = store.read(field, lr.rows[s[real]], lr.steps[s[real]])
                    if name == "action":
                        info = np.iinfo(np.int32)
                        if vals.min() < info.min or vals.max() > info.max:
                            raise DatasetFormatError(f"{store.url}: actions do not fit "
                                                     "Dopamine's int32")
                    out[real] = vals
                writers[name].write(out)
            prog.update(b - a)
        for w in writers.values():
            w.close()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    cursor = m % C
    ir = (dopamine_invalid_range(cursor, C, k, horizon) if m else np.zeros(k))
    save_gz(ckpt_path(dst, "add_count", suffix), np.array(m, np.int64), level)
    save_gz(ckpt_path(dst, "invalid_range", suffix), ir, level)
