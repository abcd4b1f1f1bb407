"""Mixtures: exact long-run fractions, per-component stores, routed priority updates."""

from __future__ import annotations

import numpy as np
import pytest

import expstore as es
from expstore.testing import EpisodeWriter, ident_spec, ref_transition


def _writer(tmp_path, name, capacity, seed, steps):
    store = es.create(tmp_path / name, ident_spec(), capacity=capacity, shard_rows=16,
                      fsync=False)
    w = EpisodeWriter(store, np.random.default_rng(seed))
    while w.count(0) < steps:
        w.random(1, max_len=12)
    return w


def test_fractions_sources_and_contents(tmp_path):
    recent = _writer(tmp_path, "recent.zarr", 64, 0, 150)  # small ring, wrapped
    longterm = _writer(tmp_path, "long.zarr", 512, 1, 400)
    per = es.PrioritizedSampler(longterm.store, seed=0, persist=False)
    mix = es.MixtureSampler([(recent.store, 0.3), (per, 0.7)], seed=0)
    counts = np.zeros(2)
    for i in range(50):
        b = mix.sample(10)
        assert len(b["index"]) == 10
        c = np.bincount(b["source"], minlength=2)
        assert set(c.tolist()) <= {3, 7, 2, 8}  # 3/7 each batch up to carried rounding
        counts += c
        for j, src in enumerate(b["source"]):
            w = (recent, longterm)[src]
            ref = ref_transition(w, b["index"][j], 0, 1, 0.99)
            assert ref is not None
            np.testing.assert_array_equal(b["obs"][j], ref["obs"][0])
        if i == 0:
            mix.update_priorities(b["index"], np.full(10, 50.0), b["step_id"], b["source"])
            rows = b["index"][b["source"] == 1]
            assert (per.priority(rows) == pytest.approx((50.0 + 1e-6) ** 0.6))
    assert counts.tolist() == [150, 350]  # exactly 30/70 over the run
    with pytest.raises(ValueError, match="source"):
        mix.update_priorities(b["index"], np.ones(10))


def test_uneven_split_is_exact_in_the_long_run(tmp_path):
    a = _writer(tmp_path, "a.zarr", 128, 0, 60)
    b = _writer(tmp_path, "b.zarr", 128, 1, 60)
    mix = es.MixtureSampler([(a.store, 1), (b.store, 2)])
    total = np.zeros(2)
    for _ in range(30):
        plan = mix.plan(32)
        total += [p.batch_size for _, p in plan.parts]
        assert plan.batch_size == 32
    np.testing.assert_allclose(total, [320, 640])


def test_empty_component_gives_its_share_unless_strict(tmp_path):
    offline = _writer(tmp_path, "off.zarr", 256, 0, 100)
    online = es.create(tmp_path / "on.zarr", ident_spec(), capacity=64, shard_rows=16)
    mix = es.MixtureSampler([(offline.store, 0.5), (online, 0.5)])
    b = mix.sample(16)
    assert (b["source"] == 0).all() and len(b["index"]) == 16
    strict = es.MixtureSampler([(offline.store, 0.5), (online, 0.5)], strict=True)
    with pytest.raises(es.NotEnoughData):
        strict.sample(16)
    with pytest.raises(ValueError, match="fraction"):
        es.MixtureSampler([(online, -1)])
