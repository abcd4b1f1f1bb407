"""Model-based fuzzing: random add / extend / flush / reopen / sample / priority updates /
episode ends / wrap-around against a plain in-memory reference ring. Any divergence fails.

The store is tiny (2 lanes of 3 shards of 8 rows) so a few dozen steps wrap every lane
several times. After every step the row index must agree with the reference exactly; the
rules also check every intact row byte for byte, every row's validity for three needs
(frame stack, 1- and 3-step horizons), sampled batches (stacked obs, next obs, n-step
rewards, discounts), priorities kept across flush + reopen, and a read-only reader that
sees what was flushed and what the writer staged in shared memory (full shards are
written in the background: each step waits for them before comparing the commit count).
"""

from __future__ import annotations

import copy
import errno
import os
import shutil

import numpy as np
from _writer_spies import route_puts, unroute_puts
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import expstore as es
from expstore.errors import WriteFailedError
from expstore.rows import FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED
from expstore.testing import scratch_dir

LANES, S, SHARDS = 2, 8, 3
LCAP = S * SHARDS
K = 3  # frame stack
SPEC = es.Spec.create(obs=es.Field((2,), np.int16, stack=K),
                      action=es.Field((), np.int64, low=0, high=3),
                      extras={"tag": es.Field((), np.int32)})
MAX_EXAMPLES = int(os.environ.get("EXPSTORE_FUZZ_EXAMPLES", "120"))
STEPS = int(os.environ.get("EXPSTORE_FUZZ_STEPS", "40"))
STATS = {"examples": 0, "rules": 0, "steps": 0, "rows_checked": 0, "samples_checked": 0}


