"""Plans drawn while another thread of the process adds to the store.

A sampler draws rows from the index and then makes their plan (steps, frame-stack and
n-step windows). The draw's random numbers release the GIL, so an actor thread may add
rows in between, and a drawn row may by then hold a later step: a final row, or one
whose next step is not written yet. Before plans judged their anchors again at the steps
they name, such a row was read as a transition (its obs the final observation, its
next_obs the same): CI met it once in ``test_hot_set``'s 40 s race. Here the adds run
inside that gap on purpose, for every kind of plan.
"""

from __future__ import annotations

import numpy as np
import pytest

import expstore as es
import expstore.index.rows as rows_mod
from expstore.sampling.base import Sampler

EP_LEN = 5  # steps per episode: one row in six is a final row


def key(g: int) -> float:
    """Transition ``g``'s obs value: episode * 100 + position (next_obs: + 1)."""
    return float((g // EP_LEN) * 100 + g % EP_LEN)


def write(store, start: int, n: int) -> None:
    for g in range(start, start + n):
        k = key(g)
        store.add(np.full(3, k, np.float32), np.array([k], np.float32), float(k),
                  np.full(3, k + 1, np.float32), g % EP_LEN == EP_LEN - 1, False)


@pytest.fixture(params=["kernel", "numpy"])
def index_path(request, monkeypatch):
    """Every test with the index's C kernel (one call under the GIL) and its numpy path
    (answers from one reading of the counts, then checked for rows rewritten since)."""
    if request.param == "numpy":
        monkeypatch.setattr(rows_mod, "native", None)
    elif rows_mod.native is None:
        pytest.skip("C index kernel not built")


@pytest.fixture
def store(tmp_path):
    """A ring of 112 rows (16-row shards) holding transitions 0-199."""
    spec = es.Spec.create(obs=es.Field((3,), np.float32), action=es.Field((1,), np.float32))
    s = es.create(tmp_path / "s.zarr", spec, capacity=112, shard_rows=16, fsync=False)
    write(s, 0, 200)
    yield s
    s.close()


@pytest.fixture
def adds_after_draws(store, monkeypatch):
    """Every draw of rows is followed by 41 adds, as an actor thread's would be (the ring
    of 112 rows is no multiple of an episode's 6: a lapped row lands on another position
    of its episode, a final row among them). Returns the count of draws so far."""
    calls = [0]
    real = Sampler.sample_rows
    g = [200]

    def draw_then_add(self, *a, **kw):
        got = real(self, *a, **kw)
        write(store, g[0], 41)
        g[0] += 41
        calls[0] += 1
        return got

    monkeypatch.setattr(Sampler, "sample_rows", draw_then_add)
    return calls


def check_transitions(batch: dict, n_step: int, gamma: float) -> None:
    """Each sample is a transition of the stream: its obs a step's (not a final row's),
    its next_obs ``m`` steps later in the same episode, its reward their discounted sum."""
    k = batch["obs"][:, 0].astype(np.int64)
    pos = k % 100
    assert (pos < EP_LEN).all(), "a final row was sampled as a transition"
    assert (batch["obs"] == k[:, None]).all() and (batch["action"][:, 0] == k).all()
    m = np.minimum(n_step, EP_LEN - pos)
    assert (batch["next_obs"] == (k + m)[:, None]).all()
    want = sum(np.where(j < m, gamma ** j * (k + j), 0.0) for j in range(n_step))
    np.testing.assert_allclose(batch["reward"], want, rtol=1e-5)


@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_transitions_planned_across_adds_are_whole(index_path, store, adds_after_draws, kind,
                                                   n_step):
    sampler = (es.UniformSampler(store, n_step=n_step, gamma=0.5, seed=1) if kind == "uniform"
               else es.PrioritizedSampler(store, n_step=n_step, gamma=0.5, seed=1))
    for _ in range(60):
        check_transitions(sampler.sample(16), n_step, 0.5)
    assert adds_after_draws[0] >= 60


def test_sequences_planned_across_adds_are_whole(index_path, store, adds_after_draws):
    sampler = es.SequenceSampler(store, length=3, seed=2)
    for _ in range(60):
        batch = sampler.sample(8)
        k = batch["obs"][:, :, 0].astype(np.int64)
        mask = batch["mask"]
        start = k[:, 0]
        assert (start % 100 < EP_LEN).all(), "a final row started a sequence"
        # every masked position continues the start's episode, one step after the other
        offsets = np.arange(k.shape[1])[None, :]
        assert ((k == start[:, None] + offsets) | ~mask).all()
    assert adds_after_draws[0] >= 60


def test_a_plan_of_rows_that_changed_since_they_were_checked_is_refused(index_path, store):
    """``make_plan`` (``Store.transitions``) names the rows that no longer start a
    transition instead of planning them."""
    final = int(np.flatnonzero((store.index.flags & es.rows.FLAG_LAST) != 0)[0])
    with pytest.raises(ValueError, match=f"rows \\[{final}\\] cannot start a transition"):
        es.sampling.make_plan(store.index, np.array([final]))


def test_rows_rewritten_while_the_numpy_path_makes_a_plan_are_drawn_again(store, monkeypatch):
    """The numpy path reads the index in several steps (the kernel answers in one call):
    adds between the steps it derived and the windows it reads rewrite rows under it, and
    ``RowIndex.current`` finds them."""
    monkeypatch.setattr(rows_mod, "native", None)
    real = rows_mod.RowIndex.stack
    g = [200]
    calls = [0, 0]  # stacks of whole batches' plans, of samples drawn again

    def stack_then_add(self, rows, steps, k):
        got = real(self, rows, steps, k)
        calls[len(rows) < 16] += 1
        if len(rows) == 16 and calls[0] % 2:  # (a batch's obs stack, not its next stack)
            write(store, g[0], 41)
            g[0] += 41
        return got

    monkeypatch.setattr(rows_mod.RowIndex, "stack", stack_then_add)
    sampler = es.UniformSampler(store, n_step=2, gamma=0.5, seed=3)
    for _ in range(20):
        check_transitions(sampler.sample(16), 2, 0.5)
    assert calls[0] >= 40 and calls[1] >= 20  # samples were drawn again, and planned
