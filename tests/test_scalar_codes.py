"""Scalars held as codes: a hot set past its budget at the fields' own widths holds flags
in 1 bit a row, a bounded discrete action in 4, a reward of few values in 8
(``storage/read/scalar_codes.py``), and gathers them with the other fields in one call.

Batches must equal, seed for seed, those of a store whose hot set holds every field at its
own width: with the C kernel and without it, for vector and frame observations, where a
shard's values overflow the code book (the field spills: the rest read from storage),
where values outside declared bounds were stored (``out_of_bounds="warn"``), and while a
writer in another process laps the ring.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_hot_set import same

import expstore as es
from expstore.loading.store_rows import StoreRows
from expstore.storage.native import native
from expstore.storage.read import hot_set
from expstore.storage.read.scalar_codes import (
    CodeBook,
    book_for,
    code_bits,
    learned,
    packed_bytes,
)

REWARDS = np.array([-1.0, 0.0, 1.0], np.float32)


def obs_of(g: int) -> np.ndarray:
    """The 2-byte observation naming transition ``g`` (below 65,536)."""
    return np.array([g % 256, g // 256], np.uint8)


def transition_of(obs: np.ndarray) -> np.ndarray:
    return obs[..., 0].astype(np.int64) + 256 * obs[..., 1].astype(np.int64)


def make_store(path, frames: bool = False, capacity: int = 4096, shard_rows: int = 64,
               action_high: int = 5, **kw):
    """Atari-like scalars (a discrete action in 0..``action_high``, rewards of -1/0/+1,
    two flags) and a 2-byte observation: a vector in multi-row chunks, or with
    ``frames`` a 2-byte image stored one row per chunk."""
    obs = (es.Field((2, 1), np.uint8, chunk_rows=1) if frames
           else es.Field((2,), np.uint8))
    spec = es.Spec.create(obs=obs, action=es.Field((), np.int64, low=0, high=action_high,
                                                   out_of_bounds=kw.pop("oob", "raise")))
    return es.create(path, spec, capacity=capacity, shard_rows=shard_rows, fsync=False,
                     **kw)


def action_of(g: int) -> int:
    return g % 6


def reward_of(g: int) -> float:
    return float(REWARDS[g % 3])


def write(store, start: int, n: int, reward=reward_of, action=action_of) -> None:
    """Transitions ``start .. start + n`` (see :func:`check`)."""
    shape = store.layout.fields["obs"].shape
    for g in range(start, start + n):
        store.add(obs_of(g).reshape(shape), action(g), reward(g),
                  obs_of(g + 1).reshape(shape), g % 50 == 49, g % 70 == 69 and g % 50 != 49)


def check(batch: dict, reward=reward_of, action=action_of) -> None:
    """Every field of a sample belongs to the transition its obs names."""
    g = transition_of(batch["obs"].reshape(len(batch["obs"]), -1))
    assert (transition_of(batch["next_obs"].reshape(len(g), -1)) == g + 1).all()
    assert (batch["action"] == [action(int(x)) for x in g]).all()
    assert (batch["reward"] == np.array([reward(int(x)) for x in g], np.float32)).all()
    assert (batch["terminated"] == (g % 50 == 49)).all()
    assert (batch["truncated"] == ((g % 70 == 69) & (g % 50 != 49))).all()


def tables(store) -> dict:
    return {n: t for n, t in store.source.reader.tables.items() if n in store.layout.spec.fields}


def compare(whole, part, n: int = 40, bs: int = 32, **kw) -> None:
    """``n`` batches of ``part`` equal ``whole``'s seed for seed, after ``n`` to warm up."""
    for seed in range(n):
        whole.sample(bs, rng=np.random.default_rng(1000 + seed))
        part.sample(bs, rng=np.random.default_rng(1000 + seed))
    for seed in range(n):
        a = whole.sample(bs, rng=np.random.default_rng(seed))
        b = part.sample(bs, rng=np.random.default_rng(seed))
        check(b, **kw)
        same(a, b)


