"""The core store against a plain reference: rows, episodes, lanes, wrap-around, reopen."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import expstore as es
from expstore.rows import FLAG_BAD, FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED
from expstore.storage.format import Layout


def frame(step_value: int, shape=(12, 10)) -> np.ndarray:
    """A deterministic frame that differs per value (so mixing frames is detectable)."""
    a = np.full(shape, step_value % 251, np.uint8)
    a[0, 0] = step_value // 251 % 251
    return a


def image_spec(stack: int | None = 4, padding: str = "reset") -> es.Spec:
    return es.Spec.create(
        obs=es.Field((12, 10), np.uint8, stack=stack, padding=padding, chunk_rows=1),
        action=es.Field((), np.int64, low=0, high=5),
        extras={"logp": es.Field((), np.float32)},
    )


class Reference:
    """Plain-Python model of one lane: the rows the store should hold, in order."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, obs, action, reward, next_obs, term, trunc, logp):
        first = not self.rows or bool(self.rows[-1]["flags"] & FLAG_LAST)
        pos = 0 if first else self.rows[-1]["ep"] + 1
        fl = (FLAG_FIRST if first else 0) | (FLAG_TERMINATED if term else 0) | (
            FLAG_TRUNCATED if trunc else 0)
        self.rows.append(dict(obs=obs, action=action, reward=reward, term=term, trunc=trunc,
                              logp=logp, flags=fl, ep=pos))
        if term or trunc:
            self.rows.append(dict(obs=next_obs, action=0, reward=0.0, term=False, trunc=False,
                                  logp=0.0, flags=FLAG_LAST, ep=pos + 1))


def write_episodes(store, ref, rng, n_steps, lane=0, start_value=0, p_end=0.05):
    v = start_value
    obs = frame(v)
    for _ in range(n_steps):
        v += 1
        nxt = frame(v)
        end = rng.random() < p_end
        term = bool(end and rng.random() < 0.5)
        trunc = bool(end and not term)
        a = int(rng.integers(0, 6))
        r = float(rng.normal())
        lp = float(rng.normal())
        store.add(obs, a, r, nxt, term, trunc, lane=lane, logp=lp)
        ref.add(obs, a, np.float32(r), nxt, term, trunc, np.float32(lp))
        if end:
            v += 1000
            nxt = frame(v)
        obs = nxt
    return v


def check_against(store, ref, lane=0):
    """Every intact row of the lane equals the reference row of the same step."""
    idx = store.index
    count, lo = int(idx.count[lane]), int(idx.valid_from[lane])
    assert count == len(ref.rows)
    steps = np.arange(lo, count)
    rows = idx.lane_rows(lane, steps)
    obs = store.read("obs", rows)
    act = store.read("action", rows)
    rew = store.read("reward", rows)
    lp = store.read("logp", rows)
    for i, s in enumerate(steps):
        want = ref.rows[s]
        assert np.array_equal(obs[i], want["obs"]), f"obs differs at step {s}"
        assert act[i] == want["action"] and rew[i] == want["reward"] and lp[i] == want["logp"]
        assert idx.flags[rows[i]] == want["flags"], f"flags differ at step {s}"
        assert idx.episode_step[rows[i]] == want["ep"]


def test_rows_match_reference_with_wraparound_and_reopen(tmp_path):
    rng = np.random.default_rng(1)
    url = tmp_path / "s.zarr"
    store = es.create(url, image_spec(), capacity=64, shard_rows=16)
    ref = Reference()
    write_episodes(store, ref, rng, 150)  # wraps the 64-row ring more than twice
    check_against(store, ref)  # staged rows are read from RAM, the rest from shards
    assert len(store) <= 64
    store.flush()
    again = es.open(url)
    check_against(again, ref)
    assert again.episodes_written == store.episodes_written == sum(
        1 for r in ref.rows if r["flags"] & FLAG_LAST)


def test_valid_from_excludes_the_shard_being_rewritten(tmp_path):
    store = es.create(tmp_path / "s.zarr", image_spec(), capacity=32, shard_rows=8)
    ref = Reference()
    write_episodes(store, ref, np.random.default_rng(0), 35, p_end=0.0)
    # 35 rows: the writer is 3 rows into shard 0's second lap, so that shard's old rows are gone
    assert int(store.index.valid_from[0]) == 35 - 3 - 32 + 8
    store.flush()
    assert int(es.open(tmp_path / "s.zarr").index.valid_from[0]) == 8


