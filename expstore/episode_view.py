"""Reading a store back episode by episode, and counts that say what they count.

* :func:`find_episodes` — where the complete episodes held are (lane, first step, steps),
  optionally only some lanes and a lane-step range.
* :func:`read_episode` — one episode as a dict of arrays, the way Minari's
  ``iterate_episodes`` hands them out.
* :func:`iter_episodes` — ``store.episodes()``: the complete episodes held, one by one.
* :func:`count_transitions` / :func:`missing_field` — the counts and errors of the
  ``Store`` read-back methods.

An episode is *complete* when its first row, every step and its final row are held
(not overwritten, not quarantined). Rows are counted in three ways: ``len(store)`` counts
rows (steps + one final row per finished episode), ``store.num_transitions`` counts steps
(env transitions) and ``store.num_episodes`` counts complete episodes held now.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .rows import FLAG_BAD, FLAG_FIRST, FLAG_LAST

#: Per-step fields an episode dict holds one value per step for (not per row).
STEP_FIELDS = ("action", "reward", "terminated", "truncated")


@dataclass(frozen=True)
class EpisodeRef:
    """Where one complete episode is: ``steps`` transitions from lane step ``first_step``
    of ``lane`` (its rows are ``first_step .. first_step + steps``, the last one final)."""

    lane: int
    first_step: int
    steps: int

    @property
    def stop(self) -> int:
        """One past the lane step of its final row."""
        return self.first_step + self.steps + 1


def _lanes(lanes: int | Iterable[int] | None, n: int) -> list[int]:
    if lanes is None:
        return list(range(n))
    out = [int(lanes)] if isinstance(lanes, (int, np.integer)) else [int(x) for x in lanes]
    bad = [x for x in out if not 0 <= x < n]
    if bad:
        raise ValueError(f"lanes: expected lane numbers in 0..{n - 1}, got {bad}")
    return out


def _step_range(steps: tuple[int | None, int | None] | None) -> tuple[int, float]:
    if steps is None:
        return 0, float("inf")
    try:
        start, stop = steps
    except (TypeError, ValueError):
        raise ValueError(f"steps: expected a (start, stop) pair of lane steps, got "
                         f"{steps!r}") from None
    lo = 0 if start is None else int(start)
    hi = float("inf") if stop is None else int(stop)
    if lo < 0 or hi < lo:
        raise ValueError(f"steps: expected 0 <= start <= stop, got {steps!r}")
    return lo, hi


def find_episodes(index: Any, lanes: int | Iterable[int] | None = None,
                  steps: tuple[int | None, int | None] | None = None) -> list[EpisodeRef]:
    """Complete episodes held in ``index`` (a ``RowIndex``), lane by lane, oldest first
    (an episode touching a quarantined row, or right after one, is damaged: left out).

    ``lanes``: a lane or lanes (default all). ``steps``: ``(start, stop)`` lane steps
    (either may be ``None``); only episodes whose rows all lie in ``[start, stop)`` count.
    """
    lo_all = index.lower_bound()
    start, stop = _step_range(steps)
    out: list[EpisodeRef] = []
    for lane in _lanes(lanes, index.lanes):
        lo, hi = int(lo_all[lane]), int(index.count[lane])
        if hi <= lo:
            continue
        s = np.arange(lo, hi, dtype=np.int64)
        rows = index.lane_rows(lane, s)
        fl = index.flags[rows]
        last = np.flatnonzero((fl & FLAG_LAST) != 0)
        T = index.episode_step[rows[last]].astype(np.int64)
        first = last - T
        ok = (first >= 0) & (T >= 1)
        first_c = np.maximum(first, 0)
        ok &= (fl[first_c] & FLAG_FIRST) != 0
        if ok.any():  # no quarantined row inside, nor just before: the rows after a bad
            # row start a new episode in the index, but they are the rest of a damaged one
            isbad = (fl & FLAG_BAD) != 0
            bad = np.concatenate([[0], np.cumsum(isbad)])
            ok &= bad[last + 1] - bad[np.maximum(first_c - 1, 0)] == 0
        for f, t in zip(first[ok], T[ok], strict=True):
            ref = EpisodeRef(lane, lo + int(f), int(t))
            if ref.first_step >= start and ref.stop <= stop:
                out.append(ref)
    return out


def count_transitions(index: Any) -> int:
    """Steps (env transitions) held, all lanes: intact rows that are not final rows."""
    total = 0
    lo_all = index.lower_bound()
    for lane in range(index.lanes):
        lo, hi = int(lo_all[lane]), int(index.count[lane])
        if hi > lo:
            fl = index.flags[index.lane_rows(lane, np.arange(lo, hi))]
            total += int(np.count_nonzero((fl & (FLAG_LAST | FLAG_BAD)) == 0))
    return total


def _stack(frames: np.ndarray, k: int, padding: str) -> np.ndarray:
    """``(n, *shape)`` frames of one episode -> ``(n, k, *shape)`` stacks, oldest first."""
    idx = np.arange(len(frames))[:, None] - (k - 1) + np.arange(k)[None, :]
    out = frames[np.maximum(idx, 0)]
    if padding == "zero":
        out[idx < 0] = 0
    return out


def read_episode(store: Any, ref: EpisodeRef, episode_id: int,
                 stacked: bool = True) -> dict[str, Any]:
    """One complete episode of ``store`` as a dict of numpy arrays.

    Keys: ``id`` (its position among the episodes iterated), ``lane``, ``first_step`` (lane
    step of its first row), ``steps`` (T), then every field by name: observation fields
    (``obs``, ``obs.<key>``) and user fields hold ``T + 1`` rows (the last is the final
    row: the final observation), ``action``/``reward``/``terminated``/``truncated`` hold
    ``T``. A frame-stacked field comes as ``(T + 1, stack, *shape)`` stacks when
    ``stacked`` (padded at the episode start like sampled batches), else single frames.
    """
    T = ref.steps
    rows = store.index.lane_rows(ref.lane, np.arange(ref.first_step, ref.stop))
    steps = np.arange(ref.first_step, ref.stop, dtype=np.int64)
    out: dict[str, Any] = {"id": episode_id, "lane": ref.lane, "first_step": ref.first_step,
                           "steps": T}
    for name, f in store.spec.fields.items():
        if name in STEP_FIELDS or name in store.spec.action_names:
            out[name] = store.read(name, rows[:T], steps[:T])
            continue
        v = store.read(name, rows, steps)
        out[name] = _stack(v, f.stack, f.padding) if stacked and f.stack else v
    return out


def iter_episodes(store: Any, lanes: int | Iterable[int] | None = None,
                  steps: tuple[int | None, int | None] | None = None,
                  stacked: bool = True) -> Iterator[dict[str, Any]]:
    """Every complete episode (see :func:`find_episodes` for the filters), read one at a
    time (memory: one episode)."""
    for i, ref in enumerate(find_episodes(store.index, lanes, steps)):
        yield read_episode(store, ref, i, stacked)


def missing_field(name: str, fields: Iterable[str]) -> KeyError:
    """The error for reading a field the store does not have, naming those it has."""
    names = list(fields)
    hint = ""
    if name.startswith("next_") and name[5:] in names:
        hint = (f" ('{name}' is not stored: it is the next row's '{name[5:]}'; "
                "store.transitions(rows) or a sampler returns it)")
    return KeyError(f"field {name!r} is not in this store{hint}; fields: {', '.join(names)}")
