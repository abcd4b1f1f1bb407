"""A learner opened before its actors have written (issue 25, item 4): a read-only store's
samplers re-read the lanes on their own (``refresh_every="auto"``), and ``NotEnoughData``
says how many rows each lane holds and how the sampler picks up other processes' rows.

Real stores on disk; the actor is a real second process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import expstore as es
from expstore.sampling.base import AUTO_REFRESH
from expstore.testing import data

PKG_ROOT = str(Path(es.__file__).resolve().parent.parent)  # the expstore these tests import
SPEC = data.spec()

ACTOR = """
import sys
import expstore as es
from expstore.testing import data
store = es.open(sys.argv[1], mode="r+", lane=int(sys.argv[2]))
batch, _ = data.make_steps(int(sys.argv[2]), 0, int(sys.argv[3]), 1)
store.extend(batch, lane=int(sys.argv[2]))
store.flush()
store.close()
"""


def actor(url: Path, lane: int, steps: int) -> None:
    """Write ``steps`` steps into ``lane`` from another process, flush, exit."""
    env = {**os.environ, "PYTHONPATH": PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-c", ACTOR, str(url), str(lane), str(steps)], env=env,
                   check=True, timeout=120)


def test_a_read_only_learner_samples_an_actor_process_rows_without_calling_refresh(tmp_path):
    url = tmp_path / "s.zarr"
    es.create(url, SPEC, capacity=512, lanes=2, shard_rows=32).close()
    learner = es.open(url)  # opened before any actor wrote
    uniform = es.UniformSampler(learner, seed=0)
    per = es.PrioritizedSampler(learner, seed=0, persist=False)
    assert uniform.refresh_every == per.refresh_every == AUTO_REFRESH
    with pytest.raises(es.NotEnoughData, match=r"rows held per lane: 0, 0; this sampler "
                                               r"re-reads the lanes other processes write "
                                               r"every 1 s"):
        uniform.sample(8)
    stuck = es.open(url)  # the same, with refreshing turned off
    plain = es.open(url)  # store.sample(): its sampler is made at the first call
    off = es.UniformSampler(stuck, seed=0, refresh_every=None)

    actor(url, 1, 150)
    deadline = time.monotonic() + 30
    for sampler in (uniform, per):
        while True:  # the learner loop: never calls refresh itself
            try:
                batch = sampler.sample(32)
                break
            except es.NotEnoughData:
                assert time.monotonic() < deadline, "the learner never saw the actor's rows"
                time.sleep(0.05)
        assert data.check_batch(batch, learner.index) == 32
        assert (batch["index"] >= learner.layout.lane_capacity).all()  # lane 1's rows
    # refresh_every=None: nothing until the store is refreshed, and the error says so
    time.sleep(AUTO_REFRESH + 0.1)
    assert data.check_batch(plain.sample(8), plain.index) == 8  # refreshes at once: >1 s old
    with pytest.raises(es.NotEnoughData, match=r"rows held per lane: 0, 0; rows other "
                                               r"processes write appear only after "
                                               r"store\.refresh\(\)"):
        off.sample(8)
    stuck.refresh()
    assert data.check_batch(off.sample(8), stuck.index) == 8
    learner.close()
    stuck.close()
    plain.close()


def test_samplers_of_a_store_this_process_writes_do_not_refresh_unless_asked(tmp_path):
    url = tmp_path / "s.zarr"
    with es.create(url, SPEC, capacity=512, lanes=2, shard_rows=32) as w:
        for s in (es.UniformSampler(w), es.PrioritizedSampler(w, persist=False),
                  es.SequenceSampler(w, length=4)):
            assert s.refresh_every is None
        assert es.UniformSampler(w, refresh_every=0.5).refresh_every == 0.5
        with pytest.raises(es.NotEnoughData, match=r"rows held per lane: 0, 0\Z"):
            es.UniformSampler(w).sample(4)  # every lane written here: nothing to refresh
    one = es.open(url, mode="r+", lane=0)  # lane 1 is written elsewhere
    s = es.UniformSampler(one)
    assert s.refresh_every is None
    with pytest.raises(es.NotEnoughData, match=r"rows held per lane: 0, 0; rows other "
                                               r"processes write appear only after "
                                               r"store\.refresh\(\)"):
        s.sample(8)
    one.close()
    for bad in (-1, "often", True):
        with pytest.raises(ValueError, match="refresh_every: expected seconds >= 0"):
            es.UniformSampler(es.open(url), refresh_every=bad)


def test_a_mixture_says_why_its_components_cannot_sample(tmp_path):
    url = tmp_path / "s.zarr"
    es.create(url, SPEC, capacity=512, lanes=1, shard_rows=32).close()
    r = es.open(url)
    mix = es.MixtureSampler([(es.UniformSampler(r), 0.5), (es.PrioritizedSampler(
        r, persist=False), 0.5)])
    with pytest.raises(es.NotEnoughData, match=r"no component of the mixture can sample yet "
                                               r"\(component \d: .*rows held per lane: 0"):
        mix.sample(8)
    r.close()


def test_a_refresh_with_nothing_new_costs_little(tmp_path):
    """The default refresh on a read-only store is cheap when nothing was written: well
    under a millisecond per lane on local disk (once a second by default)."""
    url = tmp_path / "s.zarr"
    with es.create(url, SPEC, capacity=1024, lanes=4, shard_rows=32) as w:
        for lane in range(4):
            batch, _ = data.make_steps(lane, 0, 100, 1)
            w.extend(batch, lane=lane)
    r = es.open(url)
    r.refresh()
    t0 = time.perf_counter()
    for _ in range(50):
        r.refresh()
    per_refresh = (time.perf_counter() - t0) / 50
    assert per_refresh < 0.01, per_refresh  # measured ~0.1 ms for 4 lanes (2 shared cores)
    assert len(r) >= 400  # (and it changed nothing)
    r.close()
