"""The C batch decoder against numcodecs, and on corrupt input.

``EXPSTORE_REQUIRE_NATIVE=1`` (set by CI) turns a missing kernel into a failure instead of
a skip, so CI proves the extension builds and the batch path is the one tested.
"""

from __future__ import annotations

import os
import tempfile

import crc32c
import numpy as np
import pytest
from numcodecs import blosc

try:
    from expstore.storage.native import _kernels as K  # internals: the C kernel
except ImportError:  # pragma: no cover
    K = None

if K is None and os.environ.get("EXPSTORE_REQUIRE_NATIVE"):
    raise RuntimeError("expstore.storage.native._kernels was not built (EXPSTORE_REQUIRE_NATIVE=1)")
pytestmark = pytest.mark.skipif(K is None, reason="C kernel not built")


def _decode(blob: bytes, nbytes: int, checksum: bool = False) -> tuple[int, np.ndarray]:
    out = np.zeros(max(nbytes, 1), np.uint8)
    status, _ = K.decode_blobs([blob], np.zeros(1, np.int64), out, max(nbytes, 1), checksum)
    return status, out[:nbytes]


def test_crc32c_matches_reference() -> None:
    rng = np.random.default_rng(0)
    assert K.crc32c(b"123456789") == 0xE3069283
    for n in (0, 1, 7, 8, 9, 100, 4099):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert K.crc32c(data) == crc32c.crc32c(data)


