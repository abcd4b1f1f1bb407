"""A row's coded scalars as one code (``storage/read/joint_codes.py``): batches gathered
from the joint codes equal, seed for seed, those of a store whose hot set holds every field
at its own width; laps that rewrite shards are copied again; a 257th tuple turns the copy
off and the fields' own codes serve."""

from __future__ import annotations

import numpy as np
import pytest
from test_scalar_codes import BUDGET, check, compare, make_store, tables, write

import expstore as es
from expstore.storage.native import native
from expstore.storage.read.joint_codes import MAX_TUPLES, JointCodes

pytestmark = pytest.mark.skipif(native is None, reason="C kernel not built")


def joint_of(store) -> JointCodes | bool | None:
    return store.source.reader.joint


@pytest.mark.parametrize("frames", [False, True], ids=["vector-obs", "frame-obs"])
def test_batches_from_joint_codes_equal_the_fields_own(tmp_path, frames):
    path = tmp_path / "s.zarr"
    store = make_store(path, frames=frames)
    write(store, 0, 5000)  # (wraps the 4096-row ring)
    store.close()
    whole, part = es.open(path), es.open(path, hot_bytes=BUDGET)
    compare(whole, part)
    joint = joint_of(part)
    assert isinstance(joint, JointCodes) and joint.served > 0
    assert set(joint.tables) == {"action", "reward", "terminated", "truncated"}
    assert (joint.first >= 0).all()  # every shard copied
    # every copy agrees with the fields' own codes, row by row
    rows = np.arange(part.capacity)
    steps = part.index.steps(rows)
    keep = (steps >= 0) & (steps < part.index.count[0])
    S = part.layout.shard_rows
    for name, t in tables(part).items():
        if name in joint.tables:
            code = joint.values[rows[keep] // S, rows[keep] % S]
            np.testing.assert_array_equal(joint.books[name][code],
                                          t.take(rows[keep] // S, rows[keep] % S))
    whole.close()
    part.close()


def test_a_lap_in_this_process_is_copied_again(tmp_path):
    """Shards a writer of this process rewrites change the fields' versions; their copies
    are dropped (``ShardTable.on_change``) and copied again, so the joint codes go on
    serving the new lap's rows."""
    path = tmp_path / "s.zarr"
    store = make_store(path)
    write(store, 0, 5000)
    store.close()
    whole, part = es.open(path), es.open(path, hot_bytes=BUDGET)
    compare(whole, part, n=8)
    joint = joint_of(part)
    assert isinstance(joint, JointCodes) and joint.served > 0
    writer = es.open(path, "r+", fsync=False)
    for g in range(5000, 5000 + 2 * 4096, 512):  # two laps, a flush every 512 rows
        write(writer, g, 512)
        writer.flush()
        whole.refresh()
        part.refresh()
        served = joint.served
        compare(whole, part, n=8)
        assert joint_of(part) is joint and joint.served >= served + 8  # (the new rows too)
        assert (joint.first >= 0).sum() >= len(joint.first) - 2  # (copied again)
    newest = max(int(part.index.steps(np.arange(part.capacity)).max()), 0)
    assert newest > 5000 + 4096 - 100
    writer.close()
    whole.close()
    part.close()


def test_past_256_tuples_the_fields_own_codes_serve(tmp_path):
    path = tmp_path / "s.zarr"
    store = make_store(path, action_high=15)
    actions = lambda g: (g * 7) % 16  # noqa: E731  (16 actions x 3 rewards x flags: > 256)
    rewards = lambda g: float(g % 11) - 5.0  # noqa: E731
    write(store, 0, 5000, action=actions, reward=rewards)
    store.close()
    whole, part = es.open(path), es.open(path, hot_bytes=BUDGET)
    assert tables(part)["reward"].code is not None
    compare(whole, part, action=actions, reward=rewards)
    assert joint_of(part) is False  # (turned off, its memory given back)
    for seed in range(10):
        check(part.sample(64, rng=np.random.default_rng(seed)), action=actions,
              reward=rewards)
    assert 16 * 11 * 2 > MAX_TUPLES // 2  # (the store's tuples: more than a byte codes)
    whole.close()
    part.close()
