"""The batch read path (shard tables, row cache, C kernel) and the shared-slot transport.

The batch path must return exactly what the general path returns, never serve a row
from a cache once it was overwritten, and fall back for what it cannot do. Batches from
loader workers arrive through reusable shared slots: a slot is reused only once nothing
the consumer holds refers to it.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from test_loader import decode_frame

import expstore as es
from expstore.storage import backend_for
from expstore.storage.read import ShardReader
from expstore.storage.read.read_cache import SLOT_KEY_BYTES

FRAME = (32, 32)  # 1 KiB: stored one row per inner chunk, like Atari frames


def frame(lane: int, step: int) -> np.ndarray:
    a = np.zeros(FRAME, np.uint8)
    a[0, :4] = np.frombuffer(np.int32(step).tobytes(), np.uint8)
    a[1, 0] = lane
    a[2:, :] = step % 7  # compressible, and different per step
    return a


def make_store(path, capacity=256, lanes=1, shard_rows=16):
    spec = es.Spec.create(obs=es.Field(FRAME, np.uint8, stack=4), action=es.Field((), np.int64),
                          extras={"step": es.Field((), np.int64)})
    store = es.create(path, spec, capacity=capacity, lanes=lanes, shard_rows=shard_rows)
    assert store.layout.chunk_rows("obs") == 1
    return store


def write(store, lane, start, n, episode_len=37):
    step = int(store.index.count[lane])
    for t in range(start, start + n):
        end = (t + 1) % episode_len == 0
        store.add(frame(lane, step), t % 5, float(step), frame(lane, step + 1), end, False,
                  lane=lane, step=step)
        step += 2 if end else 1


def check_batch(batch) -> None:
    steps = batch["step_id"].numpy()
    assert np.array_equal(batch["step"].numpy(), steps)
    obs = batch["obs"].numpy()
    for i, s in enumerate(steps):
        assert decode_frame(obs[i, -1])[1] == s
        assert (obs[i, -1, 2:] == s % 7).all()


def _readers(store, **kw):
    backend = backend_for(store.url)
    fast = ShardReader(backend, store.layout, row_cache_bytes=1 << 20, **kw)
    general = ShardReader(backend, store.layout, row_cache_bytes=0, **kw)
    general.tables = {}  # the general path only
    return fast, general


def _committed(store):
    idx = store.index
    lanes = np.repeat(np.arange(store.lanes), idx.lane_capacity)
    rows = np.arange(store.capacity)
    steps = idx.steps(rows)
    return rows, steps, lanes


def test_batch_path_matches_general_path(tmp_path) -> None:
    store = make_store(tmp_path / "s.zarr", capacity=256, lanes=2, shard_rows=16)
    for lane in (0, 1):
        write(store, lane, 0, 300 + 50 * lane)  # both lanes wrap
    store.flush()
    fast, general = _readers(store)
    rows, steps, _ = _committed(store)
    rng = np.random.default_rng(0)
    for _ in range(30):
        pick = rng.choice(len(rows), 40, replace=False)
        for name in ("obs", "action", "reward", "step"):
            f = store.layout.fields[name]
            a = np.zeros((40, *f.shape), f.dtype)
            b = np.zeros((40, *f.shape), f.dtype)
            ok_a = fast.read(name, rows[pick], steps[pick], a)
            ok_b = general.read(name, rows[pick], steps[pick], b)
            assert np.array_equal(ok_a, ok_b)
            assert np.array_equal(a[ok_a], b[ok_b])
    # the second pass was served by the batch path: frames from the kernel or the cache
    assert fast.stats.row_cache_hits > 0 and fast.stats.requests > 0
    wrong = steps[:8] + 1  # steps a row does not hold are never delivered
    out = np.zeros((8, *FRAME), np.uint8)
    assert not fast.read("obs", rows[:8], wrong, out).any()
    store.close()


def test_overwritten_rows_are_never_served_from_cache(tmp_path) -> None:
    store = make_store(tmp_path / "s.zarr", capacity=64, shard_rows=16)
    write(store, 0, 0, 60)
    store.flush()
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=1 << 20)
    rows, old_steps, _ = _committed(store)
    keep = (old_steps >= 0) & (old_steps < store.index.count[0])
    rows, old_steps = rows[keep], old_steps[keep]
    out = np.zeros((len(rows), *FRAME), np.uint8)
    assert reader.read("obs", rows, old_steps, out).all()  # now in the row cache
    write(store, 0, 60, 64)  # one whole lap: every row now holds a newer step
    store.flush()
    new_steps = store.index.steps(rows)
    assert (new_steps > old_steps).all()
    fresh = np.zeros_like(out)
    assert reader.read("obs", rows, new_steps, fresh).all()  # re-opens the new versions
    for i in range(len(rows)):
        assert decode_frame(fresh[i])[1] == new_steps[i]
    # the cache still holds the old frames under their old steps, but the versions the
    # reader now holds do not: asked for the old steps, nothing is delivered
    again = np.zeros_like(out)
    assert not reader.read("obs", rows, old_steps, again).any()
    store.close()


def test_codec_the_kernel_does_not_decode_falls_back(tmp_path) -> None:
    spec = es.Spec.create(obs=es.Field(FRAME, np.uint8, stack=2,
                                       codec={"name": "zstd", "level": 1}),
                          action=es.Field((), np.int64))
    store = es.create(tmp_path / "z.zarr", spec, capacity=64, shard_rows=16)
    frames = np.stack([frame(0, i) for i in range(40)])
    store.extend(dict(obs=frames[:-1], action=np.zeros(39, np.int64),
                      reward=np.zeros(39, np.float32), terminated=np.zeros(39, bool),
                      truncated=np.zeros(39, bool), next_obs=frames[1:]))
    store.flush()
    reader = ShardReader(backend_for(store.url), store.layout)
    assert not reader.kernel_ok["obs"]
    out = np.zeros((39, *FRAME), np.uint8)
    assert reader.read("obs", np.arange(39), np.arange(39), out).all()
    assert np.array_equal(out, frames[:-1])
    store.close()


@pytest.mark.parametrize("held", [False, True], ids=["read", "read_held"])
def test_corrupt_frame_through_the_batch_path_names_the_shard(tmp_path, held) -> None:
    store = make_store(tmp_path / "s.zarr", capacity=64, shard_rows=16)
    write(store, 0, 0, 40)
    store.flush()
    reader = ShardReader(backend_for(store.url), store.layout,
                         row_cache_bytes=(1 << 20) if held else 0)
    rows, steps, _ = _committed(store)
    out = np.zeros((16, *FRAME), np.uint8)
    assert reader.read("obs", rows[:16], steps[:16], out).all()  # shard 0 is now cached
    if held:
        reader.row_caches["obs"].clear()  # its frames are decoded again, into the cache
    key = store.layout.shard_key("obs", 0)
    path = tmp_path / "s.zarr" / key
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # a bit flip in the last chunk, rewritten in place (same inode)
    with open(path, "r+b") as fh:
        fh.write(bytes(data))
    with pytest.raises(es.StoreCorruptError, match=key.replace("/", ".")):
        if held:
            reader.read_held("obs", rows[:16], steps[:16])
        else:
            reader.read("obs", rows[:16], steps[:16], out)
    store.close()


def test_frames_held_in_the_cache_match_the_general_path(tmp_path) -> None:
    """``read_held`` leaves frames in the reader's cache: rows that share a cache slot in
    one read, rows the general path reads, a row asked for at two steps, and reads too
    big for the scratch rows (refused: the caller reads them the usual way)."""
    store = make_store(tmp_path / "s.zarr", capacity=256, lanes=2, shard_rows=16)
    for lane in (0, 1):
        write(store, lane, 0, 300 + 50 * lane)
    store.flush()
    backend = backend_for(store.url)
    # few open shards and descriptors: the kernel re-opens shards within reads
    fast = ShardReader(backend, store.layout, max_open=6,
                       row_cache_bytes=64 * (1024 + SLOT_KEY_BYTES), max_fds=16)
    general = ShardReader(backend, store.layout, row_cache_bytes=0)
    general.tables = {}
    cache = fast.row_caches["obs"]
    assert (cache.n, cache.scratch) == (60, 4)
    rows, steps, _ = _committed(store)
    first = fast.read_held("obs", rows[:2], steps[:2])  # nothing cached yet: general path
    assert first is not None and first[2].all()
    assert np.array_equal(first[0][first[1]], np.stack([frame(0, s) for s in steps[:2]]))
    rng = np.random.default_rng(1)
    served = refused = shared = 0
    for _ in range(300):
        pick = rng.choice(len(rows), int(rng.integers(1, 12)), replace=False)
        r, st = rows[pick], steps[pick].copy()
        if len(r) > 2:  # a row asked for again at a step it does not hold
            r, st = np.append(r, r[0]), np.append(st, st[0] + 1)
        if len(r) > 9:  # rows sharing one cache slot: more than the scratch rows spill
            at = int(r[0]) % cache.n
            r = np.concatenate([r, rows[at::cache.n][:6]])
            st = np.concatenate([st, steps[at::cache.n][:6]])
            pairs = np.unique(np.stack([r, st], 1), axis=0)  # distinct (row, step) pairs
            r, st = pairs[:, 0].copy(), pairs[:, 1].copy()
        got = fast.read_held("obs", r, st)
        expect = np.zeros((len(r), *FRAME), np.uint8)
        ok_expect = general.read("obs", r, st, expect)
        if got is None:
            refused += 1
            continue
        values, pos, ok = got
        served += 1
        shared += len(np.unique(r % cache.n)) < len(r)
        assert np.array_equal(ok, ok_expect)
        assert np.array_equal(values[pos[ok]], expect[ok])
        assert len(np.unique(pos)) == len(pos)  # every row of the read has its own place
    assert served > 100 and refused > 0 and shared > 50
    assert fast.stats.row_cache_hits > 0 and fast.stats.requests > 0
    store.close()


def test_a_read_touching_more_shards_than_max_open_gets_every_row(tmp_path) -> None:
    """Shard versions beyond ``max_open`` are closed after a read, not during it (rows of
    shards closed mid-read used to come back as "overwritten")."""
    store = make_store(tmp_path / "s.zarr", capacity=256, shard_rows=16)
    write(store, 0, 0, 250)
    store.flush()
    reader, general = _readers(store, max_open=3)
    general.max_open = 4096
    rows, steps, _ = _committed(store)
    keep = steps >= 0
    rows, steps = rows[keep], steps[keep]  # rows in all 16 shards
    for name in ("obs", "step"):
        f = store.layout.fields[name]
        out = np.zeros((len(rows), *f.shape), f.dtype)
        expect = np.zeros_like(out)
        assert general.read(name, rows, steps, expect).all()
        assert reader.read(name, rows, steps, out).all()
        assert np.array_equal(out, expect)
    assert len(reader.heads) <= 3
    store.close()


def filled_store(tmp_path):
    """512 rows in 32-row shards, 500 steps written and flushed (the ring not yet full)."""
    store = make_store(tmp_path / "s.zarr", capacity=512, shard_rows=32)
    write(store, 0, 0, 500)
    store.flush()
    return store


def _loader(store, **kw):
    kw.setdefault("num_workers", 2)
    kw.setdefault("prefetch_factor", 2)
    kw.setdefault("batches_per_message", 1)
    return es.make_loader(store, batch_size=16, multiprocessing_context="fork", **kw)


def test_batches_grouped_per_message_count_and_check(tmp_path) -> None:
    store = filled_store(tmp_path)
    loader = _loader(store, batches_per_message=4, num_batches=10)
    assert len(loader) == 10
    batches = list(loader)  # 4 + 4 + 2 batches in three messages
    assert len(batches) == 10 and loader.stats.batches == 10
    for b in batches:
        check_batch(b)
        assert b["obs"].shape == (16, 4, *FRAME)
    # each batch is its own draw: no two batches are the same sample set
    assert len({tuple(b["index"].tolist()) for b in batches}) == 10
    loader.close()
    store.close()


def test_slots_are_reused_once_batches_are_dropped(tmp_path) -> None:
    store = filled_store(tmp_path)
    loader = _loader(store)
    it = iter(loader)
    for _ in range(200):
        check_batch(next(it))
    # each worker fills its prefetch_factor + 2 slots once, then reuses them
    assert loader.stats.new_buffers <= 2 * (2 + 2)
    assert loader.stats.batches == 200
    del it
    loader.close()
    store.close()


def test_batches_held_by_the_consumer_are_never_overwritten(tmp_path) -> None:
    store = filled_store(tmp_path)
    loader = _loader(store)
    it = iter(loader)
    held = []
    for _ in range(40):  # more batches than all slots of both workers together
        b = next(it)
        held.append((b, {k: v.clone() for k, v in b.items()}))
    views = [b["obs"][:4] for b, _ in held[:5]]  # views of views keep the slot too
    for b, _ in held[:5]:
        b.clear()
    for _ in range(60):
        next(it)
    for b, copy in held[5:]:
        for k, v in b.items():
            assert torch.equal(v, copy[k]), k
    for v, (_, copy) in zip(views, held[:5]):
        assert torch.equal(v, copy["obs"][:4])
    assert loader.stats.new_buffers > 2 * (2 + 2)  # held slots forced one-off buffers
    held.clear()
    views.clear()
    gc.collect()
    for _ in range(2 * 2):  # batches already in flight were written to one-off buffers
        next(it)
    before = loader.stats.new_buffers
    for _ in range(100):
        next(it)
    assert loader.stats.new_buffers == before  # released slots are used again
    del it
    loader.close()
    store.close()


def test_iterator_dropped_with_batches_in_flight_frees_their_slots(tmp_path) -> None:
    store = filled_store(tmp_path)
    loader = _loader(store, persistent_workers=True)
    for _ in range(5):  # each new iterator drains what the old one had prefetched
        it = iter(loader)
        for _ in range(3):
            check_batch(next(it))
        del it
        gc.collect()
    it = iter(loader)
    for _ in range(100):
        check_batch(next(it))
    # Leaked slots (4 prefetched messages per dropped iterator) would force one-off
    # buffers; freed ones keep every message in the workers' 2 x 4 slots. (A slot may be
    # first used late, so the count is bounded rather than frozen after warm-up.)
    assert loader.stats.new_buffers <= 2 * (2 + 2)
    del it
    loader.close()
    store.close()


def _messages(loader, n):
    """Raw worker messages, as DataLoader's pin-memory thread sees them."""
    from torch.utils.data import DataLoader

    return [m for _, m in zip(range(n), DataLoader.__iter__(loader))]


