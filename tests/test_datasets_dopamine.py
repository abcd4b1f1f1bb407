"""Dopamine checkpoints (DQN Replay Dataset layout) <-> expstore.

Reference files are written by ``tests/_dopamine_ref.py``, a numpy port of Dopamine's own
``OutOfGraphReplayBuffer`` (``add`` with zero padding, ``save`` with ``np.save`` into
``gzip.GzipFile``), and what Dopamine would train on is decided by that port's
``is_valid_transition`` / ``sample_transition``.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _dopamine_ref import OutOfGraphReplayBuffer, pong_frames, write_repeated_checkpoint

import expstore as es
from expstore.datasets import export_dopamine, import_dopamine, lane_rows
from expstore.datasets.dopamine import find_suffixes, inspect_checkpoint  # dopamine's face
from expstore.errors import DatasetFormatError

SHAPE = (10, 10)
K = 4
EXTRA = [("sid", (), np.int64)]  # a unique id per real step (0 on padding rows)


def fill(buf: OutOfGraphReplayBuffer, episodes: int, seed: int, last_open: bool = True,
         sid0: int = 1) -> int:
    """Random episodes (lengths 1..40); the last one unfinished when ``last_open``."""
    rng = np.random.default_rng(seed)
    sid = sid0
    for ep in range(episodes):
        n = int(rng.integers(1, 40))
        for t in range(n):
            obs = rng.integers(1, 256, SHAPE, dtype=np.uint8)
            term = int(t == n - 1 and not (last_open and ep == episodes - 1))
            buf.add(obs, int(rng.integers(0, 6)), float(rng.normal()), term, sid)
            sid += 1
    return sid


def ref_buffer(capacity: int, episodes: int, seed: int = 0, **kw) -> OutOfGraphReplayBuffer:
    buf = OutOfGraphReplayBuffer(SHAPE, K, capacity, extra_storage_types=EXTRA)
    fill(buf, episodes, seed, **kw)
    return buf


def store_rows_by_sid(store: es.Store) -> dict[int, int]:
    rows = np.flatnonzero(store.index.valid(np.arange(store.capacity), store.history, 1))
    return {int(s): int(r) for s, r in zip(store.read("sid", rows), rows)}


def assert_same_transition(buf: OutOfGraphReplayBuffer, i: int, store: es.Store, row: int,
                           terminal_as: str = "terminated") -> None:
    state, action, reward, next_state, terminal = buf.sample_transition(i)
    tr = store.transitions(np.array([row]))
    np.testing.assert_array_equal(np.moveaxis(state, -1, 0), tr["obs"][0])
    assert action == tr["action"][0]
    assert np.float32(reward) == tr["reward"][0]
    assert bool(terminal) == bool(tr[terminal_as][0] or tr["truncated"][0])
    # Dopamine's next_state of a terminal transition holds its zero padding frame; the
    # store's final row holds zeros too, so even those agree
    np.testing.assert_array_equal(np.moveaxis(next_state, -1, 0), tr["next_obs"][0])


def same_rows(a: es.Store, b: es.Store) -> None:
    """Every row of every lane: all fields, flags and episode positions."""
    assert a.lanes == b.lanes and a.spec.same_as(b.spec)
    for lane in range(a.lanes):
        ra, rb = lane_rows(a, lane), lane_rows(b, lane)
        np.testing.assert_array_equal(ra.flags, rb.flags)
        np.testing.assert_array_equal(ra.episode_step, rb.episode_step)
        for name in a.spec.fields:
            np.testing.assert_array_equal(a.read(name, ra.rows, ra.steps),
                                          b.read(name, rb.rows, rb.steps), err_msg=name)


def test_wrapped_checkpoint_gives_dopamines_transitions(tmp_path):
    buf = ref_buffer(capacity=600, episodes=60, seed=1)
    assert buf.add_count > 600  # the ring wrapped
    buf.save(tmp_path, 7)
    summary = import_dopamine(tmp_path, tmp_path / "s.zarr")
    store = es.open(tmp_path / "s.zarr")
    assert store.spec.fields["obs"].stack == K and store.spec.fields["obs"].padding == "zero"
    assert summary.steps == int((buf._store["sid"] > 0).sum())
    by_sid = store_rows_by_sid(store)
    valid = [i for i in range(600) if buf.is_valid_transition(i)]
    assert len(valid) > 400
    for i in valid:  # everything Dopamine trains on is in the store, identical
        assert_same_transition(buf, i, store, by_sid[int(buf._store["sid"][i])])
    # what the store adds is only rows next to the cursor (invalid_range): the newest
    # terminal transition, or stacks Dopamine rejects because they cross the cursor
    at = {int(s): i for i, s in enumerate(buf._store["sid"]) if s}
    extra = [at[s] for s in by_sid if not buf.is_valid_transition(at[s])]
    assert set(extra) <= set(buf.invalid_range.tolist())
    # the oldest, partly overwritten episode: its first stack-1 rows cannot be sampled
    head = lane_rows(store, 0)
    assert head.episode_step[0] == K - 1 and not head.flags[0] & 1
    assert not store.index.valid(head.rows[: K - 1], store.history, 1).any()


def test_several_checkpoints_are_lanes(tmp_path):
    a = ref_buffer(capacity=5000, episodes=10, seed=2, last_open=False)  # not wrapped
    b = ref_buffer(capacity=300, episodes=30, seed=3)  # wrapped
    a.save(tmp_path, 0)
    b.save(tmp_path, 4)
    assert find_suffixes(tmp_path) == [0, 4]
    summary = import_dopamine(tmp_path, tmp_path / "s.zarr")
    store = es.open(tmp_path / "s.zarr")
    assert store.lanes == 2 and summary.lanes == 2
    la, lb = lane_rows(store, 0), lane_rows(store, 1)
    assert la.episode_step[0] == 0  # starts after Dopamine's initial padding: a new episode
    assert store.episodes_written == 10 + int((b._store["terminal"] == 1).sum())
    assert len(la.rows) == a.add_count - (K - 1) * 10 + 10  # padding dropped, final rows added
    for buf, suffix_rows in ((a, la), (b, lb)):
        sids = store.read("sid", suffix_rows.rows, suffix_rows.steps)
        held = buf._store["sid"][: min(int(buf.add_count), buf._replay_capacity)]
        assert set(held[held > 0].tolist()) == set(sids[sids > 0].tolist())


def test_round_trip_and_dopamine_reads_the_export(tmp_path):
    buf = ref_buffer(capacity=700, episodes=70, seed=4)
    (tmp_path / "a").mkdir()
    buf.save(tmp_path / "a", 3)
    import_dopamine(tmp_path / "a", tmp_path / "s1.zarr")
    out = export_dopamine(tmp_path / "s1.zarr", tmp_path / "b", suffix=11)
    assert find_suffixes(tmp_path / "b") == [11]
    import_dopamine(tmp_path / "b", tmp_path / "s2.zarr")
    s1, s2 = es.open(tmp_path / "s1.zarr"), es.open(tmp_path / "s2.zarr")
    same_rows(s1, s2)
    # Dopamine's loader reads the export; it trains on exactly the store's transitions
    cap = out.rows + 1
    ref = OutOfGraphReplayBuffer(SHAPE, K, cap, extra_storage_types=EXTRA)
    ref.load(tmp_path / "b", 11)
    assert len(ref._store["observation"]) == cap and int(ref.add_count) == out.rows
    by_sid = store_rows_by_sid(s1)
    valid = [i for i in range(cap) if ref.is_valid_transition(i)]
    assert sorted(int(ref._store["sid"][i]) for i in valid) == sorted(by_sid)
    for i in valid:
        assert_same_transition(ref, i, s1, by_sid[int(ref._store["sid"][i])])


def test_export_is_np_save_in_gzip(tmp_path):
    buf = ref_buffer(capacity=400, episodes=5, seed=5, last_open=False)
    assert buf.add_count < 400
    buf.save(tmp_path, 0)
    import_dopamine(tmp_path, tmp_path / "s.zarr")
    export_dopamine(tmp_path / "s.zarr", tmp_path / "out", capacity=450)
    for name in ("$store$_observation", "$store$_action", "$store$_reward", "$store$_terminal",
                 "$store$_sid", "add_count", "invalid_range"):
        raw = gzip.decompress((tmp_path / "out" / f"{name}_ckpt.0.gz").read_bytes())
        arr = np.load(io.BytesIO(raw))
        ref = io.BytesIO()
        np.save(ref, arr, allow_pickle=False)
        assert raw == ref.getvalue(), name
        if name.startswith("$store$_"):
            assert len(arr) == 450
    # the same rows as Dopamine's own buffer: padding, episodes, terminals, add_count
    ref = OutOfGraphReplayBuffer(SHAPE, K, 450, extra_storage_types=EXTRA)
    ref.load(tmp_path / "out", 0)
    n = int(buf.add_count)
    for name in ("observation", "action", "reward", "terminal", "sid"):
        np.testing.assert_array_equal(ref._store[name][:n], buf._store[name][:n])
    assert int(ref.add_count) == n + K - 1  # + the padding that makes the last terminal usable


def test_export_of_an_env_store(tmp_path):
    """A store written step by step: truncation becomes terminal=1 (as Dopamine's runner
    records max-steps cut-offs), final observations are dropped, one checkpoint per lane."""
    spec = es.Spec.create(obs=es.Field(SHAPE, np.uint8, stack=K, padding="zero"),
                          action=es.Field((), np.int64, low=0, high=5),
                          extras={"sid": es.Field((), np.int64)})
    rng = np.random.default_rng(6)
    with es.create(tmp_path / "env.zarr", spec, capacity=4096, lanes=2) as store:
        sid = 1
        for lane in range(2):
            for ep in range(6):
                n = int(rng.integers(2, 30))
                obs = rng.integers(1, 256, SHAPE, dtype=np.uint8)
                for t in range(n):
                    end = t == n - 1 and ep < 5  # the last episode stays open
                    nxt = rng.integers(1, 256, SHAPE, dtype=np.uint8)
                    store.add(obs, int(rng.integers(6)), float(rng.normal()), nxt,
                              end and ep % 2 == 0, end and ep % 2 == 1, lane=lane, sid=sid)
                    obs = nxt  # the next step starts where this one ended
                    sid += 1
    out = export_dopamine(tmp_path / "env.zarr", tmp_path / "ck")
    assert find_suffixes(tmp_path / "ck") == [0, 1] and out.episodes == 10
    env = es.open(tmp_path / "env.zarr")
    by_sid = store_rows_by_sid(env)
    seen = 0
    for suffix in (0, 1):
        ref = OutOfGraphReplayBuffer(SHAPE, K, 10, extra_storage_types=EXTRA)
        ref.load(tmp_path / "ck", suffix)
        ref._replay_capacity = len(ref._store["observation"])
        for i in range(ref._replay_capacity):
            if not ref.is_valid_transition(i):
                continue
            seen += 1
            row = by_sid[int(ref._store["sid"][i])]
            tr = env.transitions(np.array([row]))
            state, action, reward, nxt, terminal = ref.sample_transition(i)
            np.testing.assert_array_equal(np.moveaxis(state, -1, 0), tr["obs"][0])
            assert (action, np.float32(reward)) == (tr["action"][0], tr["reward"][0])
            assert terminal == int(tr["terminated"][0] or tr["truncated"][0])
            if not terminal:
                np.testing.assert_array_equal(np.moveaxis(nxt, -1, 0), tr["next_obs"][0])
    assert seen == len(by_sid)


# -- bad files ---------------------------------------------------------------------------
@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    ref_buffer(capacity=300, episodes=12, seed=7).save(d, 0)
    return d


def test_missing_sibling_names_the_file(ckpt, tmp_path):
    (ckpt / "add_count_ckpt.0.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"add_count_ckpt\.0\.gz"):
        import_dopamine(ckpt, tmp_path / "s.zarr")
    assert not (tmp_path / "s.zarr").exists()


def test_truncated_gzip_names_the_file(ckpt, tmp_path):
    p = ckpt / "$store$_observation_ckpt.0.gz"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(DatasetFormatError, match=r"observation_ckpt\.0\.gz.*(truncated|ends)"):
        import_dopamine(ckpt, tmp_path / "s.zarr")


def test_corrupt_gzip_names_the_file(ckpt, tmp_path):
    p = ckpt / "$store$_reward_ckpt.0.gz"
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(DatasetFormatError, match=r"reward_ckpt\.0\.gz"):
        import_dopamine(ckpt, tmp_path / "s.zarr")


def test_wrong_shape_names_the_file(ckpt, tmp_path):
    with gzip.open(ckpt / "$store$_action_ckpt.0.gz", "wb") as f:
        np.save(f, np.zeros((300, 2), np.int32))
    with pytest.raises(DatasetFormatError, match=r"action_ckpt\.0\.gz.*expected shape \(300,\)"):
        import_dopamine(ckpt, tmp_path / "s.zarr")
    with gzip.open(ckpt / "$store$_action_ckpt.0.gz", "wb") as f:
        np.save(f, np.zeros(299, np.int32))
    with pytest.raises(DatasetFormatError, match=r"action_ckpt\.0\.gz.*300 rows"):
        import_dopamine(ckpt, tmp_path / "s.zarr")


def test_wrong_stack_size_is_explained(ckpt, tmp_path):
    with pytest.raises(DatasetFormatError, match=r"invalid_range.*stack_size=2"):
        import_dopamine(ckpt, tmp_path / "s.zarr", stack=2)


def test_not_gzip(ckpt, tmp_path):
    p = ckpt / "$store$_terminal_ckpt.0.gz"
    arr = np.load(gzip.open(p))
    with open(p, "wb") as f:
        np.save(f, arr)  # plain .npy, not gzip'd
    with pytest.raises(DatasetFormatError, match=r"terminal_ckpt\.0\.gz: not valid gzip"):
        inspect_checkpoint(ckpt, 0)


# -- memory bound --------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import json, resource, sys
    from expstore.datasets import import_dopamine
    s = import_dopamine(sys.argv[1], sys.argv[2], codec={"name": "blosc", "cname": "lz4",
                        "clevel": 1})
    print(json.dumps({"steps": s.steps, "episodes": s.episodes, "seconds": s.seconds,
                      "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""")


