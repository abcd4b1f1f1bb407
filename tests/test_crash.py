"""Crash consistency: SIGKILL a writer anywhere, reopen, and find every committed row intact.

The writer (``expstore.testing.crash.writer``) writes rows whose every byte derives from
(lane, step, writer session) to 3 lanes of a small ring (image-sized frames with a frame
stack, a float vector, actions, rewards, episode ends), keeps priorities of a
``PrioritizedSampler`` that are saved on flush, and logs each flush after it returns. After
each kill the store is reopened and checked byte for byte against the log
(``crash.check_store``). Longer run: ``python scripts/crash_soak.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import expstore as es
from expstore.storage.faults import POINTS, REMOTE_ONLY  # internals: the crash points
from expstore.testing import crash, data, scratch_dir


@pytest.fixture
def workdir(tmp_path):
    with scratch_dir(str(tmp_path)) as d:
        yield d


def test_survives_kills_at_every_crash_point_and_at_random_moments(workdir):
    url, log = os.path.join(workdir, "s.zarr"), os.path.join(workdir, "log")
    crash.create_store(url)
    rng = np.random.default_rng(20261122)
    plan = [p for p in POINTS if p not in REMOTE_ONLY for _ in range(3)] + [None] * 9
    rng.shuffle(plan)
    rows = samples = prio = 0
    for k, point in enumerate(plan):
        kill = crash.kill_once(url, log, k, rng, point=point, nth=int(rng.integers(1, 6)),
                               delay=float(rng.uniform(0.02, 0.4)))
        assert point is None or kill.reached, f"kill {k}: crash point {point} never reached"
        res = crash.check_store(url, log)
        rows += res.rows
        samples += res.samples
        prio += res.priorities
    # a last writer that is not killed: the store still works after all those crashes
    crash.writer(url, log, len(plan), seed=1, ops=200)
    final = crash.check_store(url, log)
    assert len(plan) >= 24
    lap = 32 * 4
    assert min(final.counts) > 2 * lap, "the writers should have wrapped every lane"
    assert rows > 20 * 300 and samples > 20 * 64 and prio > 20 * 30
    print(f"\n{len(plan)} kills survived ({sum(p is not None for p in plan)} at crash points), "
          f"{rows + final.rows} committed rows, {prio + final.priorities} saved priorities and "
          f"{samples + final.samples} sampled transitions checked, final counts {final.counts}")


def test_kill_in_a_fresh_interpreter_via_environment(workdir):
    """The crash point armed by ``EXPSTORE_CRASH_POINT`` in a separately started process."""
    url, log = os.path.join(workdir, "s.zarr"), os.path.join(workdir, "log")
    crash.create_store(url)
    env = dict(os.environ, EXPSTORE_CRASH_POINT="flush.state:3")
    proc = subprocess.Popen([sys.executable, "-m", "expstore.testing.crash", "write", url, log,
                             "0", "7"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # the writer freezes after writing shards, pre-state
        assert line.strip() == "CRASHPOINT flush.state"
    finally:
        proc.kill()
        proc.wait()
    res = crash.check_store(url, log)  # two lane commits happened, the third did not
    assert sum(res.counts) > 0
    crash.writer(url, log, 1, seed=2, ops=50)  # a new writer takes over the killed one's lanes
    assert crash.check_store(url, log).rows > res.rows


def test_checker_catches_lost_and_foreign_rows(workdir):
    """The harness must be able to fail: lost flushed rows and rows of the wrong session."""
    url, log = os.path.join(workdir, "s.zarr"), os.path.join(workdir, "log")
    crash.create_store(url)
    crash.writer(url, log, 0, seed=3, ops=60)
    good = crash.check_store(url, log)
    with open(log, "a") as f:  # claim more was flushed than the store holds
        f.write("F 0 " + " ".join(str(c + 1) for c in good.counts) + "\n")
    with pytest.raises(AssertionError, match="data lost"):
        crash.check_store(url, log)
    with open(log, "w") as f:  # claim a different session wrote the rows
        f.write("S 5 0 0 0\n")
    with pytest.raises(AssertionError, match="session|obs.pixels"):
        crash.check_store(url, log)


def test_checker_catches_a_wrong_byte(workdir):
    url, log = os.path.join(workdir, "s.zarr"), os.path.join(workdir, "log")
    crash.create_store(url)
    crash.writer(url, log, 0, seed=4, ops=40)
    assert crash.check_store(url, log).rows > 0
    with es.open(url, "r+") as store:  # one more batch with one reward off by 1/8
        batch, _ = data.make_steps(1, store.writers[1].count, 5, session=0)
        batch["reward"][3] += 0.125
        store.extend(batch, lane=1)
    with pytest.raises(AssertionError, match="lane 1 step .* reward"):
        crash.check_store(url, log)


def test_kills_while_the_background_thread_writes(workdir):
    """A writer that only adds: every commit is a full shard written by its background
    thread. Frozen there at each crash point (the caller's thread goes on adding until its
    shard buffers run out), then killed: every committed row survives."""
    url, log = os.path.join(workdir, "s.zarr"), os.path.join(workdir, "log")
    crash.create_store(url)
    rng = np.random.default_rng(20261124)
    plan = [p for p in POINTS if p not in REMOTE_ONLY for _ in range(2)] + [None] * 4
    rng.shuffle(plan)
    rows = 0
    for k, point in enumerate(plan):
        kill = crash.kill_once(url, log, k, rng, point=point, nth=int(rng.integers(1, 4)),
                               delay=float(rng.uniform(0.05, 0.4)), adds_only=True)
        if point is not None:
            assert kill.reached, f"kill {k}: crash point {point} never reached"
            assert kill.background, f"kill {k}: {point} was not reached by the writing thread"
        rows += crash.check_store(url, log).rows
    crash.writer(url, log, len(plan), seed=5, ops=100, adds_only=True)
    final = crash.check_store(url, log)
    assert min(final.counts) > 32 * 4, "the writers should have wrapped every lane"
    print(f"\n{len(plan)} kills of an adds-only writer, {rows + final.rows} rows checked")


def test_kill_with_rows_staged_in_shared_memory(workdir):
    """kill -9 with rows added but not flushed: they were in shared memory, visible to
    readers while the writer lived; the store reopens at the last flush (verify clean),
    readers ignore the dead writer's staging, and the next writer replaces it."""
    url, log = os.path.join(workdir, "s.zarr"), os.path.join(workdir, "log")
    crash.create_store(url)
    staged = crash.kill_staged(url, log, 0, seed=3, steps=50)
    assert all(c > m for c, m in zip(staged.counts, staged.committed))
    assert len(staged.files) == 3  # one staging file per lane, left behind
    for path, ino in staged.files.items():
        assert os.stat(path).st_ino == ino
    reader = es.open(url)  # a dead writer's staged rows are not rows
    assert reader.index.count.tolist() == staged.committed
    reader.refresh()
    assert reader.index.count.tolist() == staged.committed
    reader.close()
    res = crash.check_store(url, log)  # reopened at the flush, byte for byte, verify clean
    assert res.counts == staged.committed
    crash.writer(url, log, 1, seed=4, ops=40)  # the next writer takes the lanes over
    for path, ino in staged.files.items():
        assert not os.path.exists(path) or os.stat(path).st_ino != ino
    assert crash.check_store(url, log).rows > res.rows


