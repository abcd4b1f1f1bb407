"""Random episode layouts and a plain reference model of what samplers may return.

:class:`EpisodeWriter` writes segments of episodes into a store, lane by lane, with every
observation encoding its own identity ``(lane, step, episode uid, position)``, and keeps a
plain Python log of every row ever written. The reference functions answer, with loops
and no index, which rows can start a transition / a sequence and what it must contain;
tests compare the samplers against them (wrap-around, interrupted episodes, lanes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import api as store_api
from ..field import Field
from ..spec import Spec

LANE, STEP, UID, POS = range(4)


def ident_spec(stack: int | None = None, goal: bool = False, padding: str = "reset") -> Spec:
    """Observation ``(4,)`` float64 = (lane, step, uid, pos) (+ goals), int action."""
    obs: Any = Field((4,), np.float64, stack=stack, padding=padding)
    if goal:
        obs = {"observation": obs, "achieved_goal": Field((2,), np.float64),
               "desired_goal": Field((2,), np.float64)}
    return Spec.create(obs=obs, action=Field((), np.int64))


@dataclass
class Row:
    uid: int
    pos: int
    final: bool
    terminated: bool
    truncated: bool
    reward: float
    obs: np.ndarray
    goal: np.ndarray | None = None  # achieved goal
    desired: np.ndarray | None = None


@dataclass
class EpisodeWriter:
    """Writes episodes into ``store`` and logs every row: ``log[lane][step] -> Row``."""

    store: Any
    rng: np.random.Generator
    goal: bool = False
    log: list[dict[int, Row]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.store.lanes
        self.log = [{} for _ in range(n)]
        self.next_step = [int(c) for c in self.store.index.count]
        self.pos = [0] * n
        self.uid = [lane * 1_000_000 + 1 for lane in range(n)]
        self.desired = [self.rng.normal(size=2) for _ in range(n)]
        #: achieved goal of each lane's open episode's next step (what its last step gave
        #: as next_obs), so a continuing segment starts from it
        self.open_goal: list[np.ndarray | None] = [None] * n

    def _obs(self, lane: int, step: int, uid: int, pos: int) -> np.ndarray:
        return np.array([lane, step, uid, pos], np.float64)

    def segment(self, lane: int, T: int, end: str = "open") -> None:
        """``T`` steps of the lane's open episode; ``end``: open/terminated/truncated."""
        if T < 1:
            return
        s0, p0, uid = self.next_step[lane], self.pos[lane], self.uid[lane]
        obs = np.stack([self._obs(lane, s0 + i, uid, p0 + i) for i in range(T)])
        reward = self.rng.normal(size=T).astype(np.float32)
        term = np.zeros(T, bool)
        trunc = np.zeros(T, bool)
        if end == "terminated":
            term[-1] = True
        elif end == "truncated":
            trunc[-1] = True
        final = self._obs(lane, s0 + T, uid, p0 + T)
        goals = self.rng.normal(size=(T + 1, 2))
        if self.open_goal[lane] is not None and self.pos[lane]:
            goals[0] = self.open_goal[lane]
        self.open_goal[lane] = goals[T] if end == "open" else None
        des = self.desired[lane]
        batch: dict[str, Any] = {"action": np.arange(s0, s0 + T, dtype=np.int64),
                                 "reward": reward, "terminated": term, "truncated": trunc}
        nxt = np.concatenate([obs[1:], final[None]])  # each step's next_obs: the next obs
        if self.goal:
            batch["obs"] = {"observation": obs, "achieved_goal": goals[:T],
                            "desired_goal": np.repeat(des[None], T, 0)}
            batch["next_obs"] = {"observation": nxt, "achieved_goal": goals[1:],
                                 "desired_goal": np.repeat(des[None], T, 0)}
        else:
            batch["obs"] = obs
            batch["next_obs"] = nxt
        self.store.extend(batch, lane=lane)
        log = self.log[lane]
        for i in range(T):
            log[s0 + i] = Row(uid, p0 + i, False, bool(term[i]), bool(trunc[i]),
                              float(reward[i]), obs[i], goals[i], des)
        if end == "open":
            self.next_step[lane] = s0 + T
            self.pos[lane] = p0 + T
        else:
            log[s0 + T] = Row(uid, p0 + T, True, False, False, 0.0, final, goals[T], des)
            self.next_step[lane] = s0 + T + 1
            self.pos[lane] = 0
            self.uid[lane] += 1
            self.desired[lane] = self.rng.normal(size=2)

    def interrupt(self) -> None:
        """Close and reopen the store: every lane's open episode is cut off."""
        url = self.store.url
        self.store.close()
        self.store = store_api.open(url.removeprefix("file://"), mode="r+",
                             fsync=getattr(self.store.backend, "fsync", True))
        for lane in range(self.store.lanes):
            if self.pos[lane]:
                self.pos[lane] = 0
                self.uid[lane] += 1

    def random(self, n_segments: int, max_len: int, p_open: float = 0.3,
               p_interrupt: float = 0.0) -> None:
        """``n_segments`` random segments over random lanes."""
        for _ in range(n_segments):
            lane = int(self.rng.integers(self.store.lanes))
            T = int(self.rng.integers(1, max_len + 1))
            u = self.rng.random()
            end = "open" if u < p_open else ("terminated" if u < (1 + p_open) / 2 else
                                             "truncated")
            self.segment(lane, T, end)
            if p_interrupt and self.rng.random() < p_interrupt:
                self.interrupt()

    # -- reference ------------------------------------------------------------------------
    def count(self, lane: int) -> int:
        return self.next_step[lane]

    def valid_from(self, lane: int) -> int:
        """Oldest intact step: the writer drops whole shards ahead of its cursor."""
        L = self.store.layout
        c = self.count(lane)
        if c == 0:
            return 0
        first = (c - 1) // L.shard_rows * L.shard_rows
        return max(0, first + L.shard_rows - L.lane_capacity)

    def lower(self, lane: int, guard: int = 0) -> int:
        L = self.store.layout.lane_capacity
        return max(self.valid_from(lane), self.count(lane) - L + guard)

    def step_of(self, row: int) -> tuple[int, int]:
        """(lane, step) a global row holds now (step -1: never written)."""
        L = self.store.layout.lane_capacity
        lane, slot = divmod(int(row), L)
        c = self.count(lane)
        if slot >= c:
            return lane, -1
        return lane, c - 1 - ((c - 1 - slot) % L)

    def same_episode(self, lane: int, s: int, t: int) -> bool:
        log = self.log[lane]
        return t in log and s in log and log[t].uid == log[s].uid