@pytest.mark.parametrize("cname", ["lz4", "lz4hc"])
@pytest.mark.parametrize("shuffle", [0, 1])
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.int64])
def test_decodes_what_numcodecs_encodes(cname: str, shuffle: int, dtype: type) -> None:
    rng = np.random.default_rng(1)
    for n in (1, 100, 7056, 40_000):  # one block, several blocks and a leftover block
        for kind in ("runs", "noise", "small", "mixed", "period2", "period3", "period4",
                     "period5", "period7", "period11", "period16", "period17", "period37"):
            if kind == "runs":
                a = np.repeat(rng.integers(0, 9, n // 40 + 1), 40)[:n].astype(dtype)
            elif kind == "mixed":  # pieces of periods 1-20 bytes: every LZ4 copy path
                pieces, size = [], 0
                while size < n:
                    p, k = int(rng.integers(1, 21)), int(rng.integers(3, 60))
                    piece = np.tile(rng.integers(0, 255, p), k)
                    pieces.append(piece[: int(rng.integers(1, p * k + 1))])
                    size += len(pieces[-1])
                raw = np.concatenate(pieces).astype(np.uint8)
                raw = np.resize(raw, n * np.dtype(dtype).itemsize)
                a = raw.view(dtype)  # (as bytes: float32 NaNs among them)
            elif kind.startswith("period"):  # matches at distances of 2 to 296 bytes
                p = int(kind[6:])
                a = np.tile(rng.integers(0, 255, p), n // p + 1)[:n].astype(dtype)
            elif kind == "noise":  # incompressible: stored raw (memcpyed)
                a = rng.integers(0, 255, n).astype(dtype)
            else:
                a = rng.integers(0, 4, n).astype(dtype)
            for blocksize in (0, 1024):
                enc = blosc.compress(a, cname.encode(), 5, shuffle, blocksize)
                status, out = _decode(enc, a.nbytes)
                assert status == K.STATUS_OK, (cname, shuffle, dtype, n, kind, blocksize)
                assert out.tobytes() == a.tobytes(), (cname, shuffle, dtype, n, kind, blocksize)


def test_other_codecs_are_refused_not_misread() -> None:
    a = np.repeat(np.arange(50, dtype=np.int32), 100)  # compressible: not stored raw
    for cname, shuffle in (("zstd", 0), ("blosclz", 0), ("lz4", 2)):
        status, _ = _decode(blosc.compress(a, cname.encode(), 5, shuffle, 0), a.nbytes)
        assert status == K.STATUS_UNSUPPORTED, (cname, shuffle)


def test_checksum_is_checked_before_decoding() -> None:
    frame = np.repeat(np.arange(7056 // 42, dtype=np.uint8), 42)
    enc = blosc.compress(frame, b"lz4", 5, 0, 0)
    good = enc + crc32c.crc32c(enc).to_bytes(4, "little")
    status, out = _decode(good, frame.nbytes, checksum=True)
    assert status == K.STATUS_OK and np.array_equal(out, frame)
    flipped = bytearray(good)
    flipped[len(enc) // 2] ^= 1
    assert _decode(bytes(flipped), frame.nbytes, checksum=True)[0] == K.STATUS_CHECKSUM
    assert _decode(good[:3], frame.nbytes, checksum=True)[0] == K.STATUS_CHECKSUM


def test_corrupt_frames_never_crash_or_overrun() -> None:
    """Random byte flips and truncations: a status, never a crash; the bytes around the
    destination row stay untouched."""
    rng = np.random.default_rng(2)
    frame = np.repeat(rng.integers(0, 9, 202), 35).astype(np.uint8)[:7056]
    frame[::7] = rng.integers(0, 255, len(frame[::7]))
    enc = blosc.compress(frame, b"lz4", 5, 0, 0)
    statuses = set()
    out = np.full((3, 7056), 0xAB, np.uint8)
    for _ in range(20_000):
        b = bytearray(enc)
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        if rng.random() < 0.2:
            b = b[: int(rng.integers(0, len(b)))]
        status, _ = K.decode_blobs([bytes(b)], np.ones(1, np.int64), out, 7056, False)
        statuses.add(status)
        assert (out[0] == 0xAB).all() and (out[2] == 0xAB).all()
    assert K.STATUS_CORRUPT in statuses


def test_pread_batch_reads_ranges_of_files() -> None:
    rng = np.random.default_rng(3)
    frames = [np.repeat(rng.integers(0, 9, 168), 42).astype(np.uint8) for _ in range(6)]
    blobs = [blosc.compress(f, b"lz4", 5, 0, 0) for f in frames]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "chunks")
        with open(path, "wb") as fh:
            fh.write(b"x" * 13 + b"".join(blobs))
        fd = os.open(path, os.O_RDONLY)
        try:
            starts = np.cumsum([13] + [len(b) for b in blobs[:-1]]).astype(np.int64)
            sizes = np.array([len(b) for b in blobs], np.int64)
            dst = np.array([5, 4, 3, 2, 1, 0], np.int64)
            out = np.zeros((6, 7056), np.uint8)
            status, _, nbytes = K.decode_pread(np.full(6, fd, np.int32), starts, sizes, dst,
                                               out, 7056, False)
            assert status == K.STATUS_OK and nbytes == sizes.sum()
            for i, f in enumerate(frames):
                assert np.array_equal(out[dst[i]], f)
            # reading past the end of the file is a read error, not a decode of garbage
            status, bad, _ = K.decode_pread(np.full(1, fd, np.int32), starts[-1:] + 9,
                                            sizes[-1:], dst[:1], out, 7056, False)
            assert (status, bad) == (K.STATUS_READ, 0)
            # a destination row outside ``out`` is refused
            status, _, _ = K.decode_pread(np.full(1, fd, np.int32), starts[:1], sizes[:1],
                                          np.array([6], np.int64), out, 7056, False)
            assert status == K.STATUS_BOUNDS
        finally:
            os.close(fd)


def test_argument_errors_are_clear() -> None:
    out = np.zeros((1, 8), np.uint8)
    with pytest.raises(ValueError, match="one entry per chunk"):
        K.decode_pread(np.zeros(2, np.int32), np.zeros(1, np.int64), np.zeros(1, np.int64),
                       np.zeros(1, np.int64), out, 8, False)
    with pytest.raises(ValueError, match="one entry per blob"):
        K.decode_blobs([b"x", b"y"], np.zeros(1, np.int64), out, 8, False)
    with pytest.raises(BufferError):
        K.decode_blobs([b"x"], np.zeros(1, np.int64), b"read-only", 8, False)


def test_copy_rows_gathers_and_scatters_with_bounds_checks() -> None:
    from expstore.storage.native import copy_rows

    src = np.arange(5 * 3 * 4, dtype=np.float32).reshape(5, 3, 4)
    out = np.zeros((4, 3, 4), np.float32)
    copy_rows(src, np.array([4, 0, 4, 2]), out)  # gather: out[i] = src[rows[i]]
    assert np.array_equal(out, src[[4, 0, 4, 2]])
    dst = np.zeros((6, 3, 4), np.float32)
    copy_rows(src, np.array([1, 3]), dst, np.array([5, 0]))  # scatter into chosen rows
    assert np.array_equal(dst[5], src[1]) and np.array_equal(dst[0], src[3])
    assert not dst[1:5].any()
    with pytest.raises(IndexError):
        K.copy_rows(src, np.array([5], np.int64), out, None, 48)
    with pytest.raises(IndexError):
        K.copy_rows(src, np.array([0], np.int64), out, np.array([4], np.int64), 48)
    assert not dst[1:5].any()


def test_same_bytes_and_copy_into_with_and_without_the_step_kernel(monkeypatch) -> None:
    """``kernels.same_bytes`` / ``copy_into`` (one memcmp / memcpy holding the GIL in the step
    kernel) agree with numpy, for contiguous arrays and, through numpy, for others."""
    from expstore.storage.native import kernels

    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (4, 84, 84), np.uint8)
    for native in (True, False):
        if not native:
            monkeypatch.setattr(kernels, "_same_bytes", None)
            monkeypatch.setattr(kernels, "_copy_bytes", None)
        b = a.copy()
        assert kernels.same_bytes(a[1:], b[1:]) and kernels.same_bytes(a, b)
        b[3, 83, 83] ^= 1
        assert not kernels.same_bytes(a, b) and kernels.same_bytes(a[:3], b[:3])
        assert not kernels.same_bytes(a[1:], a[:-1])
        assert kernels.same_bytes(a[:, ::2], a.copy()[:, ::2])  # not contiguous: numpy
        dst = np.zeros_like(a)
        kernels.copy_into(dst[1:], a[:-1])
        assert np.array_equal(dst[1:], a[:-1]) and not dst[0].any()
        half = np.zeros((4, 84, 42), np.uint8)
        kernels.copy_into(half, a[:, :, ::2])  # a strided source: numpy
        assert np.array_equal(half, a[:, :, ::2])