# -- the code book ------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", ["bool", "int8", "int64", "uint64", "float32", "float64"])
def test_a_code_book_gives_back_every_value_bit_for_bit(bits, dtype):
    rng = np.random.default_rng(bits)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        pool = np.array([False, True])
    elif dt.kind == "f":
        nan = np.array([0x7FC00001 if dt.itemsize == 4 else 0x7FF8000000000001],
                       f"u{dt.itemsize}").view(dt)
        pool = np.concatenate([np.array([-0.0, 0.0, np.inf, -1.5], dt), nan])
    else:
        info = np.iinfo(dt)
        pool = np.array([info.min, info.max, 0, 1, info.max - 1], dt)
    pool = pool[: 1 << bits]
    book = CodeBook(dt, bits)
    for n in (1, 7, 64, 133):
        values = pool[rng.integers(0, len(pool), n)]
        out = np.full(packed_bytes(n, bits) + 3, 0xFF, np.uint8)
        assert book.encode(values, out)
        assert not out[packed_bytes(n, bits):].any()  # (the rest zeroed)
        at = np.arange(n, dtype=np.int64)
        got = book.decode(out[(at * bits) >> 3], at)
        assert got.dtype == dt and got.tobytes() == values.tobytes()


def test_a_full_book_refuses_new_values_and_stays_as_it_was():
    book = CodeBook(np.float32, 2)
    out = np.zeros(8, np.uint8)
    assert book.encode(np.array([1, 2, 3], np.float32), out)
    before = book.table.copy(), book.size
    assert not book.encode(np.array([1, 4, 5], np.float32), out)  # 5 values, room for 4
    assert book.size == before[1] and np.array_equal(book.table, before[0])
    assert book.encode(np.array([3, 4, 1], np.float32), out)  # one more still fits
    assert book.size == 4


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_a_book_fixed_by_declared_bounds_codes_them_and_refuses_the_rest(bits):
    book = book_for(np.int64, bits, low=-3, high=-3 + (1 << bits) - 1)
    assert book.low == -3 and book.size == 1 << bits
    values = np.arange(-3, -3 + (1 << bits), dtype=np.int64)
    out = np.zeros(packed_bytes(len(values), bits), np.uint8)
    assert book.encode(values, out)
    at = np.arange(len(values), dtype=np.int64)
    assert np.array_equal(book.decode(out[(at * bits) >> 3], at), values)
    for bad in (-4, -3 + (1 << bits)):  # (stored with out_of_bounds="warn")
        assert not book.encode(np.array([0, bad], np.int64), out)
    flags = book_for(np.bool_, 1)
    assert flags.low == 0 and flags.table.tolist() == [False, True]
    assert book_for(np.float32, 8).low is None  # (learned)


SHARD_CASES = [  # (dtype, bits, low: None for a learned book, values drawn from)
    ("bool", 1, 0, [False, True]),
    ("int64", 2, -3, [-3, -2, -1, 0]),
    ("int8", 4, 100, list(range(100, 116))),
    ("uint16", 8, 7, list(range(7, 263))),
    ("uint64", 2, 5, [5, 6, 7, 8]),
    ("int64", 1, -(1 << 62), [-(1 << 62), -(1 << 62) + 1]),
    ("int64", 8, None, [-(1 << 63), (1 << 63) - 1, 0, 5]),
    ("uint64", 8, None, [(1 << 64) - 1, 1 << 63, 0]),
    ("float32", 4, None, [-0.0, 0.0, np.inf, 1.5]),
    ("float64", 8, None, [np.nan, -1.0, 2.0]),
]


