"""Damage costs only what is damaged (issue 25, items 3 and 5).

Real stores on disk; real bytes flipped in real chunk files. A bad metadata chunk
(``_flags``, ``_episode_step``, ``_step_id``) is rebuilt from what it follows from, so the
store opens and ``repair`` keeps every row whose data is intact; a bad frame costs the
samples whose reads touch it, not its shard; counts agree after quarantine.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import expstore as es
from expstore import cli
from expstore.repair import repair_store
from expstore.rows import FLAG_BAD
from expstore.storage import backend_for, read_quarantine
from expstore.storage.shard import HEADER_SIZE, index_size, parse_head
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
