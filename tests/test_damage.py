"""Damage costs only what is damaged (issue 25, items 3 and 5).

Real stores on disk; real bytes flipped in real chunk files. A bad metadata chunk
(``_flags``, ``_episode_step``, ``_step_id``) is rebuilt from what it follows from, so the
store opens and ``repair`` keeps every row whose data is intact; a bad frame costs the
samples whose reads touch it, not its shard; counts agree after quarantine.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import expstore as es
from expstore import cli
from expstore.repair import repair_store
from expstore.rows import FLAG_BAD
from expstore.storage import backend_for
from expstore.storage.format import read_quarantine
from expstore.storage.format.shard import HEADER_SIZE, index_size, parse_head
from expstore.verify import verify_store

SHARD = 64


def _store(tmp_path, steps: int = 600) -> str:
    """One lane, shards of 64 rows; episodes of varied length, terminated and truncated."""
    url = str(tmp_path / "d.zarr")
    spec = es.Spec.create(obs=es.Field((8, 8), np.uint8, stack=2, chunk_rows=1),
                          action=es.Field((), np.int64))
    rng = np.random.default_rng(3)
    with es.create(url, spec, capacity=1024, shard_rows=SHARD) as s:
        t, ep_len = 0, 0
        for t in range(steps):
            ep_len += 1
            end = rng.random() < 0.06
            term, trunc = end and ep_len % 2 == 0, end and ep_len % 2 == 1
            s.add(np.full((8, 8), t % 250, np.uint8), t, float(t),
                  np.full((8, 8), (t + 1) % 250, np.uint8), terminated=term, truncated=trunc)
            ep_len = 0 if end else ep_len
    return url


def flip_chunk(url: str, name: str, shard: int, chunk: int = 0) -> str:
    """Flip two bytes in the middle of inner chunk ``chunk`` of a shard; returns its key."""
    with es.open(url) as s:
        lay = s.layout
    key = lay.shard_key(name, shard)
    path = os.path.join(url, key)
    raw = open(path, "rb").read()
    n = lay.chunks_per_shard(name)
    head = parse_head(raw[: index_size(n) + HEADER_SIZE], n, key)
    off, nb = int(head.offsets[chunk]), int(head.nbytes[chunk])
    with open(path, "r+b") as f:
        for pos in (off + nb // 2, off + nb // 2 + 1):
            f.seek(pos)
            b = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([b ^ 0x5A]))
    return key


def _meta(url: str) -> tuple[np.ndarray, np.ndarray, int]:
    with es.open(url) as s:
        n = int(s.index.count[0])
        rows = np.arange(max(0, n - s.layout.lane_capacity), n)
        return s.index.episode_step[rows % 1024].copy(), s.index.flags[rows % 1024].copy(), n


@pytest.mark.parametrize("name", ["_flags", "_episode_step", "_step_id"])
def test_a_bad_metadata_chunk_is_rebuilt_and_repair_keeps_every_row(tmp_path, name):
    url = _store(tmp_path)
    ep0, fl0, n = _meta(url)
    flip_chunk(url, name, 4)  # rows 256..319
    assert not verify_store(url).ok
    ep, fl, _ = _meta(url)  # opens: the chunk is derived from the rows around it
    np.testing.assert_array_equal(ep, ep0)
    np.testing.assert_array_equal(fl, fl0)
    with es.open(url) as s:
        assert len(s) == n
        b = s.sample(64)
        np.testing.assert_array_equal(b["obs"][:, -1, 0, 0], b["action"] % 250)
    assert cli.main(["info", url]) == 0
    rep = repair_store(url)
    assert rep.ok, rep.remaining
    assert rep.lost_rows == 0 and rep.quarantined_rows == 0
    assert name in " ".join(rep.rewritten)
    assert verify_store(url).ok
    assert read_quarantine(backend_for(url)).lanes == {}
    ep, fl, _ = _meta(url)
    np.testing.assert_array_equal(ep, ep0)
    np.testing.assert_array_equal(fl, fl0)
    with es.open(url) as s:
        steps = np.arange(256, 320)
        np.testing.assert_array_equal(s.read("_step_id", steps), steps)


def test_both_metadata_chunks_bad_opens_with_those_rows_lost(tmp_path):
    url = _store(tmp_path)
    ep0, fl0, n = _meta(url)
    flip_chunk(url, "_flags", 4)
    flip_chunk(url, "_episode_step", 4)  # nothing left to derive rows 256..319 from
    with es.open(url) as s:
        bad = np.flatnonzero(s.index.flags & FLAG_BAD)
        np.testing.assert_array_equal(bad, np.arange(256, 320))
        assert len(s) == n - 64
        ok = np.arange(n) < 256  # rows before the damage are as written
        np.testing.assert_array_equal(s.index.episode_step[:n][ok], ep0[ok])
        np.testing.assert_array_equal(s.index.flags[:n][ok], fl0[ok])
        for _ in range(20):
            b = s.sample(64)
            assert not ((b["index"] >= 256) & (b["index"] < 320)).any()
    rep = repair_store(url)
    assert rep.ok and rep.newly_lost == {0: [(256, 320)]} and rep.lost_rows == 64
    assert verify_store(url).ok


@pytest.mark.parametrize("second", [None, "_episode_step"])
def test_a_bad_chunk_of_a_shard_of_several_costs_that_chunk_only(tmp_path, monkeypatch, caplog,
                                                                  second):
    """Scalars in 16-row chunks of 64-row shards (``Layout.scalar_chunk_rows``, as stores
    past ~268M rows of small rows have them): a bad ``_flags`` chunk is rebuilt, and with
    the ``_episode_step`` chunk beside it bad too, its 16 rows are lost, not the shard's 64
    (read shard by shard, the other 48 rows were rebuilt or lost with it)."""
    import expstore.api
    monkeypatch.setattr(expstore.api, "SCALAR_CHUNK_ROWS", 16)
    url = _store(tmp_path)
    ep0, fl0, n = _meta(url)
    with es.open(url) as s:
        assert s.layout.chunks_per_shard("_flags") == 4
    flip_chunk(url, "_flags", 4, chunk=1)  # rows 272..287
    if second:
        flip_chunk(url, second, 4, chunk=1)
    with caplog.at_level("WARNING", logger="expstore"), es.open(url) as s:
        bad = np.flatnonzero(s.index.flags & FLAG_BAD)
        lost = np.arange(272, 288) if second else np.arange(0)
        counts = re.findall(r"(\d+) row\(s\) rebuilt from their neighbours, (\d+) lost",
                            caplog.text)
        assert counts and {c for pair in counts for c in pair} <= {"0", "16"}, caplog.text
        np.testing.assert_array_equal(bad, lost)
        assert len(s) == n - len(lost)
        ok = np.ones(n, bool)  # as written, but for the lost rows and the rest of their
        if second:  # episode (the index starts the rows after lost ones as a new episode)
            ok[272:288 + int(np.argmax(ep0[288:] == 0))] = False
        np.testing.assert_array_equal(s.index.episode_step[:n][ok], ep0[ok])
        np.testing.assert_array_equal(s.index.flags[:n][ok], fl0[ok])
    rep = repair_store(url)
    assert rep.ok and rep.lost_rows == len(lost)
    assert rep.newly_lost == ({0: [(272, 288)]} if second else {})
    assert verify_store(url).ok


def test_a_reader_refreshes_past_a_bad_flags_chunk(tmp_path):
    url = _store(tmp_path, steps=300)
    reader = es.open(url)
    with es.open(url, "r+") as w:
        for t in range(300, 400):
            w.add(np.full((8, 8), t % 250, np.uint8), t, float(t),
                  np.full((8, 8), (t + 1) % 250, np.uint8), terminated=t % 30 == 0,
                  truncated=False)
    ep0, fl0, n = _meta(url)
    flip_chunk(url, "_flags", 5)  # rows 320..383, new since the reader opened
    reader.refresh()
    assert int(reader.index.count[0]) == n and len(reader) == n
    np.testing.assert_array_equal(reader.index.flags[:n], fl0)
    np.testing.assert_array_equal(reader.index.episode_step[:n], ep0)
    reader.close()


def test_info_verify_repr_and_len_agree_after_quarantine(tmp_path, capsys):
    url = _store(tmp_path)
    flip_chunk(url, "obs", 4, chunk=10)  # one frame: row 266
    flip_chunk(url, "reward", 6)  # a whole-shard chunk: rows 384..447
    rep = repair_store(url)
    assert rep.ok and rep.lost_rows == 65
    capsys.readouterr()
    assert cli.main(["info", "--json", url]) == 0
    import json

    info = json.loads(capsys.readouterr().out)
    v = verify_store(url)
    assert v.ok and v.quarantined == 65
    with es.open(url) as s:
        held = len(s)
        assert f"rows={held}," in repr(s)
    assert info["rows"] == v.rows == held == 637 - 65
    assert info["lost_rows"] == 65


# -- skip_corrupt: a bad frame costs the samples that read it, per lap -------------------------
def _frames_store(tmp_path, steps: int = 700) -> str:
    """One lane of 1024 rows, shards of 64, one frame per chunk; no episode ends (row r
    holds step r, its obs frame filled with r % 250 and action r)."""
    url = str(tmp_path / "f.zarr")
    spec = es.Spec.create(obs=es.Field((8, 8), np.uint8, stack=2, chunk_rows=1),
                          action=es.Field((), np.int64))
    with es.create(url, spec, capacity=1024, shard_rows=SHARD) as s:
        _add(s, 0, steps)
    return url


def _add(s, a: int, b: int) -> None:
    t = np.arange(a, b)
    s.extend(obs=np.repeat((t % 250).astype(np.uint8)[:, None, None], 8, 1).repeat(8, 2),
             action=t, reward=np.zeros(len(t), np.float32),
             terminated=np.zeros(len(t), bool), truncated=np.zeros(len(t), bool))


def _check_intact(obs: np.ndarray, nxt: np.ndarray, action: np.ndarray) -> None:
    """Every frame delivered is its row's: newest = action, the one before = action - 1
    (or the same frame where the stack is padded)."""
    np.testing.assert_array_equal(obs[:, -1, 0, 0], action % 250)
    older = obs[:, 0, 0, 0].astype(np.int64)
    assert ((older == (action - 1) % 250) | (older == action % 250)).all()
    np.testing.assert_array_equal(nxt[:, -1, 0, 0], (action + 1) % 250)


BAD = 300  # the row (and step) whose frame is flipped: chunk 44 of obs/c/4


def test_skip_corrupt_loader_skips_only_the_samples_reading_the_bad_frame(tmp_path):
    url = _frames_store(tmp_path)
    flip_chunk(url, "obs", BAD // SHARD, BAD % SHARD)
    store = es.open(url)
    loader = es.make_loader(store, batch_size=128, num_workers=2, num_batches=40,
                            skip_corrupt=True)
    seen = []
    for batch in loader:
        a = batch["action"].numpy()
        _check_intact(batch["obs"].numpy(), batch["next_obs"].numpy(), a)
        assert not np.isin(a, [BAD - 1, BAD]).any()  # next_obs / obs read the bad frame
        seen.append(a)
    loader.close()
    seen = np.concatenate(seen)
    assert loader.stats.corrupt_shards == 1
    assert loader.stats.corrupt_rows_quarantined == 1  # the frame's row only, not 64
    np.testing.assert_array_equal(np.flatnonzero(store.index.flags & FLAG_BAD), [BAD])
    assert len(store) == 700 - 1
    # the rest of the frame's shard trains on (some of its 62 other anchors were drawn)
    same_shard = (seen // SHARD == BAD // SHARD) & ~np.isin(seen, [BAD - 1, BAD])
    assert same_shard.sum() > 20
    store.close()


def test_skip_corrupt_quarantine_is_per_lap(tmp_path):
    """After the lane rewrites the bad frame's slot (a later lap), the row is sampled
    again, both in this process and by the loader's (persistent) workers."""
    url = _frames_store(tmp_path)
    flip_chunk(url, "obs", BAD // SHARD, BAD % SHARD)
    reader = es.open(url)
    sampler = es.UniformSampler(reader, skip_corrupt=True, seed=0)
    loader = es.make_loader(reader, sampler, batch_size=256, num_workers=2, num_batches=30,
                            persistent_workers=True)
    for batch in loader:  # the workers find the frame
        assert not np.isin(batch["action"].numpy(), [BAD - 1, BAD]).any()
    assert loader.stats.corrupt_rows_quarantined == 1
    assert reader.index.flags[BAD] & FLAG_BAD  # marked lost in the loader's process
    with es.open(url, "r+") as w:  # a lap later: slot BAD holds step BAD + 1024
        _add(w, 700, 700 + 1024)
    reader.refresh()
    assert not reader.index.flags[BAD] & FLAG_BAD and int(reader.index.count[0]) == 1724
    new = BAD + 1024
    got = np.concatenate([sampler.sample(256)["action"] for _ in range(30)])
    assert np.isin(new, got)  # in this process
    got = []
    for batch in loader:  # the same workers, which found the old lap's frame bad
        a = batch["action"].numpy()
        _check_intact(batch["obs"].numpy(), batch["next_obs"].numpy(), a)
        got.append(a)
    assert np.isin([new - 1, new], np.concatenate(got)).all()
    loader.close()
    reader.close()


def test_every_sampler_takes_skip_corrupt_and_the_hint_names_a_working_call(tmp_path):
    from expstore.errors import REPAIR_HINT

    url = _frames_store(tmp_path)
    flip_chunk(url, "obs", BAD // SHARD, BAD % SHARD)
    with es.open(url) as s:
        assert "UniformSampler(store, skip_corrupt=True)" in REPAIR_HINT
        samplers = [es.UniformSampler(s, skip_corrupt=True, seed=1),
                    es.PrioritizedSampler(s, skip_corrupt=True, persist=False, seed=2),
                    es.MixtureSampler([(s, 1.0)], skip_corrupt=True, seed=3)]
        for sampler in samplers:
            for _ in range(40):  # 5,120 draws: the bad frame (1 in ~700) comes up
                b = sampler.sample(128)
                _check_intact(b["obs"], b["next_obs"], b["action"])
        assert s.corrupt_rows_skipped > 0
        seq = es.SequenceSampler(s, length=4, persist=False, skip_corrupt=True)
        assert seq.skip_corrupt