def ref_transition(w: EpisodeWriter, row: int, history: int, n: int, gamma: float,
                   guard: int = 0) -> dict[str, Any] | None:
    """What a transition anchored at ``row`` must hold, or ``None`` if it is not valid."""
    lane, s = w.step_of(row)
    if s < 0 or s < w.lower(lane, guard):
        return None
    log = w.log[lane]
    r = log[s]
    if r.final or s - min(r.pos, history) < w.lower(lane, guard):
        return None
    m = 0
    for j in range(1, n + 1):
        t = s + j
        if t >= w.count(lane) or not w.same_episode(lane, s, t):
            return None
        m = j
        if log[t].final:
            break
    k = history + 1
    obs = np.stack([log[s - min(i, r.pos)].obs for i in range(k - 1, -1, -1)])
    e = s + m
    nxt = np.stack([log[e - min(i, log[e].pos)].obs for i in range(k - 1, -1, -1)])
    reward = sum(gamma ** j * np.float64(np.float32(log[s + j].reward)) for j in range(m))
    last = log[s + m - 1]
    return {"obs": obs, "next_obs": nxt, "reward": reward, "horizon": m,
            "terminated": last.terminated, "truncated": last.truncated,
            "discount": 0.0 if last.terminated else gamma ** m, "step": s}


def ref_sequence(w: EpisodeWriter, row: int, burn_in: int, length: int, history: int,
                 period: int, guard: int = 0) -> dict[str, Any] | None:
    """Window of a sequence starting at ``row``: obs stacks (W, k, 4), mask, or ``None``."""
    lane, s = w.step_of(row)
    if s < 0 or s < w.lower(lane, guard):
        return None
    log = w.log[lane]
    r = log[s]
    if r.final or r.pos % period or s - min(r.pos, burn_in + history) < w.lower(lane, guard):
        return None
    end = None
    for j in range(length):
        t = s + j
        if t >= w.count(lane):
            return None
        if not w.same_episode(lane, s, t):
            end = j - 1
            break
        if log[t].final:
            end = j
            break
    end = length - 1 if end is None else end
    k = history + 1
    W = burn_in + length
    obs = np.zeros((W, k, 4))
    mask = np.zeros(W, bool)
    is_last = np.zeros(W, bool)
    action = np.zeros(W, np.int64)
    for i, p in enumerate(range(-burn_in, length)):
        if p < -r.pos or p > end:
            continue
        t = s + p
        mask[i] = True
        is_last[i] = log[t].final
        action[i] = 0 if log[t].final else t
        obs[i] = np.stack([log[t - min(q, log[t].pos)].obs for q in range(k - 1, -1, -1)])
    return {"obs": obs, "mask": mask, "is_last": is_last, "action": action, "step": s}