def test_streamed_import_memory_is_bounded(tmp_path):
    """200k frames (1.4 GB inflated) import in a child process with peak RSS < 500 MB."""
    d = tmp_path / "big"
    d.mkdir()
    cap = write_repeated_checkpoint(d, 0, repeats=100)
    assert cap >= 200_000
    raw = cap * 84 * 84
    # started through sh: a child forked straight from pytest inherits pytest's RSS
    # high-water mark in ru_maxrss (Linux keeps it across exec)
    res = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", sys.executable, "-c", CHILD,
                          str(d), str(tmp_path / "s.zarr")],
                         capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parent.parent)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["steps"] == 100 * 1997 and out["episodes"] == 100
    assert out["maxrss_mb"] < 500, out
    assert out["maxrss_mb"] * 2**20 < raw / 2.5
    store = es.open(tmp_path / "s.zarr")
    lr = lane_rows(store, 0)
    probe = np.array([0, 1996, 1997 + 5, len(lr.rows) - 2])
    frames = pong_frames(1997, 0)
    got = store.read("obs", lr.rows[probe], lr.steps[probe])
    np.testing.assert_array_equal(got[0], frames[0])
    np.testing.assert_array_equal(got[1], frames[1996])
    np.testing.assert_array_equal(got[2], frames[4])  # episode 2 starts after a final row
    assert os.path.getsize(d / "$store$_observation_ckpt.0.gz") < raw / 20


