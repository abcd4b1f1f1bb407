"""A low-dim batch of a store past its hot set: the fields the hot set holds whole come in
one ``gather_held`` call, the others with one ``read_fields`` call (part from RAM, the rest
by the kernel), straight into the batch's arrays, without the general path's per-field
reads, de-duplication and final copy (``hot_batch.gather_from_hot_set``).

Each batch must equal, seed for seed, the batch of a store whose hot set holds it all, and
a plan whose rows were overwritten after it was drawn must come back as the general path
returns it (stale samples replaced by spares).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_hot_set import check, lapping_writer, make_store, same, sample_while_lapping, write

import expstore as es
from expstore.loading import execute
from expstore.loading.columns import numpy_alloc
from expstore.loading.transition_batch import finish_many, read_columns

#: hot_bytes -> the fields its hot set holds whole (a 1024-row store of 16 shards of 64
#: rows: 5 + 2 float32 vectors, a float32 reward of a new value every row, two flags)
BUDGETS = {
    0: set(),  # nothing decoded: every field from held compressed chunks or its shards
    8192: {"terminated", "truncated"},  # as 1-bit codes; 4 of 16 shards of each other field
    16384: {"terminated", "truncated"},  # and more of the vectors' shards
    24000: {"action", "reward", "terminated", "truncated"},  # obs: 8 of 16 shards
}


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_a_store_past_its_hot_set_samples_without_the_general_path(tmp_path, general_reads,
                                                                   budget):
    path = tmp_path / "s.zarr"
    store = make_store(path, capacity=1024, shard_rows=64)
    write(store, 0, 1000)
    store.close()
    whole = es.open(path)
    part = es.open(path, hot_bytes=budget)
    fields = whole.layout.spec.fields
    assert {n for n in fields if part.source.held_whole[n]} == BUDGETS[budget]
    assert all(whole.source.held_whole[n] for n in fields)
    for seed in range(40):  # (shards are decoded into hot sets as the first batches read them)
        whole.sample(32, rng=np.random.default_rng(1000 + seed))
        part.sample(32, rng=np.random.default_rng(1000 + seed))
    general_reads[0] = 0
    for seed in range(40):
        a = whole.sample(32, rng=np.random.default_rng(seed))
        b = part.sample(32, rng=np.random.default_rng(seed))
        check(b)
        same(a, b)
    assert general_reads[0] == 0
    whole.close()
    part.close()


def test_rows_overwritten_after_the_plan_come_back_as_the_general_path_gives_them(
        tmp_path, general_reads):
    """A writer laps part of the ring between a plan and its read: the batch path finds
    rows that no longer hold their steps and hands the plan to the general path, which
    replaces those samples (spares, or repeats of intact ones)."""
    store = make_store(tmp_path / "s.zarr", hot_bytes=0)
    write(store, 0, 250)
    store.flush()
    sampler = es.UniformSampler(store, seed=3)
    stale_seen = 0
    for lap in range(6):
        plan = sampler.plan(32)
        write(store, 250 + 60 * lap, 60)  # overwrites the oldest 60 rows
        store.flush()
        before = general_reads[0]
        batch = store.read_plan(plan)
        assert general_reads[0] == before + 1
        check(batch)
        (expect, stale), = finish_many(plan, *read_columns(plan, store.layout, store.source,
                                                           lazy=True), numpy_alloc)
        same(batch, expect)
        stale_seen += stale
    assert stale_seen > 0
    store.close()


def test_a_writer_sampling_its_own_store_past_its_hot_set(tmp_path, general_reads):
    """A learner that writes the store it samples, its hot set a fraction of the store:
    batches holding rows still staged in the writer's RAM, across laps of the ring, equal
    the general path's, and most come without it."""
    store = make_store(tmp_path / "s.zarr", hot_bytes=2048)
    held = {n for n in store.layout.spec.fields if store.source.held_whole[n]}
    assert held == {"terminated", "truncated"}  # (as 1-bit codes; the rest in part)
    sampler = es.UniformSampler(store, seed=0)
    write(store, 0, 100)
    store.flush()
    g, staged, batches = 100, 0, 0
    for i in range(60):  # ~2 laps of the 256-row ring
        write(store, g, 9)
        g += 9
        if i % 4:
            store.flush()
        for _ in range(3):
            plan = sampler.plan(32)
            batch = store.read_plan(plan)
            batches += 1
            check(batch)
            (expect, stale), = finish_many(plan, *read_columns(
                plan, store.layout, store.source, lazy=True), numpy_alloc)
            assert stale == 0
            same(batch, expect)
            staged += int((batch["step_id"] >= store.writers[0].committed.count).sum())
    assert staged > 0
    assert general_reads[0] < batches // 4
    store.close()


@pytest.mark.parametrize("budget", [0, 8192])
def test_a_reader_past_its_hot_set_samples_while_another_process_laps_the_ring(
        tmp_path, general_reads, budget):
    """Every sampled field belongs to the transition its obs names, while a writer in
    another process laps the ring three times under a reader whose hot set holds part of
    the store (or none of it)."""
    path = tmp_path / "s.zarr"
    writer = lapping_writer(path)
    reader = es.open(path, hot_bytes=budget)
    assert not all(reader.source.held_whole[n] for n in reader.layout.spec.fields)
    batches = sample_while_lapping(reader, writer)
    assert batches > 10 and general_reads[0] < batches
    reader.close()


@pytest.mark.parametrize("budget", [None, 16384, 0])
@pytest.mark.parametrize("batches", [1, 3])
def test_n_step_batches_come_from_the_hot_set_as_the_general_path_reads_them(
        tmp_path, general_reads, budget, batches):
    """3-step returns (rewards over the horizon, the done flags of its last step, horizons
    cut by episode ends) of a store that laps its ring, read straight into the batch arrays
    (its hot set whole, in part, or none of it), equal the general path's batches, key for
    key and in the same order; after the warm-up none takes the general path."""
    path = tmp_path / "s.zarr"
    store = make_store(path, capacity=1024, shard_rows=64)
    write(store, 0, 1500)  # laps the 1024-row ring
    store.close()
    reader = es.open(path, hot_bytes=budget)
    sampler = es.UniformSampler(reader, n_step=3, gamma=0.9, seed=4)
    for _ in range(40):
        sampler.sample(32)
    general_reads[0] = 0
    cut = 0
    for _ in range(30):
        plan = sampler.plan(32, batches=batches)
        mine = execute.assemble_batches(plan, reader.layout, reader.source)
        expect = finish_many(plan, *read_columns(plan, reader.layout, reader.source, lazy=True),
                             numpy_alloc)
        assert len(mine) == len(expect) == batches
        for (a, stale_a), (b, stale_b) in zip(mine, expect):
            assert stale_a == stale_b == 0
            same(a, b)
            k = a["obs"][:, 0]
            assert (a["action"][:, 0] == k).all()
            h = a["horizon"]
            assert ((h >= 1) & (h <= 3)).all()
            want = sum(np.where(j < h, 0.9 ** j * (k + j), 0.0) for j in range(3))
            assert np.allclose(a["reward"], want, rtol=1e-5)  # rewards key(g + j)
            assert (a["discount"] == np.where(a["terminated"], 0, 0.9 ** h).astype(
                np.float32)).all()
            cut += int((h < 3).sum())
    assert cut > 0  # some horizons were cut by an episode's end
    assert general_reads[0] == 0
    reader.close()
