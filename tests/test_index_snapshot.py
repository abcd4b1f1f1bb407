"""The index snapshot (``storage/format/index_snapshot.py``, written by lane writers,
read by ``IndexLoader.load_lane``): an open that uses it gives exactly the index, and the
seeded samples, of an open that scans the metadata shards (the same store without its
``_index/lane_*`` blocks), whatever state the blocks are in: fresh, missing, damaged,
of a store re-created in the same place, stale after the ring wrapped, left by a writer
killed mid-run; and ``expstore upgrade`` gives an old store (no id) its snapshot.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import expstore as es
from expstore.cli import main as cli_main
from expstore.errors import StoreLockedError
from expstore.storage import backend_for
from expstore.storage.format import (
    Quarantine,
    block_rows,
    write_quarantine,
)
from expstore.storage.format import index_snapshot as snap_format
from expstore.storage.read import snapshot as snap_read
from expstore.upgrade import upgrade_store

BACKUP_ATTR = "expstore_layout"  # the arrays' copy of the layout
BLOCK = 256  # rows per block in these tests (4 shards of 64)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(snap_format, "BLOCK_ROWS", BLOCK)


def _spec() -> es.Spec:
    return es.Spec.create(obs=es.Field((), np.float32), action=es.Field((), np.int64))


def _fill(store: es.Store, n: int, lane: int = 0, episode: int = 37, start: int = 0) -> None:
    """``n`` steps into ``lane``: episodes of ``episode`` steps (each lap its own length
    makes a stale block's content differ from the lap that replaced it)."""
    t = np.arange(start, start + n)
    ends = (t + 1) % episode == 0
    store.extend(dict(obs=t.astype(np.float32), action=t % 5, reward=np.zeros(n),
                      terminated=ends, truncated=np.zeros(n, bool),
                      next_obs=(t + 1).astype(np.float32)), lane=lane)


def _create(path: Path, lanes: int = 1, capacity: int = 1024, **kw) -> es.Store:
    return es.create(str(path), _spec(), capacity=capacity * lanes, lanes=lanes,
                     shard_rows=64, fsync=False, **kw)


def _scan_copy(path: Path) -> Path:
    """The same store without its snapshot blocks: opening it scans every lane."""
    copy = path.parent / (path.name + ".scan")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(path, copy)
    shutil.rmtree(copy / "_index", ignore_errors=True)
    return copy


def _view(url: str | Path) -> tuple[dict, int]:
    """What an open knows: the index, a seeded sample batch, and how many rows came from
    the snapshot."""
    with es.open(str(url)) as store:
        idx = store.index
        out = {k: getattr(idx, k).copy() for k in
               ("episode_step", "flags", "count", "committed", "valid_from")}
        out["has_lost"] = idx.has_lost
        if len(store) > 40:
            batch = store.sample(32, rng=np.random.default_rng(7))
            out.update({f"sample_{k}": np.asarray(v) for k, v in batch.items()})
        return out, store._loader.snapshot_rows


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _check(path: Path) -> int:
    """The open with the snapshot equals the scanning open; rows served by blocks."""
    got, used = _view(path)
    want, none = _view(_scan_copy(path))
    assert none == 0
    assert _same(got, want)
    return used


def _blocks(path: Path, lane: int = 0) -> list[Path]:
    return sorted((path / "_index" / f"lane_{lane}").glob("block_*"))


def test_a_fresh_snapshot_gives_the_scanned_index(tmp_path):
    path = tmp_path / "s.zarr"
    with _create(path) as store:
        assert block_rows(store.layout) == BLOCK
        _fill(store, 900)
    assert len(_blocks(path)) == 3  # blocks 0..2 whole; the tail (768..899) is scanned
    assert _check(path) == 768


def test_missing_and_damaged_blocks_fall_back_to_the_shards(tmp_path):
    path = tmp_path / "s.zarr"
    with _create(path) as store:
        _fill(store, 900)
    blocks = _blocks(path)
    blocks[0].unlink()  # missing
    raw = bytearray(blocks[1].read_bytes())  # a flipped payload byte: fails its crc32c
    raw[-100] ^= 0xFF
    blocks[1].write_bytes(bytes(raw))
    raw = bytearray(blocks[2].read_bytes())  # a torn header
    blocks[2].write_bytes(bytes(raw[:30]))
    assert _check(path) == 0


def test_blocks_of_a_store_recreated_in_the_same_place_are_not_used(tmp_path, monkeypatch):
    path = tmp_path / "s.zarr"
    with _create(path) as store:
        _fill(store, 1000, episode=11)
    old = tmp_path / "old_index"
    shutil.copytree(path / "_index", old)
    with _create(path, overwrite=True) as store:
        _fill(store, 600, episode=29)
    shutil.rmtree(path / "_index")
    shutil.copytree(old, path / "_index")  # the old store's blocks, same keys and geometry
    assert _check(path) == 0
    # the check is what stops them: without it the old store's metadata is taken
    monkeypatch.setattr(snap_read, "fits", lambda head, layout, lane, j: True)
    got, used = _view(path)
    assert used > 0 and not _same(got, _view(_scan_copy(path))[0])


def test_stale_blocks_after_the_ring_wrapped_are_used_only_where_valid(tmp_path,
                                                                       monkeypatch):
    path = tmp_path / "s.zarr"
    with _create(path) as store:  # lane of 1024 rows, 4 blocks
        _fill(store, 1024, episode=13)  # lap 0
        _fill(store, 1024, episode=31, start=1024)  # lap 1
        _fill(store, 600, episode=7, start=2048)  # part of lap 2
    # blocks 0, 1 hold lap 2; block 2 lap 1 (partly overwritten), block 3 lap 1
    assert _check(path) > 0
    # the rule is what keeps the older laps out: trusting a block for every step the lane
    # holds in its slots takes lap 1's metadata for lap 2's steps
    monkeypatch.setattr(snap_read, "valid_steps",
                        lambda head, count, valid_from, L: (max(valid_from, count - L), count))
    got, _ = _view(path)
    assert not _same(got, _view(_scan_copy(path))[0])


def test_several_lanes(tmp_path):
    path = tmp_path / "s.zarr"
    with _create(path, lanes=3) as store:
        _fill(store, 3000, lane=0, episode=17)
        _fill(store, 700, lane=1, episode=23)
        _fill(store, 100, lane=2)
    assert _check(path) > 0


def test_quarantined_rows_are_marked_lost_as_by_a_scan(tmp_path):
    path = tmp_path / "s.zarr"
    with _create(path) as store:
        _fill(store, 1500, episode=19)
    backend = backend_for(str(path))
    write_quarantine(backend, Quarantine({0: [(600, 610), (900, 901)]}))
    backend.close()
    assert _check(path) > 0
    assert _view(path)[0]["has_lost"]


def test_a_resumed_writer_completes_the_block_it_reopened_in(tmp_path):
    path = tmp_path / "s.zarr"
    with _create(path) as store:
        _fill(store, 300)  # block 1 holds 256..299 so far
    assert len(_blocks(path)) == 1
    with es.open(str(path), "r+") as store:
        _fill(store, 300, start=300)  # block 1 (256..511) completes in this session
    assert len(_blocks(path)) == 2
    assert _check(path) == 512


def test_an_object_store(tmp_path):
    url = "memory://snapshot-test/s.zarr"
    with es.create(url, _spec(), capacity=1024, shard_rows=64, overwrite=True) as store:
        _fill(store, 1000)
    got, used = _view(url)
    assert used > 0
    backend = backend_for(url)
    for key in backend.list("_index/lane_0"):
        backend.delete(key)
    want, used = _view(url)
    assert used == 0 and _same(got, want)


WRITER = r"""
import sys, numpy as np, expstore as es
from expstore.storage.format import index_snapshot
index_snapshot.BLOCK_ROWS = int(sys.argv[2])
spec = es.Spec.create(obs=es.Field((), np.float32), action=es.Field((), np.int64))
store = es.create(sys.argv[1], spec, capacity=1024, shard_rows=64, fsync=False)
print("ready", flush=True)
t0 = 0
while True:
    t = np.arange(t0, t0 + 50); t0 += 50
    store.extend(dict(obs=t.astype(np.float32), action=t % 5, reward=np.zeros(50),
                      terminated=(t + 1) % 41 == 0, truncated=np.zeros(50, bool),
                      next_obs=(t + 1).astype(np.float32)))
    if t0 % 200 == 0:
        store.flush()
"""


def test_a_writer_killed_mid_run(tmp_path):
    path = tmp_path / "s.zarr"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(BLOCK)],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20
        while len(_blocks(path)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the ring wrapped at least once
        time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _check(path) > 0


def _make_old(path: Path) -> None:
    """What a store made before store ids looks like: no id anywhere, no snapshot."""
    for meta in [path / "zarr.json", *path.glob("*/zarr.json")]:
        doc = json.loads(meta.read_text())
        for key in ("expstore", BACKUP_ATTR):
            doc.get("attributes", {}).get(key, {}).pop("store_id", None)
        meta.write_text(json.dumps(doc, indent=2))
    shutil.rmtree(path / "_index", ignore_errors=True)


def test_an_old_store_opens_as_is_and_after_upgrade(tmp_path, capsys):
    path = tmp_path / "s.zarr"
    with _create(path) as store:
        _fill(store, 1500, episode=19)
    _make_old(path)
    with es.open(str(path), "r+") as store:  # an old store: opened and written as before
        assert store.layout.store_id is None
        _fill(store, 600, start=1500)
    assert not (path / "_index").exists()  # (no id: no snapshot written)
    want, used = _view(path)
    assert used == 0
    holder = subprocess.Popen(  # a writer in another process holds the lanes: refused
        [sys.executable, "-c", "import sys, time, expstore as es\n"
         "s = es.open(sys.argv[1], 'r+'); print('ready', flush=True); time.sleep(60)",
         str(path)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLockedError):
            upgrade_store(str(path))
    finally:
        holder.kill()
        holder.wait()
    assert es.open(str(path)).layout.store_id is None  # (refused before changing anything)
    time.sleep(0.1)
    assert cli_main(["upgrade", "-q", str(path)]) == 0
    assert "block(s) written" in capsys.readouterr().out
    layout = es.open(str(path)).layout
    assert layout.store_id is not None
    for meta in path.glob("_*/zarr.json"):  # the copy repair rebuilds the group from
        assert json.loads(meta.read_text())["attributes"][BACKUP_ATTR]["store_id"] \
            == layout.store_id
    got, used = _view(path)
    assert used > 0 and _same(got, want)
    rep = upgrade_store(str(path))  # again: nothing left to do
    assert not rep.id_added and rep.blocks_written == 0 and rep.blocks_kept > 0
    with es.open(str(path), "r+") as store:  # the writer now keeps the snapshot up
        _fill(store, 700, start=2100)
    assert _check(path) > 0


def test_an_s3_store(s3_url):
    url, so = s3_url
    with es.create(url, _spec(), capacity=1024, shard_rows=64, storage_options=so) as store:
        _fill(store, 900)

    def view() -> tuple[dict, int]:
        with es.open(url, storage_options=so) as store:
            idx = store.index
            return ({k: getattr(idx, k).copy() for k in
                     ("episode_step", "flags", "count", "committed", "valid_from")},
                    store._loader.snapshot_rows)

    got, used = view()
    assert used == 768
    backend = backend_for(url, so)
    for key in backend.list("_index/lane_0"):
        backend.delete(key)
    want, used = view()
    assert used == 0 and _same(got, want)


def test_lowering_a_lane_count_drops_the_blocks_past_it(tmp_path):
    """An import resumed one row back (``datasets/dopamine/lane.py``) rewrites steps the
    lane had committed: the block holding them goes before the lane state is written."""
    from expstore.datasets.resume import rewind_lane

    path = tmp_path / "s.zarr"
    with _create(path) as store:
        _fill(store, 750)  # 750 + 20 final rows: blocks 0, 1 and 2 (512..767) written
    assert len(_blocks(path)) == 3
    rewind_lane(str(path), 0, 760, None)
    assert [b.name for b in _blocks(path)] == ["block_0", "block_1"]
    with es.open(str(path), "r+") as store:  # step 760 on: other metadata than before
        _fill(store, 200, episode=5, start=760)
    assert _check(path) > 0


def test_blocks_of_rows_added_one_step_at_a_time(tmp_path):
    """``add`` (the step kernel's path) stages the metadata the blocks are made from."""
    path = tmp_path / "s.zarr"
    with _create(path) as store:
        for t in range(1000):
            store.add(np.float32(t), t % 5, 0.0, np.float32(t + 1), (t + 1) % 43 == 0, False)
    assert _check(path) > 0