@pytest.mark.slow  # ~13 s: kills writers mid-upload on moto
def test_s3_kills_mid_upload_keep_the_last_committed_state(s3_url):
    """The same harness on S3 (a real moto server): a flush uploads a shard's objects
    concurrently, and a writer killed with some uploaded and others not (``put.upload``),
    before its lane state (``flush.state``), after it, or at a random moment leaves the
    last committed state: every flushed row intact, the store opens, verify is clean, and
    the next writer takes the dead one's lanes over."""
    pytest.importorskip("s3fs")
    url, so = s3_url
    crash.create_store(url, storage_options=so)
    with scratch_dir() as d:
        log = os.path.join(d, "log")
        rng = np.random.default_rng(20261125)
        plan = ["put.upload"] * 3 + ["flush.state", "flush.done", "flush.drop"] + [None] * 2
        rng.shuffle(plan)
        rows = 0
        for k, point in enumerate(plan):
            kill = crash.kill_once(url, log, k, rng, point=point, nth=int(rng.integers(1, 4)),
                                   delay=float(rng.uniform(0.3, 1.0)), timeout=60,
                                   storage_options=so)
            assert point is None or kill.reached, f"kill {k}: crash point {point} never reached"
            rows += crash.check_store(url, log, storage_options=so).rows
        crash.writer(url, log, len(plan), seed=3, ops=60, storage_options=so)
        final = crash.check_store(url, log, storage_options=so)
    assert rows > 0 and final.rows > 0 and sum(final.counts) > 0
    print(f"\n{len(plan)} kills of an S3 writer survived, {rows + final.rows} rows checked")
