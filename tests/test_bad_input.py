"""Bad input: each case raises a clear error naming the field or file, and loses nothing.

After every rejected call the store still holds exactly what it held before (checked byte
for byte with ``testing.data``), and accepts the next valid call.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import tempfile
import zlib

import numpy as np
import pytest
from _writer_spies import route_puts

import expstore as es
from expstore.errors import (
    ReadOnlyError,
    SpecError,
    StoreCorruptError,
    ValidationError,
    WriteFailedError,
)
from expstore.testing import data, scratch_dir
from expstore.verify import verify_store


def _one_session(lane, steps):
    return np.zeros(len(np.atleast_1d(steps)), np.int64)


def check_all(store) -> int:
    """Every intact row of every lane holds the bytes written (session 0, one writer)."""
    return sum(data.check_lane(store, lane, _one_session, {0}) for lane in range(store.lanes))


@pytest.fixture
def store(tmp_path):
    with scratch_dir(str(tmp_path)) as d:
        s = es.create(os.path.join(d, "s.zarr"), data.spec(), capacity=3 * 4 * 32, lanes=3,
                      shard_rows=32)
        for lane in range(3):
            b, _ = data.make_steps(lane, 0, 20, 0)
            s.extend(b, lane=lane)
        s.flush()
        yield s
        s.close()


def _step(store, lane=0):
    """One valid step of ``lane`` as keyword arguments of ``add``."""
    b, _ = data.make_steps(lane, int(store.index.count[lane]), 1, 0)
    return dict(obs={k: v[0] for k, v in b["obs"].items()}, action=b["action"][0],
                reward=b["reward"][0], next_obs={k: v[0] for k, v in b["next_obs"].items()},
                terminated=b["terminated"][0], truncated=b["truncated"][0],
                session=b["session"][0], lane=lane)


def _rejects(store, call, match, err=ValidationError):
    """``call`` raises ``err`` matching ``match``; nothing changed; the store still works."""
    before = [w.count for w in store.writers.values()], len(store)
    with pytest.raises(err, match=match):
        call()
    assert ([w.count for w in store.writers.values()], len(store)) == before
    store.add(**_step(store))  # the next valid call is accepted
    assert check_all(store) == len(store)


# -- values ------------------------------------------------------------------------------
def test_wrong_shapes(store):
    st = _step(store)
    _rejects(store, lambda: store.add(**{**st, "obs": {**st["obs"], "pixels": np.zeros((31, 32),
                                                                                   np.uint8)}}),
             r"obs\.pixels: expected shape \(32, 32\) or \(4, 32, 32\), got \(31, 32\)")
    st = _step(store)
    _rejects(store, lambda: store.add(**{**st, "obs": {**st["obs"], "vec": np.zeros(4)}}),
             r"obs\.vec: expected shape \(3,\)")
    st = _step(store)
    _rejects(store, lambda: store.add(**{**st, "action": [1, 2]}), r"action: expected shape \(\)")
    st = _step(store)
    _rejects(store, lambda: store.add(**{**st, "obs": {"pixels": st["obs"]["pixels"]}}),
             r"obs: missing key\(s\) \['vec'\]")
    b, _ = data.make_steps(1, store.writers[1].count, 5, 0)
    b["action"] = b["action"][:4]
    _rejects(store, lambda: store.extend(b, lane=1), r"action: expected shape \(5,\), got \(4,\)")
    # all lanes at once: the leading num_envs axis must be the lane count
    st = _step(store)
    del st["lane"]
    _rejects(store, lambda: store.add(**{k: np.stack([v, v]) if not isinstance(v, dict) else
                                         {kk: np.stack([vv, vv]) for kk, vv in v.items()}
                                         for k, v in st.items()}), r"expected shape \(3,")


def test_wrong_dtypes(store):
    st = _step(store)
    frac = st["obs"]["pixels"].astype(np.float32) + 0.5
    _rejects(store, lambda: store.add(**{**st, "obs": {**st["obs"], "pixels": frac}}),
             r"obs\.pixels: dtype float32 cannot be cast safely to uint8")
    st = _step(store)
    _rejects(store, lambda: store.add(**{**st, "action": "left"}), r"action: dtype <U4")
    st = _step(store)
    _rejects(store, lambda: store.add(**{**st, "session": 2**40}),
             r"session: value\(s\) 1099511627776\.\.1099511627776 do not fit dtype int32")
    st = _step(store)
    _rejects(store, lambda: store.add(**{**st, "terminated": 2}),
             r"terminated: dtype int64 cannot be cast safely to bool")


def test_nonfinite_rejected_by_default_and_stored_when_allowed(store, tmp_path):
    for bad in (np.nan, np.inf):
        st = _step(store)
        _rejects(store, lambda st=st, bad=bad: store.add(**{**st, "reward": bad}),
                 rf"reward: expected finite values, got {bad}.*reject_nonfinite=True")
    st = _step(store)
    vec = st["obs"]["vec"].copy()
    vec[1] = -np.inf
    _rejects(store, lambda: store.add(**{**st, "obs": {**st["obs"], "vec": vec}}),
             r"obs\.vec: expected finite values, got -inf at \(1,\)")
    b, _ = data.make_steps(2, store.writers[2].count, 6, 0)
    b["next_obs"]["vec"][:] = np.nan  # only read where an episode ends
    b["terminated"][-1] = True
    _rejects(store, lambda: store.extend(b, lane=2), r"next_obs\.vec: expected finite")
    # the policy is part of the spec: reject_nonfinite=False stores them as they are
    spec = es.Spec.create(obs=es.Field((3,), np.float32), action=es.Field((), np.int64),
                          reject_nonfinite=False)
    with scratch_dir(str(tmp_path)) as d, \
            es.create(os.path.join(d, "nan.zarr"), spec, capacity=128, shard_rows=32) as s:
        s.add(np.array([np.nan, np.inf, 1.0]), 0, np.nan, np.zeros(3), False, False)
        s.add(np.zeros(3), 1, 2.0, np.zeros(3), True, False)
        s.flush()
        assert np.isnan(s.read("reward", np.array([0])))[0]
        got = s.read("obs", np.array([0]))[0]
        assert np.isnan(got[0]) and np.isposinf(got[1]) and got[2] == 1.0


def test_actions_out_of_range(store):
    for bad, word in ((6, "above high"), (-1, "below low")):
        st = _step(store)
        _rejects(store, lambda st=st, bad=bad: store.add(**{**st, "action": bad}),
                 rf"action: value {bad} at \(\) is {word} bound .*\(expected 0\.\.5\)")
    b, _ = data.make_steps(0, store.writers[0].count, 8, 0)
    b["action"][5] = 9
    _rejects(store, lambda: store.extend(b), r"action: value 9 at \(5,\) is above high")


def test_missing_and_unknown_keys(store):
    b, _ = data.make_steps(0, store.writers[0].count, 4, 0)
    del b["reward"]
    _rejects(store, lambda: store.extend(b), r"extend: missing key\(s\) \['reward'\]")
    b, _ = data.make_steps(0, store.writers[0].count, 4, 0)
    b["terminated"][2] = True
    del b["next_obs"]
    _rejects(store, lambda: store.extend(b), r"next_obs: required for steps that end")
    st = _step(store)
    _rejects(store, lambda: store.add(**st, goal=1.0), r"unknown field\(s\) \['goal'\]")
    with pytest.raises(ValueError, match=r"lane: expected 0\.\.2, got 3"):
        es.open(store.url, "r", lane=3)


# -- stores and files --------------------------------------------------------------------
def _reopen_fails(store, match, err=StoreCorruptError, **kw):
    store.flush()
    with pytest.raises(err, match=match):
        es.open(store.url, **kw)


def test_reopen_with_another_spec(store):
    other = data.spec(extra=es.Field((2,), np.float32))
    _reopen_fails(store, r"store spec differs from the given spec: field 'extra' only in the "
                  r"given spec", SpecError, spec=other)
    changed = es.Spec.create(obs={"pixels": es.Field((32, 32), np.uint8, stack=2),
                                  "vec": es.Field((3,), np.float32)},
                             action=es.Field((), np.int64, low=0, high=5),
                             extras={"session": es.Field((), np.int32)})
    _reopen_fails(store, r"field 'obs\.pixels': stack is 4 in the store, 2 given", SpecError,
                  spec=changed)
    assert check_all(es.open(store.url, spec=data.spec())) == len(store)


def _shard_path(store, name, shard):
    return os.path.join(store.url[len("file://"):], store.layout.shard_key(name, shard))


def test_truncated_and_corrupt_shards_name_the_file(store):
    store.close()
    url = store.url
    path = _shard_path(store, "obs.pixels", 0)
    with open(path, "rb") as f:
        raw = f.read()
    with open(path, "wb") as f:  # truncated inside its chunks
        f.write(raw[: len(raw) // 2])
    reader = es.open(url)
    rows = np.arange(0, 20)
    with pytest.raises(StoreCorruptError, match=r"obs\.pixels/c/0/0/0"):
        reader.read("obs.pixels", rows)
    reader.close()
    rep = verify_store(url)
    assert any("obs.pixels/c/0/0/0" in p for p in rep.problems)
    with open(path, "wb") as f:  # truncated inside its index
        f.write(raw[:10])
    with pytest.raises(StoreCorruptError, match=r"obs\.pixels/c/0/0/0: shard truncated"):
        es.open(url).read("obs.pixels", rows)
    meta = _shard_path(store, "_flags", 4)  # lane 1's metadata: the index cannot load
    with open(meta, "r+b") as f:
        f.seek(30)
        f.write(b"\xff\xfe")
    with es.open(url) as s:  # lane 1's flags follow from its rows (metadata_rebuild.py)
        assert not (s.index.flags & es.rows.FLAG_BAD).any()
    assert any("_flags/c/4" in p for p in verify_store(url).problems)
    with open(path, "wb") as f:
        f.write(raw)
    # nothing else was lost: after repair every other row is intact
    from expstore.repair import repair_store

    rep = repair_store(url)
    assert rep.ok and rep.newly_lost == {1: [(0, 21)]}
    s = es.open(url)
    assert check_all(s) == len(s)  # len counts the 21 quarantined rows out
    s.close()


def test_missing_and_newer_state_files(store):
    store.close()
    root = store.url[len("file://"):]
    state = os.path.join(root, "_state", "lane_2.json")
    saved = open(state, "rb").read()
    os.remove(state)
    with pytest.raises(StoreCorruptError, match=r"_state/lane_2\.json: lane state file is "
                                                r"missing"):
        es.open(store.url)
    body = {"version": 2, "lane": 2, "count": 21, "valid_from": 0, "episodes": 0,
            "generation": 3, "cursor_v2": 7}
    with open(state, "w") as f:
        json.dump({"state": body, "crc32": zlib.crc32(json.dumps(body, sort_keys=True)
                                                      .encode())}, f)
    with pytest.raises(StoreCorruptError, match=r"lane_2\.json: lane state format version 2 is "
                                                r"newer than this expstore supports \(1\)"):
        es.open(store.url)
    with open(state, "wb") as f:
        f.write(saved[:-5])  # torn / corrupt
    with pytest.raises(StoreCorruptError, match=r"lane_2\.json: lane state file is not valid"):
        es.open(store.url)
    with open(state, "wb") as f:
        f.write(saved)
    s = es.open(store.url)
    assert check_all(s) == len(s) == 3 * 21
    s.close()


def test_newer_store_format(store):
    store.close()
    path = os.path.join(store.url[len("file://"):], "zarr.json")
    meta = json.load(open(path))
    meta["attributes"]["expstore"]["format_version"] = 9
    json.dump(meta, open(path, "w"))
    with pytest.raises(StoreCorruptError, match=r"zarr\.json: store format version 9 is not one "
                                                r"this expstore reads"):
        es.open(store.url)


# -- storage refusing writes -------------------------------------------------------------
class FullDisk:
    """Make the store's ``backend.put`` fail with ENOSPC once ``budget`` bytes are used."""

    def __init__(self, backend, budget=0):
        self.backend, self.budget, self.real = backend, budget, backend.put
        self.failed: list[str] = []
        route_puts(backend, self.put)

    def put(self, key, data):
        if self.budget is not None and len(data) > self.budget:
            self.failed.append(key)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), key)
        if self.budget is not None:
            self.budget -= len(data)
        self.real(key, data)

    def free(self):
        self.budget = None


