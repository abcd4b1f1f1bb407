"""Batch buffers used again (``expstore.loading.scratch``): never while anything refers to
them, so a batch the caller keeps, or a tensor made from it, keeps its values."""

from __future__ import annotations

import threading

import numpy as np
import torch
from test_batch_path import make_store, write

from expstore.loading import scratch

N = scratch.MIN_BYTES  # a buffer the pool takes


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_buffer_is_used_again_only_once_nothing_refers_to_it() -> None:
    assert scratch._ALONE is not None  # (CPython with its GIL: reference counts are exact)
    a = scratch.empty((N,), np.uint8)
    first = _addr(a)
    b = scratch.empty((N,), np.uint8)
    assert _addr(b) != first  # a still held
    del a
    c = scratch.empty((N // 2,), np.int16)  # the same bytes, another dtype
    assert _addr(c) == first
    view = c[10:20]
    del c
    d = scratch.empty((N,), np.uint8)  # the view holds the buffer
    assert _addr(d) not in (first, _addr(b))
    del view
    assert _addr(scratch.empty((N,), np.uint8)) == first
    small = scratch.empty((16,), np.float32)  # below MIN_BYTES: not pooled
    assert small.base is None


def test_each_thread_has_its_own_buffers() -> None:
    scratch.empty((N,), np.uint8)  # (dropped: free in this thread's pool)
    mine = _addr(scratch.empty((N,), np.uint8))
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(_addr(scratch.empty((N,), np.uint8))))
    t.start()
    t.join()
    assert theirs[0] != mine


def test_free_buffers_kept_stay_within_the_bound() -> None:
    held = [scratch.empty((n << 20,), np.uint8) for n in (9, 17, 25, 33)]
    assert sum(b.nbytes for b in scratch._pool.buffers) > scratch.MAX_KEPT_BYTES  # all held
    del held
    scratch.empty((1 << 20,), np.uint8)  # a new allocation trims what is free
    kept = sum(b.nbytes for b in scratch._pool.buffers)
    assert kept <= scratch.MAX_KEPT_BYTES


def test_batches_the_caller_keeps_keep_their_values(tmp_path) -> None:
    """Batches of stacked frames (256 KiB per column: pooled) sampled while earlier ones
    are kept, as arrays, as views and as tensors: none changes."""
    store = make_store(tmp_path / "s.zarr", capacity=1024, shard_rows=64)
    write(store, 0, 0, 900)
    store.flush()
    rng = np.random.default_rng(0)
    kept = store.sample(64, rng=rng)
    assert kept["obs"].nbytes >= scratch.MIN_BYTES
    copy = {k: v.copy() for k, v in kept.items()}
    view = store.sample(64, rng=rng)["next_obs"][5:9]
    view_copy = view.copy()
    tensor = torch.from_numpy(store.sample(64, rng=rng)["obs"])
    tensor_copy = tensor.clone()
    reused = set()
    for _ in range(30):
        batch = store.sample(64, rng=rng)
        reused.add(_addr(batch["obs"]))
        assert not np.shares_memory(batch["obs"], kept["obs"])
        assert not np.shares_memory(batch["next_obs"], view)
        del batch
    assert len(reused) <= 4  # dropped batches' buffers were used again
    for k, v in kept.items():
        assert np.array_equal(v, copy[k]), k
    assert np.array_equal(view, view_copy)
    assert torch.equal(tensor, tensor_copy)
    store.close()


def test_a_caller_keeping_many_batches_does_not_grow_the_pool_past_its_bound() -> None:
    held = [scratch.empty((9 << 20,), np.uint8) for _ in range(40)]  # (pages never touched)
    assert sum(b.nbytes for b in scratch._pool.buffers) <= scratch.MAX_POOL_BYTES
    assert len({_addr(a) for a in held}) == 40  # every one its own memory
    del held
    scratch.empty((N,), np.uint8)
    assert sum(b.nbytes for b in scratch._pool.buffers) <= scratch.MAX_KEPT_BYTES