def test_sample_never_mixes_episodes_and_pads_with_first_frame(tmp_path):
    rng = np.random.default_rng(2)
    store = es.create(tmp_path / "s.zarr", image_spec(stack=4), capacity=128, shard_rows=16)
    ref = Reference()
    write_episodes(store, ref, rng, 400, p_end=0.15)
    batch = store.sample(256)
    steps = batch["step_id"]
    for i, s in enumerate(steps):
        s = int(s)
        assert not ref.rows[s]["flags"] & FLAG_LAST
        ep = ref.rows[s]["ep"]
        want = [ref.rows[s - min(j, ep)]["obs"] for j in (3, 2, 1, 0)]
        assert np.array_equal(batch["obs"][i], np.stack(want))
        ep1 = ref.rows[s + 1]["ep"]
        want = [ref.rows[s + 1 - min(j, ep1)]["obs"] for j in (3, 2, 1, 0)]
        assert np.array_equal(batch["next_obs"][i], np.stack(want))
        assert batch["terminated"][i] == ref.rows[s]["term"]
        assert batch["truncated"][i] == ref.rows[s]["trunc"]
        assert batch["reward"][i] == ref.rows[s]["reward"]
    assert batch["obs"].shape == (256, 4, 12, 10) and batch["obs"].dtype == np.uint8
    assert np.all(batch["weight"] == 1)


def test_zero_padding(tmp_path):
    store = es.create(tmp_path / "s.zarr", image_spec(stack=3, padding="zero"), capacity=32,
                      shard_rows=8)
    for t in range(5):
        store.add(frame(t + 1), 0, 0.0, frame(t + 2), False, False, logp=0.0)
    b = store.transitions(np.array([0, 1, 2]))
    assert np.array_equal(b["obs"][0, :2], np.zeros((2, 12, 10), np.uint8))
    assert np.array_equal(b["obs"][0, 2], frame(1))
    assert np.array_equal(b["obs"][1, 1:], np.stack([frame(1), frame(2)]))
    assert np.array_equal(b["obs"][2], np.stack([frame(1), frame(2), frame(3)]))


def test_stacked_obs_are_accepted_and_only_newest_frame_stored(tmp_path):
    store = es.create(tmp_path / "s.zarr", image_spec(stack=4), capacity=32, shard_rows=8)
    stack = np.stack([frame(1), frame(2), frame(3), frame(4)])
    store.add(stack, 1, 1.0, np.stack([frame(2), frame(3), frame(4), frame(5)]), True, False,
              logp=0.0)
    assert np.array_equal(store.read("obs", np.array([0, 1])), np.stack([frame(4), frame(5)]))


def test_extend_equals_repeated_add(tmp_path):
    rng = np.random.default_rng(3)
    T = 90
    obs = np.stack([frame(i) for i in range(T)])
    nxt = np.stack([frame(i + 1) for i in range(T)])
    act = rng.integers(0, 6, T)
    rew = rng.normal(size=T).astype(np.float32)
    term = rng.random(T) < 0.05
    trunc = ~term & (rng.random(T) < 0.05)
    lp = rng.normal(size=T).astype(np.float32)
    a = es.create(tmp_path / "a.zarr", image_spec(), capacity=64, shard_rows=16)
    b = es.create(tmp_path / "b.zarr", image_spec(), capacity=64, shard_rows=16)
    a.extend(dict(obs=obs, action=act, reward=rew, next_obs=nxt, terminated=term,
                  truncated=trunc, logp=lp))
    for t in range(T):
        b.add(obs[t], act[t], rew[t], nxt[t], term[t], trunc[t], logp=lp[t])
    a.flush()
    b.flush()
    za, zb = zarr.open_group(tmp_path / "a.zarr", mode="r"), zarr.open_group(tmp_path / "b.zarr",
                                                                             mode="r")
    for name in ("obs", "action", "reward", "terminated", "truncated", "logp", "_flags",
                 "_episode_step", "_step_id"):
        assert np.array_equal(za[name][:], zb[name][:]), name


