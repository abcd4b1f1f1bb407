"""Deterministic rows: every stored byte is a function of ``(lane, step, session)``.

A writer builds steps with :func:`make_steps`; a checker recomputes what any committed row
(:func:`check_lane`) or any sampled transition (:func:`check_batch`) must hold, byte for
byte, without a log of the data. ``session`` numbers the writer processes that wrote a lane
(a restarted writer starts a new episode and writes different bytes than the one before it,
so a row leaking from a killed writer's uncommitted data cannot pass for a committed one).
Each pixel frame starts with a 16-byte header ``(step int64, lane int32, session int32)``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..field import Field
from ..rows import FLAG_BAD, FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED
from ..spec import Spec

SHAPE = (32, 32)  # 1 KiB frames: stored one row per inner chunk, like images
STACK = 4
EPISODE = 23  # mean episode length (steps)
N_ACTIONS = 6

SessionOf = Callable[[int, np.ndarray], np.ndarray]  # (lane, steps) -> session numbers


def spec(**extras: Field) -> Spec:
    """Dict observation (stacked uint8 frames + a float vector), discrete action, session."""
    return Spec.create(
        obs={"pixels": Field(SHAPE, np.uint8, stack=STACK), "vec": Field((3,), np.float32)},
        action=Field((), np.int64, low=0, high=N_ACTIONS - 1),
        extras={"session": Field((), np.int32), **extras},
    )


def _arr(lane, steps, sessions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = np.atleast_1d(np.asarray(steps, np.int64))
    shape = np.broadcast_shapes(s.shape, np.shape(lane), np.shape(sessions))
    return (np.broadcast_to(np.asarray(lane, np.int64), shape),
            np.broadcast_to(s, shape), np.broadcast_to(np.asarray(sessions, np.int64), shape))


def pixels(lane, steps, sessions) -> np.ndarray:
    """Frames ``(*shape, 32, 32)`` uint8 whose first 16 bytes say (step, lane, session)."""
    ln, s, ses = _arr(lane, steps, sessions)
    shape = s.shape
    ln, s, ses = ln.ravel(), s.ravel(), ses.ravel()
    n = len(s)
    a = ((s * 2654435761 + ln * 97 + ses * 7919) % 251 + 1).astype(np.int32)
    b = ((s + 3 * ses) % 256).astype(np.int32)
    flat = np.arange(SHAPE[0] * SHAPE[1], dtype=np.int32)[None, :] * a[:, None]
    flat += b[:, None]
    flat = flat.astype(np.uint8)  # wraps: the value mod 256
    flat[:, :8] = s.astype("<i8").view(np.uint8).reshape(n, 8)
    flat[:, 8:12] = ln.astype("<i4").view(np.uint8).reshape(n, 4)
    flat[:, 12:16] = ses.astype("<i4").view(np.uint8).reshape(n, 4)
    return flat.reshape(*shape, *SHAPE)


def frame_header(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, lanes, sessions) embedded in frames of any leading shape."""
    flat = np.ascontiguousarray(frames).reshape(-1, SHAPE[0] * SHAPE[1])
    lead = frames.shape[:-2]
    steps = flat[:, :8].copy().view("<i8").reshape(lead)
    lanes = flat[:, 8:12].copy().view("<i4").reshape(lead)
    sessions = flat[:, 12:16].copy().view("<i4").reshape(lead)
    return steps, lanes, sessions


def vec(lane, steps, sessions) -> np.ndarray:
    ln, s, ses = _arr(lane, steps, sessions)
    return np.stack([s % (1 << 24), ln, ses + 0.5], axis=-1).astype(np.float32)


def action(lane, steps, sessions) -> np.ndarray:
    ln, s, ses = _arr(lane, steps, sessions)
    return (s * 31 + ln * 7 + ses * 3) % N_ACTIONS


def reward(lane, steps, sessions) -> np.ndarray:
    ln, s, ses = _arr(lane, steps, sessions)
    return (((s * 17 + ln * 5 + ses * 11) % 1000) / 8.0).astype(np.float32)


