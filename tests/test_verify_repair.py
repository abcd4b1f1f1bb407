"""``verify`` finds every corrupted shard; ``repair`` quarantines the rows and training goes on.

Stores are written by the crash harness's writer (deterministic bytes), then bytes are
flipped on disk. Every chunk carries a crc32c and every shard header and index one too, so
a flipped bit anywhere in a shard is found, named, and mapped to the lane steps it holds.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib

import numpy as np
import pytest

import expstore as es
from expstore import cli, index_loader
from expstore import verify as verify_mod
from expstore.errors import StoreCorruptError
from expstore.repair import repair_store
from expstore.rows import FLAG_BAD
from expstore.storage import backend_for
from expstore.storage.format import Quarantine, read_quarantine, write_quarantine
from expstore.testing import crash, data, scratch_dir
from expstore.verify import verify_store


@pytest.fixture
def written(tmp_path):
    """A closed 3-lane store (wrapped) written by the crash writer, and its log."""
    with scratch_dir(str(tmp_path)) as d:
        url, log = os.path.join(d, "s.zarr"), os.path.join(d, "log")
        crash.create_store(url)
        crash.writer(url, log, 0, seed=11, ops=160)
        yield url, log


def _shard_files(url: str) -> list[str]:
    out = []
    for folder, _, files in os.walk(url):
        rel = os.path.relpath(folder, url)
        if "/c" in "/" + rel.replace(os.sep, "/") + "/" and rel.split(os.sep)[0] != "_state":
            out += [os.path.join(folder, f) for f in files if not f.startswith(".")]
    return sorted(out)


def _flip(path: str, pos: int, bit: int = 0) -> tuple[int, int]:
    with open(path, "r+b") as f:
        f.seek(pos)
        old = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([old ^ (1 << bit)]))
    return pos, old


def _restore(path: str, pos: int, old: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(bytes([old]))


def _key(url: str, path: str) -> str:
    return os.path.relpath(path, url).replace(os.sep, "/")


def test_verify_finds_every_flipped_bit(written):
    url, _ = written
    assert verify_store(url).ok
    files = _shard_files(url)
    rng = np.random.default_rng(5)
    found = 0
    trials = 80
    for _ in range(trials):
        path = files[int(rng.integers(len(files)))]
        size = os.path.getsize(path)
        pos, old = _flip(path, int(rng.integers(size)), int(rng.integers(8)))
        try:
            rep = verify_store(url)
            assert not rep.ok, f"flipped bit at byte {pos} of {_key(url, path)} not found"
            assert any(_key(url, path) in p for p in rep.problems), rep.problems
            # a corrupted shard maps to lost rows, or to a metadata chunk rebuilt from them
            assert rep.lost or rep.rebuildable, "a corrupted shard must map to lost rows"
            found += 1
        finally:
            _restore(path, pos, old)
    assert found == trials and verify_store(url).ok


def test_verify_lists_every_corrupted_shard_at_once(written):
    url, _ = written
    files = _shard_files(url)
    rng = np.random.default_rng(6)
    picked = [files[i] for i in rng.choice(len(files), 8, replace=False)]
    for path in picked:
        _flip(path, int(rng.integers(os.path.getsize(path))))
    rep = verify_store(url)
    named = {_key(url, p) for p in picked if any(_key(url, p) in q for q in rep.problems)}
    assert named == {_key(url, p) for p in picked}
    assert cli.main(["verify", "-q", url]) == 1


def _corrupt_three(url: str) -> dict[str, str]:
    """An image chunk (lane 0), a metadata shard (lane 1) and the header of lane 2's
    newest, partly filled shard."""
    store = es.open(url)
    lay, idx = store.layout, store.index
    newest = int(idx.count[2]) - 1
    store.close()
    spl = lay.shards_per_lane
    keys = {"image": lay.shard_key("obs.pixels", 1), "meta": lay.shard_key("_flags", spl + 1),
            "header": lay.shard_key("reward", 2 * spl + (newest % lay.lane_capacity)
                                    // lay.shard_rows)}
    for what, key in keys.items():
        path = os.path.join(url, key)
        n_chunks = lay.chunks_per_shard(key.split("/")[0])
        pos = {"image": os.path.getsize(path) - 50, "meta": os.path.getsize(path) - 2,
               "header": 16 * n_chunks + 4 + 10}[what]
        _flip(path, pos, 3)
    return keys


def test_repair_quarantines_bad_rows_and_sampling_goes_on(written):
    url, log = written
    keys = _corrupt_three(url)
    found = verify_store(url)
    assert {k for k in keys.values() if any(k in p for p in found.problems)} == set(keys.values())
    es.open(url).close()  # the bad _flags chunk is derived from its rows (test_damage.py)
    assert cli.main(["repair", "-q", "--dry-run", url]) == 0
    assert read_quarantine(backend_for(url)).lanes == {}  # dry run
    rep = repair_store(url)
    assert rep.ok and rep.newly_lost == found.lost
    assert rep.lost_rows == sum(b - a for r in found.lost.values() for a, b in r) > 0
    assert set(rep.newly_lost) == {0, 2}  # lane 1's _flags chunk was rewritten instead
    assert list(rep.rewritten) == [keys["meta"]]
    after = verify_store(url)
    assert after.ok and after.quarantined == rep.lost_rows
    assert cli.main(["verify", "-q", url]) == 0

    store = es.open(url)
    bad_rows = np.flatnonzero(store.index.flags & FLAG_BAD)
    assert len(bad_rows) == rep.lost_rows
    sessions = crash.Log.read(log, 3).session_of
    uniform = es.UniformSampler(store, seed=0, n_step=3)
    prio = es.PrioritizedSampler(store, seed=1, persist=False)
    checked = 0
    for _ in range(60):
        for sampler in (uniform, prio):
            plan = sampler.plan(64)  # (with n_step 3, the 4-frame next stack covers t..t+3)
            used = np.concatenate([plan.obs_rows.ravel(), plan.next_rows.ravel()])
            steps = np.concatenate([plan.obs_steps.ravel(), plan.next_steps.ravel()])
            assert not (store.index.flags[used] & FLAG_BAD).any()
            lanes = used // store.layout.lane_capacity
            for lane, ranges in rep.newly_lost.items():
                for a, b in ranges:
                    assert not ((lanes == lane) & (steps >= a) & (steps < b)).any()
        checked += data.check_batch(store.sample(64), store.index, sessions)
    store.close()
    assert checked == 60 * 64
    # the writer takes over again (its newest shard had a corrupt header) and keeps going
    crash.writer(url, log, 1, seed=12, ops=120)
    res = crash.check_store(url, log)
    assert res.rows > 0 and verify_store(url).ok


def test_a_live_reader_picks_up_the_quarantine_on_refresh(written, monkeypatch):
    url, log = written
    reader = es.open(url)
    lay = reader.layout
    path = os.path.join(url, lay.shard_key("obs.pixels", 2))  # lane 0: rows it may sample
    _flip(path, os.path.getsize(path) - 30)
    rep = repair_store(url)
    assert rep.lost_rows == 1
    monkeypatch.setattr(index_loader, "QUARANTINE_RELOAD", 0.0)
    reader.refresh()
    assert np.count_nonzero(reader.index.flags & FLAG_BAD) == 1
    sessions = crash.Log.read(log, 3).session_of
    for _ in range(100):  # would raise StoreCorruptError on the corrupt frame
        data.check_batch(reader.sample(64), reader.index, sessions)
    reader.close()


def test_repair_rebuilds_a_missing_lane_state(written):
    url, log = written
    before = es.open(url)
    count, lo = int(before.index.count[1]), int(before.index.lower_bound()[1])
    before.close()
    os.remove(os.path.join(url, "_state", "lane_1.json"))
    with pytest.raises(StoreCorruptError, match="lane_1.json: lane state file is missing"):
        es.open(url)
    rep = repair_store(url)
    assert rep.ok and set(rep.rebuilt) == {1}
    st = rep.rebuilt[1]
    assert st.count == count and st.valid_from <= lo  # nothing committed was lost
    store = es.open(url)
    log_ = crash.Log.read(log, 3)
    assert data.check_lane(store, 1, log_.session_of, log_.start_counts(1)) == count - \
        int(store.index.lower_bound()[1])
    store.close()


def _newer_state(path: str) -> None:
    body = {"version": 99, "lane": 0, "count": 5, "valid_from": 0, "episodes": 0,
            "generation": 1, "something_new": [1, 2]}
    crc = zlib.crc32(json.dumps(body, sort_keys=True).encode())
    with open(path, "w") as f:
        json.dump({"state": body, "crc32": crc}, f)


def test_repair_leaves_a_newer_state_alone(written):
    url, _ = written
    path = os.path.join(url, "_state", "lane_0.json")
    _newer_state(path)
    with pytest.raises(StoreCorruptError, match="lane_0.json.*newer"):
        es.open(url)
    rep = repair_store(url)
    assert not rep.ok and any("newer" in p for p in rep.remaining)
    assert not rep.rebuilt
    with open(path) as f:
        assert json.load(f)["state"]["version"] == 99  # untouched


def test_lost_rows_split_episodes_for_every_need(tmp_path):
    """Exhaustively: no valid anchor's frame stack or n-step window, and no sequence
    window, touches a quarantined row; rows on both sides of it still serve."""
    with scratch_dir(str(tmp_path)) as d:
        url = os.path.join(d, "s.zarr")
        crash.create_store(url, lanes=1, shard_rows=64, shards_per_lane=4)
        with es.open(url, "r+") as store:
            batch, _ = data.make_steps(0, 0, 200, session=0)
            store.extend(batch)
        q = Quarantine()
        q.add(0, 100, 104)
        write_quarantine(backend_for(url), q)
        store = es.open(url)
        idx = store.index
        rows = np.arange(int(idx.count[0]))
        lost = (rows >= 100) & (rows < 104)
        assert ((idx.flags[rows] & FLAG_BAD) != 0).tolist() == lost.tolist()
        for history, horizon in ((3, 1), (3, 3), (0, 5)):
            ok = idx.valid(rows, history, horizon)
            ends, m = idx.horizon(rows[ok], horizon)
            pos = idx.episode_step[rows[ok]]
            for r, e, p in zip(rows[ok], ends, pos):
                window = np.arange(r - min(p, history), e + 1)
                assert not lost[window].any(), (r, window)
            assert ok[:100].sum() > 50 and ok[104:].sum() > 50
        seq = es.SequenceSampler(store, length=8, burn_in=2, persist=False, seed=0)
        for _ in range(30):
            plan = seq.plan(32)
            B, W = plan.win_rows.shape
            used = np.concatenate([plan.win_rows[plan.mask],
                                   plan.stack_rows.reshape(B, W, -1)[plan.mask].ravel()])
            assert not lost[used].any()
        store.close()


# -- zarr metadata, hints ---------------------------------------------------------------------
def _small_store(tmp_path) -> str:
    url = str(tmp_path / "m.zarr")
    spec = es.Spec.create(obs=es.Field((4, 4), np.uint8, stack=2), action=es.Field((), np.int64))
    with es.create(url, spec, capacity=512) as s:
        for t in range(300):
            s.add(np.full((4, 4), t % 200, np.uint8), t, 1.0, np.full((4, 4), (t + 1) % 200,
                  np.uint8), terminated=t % 50 == 49, truncated=False)
    return url


def _zarr_sees(url: str) -> set[str]:
    import zarr

    return set(zarr.open_group(url, mode="r").array_keys())


@pytest.mark.parametrize("damage", ["delete", "garbage"])
def test_repair_rebuilds_the_group_zarr_json(tmp_path, damage):
    url = _small_store(tmp_path)
    path = os.path.join(url, "zarr.json")
    with open(path, "rb") as f:
        original = f.read()
    with es.open(url) as s:
        want = s.read("obs", np.arange(300))
    if damage == "delete":
        os.remove(path)
    else:
        with open(path, "w") as f:
            f.write('{"zarr_format": 3, "node_type": "gro')
    assert not verify_store(url).ok
    rep = repair_store(url)
    assert rep.ok and "zarr.json" in rep.metadata, rep.summary()
    assert "rebuilt zarr.json" in rep.summary()
    with open(path, "rb") as f:
        assert f.read() == original  # the same bytes create wrote (spec, stack, capacity)
    assert verify_store(url).ok
    with es.open(url) as s:
        assert s.spec.fields["obs"].stack == 2 and (s.read("obs", np.arange(300)) == want).all()
        assert s.sample(8)["obs"].shape == (8, 2, 4, 4)
    assert "obs" in _zarr_sees(url)


def test_verify_checks_plain_zarr_sees_every_array_and_repair_rebuilds_it(tmp_path):
    url = _small_store(tmp_path)
    path = os.path.join(url, "obs", "zarr.json")
    with open(path, "rb") as f:
        original = f.read()
    os.remove(path)
    assert "obs" not in _zarr_sees(url)
    rep = verify_store(url)
    assert not rep.ok and any("obs/zarr.json: missing (plain zarr no longer sees" in p
                              for p in rep.problems)
    assert cli.main(["verify", url, "-q"]) == 1
    dry = repair_store(url, dry_run=True)
    assert "obs/zarr.json" in dry.metadata and not os.path.exists(path)
    assert "would rebuild obs/zarr.json" in dry.summary()
    rep = repair_store(url)
    assert rep.ok and list(rep.metadata) == ["obs/zarr.json"]
    with open(path, "rb") as f:
        assert f.read() == original
    assert "obs" in _zarr_sees(url) and verify_store(url).ok
    # an array whose metadata plain zarr parses but with another shape is found too
    with open(path) as f:
        doc = json.load(f)
    doc["shape"][0] = 4096
    with open(path, "w") as f:
        json.dump(doc, f)
    assert any("differs from the store's layout in shape" in p
               for p in verify_store(url).problems)
    assert repair_store(url).ok and verify_store(url).ok


def test_repair_without_any_layout_copy_says_why(tmp_path):
    url = _small_store(tmp_path)
    for name in os.listdir(url):
        if os.path.exists(os.path.join(url, name, "zarr.json")):
            os.remove(os.path.join(url, name, "zarr.json"))
    os.remove(os.path.join(url, "zarr.json"))
    rep = repair_store(url)
    assert not rep.ok and "no array zarr.json holds a copy" in rep.remaining[0]


def test_corruption_errors_name_verify_and_repair(tmp_path):
    url = _small_store(tmp_path)
    os.remove(os.path.join(url, "_state", "lane_0.json"))
    with pytest.raises(StoreCorruptError, match="lane state file is missing.*expstore verify "
                       ".*expstore repair"):
        es.open(url)
    assert repair_store(url).ok
    shard = next(p for p in _shard_files(url) if os.sep + "obs" + os.sep in p)
    _flip(shard, os.path.getsize(shard) - 3)
    with es.open(url) as s:
        with pytest.raises(StoreCorruptError) as info:
            s.read("obs", np.arange(300))
    root = f"file://{os.path.abspath(url)}"  # the hint names the store itself
    assert f"'expstore verify {root}'" in str(info.value) and "STORE" not in str(info.value)
    assert f"'expstore repair {root}'" in str(info.value) and info.value.url == root
    assert "expstore repair" not in info.value.detail
    assert all("expstore repair" not in p for p in verify_store(url).problems)


# -- training through damage: skip_corrupt ---------------------------------------------------
def _corrupt_store(tmp_path):
    url = str(tmp_path / "c.zarr")
    spec = es.Spec.create(obs=es.Field((8, 8), np.uint8, stack=2, chunk_rows=64),
                          action=es.Field((), np.int64))  # (obs: one chunk per shard)
    with es.create(url, spec, capacity=1024, shard_rows=64) as s:
        for t in range(900):
            s.add(np.full((8, 8), t % 250, np.uint8), t, 1.0,
                  np.full((8, 8), (t + 1) % 250, np.uint8), terminated=t % 100 == 99,
                  truncated=False)
        lay = s.layout
    key = lay.shard_key("obs", 3)  # rows 192..255
    path = os.path.join(url, key)
    raw = bytearray(open(path, "rb").read())
    raw[-40:] = b"\x55" * 40  # the last inner chunks fail their crc32c
    with open(path, "wb") as f:
        f.write(bytes(raw))
    return url, range(192, 256)


@pytest.mark.slow  # ~13 s with workers
@pytest.mark.parametrize("workers", [0, 2])
def test_skip_corrupt_trains_through_a_bad_shard(tmp_path, workers, caplog):
    url, bad_rows = _corrupt_store(tmp_path)
    store = es.open(url)
    with pytest.raises(StoreCorruptError, match="expstore verify"):
        for _ in es.make_loader(store, batch_size=64, num_workers=workers, num_batches=40):
            pass
    caplog.set_level("WARNING", logger="expstore")
    loader = es.make_loader(store, batch_size=64, num_workers=workers, num_batches=40,
                            skip_corrupt=True)
    seen = 0
    for batch in loader:
        obs = batch["obs"].numpy()
        index = batch["index"].numpy()
        assert obs.shape == (64, 2, 8, 8)
        # every delivered sample is intact: its newest frame is its row's value
        np.testing.assert_array_equal(obs[:, -1, 0, 0], (index - index // 101) % 250)
        assert not np.isin(index, bad_rows).any()
        seen += 1
    loader.close()
    assert seen == 40 and loader.stats.corrupt_rows_skipped > 0
    if workers == 0:
        warnings = [r for r in caplog.records if "of obs/c/3" in r.getMessage()]
        assert len(warnings) == 1  # logged once per shard
    store.close()


def test_in_process_sampling_skips_corrupt_shards(tmp_path, caplog):
    url, bad_rows = _corrupt_store(tmp_path)
    store = es.open(url)
    with pytest.raises(StoreCorruptError, match="expstore repair"):
        for _ in range(40):
            store.sample(64)
    caplog.set_level("WARNING", logger="expstore")
    store.skip_corrupt = True
    before = store.num_transitions
    sampler = es.UniformSampler(store)
    for _ in range(40):
        for b in (store.sample(64), sampler.sample(64)):
            assert not np.isin(b["index"], bad_rows).any()
            np.testing.assert_array_equal(b["obs"][:, -1, 0, 0],
                                          (b["index"] - b["index"] // 101) % 250)
    assert store.corrupt_rows_skipped > 0
    assert before - store.num_transitions == 63  # its 64 rows (one a final row) are lost
    assert sum("of obs/c/3" in r.getMessage() for r in caplog.records) == 1
    store.close()


def test_in_process_skip_corrupt_never_draws_a_stack_reaching_the_shard(tmp_path):
    """After the first hit no sample reads the shard again: not its rows, nor the frame
    stack of the row just after it (that row starts a new episode in the index)."""
    url, bad_rows = _corrupt_store(tmp_path)
    store = es.open(url)
    store.skip_corrupt = True
    while not store.corrupt_rows_skipped:
        store.sample(64)
    skipped = store.corrupt_rows_skipped
    for _ in range(100):  # 6,400 draws: the row after the shard (1 in ~840) comes up
        b = store.sample(64)
        assert not np.isin(b["index"], bad_rows).any()
        np.testing.assert_array_equal(b["obs"][:, -1, 0, 0],
                                      (b["index"] - b["index"] // 101) % 250)
    assert store.corrupt_rows_skipped == skipped
    store.close()


def test_a_store_without_its_zarr_json_is_damaged_not_absent(tmp_path):
    """Only a path holding nothing of a store is "no store": one that lost its group
    zarr.json (and even its lane states) is corruption that repair rebuilds."""
    url = _small_store(tmp_path)
    with es.open(url) as s:
        want = s.read("obs", np.arange(300))
    os.remove(os.path.join(url, "zarr.json"))
    with pytest.raises(StoreCorruptError, match="zarr.json: missing .*expstore repair"):
        es.open(url)
    shutil.rmtree(os.path.join(url, "_state"))
    with pytest.raises(StoreCorruptError, match="zarr.json: missing"):
        es.open(url)
    assert not verify_store(url).ok
    rep = repair_store(url)
    assert rep.ok and "zarr.json" in rep.metadata and 0 in rep.rebuilt, rep.summary()
    with es.open(url) as s:
        assert (s.read("obs", np.arange(300)) == want).all()
    with pytest.raises(es.StoreNotFoundError, match="no store at .*: the folder is empty"):
        os.mkdir(tmp_path / "empty")
        repair_store(str(tmp_path / "empty"))
    assert os.listdir(tmp_path / "empty") == []  # repair wrote nothing there


def test_steps_closed_by_a_broken_stream_verify_clean_and_repair_keeps_them(tmp_path):
    """A step whose ``next_obs`` the lane's next ``obs`` does not continue (two envs in one
    lane, a reset not reported) is closed by the writer with a final row, its flags kept.
    Verify took those final rows for corruption and repair quarantined them, so the steps
    lost the ``next_obs`` they were given. They are the store's own rows: verify finds
    nothing, repair quarantines nothing, and sampling gives each step its ``next_obs``."""
    spec = es.Spec.create(obs=es.Field((3,), np.float32), action=es.Field((), np.int64))
    url = str(tmp_path / "s.zarr")
    store = es.create(url, spec, capacity=1024, shard_rows=64)
    for i in range(40):  # every step's next_obs is i + 0.5, the next step's obs is i + 1
        store.add(np.full(3, i, np.float32), 0, 1.0, np.full(3, i + 0.5, np.float32),
                  False, False)
    obs = np.repeat(np.arange(40, 80, dtype=np.float32)[:, None], 3, axis=1)
    store.extend(obs=obs, action=np.zeros(40, np.int64), reward=np.ones(40, np.float32),
                 next_obs=obs + 0.5, terminated=np.zeros(40, bool),
                 truncated=np.zeros(40, bool))
    store.close()
    found = verify_store(url)
    assert found.ok and not found.problems
    rep = repair_store(url)
    assert rep.lost_rows == 0 and rep.quarantined_rows == 0
    back = es.open(url)
    b = back.sample(64)
    assert np.array_equal(b["next_obs"], b["obs"] + 0.5)
    assert not b["terminated"].any()  # (they bootstrap from the row that closed them)
    back.close()


def _broken_stream_store(url: str) -> None:
    """40 steps added one by one whose next_obs (i + 0.5) the next obs (i + 1) does not
    continue: each closed by a final row."""
    spec = es.Spec.create(obs=es.Field((3,), np.float32), action=es.Field((), np.int64))
    store = es.create(url, spec, capacity=1024, shard_rows=64)
    for i in range(40):
        store.add(np.full(3, i, np.float32), 0, 1.0, np.full(3, i + 0.5, np.float32),
                  False, False)
    store.close()


def _broken_stream_store_repaired_before(url: str):
    """:func:`_broken_stream_store` with what the old repair quarantined (each final row
    closing a step); returns its backend."""
    _broken_stream_store(url)
    backend = backend_for(url)
    q = Quarantine()
    for step in range(1, 79, 2):
        q.add(0, step, step + 1)
    write_quarantine(backend, q)
    return backend


def test_repair_release_intact_gives_back_rows_an_earlier_repair_quarantined(tmp_path):
    """Stores repaired before the fix above have those final rows quarantined (their steps
    never sampled again); ``repair --release-intact`` reads quarantined rows again and
    releases the ones that pass every check. Without the option repair leaves them."""
    url = str(tmp_path / "s.zarr")
    backend = _broken_stream_store_repaired_before(url)
    assert verify_store(url).quarantined == 39 and repair_store(url).released_rows == 0
    assert cli.main(["repair", "-q", "--release-intact", "--dry-run", url]) == 0
    assert read_quarantine(backend).count(0, 0, 100) == 39  # (a dry run)
    rep = repair_store(url, release_intact=True)
    assert rep.released_rows == 39 and rep.released == {0: [(s, s + 1) for s in range(1, 79, 2)]}
    assert read_quarantine(backend).lanes == {} and verify_store(url).quarantined == 0
    store = es.open(url)
    b = store.sample(64)
    assert np.array_equal(b["next_obs"], b["obs"] + 0.5) and store.num_transitions == 40
    store.close()


def test_repair_release_intact_keeps_rows_that_are_still_bad(written):
    url, _ = written
    _corrupt_three(url)
    rep = repair_store(url)
    assert rep.lost_rows > 0
    again = repair_store(url, release_intact=True)
    assert again.released_rows == 0 and again.ok
    assert verify_store(url).quarantined == rep.lost_rows


def test_recheck_reads_the_quarantined_rows_shards_not_the_lane_again(tmp_path, monkeypatch):
    """``verify --recheck-quarantined`` reads the shards holding quarantined rows and the
    shard on each side (a row is checked against the one before it, across a shard's
    edge), not every shard of the lane a second time."""
    url = str(tmp_path / "s.zarr")
    spec = es.Spec.create(obs=es.Field((3,), np.float32), action=es.Field((), np.int64))
    store = es.create(url, spec, capacity=4096, shard_rows=32)
    obs = np.arange(601 * 3, dtype=np.float32).reshape(601, 3)
    store.extend(obs=obs[:-1], action=np.zeros(600, np.int64), reward=np.ones(600, np.float32),
                 terminated=np.zeros(600, bool), truncated=np.zeros(600, bool),
                 next_obs=obs[1:])
    n_fields = len(store.layout.fields)
    store.close()
    backend = backend_for(url)
    q = Quarantine()
    q.add(0, 320, 322)  # the first rows of shard 10 (its edge with shard 9)
    q.add(0, 330, 331)
    write_quarantine(backend, q)
    reads = []  # (every shard file verify decodes goes through _check_shard)
    check_shard = verify_mod._check_shard
    monkeypatch.setattr(verify_mod, "_check_shard",
                        lambda *a, **k: reads.append(a[3]) or check_shard(*a, **k))
    plain = verify_store(url)
    assert plain.ok and plain.quarantined == 3 and len(reads) == 19 * n_fields
    reads.clear()
    again = verify_store(url, recheck_quarantined=True)
    assert again.intact_quarantined == {0: [(320, 322), (330, 331)]}
    assert sorted(set(reads[19 * n_fields:])) == [9, 10, 11]  # the lane again: 0..18
    assert len(reads) == (19 + 3) * n_fields and again.shards == len(reads)


def test_quarantine_release_cuts_ranges():
    q = Quarantine()
    q.add(0, 10, 20)
    q.add(0, 30, 40)
    q.release(0, 15, 35)
    assert q.lanes == {0: [(10, 15), (35, 40)]}
    q.release(0, 0, 100)
    assert q.lanes == {} and not q


def test_a_live_reader_picks_up_released_rows_on_refresh(tmp_path, monkeypatch):
    """A learner that opened the store while an earlier repair's quarantine stood samples
    the released steps after ``repair --release-intact`` and a ``refresh()``, with the
    index a fresh open gives; before the quarantine is re-read nothing changes."""
    url = str(tmp_path / "s.zarr")
    _broken_stream_store_repaired_before(url)
    learner = es.open(url)
    assert np.count_nonzero(learner.index.flags & FLAG_BAD) == 39
    assert repair_store(url, release_intact=True).released_rows == 39
    learner.refresh()  # (within QUARANTINE_RELOAD of the open: not re-read yet)
    assert np.count_nonzero(learner.index.flags & FLAG_BAD) == 39
    monkeypatch.setattr(index_loader, "QUARANTINE_RELOAD", 0.0)
    learner.refresh()
    fresh = es.open(url)
    np.testing.assert_array_equal(learner.index.flags, fresh.index.flags)
    np.testing.assert_array_equal(learner.index.episode_step, fresh.index.episode_step)
    b = learner.sample(64)
    assert np.array_equal(b["next_obs"], b["obs"] + 0.5)
    learner.close()
    fresh.close()


def test_released_anchors_enter_a_live_prioritized_sampler(tmp_path, monkeypatch):
    """Rows released while a learner runs enter its priority tree at the maximum priority;
    the priorities it learned for the other rows stay; rows still quarantined stay out,
    and a loss that renumbered the episode after it is undone."""
    spec = es.Spec.create(obs=es.Field((3,), np.float32), action=es.Field((), np.int64))
    url = str(tmp_path / "s.zarr")
    store = es.create(url, spec, capacity=1024, shard_rows=64)
    obs = np.repeat(np.arange(201, dtype=np.float32)[:, None], 3, axis=1)
    store.extend(obs=obs[:-1], action=np.zeros(200, np.int64), reward=np.ones(200, np.float32),
                 next_obs=obs[1:], terminated=np.zeros(200, bool),
                 truncated=np.zeros(200, bool))
    store.close()
    backend = backend_for(url)
    q = Quarantine()
    q.add(0, 50, 60)
    q.add(0, 120, 125)
    write_quarantine(backend, q)
    learner = es.open(url)
    sampler = es.PrioritizedSampler(learner, persist=False)
    tree = sampler.priorities
    assert not tree.get(np.arange(50, 60)).any() and learner.index.episode_step[70] == 10
    sampler.update_priorities(np.arange(0, 40), np.full(40, 0.01))
    learned = tree.get(np.arange(0, 40))
    q.release(0, 50, 60)  # (what repair --release-intact writes for rows found intact)
    write_quarantine(backend, q)
    monkeypatch.setattr(index_loader, "QUARANTINE_RELOAD", 0.0)
    learner.refresh()
    assert (tree.get(np.arange(50, 60)) > 0).all()
    assert not tree.get(np.arange(120, 125)).any()
    np.testing.assert_array_equal(tree.get(np.arange(0, 40)), learned)
    assert learner.index.episode_step[70] == 70 and learner.index.episode_step[130] == 5
    assert not (learner.index.flags[50:60] & FLAG_BAD).any()
    assert (learner.index.flags[120:125] & FLAG_BAD).all()
    learner.close()