def test_disk_full_during_flush_keeps_every_row(store):
    before = len(store)
    b, _ = data.make_steps(0, store.writers[0].count, 5, 0)
    store.extend(b)
    disk = FullDisk(store.backend, budget=3000)
    with pytest.raises(WriteFailedError, match=r"s\.zarr/.*: write failed \(No space left on "
                       r"device\); lane 0 keeps 5 uncommitted rows in RAM") as e:
        store.flush()
    assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
    assert len(store) == before + 5 and check_all(store) == len(store)  # staged rows readable
    other = es.open(store.url)  # another process sees exactly the committed rows
    assert len(other) == before and check_all(other) == before
    # a batch that fills the shard: the automatic flush fails, every row stays staged
    b, _ = data.make_steps(0, store.writers[0].count, 40, 0)
    with pytest.raises(WriteFailedError):
        store.extend(b)
    n_after = len(store)
    assert n_after > before + 40 and store.writers[0].pending
    assert check_all(store) == n_after
    data.check_batch(store.sample(64), store.index, _one_session)
    # while the disk stays full, more steps are refused before anything is staged
    _rejects_full = len(store)
    with pytest.raises(WriteFailedError):
        store.add(**_step(store))
    assert len(store) == _rejects_full
    disk.free()
    store.flush()  # everything staged reaches storage
    other.refresh()
    assert len(other) == len(store) and check_all(other) == len(store)
    # a full disk during a batch longer than the whole lane: the newest lap survives
    disk.budget = 0
    b, _ = data.make_steps(2, store.writers[2].count, 300, 0)
    with pytest.raises(WriteFailedError):
        store.extend(b, lane=2)
    assert check_all(store) == len(store)
    disk.free()
    store.flush()
    other.refresh()
    assert len(other) == len(store) and check_all(other) == len(store)
    assert verify_store(store.url).ok
    other.close()