@pytest.mark.parametrize("dtype,bits,low,pool", SHARD_CASES)
@pytest.mark.parametrize("kernel", [True, False])
def test_shards_coded_in_one_call_match_one_at_a_time(dtype, bits, low, pool, kernel,
                                                       monkeypatch):
    """``encode_shards`` (one kernel call, ``scalar_codes.h``; or its numpy fallback) codes
    each shard, zeroes the rest of its slot, and grows a learned book exactly as
    ``encode`` shard by shard; it stops at the first shard the book cannot hold (a value
    outside a fixed book, a learned book's 2**bits + 1st value), leaving the book as it
    was before that shard."""
    from expstore.storage.native import kernels
    if not kernel:
        monkeypatch.setattr(kernels, "native", None)
    elif native is None:
        pytest.skip("the C kernels are not built")
    dt = np.dtype(dtype)
    rng = np.random.default_rng(bits)
    counts = np.array([37, 64, 0, 1, 50], np.int64)
    src = np.array(pool, dt)[rng.integers(0, len(pool), int(counts.sum()) + 5)]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) + 3
    slot_bytes = packed_bytes(512, bits) + 2  # (512 rows a slot)
    slots = np.array([4, 0, 2, 1, 3], np.int64)
    book = book_for(dt, bits, low, None if low is None else low + (1 << bits) - 1)
    ref = book_for(dt, bits, low, None if low is None else low + (1 << bits) - 1)
    pool_c = np.full((6, slot_bytes), 0xAB, np.uint8)
    pool_ref = pool_c.copy()
    assert book.encode_shards(src, starts, counts, pool_c, slots) == len(slots)
    for at, n, slot in zip(starts, counts, slots, strict=True):
        assert ref.encode(src[at:at + n], pool_ref[slot])
    if low is not None:  # a fixed book: the same codes
        assert np.array_equal(pool_c, pool_ref)  # (slot 5, not asked for, untouched)
    else:  # a learned book: the same values, given codes in an order of its own
        assert book.size == ref.size
        keys = book.table.view(f"u{dt.itemsize}")[:book.size].astype(np.int64).tolist()
        assert sorted(keys) == sorted(ref._code) and book._code == {
            k: c for c, k in enumerate(keys)}
        assert (pool_c[5] == 0xAB).all()
        assert all((pool_c[s][packed_bytes(n, bits):] == 0).all()
                   for s, n in zip(slots, counts, strict=True))
    at = np.arange(64, dtype=np.int64)
    for k in (0, 1, 4):  # each shard's values come back bit for bit
        got = book.decode(pool_c[slots[k]][(at[:counts[k]] * bits) >> 3], at[:counts[k]])
        assert got.tobytes() == src[starts[k]:starts[k] + counts[k]].tobytes()
    # a shard the book cannot hold: a value past a fixed book, or one value too many
    if low is not None:
        bad = np.array([low + (1 << bits)] if dt.kind != "b" else [], dt)
    else:
        bad = (rng.permutation(300) + 1000).astype(dt)  # (past the book's 2**bits values)
    if not len(bad):
        return  # (a bool holds every value it can take)
    src2 = np.concatenate([src[:20], bad, src[:10]])
    size, table = book.size, book.table.tobytes()
    done = book.encode_shards(src2, np.array([0, 20], np.int64),
                              np.array([20, len(src2) - 20], np.int64), pool_c,
                              np.array([0, 1], np.int64))
    assert done == 1
    assert book.size == size and book.table[:size].tobytes() == table[:size * dt.itemsize]
    assert len(book._code) == (0 if low is not None else size)


def test_code_widths_from_the_spec():
    assert code_bits((), np.bool_) == 1
    assert code_bits((), np.int64, 0, 1) == 1
    assert code_bits((), np.int64, 0, 3) == 2
    assert code_bits((), np.int64, 0, 5) == 4  # an Atari action set
    assert code_bits((), np.int64, -3, 14) == 8  # 18 actions
    assert code_bits((), np.float32) == 8
    assert code_bits((3,), np.float32) is None  # vectors keep their width
    assert code_bits((), np.complex64) is None
    assert not learned(np.bool_) and not learned(np.int64, 0, 17)
    assert learned(np.float32) and learned(np.int64) and learned(np.int64, 0, 1000)


# -- stores past their budget -------------------------------------------------------------


#: raw: 16 B a row (obs 2, action 8, reward 4, flags 2), 64 KiB for 4096 rows; as codes
#: 3.75 B a row (obs 2, action 4 bits, reward 8, flags 1 each), 15,360 bytes
BUDGET = 20_000