def test_copied_out_messages_free_their_slot_at_once(tmp_path) -> None:
    """What ``pin_memory=True`` does per message (the copy is page-locked where CUDA is)."""
    from expstore.loading.transport import FREE, _workers, open_message  # internals: slots

    store = filled_store(tmp_path)
    loader = _loader(store, batches_per_message=2)
    msgs = _messages(loader, 6)
    for m in msgs:
        slot_table = _workers[m.key]["control"]
        assert slot_table[m.slot] != FREE
        copied = m.copy_out(pin=False)
        assert slot_table[m.slot] == FREE  # released before the batch is even opened
        batches, host = open_message(copied)
        assert len(batches) == 2 and host["_expstore_stats"][0] == 2
        for b in batches:
            check_batch(b)
    loader.close()
    store.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a GPU machine)")
def test_pinned_batches_to_the_gpu(tmp_path) -> None:
    store = filled_store(tmp_path)
    loader = _loader(store, pin_memory=True, device="cuda", num_batches=20)
    for b in loader:
        assert b["obs"].is_cuda
        check_batch({k: v.cpu() for k, v in b.items()})
    loader.close()
    store.close()


def _check_sampled(batch, lane=0) -> None:
    """Every sample's newest obs frame is its anchor step's, its next_obs frame the next
    step's, and its extra field the anchor step: no cached frame of another step."""
    for i, s in enumerate(batch["step_id"].tolist()):
        assert decode_frame(batch["obs"][i, -1]) == (lane, s)
        assert decode_frame(batch["next_obs"][i, -1]) == (lane, s + 1)
        assert batch["step"][i] == s
        assert (batch["obs"][i, -1, 2:] == s % 7).all()