def test_a_background_write_error_surfaces_and_nothing_is_lost(store):
    """The add that fills a shard hands it to the background thread; that write hits a full
    disk. The next add raises WriteFailedError (nothing staged by it), every row stays staged
    and readable, a flush while the disk is full raises too, and the flush after space is
    back writes it all: another process then reads every row."""
    w = store.writers[0]
    S = store.layout.shard_rows
    committed = w.committed.count
    disk = FullDisk(store.backend, budget=0)
    while w.count % S:  # one-step adds up to the shard boundary: none waits for a write
        store.add(**_step(store))
    w.wait()  # the background write has failed by now
    n = len(store)
    with pytest.raises(WriteFailedError, match=r"No space left on device.*lane 0 keeps"):
        store.add(**_step(store))
    assert len(store) == n and check_all(store) == n and w.pending  # kept, staged
    assert disk.failed and w.committed.count == committed
    with pytest.raises(WriteFailedError):  # still full: the retry fails, nothing is lost
        store.flush()
    with pytest.raises(WriteFailedError):  # and more steps are refused before staging
        store.add(**_step(store))
    assert len(store) == n and check_all(store) == n
    other = es.open(store.url)
    assert int(other.index.committed[0]) == committed
    disk.free()
    store.add(**_step(store))  # retries the failed shard first, then stages the step
    assert not w.pending and w.committed.count == (committed // S + 1) * S
    store.flush()
    other.refresh()
    assert int(other.index.committed[0]) == w.count and check_all(other) == len(store)
    assert verify_store(store.url).ok
    other.close()


def _can_mount() -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    probe = tempfile.mkdtemp(prefix="expstore-mount-probe-")  # one per process (xdist)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe],
                        capture_output=True).returncode == 0
    if ok:
        subprocess.run(["umount", probe])
    os.rmdir(probe)
    return ok


