"""Conformance tests every sampler must pass, as :class:`~expstore.testing.backend.BackendTests`
is for backends (and as TorchRL runs its replay-buffer tests over sampler x storage).

Subclass :class:`SamplerTests` in a test module and provide two fixtures: ``case`` (a
:class:`SamplerCase`: how to build the sampler and what its batches look like; the
built-in samplers are ``SAMPLER_CASES``) and ``url`` (a fresh store URL, e.g. from
:func:`store_url`: a local folder or ``memory://``), as ``tests/test_sampler_conformance.py``
does.

Stores hold :func:`~expstore.testing.episodes.ident_spec` observations (every frame says
its ``(lane, step, episode, position)``), written by an
:class:`~expstore.testing.episodes.EpisodeWriter` whose log is the reference. The
contract: batches have the requested size and the spec's fields, dtypes and shapes; every
sample is one the reference says may be returned (``ref_transition`` / ``ref_sequence``:
no final row, no episode or lane crossing, nothing overwritten), also after the ring
wrapped; rows lost to quarantine and rows not yet flushed (for readers of committed rows)
are never returned; the same seed gives the same batches; ``NotEnoughData`` says the rows
held per lane before enough rows exist; a sampler on a reader sees what a writer added
once it refreshes; ``make_loader`` yields the same batches' kind; ``update_priorities``
takes every sampler's batches (prioritized samplers then rarely draw rows given priority
zero).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from .. import api
from ..errors import NotEnoughData
from ..sampling import (
    HERSampler,
    MixtureSampler,
    PrioritizedSampler,
    ReaderView,
    SequenceSampler,
    UniformSampler,
)
from ..storage.format import Quarantine, write_quarantine
from .episodes import STEP, EpisodeWriter, ident_spec, ref_sequence, ref_transition

#: frames stacked per observation, lanes, rows per lane and per shard of the test stores
STACK, LANES, LANE_ROWS, SHARD_ROWS = 2, 2, 32, 8
OBS = "obs.observation"


def goal_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    """HER's ``compute_reward``: minus the distance between the goals."""
    return -np.linalg.norm(achieved - desired, axis=-1).astype(np.float32)


@dataclass(frozen=True)
class SamplerCase:
    """One sampler under test. ``make(store, seed, **kw)`` builds it (``kw``: options of
    the :class:`~expstore.sampling.Sampler` base, e.g. ``refresh_every``); the other
    fields say what its batches hold and how to check them."""

    name: str
    make: Callable[..., Any]
    #: n-step horizon and discount of its transitions (sequences: 1), guard band (rows)
    n_step: int = 1
    gamma: float = 0.99
    guard: int = 0
    #: sequences: ``(burn_in, length, period)``; ``None``: transitions
    sequence: tuple[int, int, int] | None = None
    #: which samples of a batch were drawn by priority (``None``: no priorities)
    by_priority: Callable[[dict], np.ndarray] | None = None
    #: ``make_loader`` serves it (a mixture's plans name several stores: it does not yet)
    loadable: bool = True
    #: keys its batches add to a transition's or sequence's (int64, ``relabeled``: bool)
    extra_keys: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.name


def _all(batch: dict) -> np.ndarray:
    return np.ones(len(batch["index"]), bool)


