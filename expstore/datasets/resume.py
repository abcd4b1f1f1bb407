"""Resuming an interrupted streamed import (shared by the Dopamine and LeRobot imports).

An import marks its store partial (``write_import_marker``) until every source row is in.
Source rows map to store rows deterministically (each kept row is one store row, two when it
ends an episode: its step and the episode's final row), so the rows a lane committed say
which source row comes next.

* :func:`resumable_marker` — the marker of a partial import of the same source and options
  to go on with, or ``None``.
* :func:`resume_point` — ``(next source row, store rows before it)`` from the committed count.
* :func:`episode_position` — the episode position the resumed row continues at.
* :func:`rewind_lane` — drop a lone last step whose final row was not committed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import DatasetFormatError
from ..storage.backends import backend_for
from ..storage.format import (
    drop_blocks,
    read_import_marker,
    read_layout,
    read_state,
    write_state,
)


def resumable_marker(url: str, fmt: str, source: str, options: dict[str, Any],
                     storage_options: Any, overwrite: bool) -> dict[str, Any] | None:
    """The marker of a partial ``fmt`` import of ``source`` with ``options`` at ``url`` to
    resume, or ``None`` (nothing there, or ``overwrite``). A store that is not such an
    import is left alone: ``create`` refuses it unless ``overwrite``; a partial import with
    other settings raises ``FileExistsError`` naming them."""
    if overwrite:
        return None
    backend = backend_for(url, storage_options, fsync=False)
    try:
        if backend.get("zarr.json") is None:
            return None
        marker = read_import_marker(backend)
    finally:
        backend.close()
    if marker is None or marker.get("status") == "complete":
        return None  # create() refuses: a store exists
    if marker.get("status") != "partial" or marker.get("format") != fmt:
        return None
    mine = {"source": source, **options}
    theirs = {"source": marker.get("source"), **(marker.get("options") or {})}
    diff = [f"{k}: stored {theirs.get(k)!r}, given {mine[k]!r}" for k in mine
            if _norm(theirs.get(k)) != _norm(mine[k])]
    if diff:
        raise FileExistsError(f"{backend.url}: holds a partial import with other settings ("
                              + "; ".join(diff) + "); re-run it with the same ones to resume, "
                              "or pass overwrite=True (--overwrite) to start over")
    return marker


def _norm(v: Any) -> Any:
    return json.loads(json.dumps(v))


def resume_point(keep: np.ndarray, term: np.ndarray, committed: int) -> tuple[int, int]:
    """``(q, rows)``: the first source row not yet stored and the store rows before it.

    ``keep[q]``: source row ``q`` becomes a store row; ``term[q]``: it ends an episode (and
    gets a final row). ``committed`` rows of the lane are on storage; ``rows`` is
    ``committed`` or one less when the lane ends between an episode's last step and its
    final row (which the import then writes again, with the final row).
    """
    per = keep.astype(np.int64) * (1 + (term & keep))
    cum = np.cumsum(per)  # store rows after source row q
    q = int(np.searchsorted(cum, committed, side="right"))  # rows before q: <= committed
    before = int(cum[q - 1]) if q else 0
    if q < len(cum) and before < committed:  # inside row q's pair (step + final row)
        return q, before
    if before != committed:
        raise DatasetFormatError(f"the lane holds {committed} rows, more than the "
                                 f"{int(cum[-1]) if len(cum) else 0} this source makes; "
                                 "was the store written by another import? (pass "
                                 "overwrite=True to start over)")
    return q, before


def episode_position(keep: np.ndarray, term: np.ndarray, q: int, first: int) -> int:
    """Episode position of the row that source row ``q`` becomes (``first``: of row 0)."""
    ends = np.flatnonzero(term[:q] & keep[:q])
    if len(ends):
        return int(keep[ends[-1] + 1 : q].sum())
    return first + int(keep[:q].sum())


def committed_rows(url: str, lane: int, storage_options: Any) -> int:
    """Rows of ``lane`` committed on storage."""
    backend = backend_for(url, storage_options, fsync=False)
    try:
        return int(read_state(backend, lane).count)
    finally:
        backend.close()


def rewind_lane(url: str, lane: int, rows: int, storage_options: Any) -> None:
    """Set ``lane``'s committed count back to ``rows`` (dropping a final row's lone step).
    The index snapshot's blocks holding steps past ``rows`` go first: the steps are
    written again, maybe differently."""
    backend = backend_for(url, storage_options, fsync=True)
    try:
        st = read_state(backend, lane)
        if st.count > rows:
            drop_blocks(backend, read_layout(backend), lane, rows, st.count)
            st.count = rows
            write_state(backend, st)
    finally:
        backend.close()