needs_mount = pytest.mark.skipif(not _can_mount(), reason="needs root and mount (tmpfs)")


@pytest.fixture
def small_tmpfs(tmp_path):
    path = str(tmp_path / "mnt")
    os.makedirs(path)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path])


@needs_mount
def test_a_real_full_disk(small_tmpfs):
    s = es.create(os.path.join(small_tmpfs, "s.zarr"), data.spec(), capacity=3 * 4 * 32,
                  lanes=3, shard_rows=32)
    b, _ = data.make_steps(0, 0, 20, 0)
    s.extend(b)
    s.flush()
    free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
    filler = os.path.join(small_tmpfs, "filler")
    with open(filler, "wb") as f:
        f.write(b"\0" * (free - 8192))
    with pytest.raises(WriteFailedError, match="No space left on device"):
        for _ in range(10):
            b, _ = data.make_steps(0, s.writers[0].count, 10, 0)
            s.extend(b)
            s.flush()
    assert check_all(s) == len(s)
    assert not [f for _, _, fs in os.walk(small_tmpfs) for f in fs if f.endswith(".tmp")]
    os.remove(filler)
    s.flush()
    n = len(s)
    s.close()
    s = es.open(os.path.join(small_tmpfs, "s.zarr"))
    assert len(s) == n and check_all(s) == n
    s.close()