@pytest.mark.parametrize("frames", [False, True], ids=["vector-obs", "frame-obs"])
def test_scalars_past_the_budget_are_held_as_codes(tmp_path, general_reads, frames):
    path = tmp_path / "s.zarr"
    store = make_store(path, frames=frames)
    write(store, 0, 5000)  # (wraps the 4096-row ring)
    store.close()
    whole, part = es.open(path), es.open(path, hot_bytes=BUDGET)
    assert all(t.code is None for t in tables(whole).values())
    bits = {n: t.code and t.code.bits for n, t in tables(part).items()}
    assert bits == {"obs": None, "action": 4, "reward": 8, "terminated": 1, "truncated": 1}
    assert all(part.source.held_whole[n] is not False for n in bits)
    compare(whole, part)
    held = tables(part)
    assert all(t.holds_whole is not False and not t.spilled for t in held.values())
    assert sum(t.values.nbytes for t in held.values()) <= BUDGET
    assert held["reward"].code.size == 3 and held["action"].code.low == 0  # (fixed: 0..15)
    if not frames:  # (a frame batch reads its stacks the general way)
        general_reads[0] = 0
        compare(whole, part, n=20)
        assert general_reads[0] == 0
    whole.close()
    part.close()


@pytest.mark.parametrize("shard_rows", [64, 48])  # (48: the kernel divides, no shift)
def test_batches_without_the_kernel_gather_the_same(tmp_path, monkeypatch, general_reads,
                                                    shard_rows):
    path = tmp_path / "s.zarr"
    store = make_store(path, shard_rows=shard_rows)
    write(store, 0, 3000)
    store.close()
    whole, part = es.open(path), es.open(path, hot_bytes=BUDGET)
    compare(whole, part, n=30)  # (filled by the kernel)
    served = []
    real = StoreRows.gather_held
    monkeypatch.setattr(StoreRows, "gather_held",
                        lambda self, *a: served.append(real(self, *a)) or served[-1])
    general_reads[0] = 0
    compare(whole, part, n=30)  # (gathered by the kernel: one call a batch)
    assert general_reads[0] == 0 and len(served) == 120 and all(served)
    monkeypatch.setattr(hot_set, "native", None)  # gathered by numpy
    compare(whole, part, n=30)
    whole.close()
    part.close()


def test_a_reward_of_many_values_keeps_its_width(tmp_path):
    path = tmp_path / "s.zarr"
    store = make_store(path)
    write(store, 0, 3000, reward=lambda g: g / 7)
    store.close()
    part = es.open(path, hot_bytes=BUDGET)
    t = tables(part)
    assert t["reward"].code is None and t["terminated"].code.bits == 1
    part.close()


def sparse_reward(g: int) -> float:
    """Few values in the shards ``few_values`` reads at open (0, 32 and 63 of 64-row
    shards in a 4096-row ring), a new value every 10th step elsewhere: ~6 a shard, so
    the 256-value book fills after ~40 of them."""
    return float(g % 3) if (g % 4096) // 64 in (0, 32, 63) or g % 10 else 0.5 + g


def test_values_the_book_cannot_hold_spill_to_storage(tmp_path, general_reads):
    path = tmp_path / "s.zarr"
    store = make_store(path)
    write(store, 0, 4096, reward=sparse_reward)
    store.close()
    whole, part = es.open(path), es.open(path, hot_bytes=BUDGET)
    reward = tables(part)["reward"]
    assert reward.code is not None and part.source.held_whole["reward"]
    compare(whole, part, reward=sparse_reward)
    assert reward.spilled and part.source.held_whole["reward"] is False
    assert 0 < int((reward.first >= 0).sum()) < 64  # what it holds it still serves
    assert part.source.held_whole["terminated"]
    general_reads[0] = 0
    compare(whole, part, n=20, reward=sparse_reward)
    assert general_reads[0] == 0  # (the spilled rows: one read_fields call a batch)
    whole.close()
    part.close()


def test_values_stored_past_declared_bounds_are_read_at_their_width(tmp_path):
    """An action declared 0..1 (1 bit) that was stored with ``out_of_bounds="warn"``
    holding 0..5: the first shard read overflows the book, and the field is held at its
    own width within the same bytes."""
    path = tmp_path / "s.zarr"
    store = make_store(path, action_high=1, oob="warn")
    with pytest.warns(UserWarning):
        write(store, 0, 3000)
    store.close()
    whole, part = es.open(path), es.open(path, hot_bytes=BUDGET)
    action = tables(part)["action"]
    assert action.code.bits == 1
    compare(whole, part)
    assert action.code is None
    whole.close()
    part.close()