def test_in_process_sample_reads_through_a_bounded_frame_cache(tmp_path) -> None:
    store = make_store(tmp_path / "s.zarr", capacity=256, shard_rows=16)
    write(store, 0, 0, 200)
    store.close()
    budget = 64 << 10  # 64 frames of 1 KiB: smaller than the store
    with pytest.raises(ValueError, match="cache_bytes"):
        es.open(tmp_path / "s.zarr", cache_bytes=-1)
    store = es.open(tmp_path / "s.zarr", cache_bytes=budget)
    cache = store.reader.row_caches["obs"]
    assert 0 < cache.data.nbytes <= budget
    rows = np.flatnonzero(store.index.valid(np.arange(200), store.history, 1))[:12]
    first = store.transitions(rows)
    hits = store.reader.stats.row_cache_hits
    again = store.transitions(rows)  # the same frames: served from the cache
    assert store.reader.stats.row_cache_hits - hits >= len(rows)
    for k in first:
        assert np.array_equal(first[k], again[k])
    for _ in range(50):  # many more frames than the cache holds
        _check_sampled(store.sample(32))
    assert cache.data.nbytes <= budget
    store.close()
    off = es.open(tmp_path / "s.zarr", cache_bytes=0)  # no cache: the same batches
    assert not off.reader.row_caches["obs"]
    plain = off.transitions(rows)
    for k in first:
        assert np.array_equal(first[k], plain[k])
    off.close()


def test_staged_and_wrapped_rows_sampled_in_process_are_never_stale(tmp_path) -> None:
    """A writer samples its own store while it wraps the ring several times: unflushed
    rows come from RAM, and frames cached before a slot was rewritten are never served."""
    store = make_store(tmp_path / "s.zarr", capacity=64, shard_rows=16)
    write(store, 0, 0, 40)
    store.flush()
    staged = 0
    for t in range(40, 400, 7):
        write(store, 0, t, 7)
        if t % 3 == 0:
            store.flush()
        batch = store.sample(16)
        _check_sampled(batch)
        staged += int((batch["step_id"] >= store.writers[0].committed.count).sum())
    assert staged > 0  # unflushed rows were sampled
    assert store.reader.stats.row_cache_hits > 0  # through the frame cache
    store.close()