SAMPLER_CASES: tuple[SamplerCase, ...] = (
    SamplerCase("uniform", lambda store, seed, **kw: UniformSampler(
        store, n_step=3, gamma=0.9, guard=3, seed=seed, **kw), n_step=3, gamma=0.9, guard=3),
    SamplerCase("prioritized", lambda store, seed, **kw: PrioritizedSampler(
        store, n_step=3, gamma=0.9, guard=3, seed=seed, persist=False, **kw), n_step=3,
        gamma=0.9, guard=3, by_priority=_all),
    SamplerCase("sequence", lambda store, seed, **kw: SequenceSampler(
        store, length=4, burn_in=1, period=2, seed=seed, persist=False, **kw),
        sequence=(1, 4, 2)),
    SamplerCase("sequence-prioritized", lambda store, seed, **kw: SequenceSampler(
        store, length=4, burn_in=1, prioritized=True, seed=seed, persist=False, **kw),
        sequence=(1, 4, 1), by_priority=_all),
    SamplerCase("her", lambda store, seed, **kw: HERSampler(
        UniformSampler(store, seed=seed, **kw), goal_reward, "future", k=1, seed=seed),
        extra_keys=("relabeled",)),
    SamplerCase("mixture", lambda store, seed, **kw: MixtureSampler(
        [(UniformSampler(store, seed=seed, **kw), 0.5),
         (PrioritizedSampler(store, seed=seed, persist=False, **kw), 0.5)], seed=seed),
        by_priority=lambda batch: batch["source"] == 1, loadable=False,
        extra_keys=("source",)),
)


# -- stores and checks ---------------------------------------------------------------------------
def new_store(url: str) -> Any:
    return api.create(url, ident_spec(stack=STACK, goal=True), capacity=LANES * LANE_ROWS,
                      lanes=LANES, shard_rows=SHARD_ROWS, fsync=False)


def written(url: str, rows_per_lane: int, seed: int = 0) -> EpisodeWriter:
    """A new store at ``url`` with at least ``rows_per_lane`` steps in every lane."""
    w = EpisodeWriter(new_store(url), np.random.default_rng(seed), goal=True)
    while min(w.count(lane) for lane in range(LANES)) < rows_per_lane:
        w.random(4, max_len=9, p_open=0.3)
    return w