def test_export_into_a_smaller_ring_keeps_the_newest_rows(tmp_path):
    """``capacity`` below the rows to write: the file wraps like Dopamine's ring (oldest
    rows overwritten, ``add_count > capacity``) and imports back as such."""
    buf = ref_buffer(capacity=2000, episodes=30, seed=8)
    buf.save(tmp_path, 0)
    import_dopamine(tmp_path, tmp_path / "s1.zarr")
    out = export_dopamine(tmp_path / "s1.zarr", tmp_path / "small", capacity=150)
    ref = OutOfGraphReplayBuffer(SHAPE, K, 150, extra_storage_types=EXTRA)
    ref.load(tmp_path / "small", 0)
    assert int(ref.add_count) > 150 and out.rows == 150
    import_dopamine(tmp_path / "small", tmp_path / "s2.zarr")
    s1, s2 = es.open(tmp_path / "s1.zarr"), es.open(tmp_path / "s2.zarr")
    r1, r2 = lane_rows(s1, 0), lane_rows(s2, 0)
    sid1 = s1.read("sid", r1.rows, r1.steps)
    sid2 = s2.read("sid", r2.rows, r2.steps)
    assert len(r2.rows) < 160
    tail = sid1[-len(sid2):]
    real = sid2 > 0  # the rows kept are the newest of the store (final rows hold sid 0)
    np.testing.assert_array_equal(sid2[real], tail[tail > 0][-int(real.sum()):])
    by_sid = store_rows_by_sid(s2)
    for i in range(150):
        if ref.is_valid_transition(i):
            assert_same_transition(ref, i, s2, by_sid[int(ref._store["sid"][i])])