class Lane:
    """Reference of one lane: every row ever written, by step."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.committed = 0
        self.open_ep = 0  # position in its episode of the next step (0: a new one starts)
        self.held = None  # next_obs given with the newest step while its episode is open

    @property
    def count(self) -> int:
        return len(self.rows)

    @staticmethod
    def lower(count: int) -> int:
        """Oldest intact step: the writer invalidates a whole shard slot ahead of itself."""
        return max(0, -(-count // S) * S - LCAP)

    def add_step(self, obs, action, reward, term, trunc, tag, next_obs) -> None:
        if self.held is not None and not np.array_equal(self.held, obs):
            # the newest step is not continued: a final row holds its next_obs
            self.rows.append(dict(obs=self.held, action=0, reward=np.float32(0), term=False,
                                  trunc=False, tag=0, flags=FLAG_LAST, ep=self.open_ep))
            self.open_ep = 0
        self.held = None if term or trunc else next_obs
        ep = self.open_ep
        fl = (FLAG_FIRST if ep == 0 else 0) | (FLAG_TERMINATED if term else 0) | \
            (FLAG_TRUNCATED if trunc else 0)
        self.rows.append(dict(obs=obs, action=action, reward=np.float32(reward), term=term,
                              trunc=trunc, tag=tag, flags=fl, ep=ep))
        self.open_ep = ep + 1
        if term or trunc:
            self.rows.append(dict(obs=next_obs, action=0, reward=np.float32(0), term=False,
                                  trunc=False, tag=0, flags=FLAG_LAST, ep=ep + 1))
            self.open_ep = 0

    def transition(self, t: int, n: int, gamma: float, count: int | None = None):
        """The transition from step ``t`` with an ``n``-step horizon; ``None`` if invalid."""
        count = self.count if count is None else count
        lo = self.lower(count)
        if not lo <= t < count or self.rows[t]["flags"] & FLAG_LAST:
            return None
        ep = self.rows[t]["ep"]
        if t - min(ep, K - 1) < lo:
            return None
        m = 0
        for j in range(1, n + 1):
            if t + j >= count or self.rows[t + j]["flags"] & FLAG_FIRST:
                return None
            m = j
            if self.rows[t + j]["flags"] & FLAG_LAST:
                break
        back = np.arange(K - 1, -1, -1)
        first = t - ep
        obs = np.stack([self.rows[s]["obs"] for s in np.maximum(t - back, first)])
        nxt = np.stack([self.rows[s]["obs"] for s in np.maximum(t + m - back, first)])
        r = np.array([self.rows[t + j]["reward"] for j in range(m)], np.float64)
        reward = np.float32(r[0]) if n == 1 else np.float32(
            (r * gamma ** np.arange(m)).sum())
        last = self.rows[t + m - 1]
        out = dict(obs=obs, next_obs=nxt, action=self.rows[t]["action"], reward=reward,
                   tag=self.rows[t]["tag"], terminated=last["term"], truncated=last["trunc"])
        if n > 1:
            out["discount"] = np.float32(0.0 if last["term"] else gamma ** m)
            out["horizon"] = m
        return out


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ctx = scratch_dir()
        self.dir = self.ctx.__enter__()
        self.url = os.path.join(self.dir, "s.zarr")
        shutil.copytree(TEMPLATE, self.url)
        self.store = es.open(self.url, "r+")
        self.lanes = [Lane() for _ in range(LANES)]
        self.rng = np.random.default_rng(0)
        self.next_value = [1000 * lane for lane in range(LANES)]  # each lane's next obs
        self.prio = es.PrioritizedSampler(self.store, alpha=1.0, eps=0.0, name="fuzz")
        self.ref_prio: dict[tuple[int, int], float] = {}
        self.max_p = 1.0
        self.saved: tuple[dict, float] | None = None
        self.reader = es.open(self.url, "r")
        STATS["examples"] += 1

    def teardown(self) -> None:
        self.prio.close()
        self.reader.close()
        self.store.close()
        self.ctx.__exit__(None, None, None)

    # -- writing ---------------------------------------------------------------------------
    def _steps(self, lane: int, T: int, p_end: float, seed: int) -> dict:
        """Steps whose ``next_obs`` is mostly the next step's ``obs`` (the next batch of the
        lane continues it too); a final observation where an episode ends, and now and then
        one that nothing continues (the store must close that step with a final row)."""
        rng = np.random.default_rng(seed)
        start = self.next_value[lane]
        obs = np.stack([[(start + i) % 30000, lane] for i in range(T + 1)]).astype(np.int16)
        nxt, obs = obs[1:].copy(), obs[:T]
        self.next_value[lane] = (start + T) % 30000
        end = rng.random(T) < p_end
        broken = rng.random(T) < 0.1
        nxt[end | broken, 1] += 100
        term = end & (rng.random(T) < 0.5)
        return dict(obs=obs, next_obs=nxt, action=rng.integers(0, 4, T),
                    reward=rng.normal(size=T).astype(np.float32), terminated=term,
                    truncated=end & ~term, tag=rng.integers(-1000, 1000, T).astype(np.int32))

    def _model(self, lane: int, b: dict, commits: bool = True) -> None:
        ref = self.lanes[lane]
        before = ref.count
        for i in range(len(b["reward"])):
            ref.add_step(b["obs"][i], int(b["action"][i]), b["reward"][i],
                         bool(b["terminated"][i]), bool(b["truncated"][i]), int(b["tag"][i]),
                         b["next_obs"][i])
        # a row gets the max priority once its next row is written (and continues its
        # episode); the newest row of a lane waits (PriorityIndex(lag=1))
        for s in range(max(before - 2, 0), ref.count - 1):
            if (lane, s) not in self.ref_prio and not ref.rows[s]["flags"] & FLAG_LAST \
                    and not ref.rows[s + 1]["flags"] & FLAG_FIRST:
                self.ref_prio[(lane, s)] = self.max_p
        if commits:  # an automatic flush commits every full shard
            ref.committed = max(ref.committed, ref.count - ref.count % S)
        lo = Lane.lower(ref.count)
        self.ref_prio = {k: v for k, v in self.ref_prio.items() if k[0] != lane or k[1] >= lo}
        STATS["steps"] += len(b["reward"])

    @rule(lane=st.integers(0, LANES - 1), T=st.integers(1, 20),
          p_end=st.sampled_from([0.0, 0.1, 0.5]), seed=st.integers(0, 2**16))
    def extend(self, lane, T, p_end, seed):
        b = self._steps(lane, T, p_end, seed)
        self.store.extend(b, lane=lane)
        self._model(lane, b)

    @rule(lane=st.integers(0, LANES - 1), p_end=st.sampled_from([0.0, 0.3]),
          seed=st.integers(0, 2**16))
    def add(self, lane, p_end, seed):
        b = self._steps(lane, 1, p_end, seed)
        self.store.add(b["obs"][0], b["action"][0], b["reward"][0], b["next_obs"][0],
                       b["terminated"][0], b["truncated"][0], lane=lane, tag=b["tag"][0])
        self._model(lane, b)

    @rule(p_end=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**16))
    def add_all_lanes(self, p_end, seed):
        parts = [self._steps(lane, 1, p_end, seed + lane) for lane in range(LANES)]
        b = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        self.store.add(b["obs"], b["action"], b["reward"], b["next_obs"], b["terminated"],
                       b["truncated"], tag=b["tag"])
        for lane, p in enumerate(parts):
            self._model(lane, p)

    @rule(lane=st.integers(0, LANES - 1), T=st.integers(1, 40),
          p_end=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**16))
    def extend_while_the_disk_is_full(self, lane, T, p_end, seed):
        """Every write fails (ENOSPC): a batch that fills a shard raises, yet every row is
        staged and readable here; once space is back, flush() commits them all."""
        b = self._steps(lane, T, p_end, seed)
        w = self.store.writers[lane]
        sim = copy.deepcopy(self.lanes[lane])  # rows the batch takes, final rows included
        before = sim.count
        for i in range(T):
            sim.add_step(b["obs"][i], 0, 0.0, bool(b["terminated"][i]),
                         bool(b["truncated"][i]), 0, b["next_obs"][i])
        fills = w.count % S + sim.count - before >= S

        def full(key, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), key)

        route_puts(self.store.backend, full)
        try:
            try:
                self.store.extend(b, lane=lane)
                raised = False
            except WriteFailedError:
                raised = True
            assert raised == fills
            self._model(lane, b, commits=False)
            self.check_rows_and_validity()  # staged rows (pending shards too) read back
            self._check_sample(self.store, 3, seed, committed=False)
        finally:
            unroute_puts(self.store.backend)
        self.flush()

    @rule()
    def flush(self):
        self.store.flush()
        for ref in self.lanes:
            ref.committed = ref.count
        self.saved = (dict(self.ref_prio), self.max_p)  # the flush hook saved priorities

    @rule()
    def reopen(self):
        self.flush()  # what close() does: commit, then save the priorities
        self.prio.close()
        self.store.close()
        self.store = es.open(self.url, "r+")
        for ref in self.lanes:
            ref.open_ep = 0  # a reopened writer starts new episodes
            ref.held = None  # and knows no next_obs of the steps before
        self.prio = es.PrioritizedSampler(self.store, alpha=1.0, eps=0.0, name="fuzz")
        saved, self.max_p = self.saved
        self.ref_prio = {}  # loaded: every intact non-final row with a next row
        for lane, ref in enumerate(self.lanes):
            for s in range(Lane.lower(ref.count), ref.count - 1):
                if not ref.rows[s]["flags"] & FLAG_LAST:
                    self.ref_prio[(lane, s)] = saved.get((lane, s), 0) or self.max_p

    # -- reading ---------------------------------------------------------------------------
    @precondition(lambda self: sum(r.count for r in self.lanes) > 0)
    @rule(data=st.data())
    def update_priorities(self, data):
        lane = data.draw(st.integers(0, LANES - 1))
        ref = self.lanes[lane]
        if not ref.count:
            return
        steps = np.array(data.draw(st.lists(st.integers(max(0, ref.count - LCAP - 3),
                                                        ref.count - 1), min_size=1,
                                            max_size=6)))
        td = np.array(data.draw(st.lists(st.floats(0.01, 50.0), min_size=len(steps),
                                         max_size=len(steps))))
        rows = lane * LCAP + steps % LCAP
        want = sum(1 for s in steps if (lane, int(s)) in self.ref_prio)
        applied = self.prio.update_priorities(rows, td, steps)
        assert applied == want
        for s, p in zip(steps.tolist(), td.tolist()):
            if (lane, s) in self.ref_prio:
                self.ref_prio[(lane, s)] = p
                self.max_p = max(self.max_p, p)

    @rule(n=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
    def sample(self, n, seed):
        self._check_sample(self.store, n, seed, committed=False)

    @rule(n=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
    def reader_refresh_and_sample(self, n, seed):
        self.reader.refresh()  # committed rows, and the rows staged in shared memory
        for lane, ref in enumerate(self.lanes):
            assert int(self.reader.index.count[lane]) == ref.count
            assert int(self.reader.index.committed[lane]) == ref.committed
            assert int(self.reader.index.lower_bound()[lane]) == Lane.lower(ref.count)
        self._check_sample(self.reader, n, seed, committed=False)

    def _check_sample(self, store, n, seed, committed):
        sampler = es.UniformSampler(store, n_step=n, gamma=0.9, seed=seed)
        counts = [r.committed if committed else r.count for r in self.lanes]
        valid = [t for lane, ref in enumerate(self.lanes)
                 for t in range(Lane.lower(counts[lane]), counts[lane])
                 if ref.transition(t, n, 0.9, counts[lane]) is not None]
        if not valid:
            return
        batch = sampler.sample(16)
        for i, row in enumerate(batch["index"].tolist()):
            lane, t = row // LCAP, int(batch["step_id"][i])
            want = self.lanes[lane].transition(t, n, 0.9, counts[lane])
            assert want is not None, f"sampled lane {lane} step {t}, not a valid transition"
            for k, v in want.items():
                got = batch[k][i]
                assert np.array_equal(got, v) or (k in ("reward", "discount") and
                                                  np.isclose(got, v, rtol=1e-6)), (k, got, v)
        STATS["samples_checked"] += len(batch["index"])

    @rule()
    def check_rows_and_validity(self):
        idx = self.store.index
        for lane, ref in enumerate(self.lanes):
            lo, c = Lane.lower(ref.count), ref.count
            steps = np.arange(lo, c)
            rows = idx.lane_rows(lane, steps)
            if len(rows):
                got = {n: self.store.read(n, rows) for n in ("obs", "action", "reward", "tag",
                                                             "terminated", "truncated")}
                for j, s in enumerate(steps.tolist()):
                    r = ref.rows[s]
                    assert np.array_equal(got["obs"][j], r["obs"]), (lane, s)
                    assert (got["action"][j], got["reward"][j], got["tag"][j]) == \
                        (r["action"], r["reward"], r["tag"]), (lane, s)
                    assert (got["terminated"][j], got["truncated"][j]) == (r["term"],
                                                                           r["trunc"])
                STATS["rows_checked"] += len(rows)
            all_rows = np.arange(lane * LCAP, (lane + 1) * LCAP)
            st_ = idx.steps(all_rows)
            for n in (1, 3):
                ok = idx.valid(all_rows, K - 1, n)
                want = [st_[j] >= 0 and ref.transition(int(st_[j]), n, 0.9) is not None
                        for j in range(LCAP)]
                assert ok.tolist() == want, (lane, n)

    # -- after every step ------------------------------------------------------------------
    @invariant()
    def index_matches_reference(self):
        STATS["rules"] += 1
        idx = self.store.index
        for lane, ref in enumerate(self.lanes):  # full shards are written in the background:
            assert int(idx.committed[lane]) <= ref.committed  # committed once written
            self.store.writers[lane].wait()
        self.store._poll_writes()
        for lane, ref in enumerate(self.lanes):
            assert int(idx.count[lane]) == ref.count
            assert int(idx.committed[lane]) == ref.committed
            lo = Lane.lower(ref.count)
            assert int(idx.lower_bound()[lane]) == lo
            steps = np.arange(lo, ref.count)
            rows = idx.lane_rows(lane, steps)
            assert idx.flags[rows].tolist() == [ref.rows[s]["flags"] for s in steps]
            assert idx.episode_step[rows].tolist() == [ref.rows[s]["ep"] for s in steps]
        assert len(self.store) == sum(r.count - Lane.lower(r.count) for r in self.lanes)

    @invariant()
    def priorities_match_reference(self):
        leaves = self.prio.priorities.get(np.arange(LANES * LCAP))
        want = np.zeros(LANES * LCAP)
        for (lane, s), p in self.ref_prio.items():
            want[lane * LCAP + s % LCAP] = p
        assert np.allclose(leaves, want, rtol=1e-6), np.flatnonzero(
            ~np.isclose(leaves, want, rtol=1e-6))


TEMPLATE = ""


def setup_module(module):
    module._tmp = scratch_dir()
    d = module._tmp.__enter__()
    module.TEMPLATE = os.path.join(d, "template.zarr")
    es.create(module.TEMPLATE, SPEC, capacity=LANES * LCAP, lanes=LANES, shard_rows=S).close()


def teardown_module(module):
    module._tmp.__exit__(None, None, None)
    print(f"\nfuzz: {STATS['examples']} examples, {STATS['rules']} state-machine steps, "
          f"{STATS['steps']} env steps written, "
          f"{STATS['rows_checked']} rows and {STATS['samples_checked']} samples checked")


StoreMachine.TestCase.settings = settings(
    max_examples=MAX_EXAMPLES, stateful_step_count=STEPS, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TestStore = StoreMachine.TestCase