def expected_shapes(case: SamplerCase, store: Any, batch_size: int
                    ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Every key a batch of ``case`` holds -> (shape, dtype), from the store's spec."""
    lead = (batch_size,) if case.sequence is None else \
        (batch_size, case.sequence[0] + case.sequence[1])
    out = {}
    for name, f in store.spec.fields.items():
        shape = (*lead, *((f.stack,) if f.stack else ()), *f.shape)
        out[name] = (shape, f.dtype)
        if case.sequence is None and name in store.spec.obs_names:
            out["next_" + name] = (shape, f.dtype)
    if case.sequence is not None:
        out.update(dict.fromkeys(("mask", "is_first", "is_last"), (lead, np.dtype(bool))))
    if case.n_step > 1:
        out["horizon"] = ((batch_size,), np.dtype(np.int64))
        out["discount"] = ((batch_size,), np.dtype(np.float32))
    out["index"] = out["step_id"] = ((batch_size,), np.dtype(np.int64))
    out["weight"] = ((batch_size,), np.dtype(np.float32))
    for key in case.extra_keys:
        out[key] = ((batch_size,), np.dtype(bool if key == "relabeled" else np.int64))
    return out


def check_samples(case: SamplerCase, w: EpisodeWriter, batch: dict) -> None:
    """Every sample of ``batch`` is one the reference allows, holding what it must: frames,
    ends, n-step rewards and discounts (relabeled HER samples: their own rewards)."""
    history = STACK - 1
    relabeled = batch.get("relabeled", np.zeros(len(batch["index"]), bool))
    for i, row in enumerate(np.asarray(batch["index"])):
        if case.sequence is None:
            ref = ref_transition(w, row, history, case.n_step, case.gamma, case.guard)
            assert ref is not None, f"{case}: row {row} cannot start a transition"
            np.testing.assert_array_equal(batch[OBS][i], ref["obs"])
            np.testing.assert_array_equal(batch["next_" + OBS][i], ref["next_obs"])
            assert (batch["terminated"][i], batch["truncated"][i]) == \
                (ref["terminated"], ref["truncated"]), (case.name, row)
            if not relabeled[i]:
                np.testing.assert_allclose(batch["reward"][i], ref["reward"], rtol=1e-6,
                                           atol=1e-6)
            if case.n_step > 1:
                assert batch["horizon"][i] == ref["horizon"], (case.name, row)
                np.testing.assert_allclose(batch["discount"][i], ref["discount"], rtol=1e-6)
        else:
            burn_in, length, period = case.sequence
            ref = ref_sequence(w, row, burn_in, length, history, period, case.guard)
            assert ref is not None, f"{case}: row {row} cannot start a sequence"
            for key in ("mask", "is_last", "action"):
                np.testing.assert_array_equal(batch[key][i], ref[key], err_msg=key)
            np.testing.assert_array_equal(batch[OBS][i], ref["obs"])
        assert batch["step_id"][i] == ref["step"], (case.name, row)


def frame_steps(case: SamplerCase, batch: dict, lane: int) -> np.ndarray:
    """The steps of ``lane`` whose frames ``batch`` holds (observations and next ones)."""
    frames = [np.asarray(batch[OBS])]
    if case.sequence is None:
        frames.append(np.asarray(batch["next_" + OBS]))
    else:
        frames = [frames[0][np.asarray(batch["mask"])]]  # padding is zeros, not a frame
    allf = np.concatenate([f.reshape(-1, 4) for f in frames])
    return allf[allf[:, 0] == lane][:, STEP].astype(np.int64)


def update(sampler: Any, batch: dict, td_error: np.ndarray) -> Any:
    """``update_priorities`` as a training loop calls it with the batch it got."""
    extra = {"source": batch["source"]} if "source" in batch else {}
    return sampler.update_priorities(batch["index"], td_error, step_id=batch["step_id"],
                                     **extra)


class SamplerTests:
    """The contract of a sampler; see the module doc."""

    batch_size = 8

    @pytest.fixture
    def case(self) -> SamplerCase:
        raise NotImplementedError("subclasses of SamplerTests provide a case fixture")

    @pytest.fixture
    def url(self) -> str:
        raise NotImplementedError("subclasses of SamplerTests provide a url fixture")

    # -- batches ------------------------------------------------------------------------------
    def test_batches_have_the_size_fields_dtypes_and_shapes(self, case, url):
        w = written(url, 20)
        batch = case.make(w.store, 0).sample(self.batch_size)
        want = expected_shapes(case, w.store, self.batch_size)
        assert sorted(batch) == sorted(want)
        for key, (shape, dtype) in want.items():
            assert (batch[key].shape, batch[key].dtype) == (shape, dtype), key

    def test_samples_are_ones_the_reference_allows(self, case, url):
        w = written(url, 24, seed=1)
        sampler = case.make(w.store, 1)
        for _ in range(4):
            check_samples(case, w, sampler.sample(self.batch_size))

    def test_samples_stay_valid_after_the_ring_wraps(self, case, url):
        w = written(url, 3 * LANE_ROWS + 5, seed=2)
        sampler = case.make(w.store, 2)
        for _ in range(4):
            batch = sampler.sample(self.batch_size)
            check_samples(case, w, batch)
            assert (batch["step_id"] >= LANE_ROWS).all()  # nothing of the first lap is left

    def test_quarantined_rows_are_never_returned(self, case, url):
        w = written(url, 28, seed=3)
        w.store.flush()
        lo, hi = w.lower(0), w.count(0)
        lost = (lo + (hi - lo) // 3, lo + (hi - lo) // 3 + 5)
        write_quarantine(w.store.backend, Quarantine({0: [lost]}))
        reader = api.open(url)
        sampler = case.make(reader, 3)
        for _ in range(6):
            steps = frame_steps(case, sampler.sample(self.batch_size), lane=0)
            assert not ((steps >= lost[0]) & (steps < lost[1])).any(), (case.name, lost)
        reader.close()

    def test_rows_not_yet_flushed_are_not_served_to_committed_readers(self, case, url):
        w = written(url, 16, seed=4)
        w.store.flush()
        w.segment(0, 3, "terminated")  # staged (a shard that fills is flushed, though)
        w.segment(1, 3, "open")
        committed = w.store.index.committed.tolist()
        assert committed != [w.count(lane) for lane in range(LANES)]  # some rows staged
        sampler = case.make(w.store, 4)
        view = ReaderView(committed_only=True)
        for _ in range(4):
            batch = sampler.sample(self.batch_size, view=view)
            for lane in range(LANES):
                assert (frame_steps(case, batch, lane) < committed[lane]).all(), case.name

    def test_the_same_seed_gives_the_same_batches(self, case, url):
        w = written(url, 20, seed=5)
        a, b = case.make(w.store, 7), case.make(w.store, 7)
        for _ in range(3):
            x, y = a.sample(self.batch_size), b.sample(self.batch_size)
            assert sorted(x) == sorted(y)
            for key in x:
                np.testing.assert_array_equal(x[key], y[key], err_msg=key)

    # -- too few rows, and rows added later ------------------------------------------------------
    def test_not_enough_data_says_the_rows_held(self, case, url):
        w = EpisodeWriter(new_store(url), np.random.default_rng(6), goal=True)
        sampler = case.make(w.store, 6)
        with pytest.raises(NotEnoughData, match=r"rows held per lane: 0, 0"):
            sampler.sample(self.batch_size)
        w.segment(0, 1, "open")  # one row, whose next step does not exist yet
        with pytest.raises(NotEnoughData, match=r"rows held per lane: 1, 0"):
            sampler.sample(self.batch_size)

    def test_a_refreshing_reader_sees_what_a_writer_added(self, case, url):
        w = EpisodeWriter(new_store(url), np.random.default_rng(8), goal=True)
        w.store.flush()
        reader = api.open(url)
        sampler = case.make(reader, 8, refresh_every=0)  # re-read lanes before each batch
        with pytest.raises(NotEnoughData):
            sampler.sample(self.batch_size)
        while min(w.count(lane) for lane in range(LANES)) < 20:
            w.random(4, max_len=9)
        w.store.flush()
        for _ in range(3):
            check_samples(case, w, sampler.sample(self.batch_size))
        reader.close()

    # -- the loader and priorities ---------------------------------------------------------------
    def test_make_loader_yields_the_same_kind_of_batches(self, case, url):
        from ..loading import make_loader

        w = written(url, 20, seed=9)
        sampler = case.make(w.store, 9)
        if not case.loadable:  # refused when the loader is made, naming the way out
            with pytest.raises(TypeError, match=r"^sampler: .*one loader per component"):
                make_loader(w.store, sampler, batch_size=self.batch_size, num_workers=0)
            return
        want = expected_shapes(case, w.store, self.batch_size)
        loader = make_loader(w.store, sampler, batch_size=self.batch_size, num_workers=0,
                             num_batches=2)
        n = 0
        for batch in loader:
            got = {k: v.numpy() for k, v in batch.items()}
            assert {k: (v.shape, v.dtype) for k, v in got.items()} == want
            check_samples(case, w, got)
            n += 1
        assert n == 2

    def test_update_priorities_takes_every_samplers_batches(self, case, url):
        w = written(url, 24, seed=10)
        sampler = case.make(w.store, 10)
        batch = sampler.sample(16)
        done = update(sampler, batch, np.zeros(16))
        if case.by_priority is None:
            assert not done  # uniform samplers take the call and ignore it
            return
        mine = case.by_priority(batch)
        zeroed = set(np.asarray(batch["index"])[mine].tolist())
        assert 0 < done <= mine.sum()
        drawn = np.concatenate([np.asarray(b["index"])[case.by_priority(b)]
                                for b in (sampler.sample(16) for _ in range(6))])
        assert np.isin(drawn, list(zeroed)).mean() < 0.1, "rows of priority 0 keep coming"


def store_url(kind: str, tmp_path: Any) -> str:
    """A fresh store URL of ``kind``: ``"local"`` (a folder under ``tmp_path``) or
    ``"memory"`` (``memory://``, this process's RAM)."""
    if kind == "local":
        return str(tmp_path / "store.zarr")
    if kind == "memory":
        return f"memory://sampler-conformance/{uuid.uuid4().hex}.zarr"
    raise ValueError(f"kind: expected 'local' or 'memory', got {kind!r}")