def test_plain_zarr_reads_every_field_exactly(tmp_path):
    rng = np.random.default_rng(4)
    url = tmp_path / "s.zarr"
    store = es.create(url, image_spec(), capacity=64, shard_rows=16)
    ref = Reference()
    write_episodes(store, ref, rng, 40)  # 40+ rows: two full shards and a partial one
    store.flush()
    z = zarr.open_group(url, mode="r")
    n = len(ref.rows)
    assert np.array_equal(z["obs"][:n], np.stack([r["obs"] for r in ref.rows]))
    assert np.array_equal(z["action"][:n], np.array([r["action"] for r in ref.rows]))
    assert np.array_equal(z["reward"][:n], np.array([r["reward"] for r in ref.rows],
                                                    np.float32))
    assert np.array_equal(z["logp"][:n], np.array([r["logp"] for r in ref.rows], np.float32))
    assert np.array_equal(z["terminated"][:n], np.array([r["term"] for r in ref.rows]))
    assert np.array_equal(z["_step_id"][:n], np.arange(n))
    assert np.all(z["_step_id"][n:] == -1)  # unwritten rows read as the fill value
    assert z.attrs["expstore"]["capacity"] == 64


def test_lanes_get_one_step_each_and_stay_apart(tmp_path):
    store = es.create(tmp_path / "s.zarr", image_spec(), capacity=128, lanes=4, shard_rows=8)
    refs = [Reference() for _ in range(4)]
    for t in range(50):
        obs = np.stack([frame(1000 * i + t) for i in range(4)])
        nxt = np.stack([frame(1000 * i + t + 1) for i in range(4)])
        term = np.array([t % 7 == 6, False, t % 11 == 10, False])
        store.add(obs, np.arange(4) % 6, np.full(4, 0.5), nxt, term, np.zeros(4, bool),
                  logp=np.zeros(4))
        for i in range(4):
            refs[i].add(obs[i], i % 6, np.float32(0.5), nxt[i], term[i], False, np.float32(0))
    store.flush()
    again = es.open(tmp_path / "s.zarr")
    for i in range(4):
        check_against(again, refs[i], lane=i)
    b = again.sample(128)
    lanes = b["index"] // again.layout.lane_capacity
    assert set(lanes.tolist()) == {0, 1, 2, 3}
    # every stacked frame of a sample (and of its next obs) comes from the sample's own lane
    for key in ("obs", "next_obs"):
        v = b[key][:, :, 0, 0].astype(np.int64) * 251 + b[key][:, :, 1, 1]
        assert np.all(v // 1000 == lanes[:, None]), key


def test_reopen_r_plus_continues_and_interrupted_episode_is_not_sampled(tmp_path):
    url = tmp_path / "s.zarr"
    store = es.create(url, image_spec(stack=None), capacity=64, shard_rows=16)
    for t in range(10):
        store.add(frame(t), 0, 0.0, frame(t + 1), False, False, logp=0.0)
    store.close()  # episode left open: 10 rows, the last has no next row
    store = es.open(url, mode="r+")
    assert len(store) == 10
    for t in range(5):
        store.add(frame(100 + t), 1, 1.0, frame(101 + t), t == 4, False, logp=0.0)
    store.flush()
    s = es.open(url)
    idx = s.index
    assert idx.flags[10] & FLAG_FIRST
    assert s.index.valid(np.arange(16), 0, 1).tolist() == [True] * 9 + [False] + [True] * 5 + [
        False]
    b = s.sample(200)
    assert 9 not in b["index"]


def test_open_errors_name_the_problem(tmp_path):
    url = tmp_path / "s.zarr"
    es.create(url, image_spec(), capacity=32, shard_rows=8).close()
    with pytest.raises(FileExistsError, match="overwrite"):
        es.create(url, image_spec(), capacity=32, shard_rows=8)
    other = es.Spec.create(obs=es.Field((3,), np.float32), action=es.Field((), np.int64))
    with pytest.raises(es.SpecError, match="obs"):
        es.open(url, spec=other)
    with pytest.raises(es.ReadOnlyError):
        es.open(url).add(frame(0), 0, 0.0, frame(1), False, False, logp=0.0)
    with pytest.raises(es.StoreNotFoundError, match="no store at .*nothing.zarr: the path"):
        es.open(tmp_path / "nothing.zarr")
    (url / "_state" / "lane_0.json").write_text("{not json")
    with pytest.raises(es.StoreCorruptError, match="lane_0.json"):
        es.open(url)
    (url / "_state" / "lane_0.json").unlink()
    with pytest.raises(es.StoreCorruptError, match="lane_0.json.*missing"):
        es.open(url)


def test_corrupt_shard_is_named(tmp_path):
    url = tmp_path / "s.zarr"
    store = es.create(url, image_spec(), capacity=32, shard_rows=8)
    for t in range(12):
        store.add(frame(t), 0, 0.0, frame(t + 1), False, False, logp=0.0)
    store.close()
    shard = url / "_flags" / "c" / "0"
    data = bytearray(shard.read_bytes())
    data[3] ^= 0xFF  # inside the shard index: fails its crc32c
    shard.write_bytes(bytes(data))
    with es.open(url) as s:  # the index rebuilds the flags from the rows (issue 25)
        with pytest.raises(es.StoreCorruptError, match=r"_flags/c/0.*crc32c"):
            s.read("_flags", np.arange(8))


def test_validation_names_field_and_stores_nothing(tmp_path):
    store = es.create(tmp_path / "s.zarr", image_spec(), capacity=32, shard_rows=8)
    store.add(frame(0), 1, 0.0, frame(1), False, False, logp=0.0)
    cases = [
        (dict(action=6), "action.*above high"),
        (dict(action=-1), "action.*below low"),
        (dict(obs=np.zeros((5, 5), np.uint8)), r"obs: expected shape \(12, 10\)"),
        (dict(obs=np.zeros((12, 10), np.float32) + 0.5), "obs: dtype float32 cannot be cast"),
        (dict(reward=float("nan")), "reward: expected finite"),
        (dict(logp=None), "logp: missing value"),
    ]
    for change, pattern in cases:
        args = dict(obs=frame(1), action=1, reward=0.0, next_obs=frame(2), terminated=False,
                    truncated=False, logp=0.0)
        args.update(change)
        with pytest.raises(es.ValidationError, match=pattern):
            store.add(**args)
    with pytest.raises(es.ValidationError, match="unknown field"):
        store.add(frame(1), 1, 0.0, frame(2), False, False, logp=0.0, bogus=1)
    with pytest.raises(es.ValidationError, match="next_obs: required"):
        store.extend(dict(obs=frame(1)[None], action=[1], reward=[0.0], terminated=[True],
                          truncated=[False], logp=[0.0]))
    assert len(store) == 1 and int(store.index.count[0]) == 1


def test_capacity_must_fit_shards():
    spec = image_spec()
    with pytest.raises(es.SpecError, match="capacity"):
        Layout(spec, 100, 1, 16)
    assert es.round_capacity(100, lanes=2, shard_rows=16) == 128


def test_create_rounds_capacity_to_whole_shards(tmp_path):
    store = es.create(tmp_path / "s.zarr", image_spec(), capacity=100_000)
    assert store.layout.shard_rows == 2048  # auto: a power of two near 1/32 of a lane
    assert store.capacity == 49 * 2048  # the smallest whole number of shards >= 100_000
    assert es.open(tmp_path / "s.zarr").capacity == 49 * 2048


def test_a_vector_steps_quick_check_gives_what_the_general_check_gives():
    from expstore.step_check import LanesCheck
    from expstore.validate import validate_steps

    spec = es.Spec.create(obs=es.Field((12, 10), np.uint8, stack=4),
                          action=es.Field((), np.int64, low=0, high=5))
    rng = np.random.default_rng(0)
    stacks = rng.integers(0, 255, (3, 4, 12, 10), dtype=np.uint8)
    step = [stacks, np.array([0, 5, 2]), np.array([0.5, -1.0, 2.0]),  # float64 rewards
            np.roll(stacks, 1, axis=1), np.array([True, False, False]), np.zeros(3, bool)]
    quick = LanesCheck(spec, 3)
    got = quick.check(*step, {})
    want = validate_steps(spec, *step, {}, (3,))
    assert got is not None and sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
    # anything it does not take as it is goes to the general check (which casts or refuses)
    for i, bad in [(1, np.array([0, 6, 2])), (1, np.array([0, 1, 2], np.int32)),
                   (2, np.array([0.5, np.nan, 1.0])), (2, [0.5, 1.0, 2.0]),
                   (0, stacks[:2]), (3, None)]:
        assert quick.check(*step[:i], bad, *step[i + 1:], {}) is None
    assert quick.check(*step, {"logp": np.zeros(3)}) is None
    store_spec = image_spec()  # user fields: always the general check
    assert LanesCheck(store_spec, 3).check(*step, {}) is None


def test_vector_add_refuses_what_one_add_refuses(tmp_path):
    store = es.create(tmp_path / "s.zarr", image_spec(), capacity=128, lanes=4, shard_rows=8)
    obs = np.stack([frame(i) for i in range(4)])
    ok = dict(obs=obs, action=np.arange(4), reward=np.zeros(4), next_obs=obs,
              terminated=np.zeros(4, bool), truncated=np.zeros(4, bool), logp=np.zeros(4))
    with pytest.raises(es.ValidationError, match=r"^action: value 6 at \(2,\) is above high"):
        store.add(**{**ok, "action": np.array([0, 1, 6, 2])})
    with pytest.raises(es.ValidationError, match=r"^reward: expected finite values"):
        store.add(**{**ok, "reward": np.array([0.0, np.inf, 0.0, 0.0])})
    assert store.index.count.tolist() == [0, 0, 0, 0]
    store.add(**ok)
    assert store.index.count.tolist() == [1, 1, 1, 1]
    store.close()


def test_vector_add_gives_a_priority_sampler_what_one_add_per_lane_gives(tmp_path):
    vec, one = (es.create(tmp_path / f"{k}.zarr", image_spec(), capacity=128, lanes=4,
                          shard_rows=8) for k in ("vec", "one"))
    samplers = [es.PrioritizedSampler(s, alpha=1.0, eps=0.0, persist=False, seed=0)
                for s in (vec, one)]
    for t in range(45):
        obs = np.stack([frame(1000 * i + t) for i in range(4)])
        nxt = np.stack([frame(1000 * i + t + 1) for i in range(4)])
        term = np.array([t % 7 == 6, False, t % 5 == 4, t % 9 == 8])
        step = (obs, np.arange(4) % 6, np.full(4, 0.5), nxt, term, np.zeros(4, bool))
        vec.add(*step, logp=np.zeros(4))
        for i in range(4):
            one.add(*(v[i] for v in step), lane=i, logp=0.0)
        if t == 20:  # the same new priorities in both (rows that have a next row)
            for s in samplers:
                rows = s.priorities.live_rows(2)[0][:5]
                s.update_priorities(rows, np.arange(1.0, 6.0), s.index.steps(rows))
    cap = vec.layout.capacity
    got, want = (s.priority(np.arange(cap)) for s in samplers)
    assert np.count_nonzero(want) > 80 and np.array_equal(got, want)
    vec.close()
    one.close()


def _metadata_store(path, rows=1 << 17, episode_len=100):
    spec = es.Spec.create(obs=es.Field((), np.float32), action=es.Field((), np.int64))
    store = es.create(path, spec, capacity=rows, shard_rows=4096)
    t = np.arange(rows - rows // episode_len)  # steps; each episode adds a final row
    ends = (t + 1) % (episode_len - 1) == 0
    store.extend(dict(obs=t.astype(np.float32), action=t % 5, reward=np.zeros(len(t)),
                      terminated=ends, truncated=np.zeros(len(t), bool),
                      next_obs=(t + 1).astype(np.float32)))
    store.close()
    return rows


def test_open_streams_the_index_in_blocks(tmp_path, monkeypatch):
    """Opening indexes a lane block by block: what the load allocates beyond the index
    (5 B/row) stays a few MB: one pass over all rows took ~64 B/row."""
    import tracemalloc

    import expstore.index_loader as loader_mod

    rows = _metadata_store(tmp_path / "m.zarr", rows=1 << 18)
    full = es.open(tmp_path / "m.zarr")
    monkeypatch.setattr(loader_mod, "LOAD_BLOCK_ROWS", 8192)
    tracemalloc.start()
    try:
        store = es.open(tmp_path / "m.zarr")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(store) == len(full) > rows * 0.99
    assert np.array_equal(store.index.flags, full.index.flags)
    assert np.array_equal(store.index.episode_step, full.index.episode_step)
    assert peak < 10 * rows, f"open peaked at {peak / rows:.1f} B/row"
    store.close()
    full.close()


def test_blockwise_open_marks_lost_rows_like_one_pass(tmp_path, monkeypatch):
    import expstore.index_loader as loader_mod
    from expstore.storage import backend_for
    from expstore.storage.format import Quarantine, write_quarantine

    url = tmp_path / "m.zarr"
    rows = _metadata_store(url, rows=1 << 14)
    q = Quarantine()
    q.add(0, 5000, 5010)  # inside a block
    q.add(0, 8190, 8200)  # across a block boundary
    write_quarantine(backend_for(str(url)), q)
    one = es.open(url)
    monkeypatch.setattr(loader_mod, "LOAD_BLOCK_ROWS", 4096)
    blocks = es.open(url)
    assert np.array_equal(one.index.flags, blocks.index.flags)
    assert np.array_equal(one.index.episode_step, blocks.index.episode_step)
    lost = np.flatnonzero(blocks.index.flags & FLAG_BAD)
    assert set(lost.tolist()) == set(range(5000, 5010)) | set(range(8190, 8200))
    assert rows == blocks.capacity
    one.close()
    blocks.close()