@needs_mount
def test_read_only_storage_opened_for_writing(small_tmpfs):
    url = os.path.join(small_tmpfs, "s.zarr")
    s = es.create(url, data.spec(), capacity=3 * 4 * 32, lanes=3, shard_rows=32)
    b, _ = data.make_steps(1, 0, 20, 0)
    s.extend(b, lane=1)
    s.close()
    subprocess.run(["mount", "-o", "remount,ro", small_tmpfs], check=True)
    with pytest.raises(ReadOnlyError, match=r"s\.zarr/_state: cannot open for writing "
                                            r"\(read-only file system\); open with mode='r'"):
        es.open(url, "r+")
    with pytest.raises(ReadOnlyError, match="read-only"):
        es.open(url, "r+", lease_ttl=None)
    r = es.open(url)
    assert check_all(r) == len(r) == 21
    with pytest.raises(ReadOnlyError, match=r"opened read-only \(mode='r'\)"):
        r.add(**_step(r, 1))
    r.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_store_without_write_permission(store):
    store.close()
    root = store.url[len("file://"):]
    os.chmod(os.path.join(root, "_state"), 0o555)
    try:
        with pytest.raises(ReadOnlyError, match=r"_state: cannot open for writing "
                                                r"\(permission denied\)"):
            es.open(store.url, "r+")
    finally:
        os.chmod(os.path.join(root, "_state"), 0o755)


def test_priority_updates_reject_bad_values(store):
    sampler = es.PrioritizedSampler(store, persist=False)
    batch = sampler.sample(16)
    with pytest.raises(ValueError, match="td_error: expected finite values, got nan"):
        sampler.update_priorities(batch["index"], np.full(16, np.nan), batch["step_id"])
    with pytest.raises(ValueError, match="td_error: expected 16 values"):
        sampler.update_priorities(batch["index"], np.ones(3), batch["step_id"])
    with pytest.raises(ValueError, match=r"index.*\[0, 384\)"):
        sampler.update_priorities(np.array([10_000]), np.ones(1))
    assert sampler.update_priorities(batch["index"], np.ones(16), batch["step_id"]) == 16