def ends(lane, steps) -> tuple[np.ndarray, np.ndarray]:
    """(terminated, truncated) of the step written at row ``steps`` of ``lane``."""
    s = np.atleast_1d(np.asarray(steps, np.int64))
    h = (s * 2654435761 + np.asarray(lane, np.int64) * 40503 + 12345) % (1 << 32)
    done = h % EPISODE == 0
    term = done & ((h // EPISODE) % 2 == 0)
    return term, done & ~term


def step_rows(lane: int, start: int, T: int) -> tuple[np.ndarray, int]:
    """Rows that ``T`` consecutive steps starting at row ``start`` take (final rows skipped)."""
    out = np.empty(T, np.int64)
    r = start
    for t in range(T):
        out[t] = r
        term, trunc = ends(lane, r)
        r += 2 if (term[0] or trunc[0]) else 1
    return out, r


def make_steps(lane: int, start: int, T: int, session: int) -> tuple[dict, int]:
    """``T`` steps of ``lane`` for ``store.extend`` when the lane's next row is ``start``.

    Returns the batch and the lane's next row after it.
    """
    rows, nxt = step_rows(lane, start, T)
    term, trunc = ends(lane, rows)
    batch = {
        "obs": {"pixels": pixels(lane, rows, session), "vec": vec(lane, rows, session)},
        "next_obs": {"pixels": pixels(lane, rows + 1, session),
                     "vec": vec(lane, rows + 1, session)},
        "action": action(lane, rows, session),
        "reward": reward(lane, rows, session),
        "terminated": term,
        "truncated": trunc,
        "session": np.full(T, session, np.int32),
    }
    return batch, nxt


def expected_fields(lane: int, steps: np.ndarray, sessions: np.ndarray,
                    last: np.ndarray) -> dict[str, np.ndarray]:
    """What rows ``steps`` (final rows where ``last``) hold in every user field."""
    keep = ~last
    term, trunc = ends(lane, steps)
    return {
        "obs.pixels": pixels(lane, steps, sessions),
        "obs.vec": vec(lane, steps, sessions),
        "action": np.where(keep, action(lane, steps, sessions), 0),
        "reward": np.where(keep, reward(lane, steps, sessions), 0).astype(np.float32),
        "terminated": term & keep,
        "truncated": trunc & keep,
        "session": np.where(keep, sessions, 0).astype(np.int32),
    }


def check_lane(store, lane: int, session_of: SessionOf | None = None,
               starts: set[int] | None = None, steps: np.ndarray | None = None) -> int:
    """Check every intact row of ``lane`` (or ``steps``) byte for byte; return rows checked.

    ``session_of`` gives the writer session of each step (from the writer's log); without
    it the session is read from each row's frame header and only consistency is checked.
    ``starts``: lane counts at which a writer (re)started (each starts a new episode).
    Raises ``AssertionError`` naming the lane, step and field on the first mismatch.
    """
    idx = store.index
    if steps is None:
        lo = int(idx.lower_bound()[lane])
        steps = np.arange(lo, int(idx.count[lane]))
    steps = np.asarray(steps, np.int64)
    lost = (idx.flags[idx.lane_rows(lane, steps)] & FLAG_BAD) != 0  # quarantined: skip
    steps = steps[~lost]
    if len(steps) == 0:
        return 0
    rows = idx.lane_rows(lane, steps)
    got = {name: store.read(name, rows, steps) for name in store.layout.fields}
    fl = got["_flags"]
    last = (fl & FLAG_LAST) != 0
    if session_of is None:
        sessions = frame_header(got["obs.pixels"])[2].astype(np.int64)
    else:
        sessions = np.asarray(session_of(lane, steps), np.int64)
    want = expected_fields(lane, steps, sessions, last)
    _expect(lane, steps, "_step_id", got["_step_id"], steps)
    for name, w in want.items():
        _expect(lane, steps, name, got[name], w)
    if not lost.any():  # (after lost rows the index starts new episodes: not the stored ones)
        _expect(lane, steps, "index.flags", idx.flags[rows], fl)
        _expect(lane, steps, "index.episode_step", idx.episode_step[rows],
                got["_episode_step"])
    _check_structure(lane, steps, got, sessions, starts)
    return len(steps)


def _check_structure(lane: int, steps: np.ndarray, got: dict, sessions: np.ndarray,
                     starts: set[int] | None) -> None:
    """Episode bookkeeping: first/final rows, positions, done flags, session boundaries."""
    fl = got["_flags"].astype(np.int64)
    ep = got["_episode_step"].astype(np.int64)
    term, trunc = got["terminated"], got["truncated"]
    first, last = (fl & FLAG_FIRST) != 0, (fl & FLAG_LAST) != 0
    _expect(lane, steps, "_flags/terminated", (fl & FLAG_TERMINATED) != 0, term)
    _expect(lane, steps, "_flags/truncated", (fl & FLAG_TRUNCATED) != 0, trunc)
    _expect(lane, steps, "_flags/first vs _episode_step", first, ep == 0)
    if len(steps) < 2:
        return
    contiguous = np.diff(steps) == 1
    s = steps[1:][contiguous]
    prev = np.flatnonzero(contiguous)
    cur = prev + 1
    new_session = sessions[cur] != sessions[prev]
    if starts is not None:
        new_session |= np.isin(s, list(starts))
    done_prev = (term[prev] | trunc[prev]) & ~last[prev]
    _expect(lane, s, "final row after a done step", last[cur], done_prev & ~new_session)
    _expect(lane, s, "first row", first[cur], last[prev] | new_session)
    _expect(lane, s, "_episode_step", ep[cur], np.where(first[cur], 0, ep[prev] + 1))


def _expect(lane: int, steps: np.ndarray, what: str, got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"lane {lane} {what}: shape {got.shape} != expected {want.shape}")
    bad = got != want
    if bad.ndim > 1:
        bad = bad.reshape(len(bad), -1).any(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(
            f"lane {lane} step {int(steps[i])} {what}: {int(bad.sum())} row(s) differ; first: "
            f"got {_short(got[i])}, expected {_short(want[i])}")


def _short(v: np.ndarray) -> str:
    v = np.asarray(v)
    return repr(v.ravel()[:20].tolist()) + ("..." if v.size > 20 else "")


def check_batch(batch: dict, index=None, session_of: SessionOf | None = None,
                lane_capacity: int | None = None) -> int:
    """Check a sampled 1-step batch against the written bytes; return samples checked.

    Every frame of ``obs``/``next_obs`` must be the frame of the step its header names,
    the stack must end at the anchor step and repeat its first frame only at the start
    (``reset`` padding), and all scalar fields must match the anchor step and the session
    of its frames (``session_of``: also the session the writer log gives). With ``index``
    (the row index the batch was planned from, unchanged since), the padding must start
    exactly at the anchor's episode start.
    """
    L = index.lane_capacity if index is not None else lane_capacity
    rows = np.asarray(batch["index"], np.int64)
    t = np.asarray(batch["step_id"], np.int64)
    lane = rows // L
    pix, nxt = np.asarray(batch["obs.pixels"]), np.asarray(batch["next_obs.pixels"])
    hs, hl, hses = frame_header(pix)
    sess = hses[:, -1].astype(np.int64)
    back = np.arange(STACK - 1, -1, -1)
    start = hs[:, 0]
    if index is not None:
        start = t - np.minimum(index.episode_step[rows], STACK - 1)
    obs_steps = np.maximum(t[:, None] - back, start[:, None])
    nxt_steps = np.maximum(t[:, None] + 1 - back, start[:, None])
    L1, S1 = lane[:, None], sess[:, None]
    term, trunc = ends(lane, t)
    checks = {
        "obs frame headers (step)": (hs, obs_steps),
        "obs frame headers (lane)": (hl, np.broadcast_to(L1, hl.shape)),
        "obs frame headers (session)": (hses, np.broadcast_to(S1, hses.shape)),
        "obs.pixels": (pix, pixels(L1, obs_steps, S1)),
        "next_obs.pixels": (nxt, pixels(L1, nxt_steps, S1)),
        "obs.vec": (batch["obs.vec"], vec(lane, t, sess)),
        "next_obs.vec": (batch["next_obs.vec"], vec(lane, t + 1, sess)),
        "action": (batch["action"], action(lane, t, sess)),
        "reward": (batch["reward"], reward(lane, t, sess)),
        "session": (batch["session"], sess),
        "terminated": (batch["terminated"], term),
        "truncated": (batch["truncated"], trunc),
    }
    if session_of is not None:
        want = np.empty(len(t), np.int64)
        for ln in np.unique(lane).tolist():
            want[lane == ln] = session_of(ln, t[lane == ln])
        checks["session (writer log)"] = (sess, want)
    for name, (g, w) in checks.items():
        g, w = np.asarray(g), np.asarray(w)
        bad = (g != w).reshape(len(g), -1).any(axis=1) if g.shape == w.shape else None
        if bad is None or bad.any():
            i = 0 if bad is None else int(np.flatnonzero(bad)[0])
            raise AssertionError(
                f"sample {i} (lane {int(lane[i])}, row {int(rows[i])}, step {int(t[i])}): "
                f"{name} differs from the bytes written: got {_short(g[i])}, expected "
                f"{_short(w[i])}")
    return len(rows)