@pytest.mark.skipif(native is None, reason="the C kernels are not built")
def test_the_kernel_refuses_a_code_it_cannot_read():
    n_shards, rows = 2, 8
    first = np.zeros(n_shards, np.int64)
    n_rows = np.full(n_shards, rows, np.int64)
    trusted = np.full(n_shards, 100, np.int64)
    slot = np.arange(n_shards, dtype=np.int64)
    values = np.zeros(n_shards * rows, np.uint8)
    out = np.zeros(2, np.float32)
    locs = ((np.array([0, 1], np.int64), np.array([0, 1], np.int64)),)
    known = np.zeros(1, np.int64)
    for code, msg in [((3, np.zeros(8 * 4, np.uint8)), "bits 1, 2, 4 or 8"),
                      ((2, np.zeros(3 * 4, np.uint8)), "2\\*\\*bits rows"),
                      ((2,), "code is")]:
        with pytest.raises((ValueError, TypeError), match=msg):
            native.gather_held(rows, n_shards, known, locs,
                               ((0, first, n_rows, trusted, slot, values, out, code),), True)
    table = np.array([7, 8, 9, 10], np.float32)
    values[0] = 0b1110  # rows 0, 1 of shard 0: codes 2, 3
    assert native.gather_held(rows, n_shards, known, locs,
                              ((0, first, n_rows, trusted, slot, values, out,
                                (2, table.view(np.uint8))),), True)
    assert out.tolist() == [9.0, 10.0]


def lapping_writer(path) -> subprocess.Popen:
    """A process lapping the ring of the store at ``path`` (holding rows 0-4999) twice, a
    flush every 300 rows; it prints the rows it reached."""
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = {[os.path.dirname(__file__), *sys.path]!r}
        import expstore as es
        from test_scalar_codes import write
        store = es.open({str(path)!r}, "r+", fsync=False)
        g = 5000
        while g < 5000 + 2 * 4096:
            write(store, g, 300)
            g += 300
            store.flush()
        store.close()
        print(g)
    """)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("run", range(2))
def test_codes_stay_right_while_another_process_laps_the_ring(tmp_path, run):
    path = tmp_path / "s.zarr"
    store = make_store(path)
    write(store, 0, 5000)
    store.close()
    reader = es.open(path, hot_bytes=BUDGET)
    assert tables(reader)["reward"].code is not None
    writer = lapping_writer(path)
    sampler = es.UniformSampler(reader, seed=run, refresh_every=0)
    batches, newest = 0, 0
    try:
        while writer.poll() is None:
            batch = sampler.sample(64)
            check(batch)
            newest = max(newest, int(transition_of(batch["obs"]).max()))
            batches += 1
    finally:
        out, _ = writer.communicate(timeout=120)
    assert writer.returncode == 0 and int(out) >= 5000 + 2 * 4096
    for _ in range(20):
        batch = sampler.sample(64)
        check(batch)
        newest = max(newest, int(transition_of(batch["obs"]).max()))
    assert batches > 5 and newest > 5000 + 4096  # (rows of its second lap were read)
    reader.close()


def test_a_shard_the_probe_cannot_read_is_passed_over(tmp_path):
    """``few_values`` reads 3 shards of the reward at open; one of them damaged (its
    bytes flipped) or missing leaves the guess to the others, and the store opens."""
    path = tmp_path / "s.zarr"
    store = make_store(path)
    write(store, 0, 4096)
    L = store.layout
    store.close()
    first = path / L.shard_key("reward", 0)
    raw = bytearray(first.read_bytes())
    raw[len(raw) // 2:] = bytes(b ^ 0xFF for b in raw[len(raw) // 2:])
    first.write_bytes(bytes(raw))
    (path / L.shard_key("reward", 63)).unlink()
    part = es.open(path, hot_bytes=BUDGET)
    assert tables(part)["reward"].code is not None  # (shard 32 alone: 3 values)
    part.close()
