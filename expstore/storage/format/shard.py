"""Zarr v3 sharding-codec shards, assembled and parsed by hand (docs/architecture.md §3).

Layout of one shard object (``index_location="start"``)::

    [ index: n_chunks x (offset u64, nbytes u64) | crc32c u32 ]  [ header 32 B ]  [ chunks ]

The index is exactly what the zarr v3 sharding spec asks for, so plain ``zarr`` reads every
shard. The header sits in bytes no index entry points at (zarr never reads it): it records
``first_step`` (the lane step of the shard's row 0 in this lap) and ``n_rows`` written, so a
reader can prove that the version it holds contains the step it was asked for. The header
also carries the crc32c of the index it was written with (in bytes older versions left
zero): a header read with another version's index (a torn read of a shard rewritten in
place, see ``ShardImage``) is refused, and the reader reads again.

Checksums (stores made with ``Layout.checksum``, flag ``CHECKSUMS`` in the header): every
inner chunk ends with the crc32c of its bytes (zarr's ``crc32c`` codec, declared in the array
metadata, so zarr checks it too) and the header carries the crc32c of its other bytes. With
the index's own crc32c, every byte that matters is covered: a flipped bit anywhere is found.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import crc32c
import numcodecs
import numpy as np

from ...errors import ChecksumError

MAGIC = b"EXPS"
#: magic, version, flags, first_step, n_rows, crc32c of the header, crc32c of the index
HEADER = struct.Struct("<4sHHqiII4x")
HEADER_SIZE = HEADER.size  # 32 bytes
CHECKSUMS = 1  # header flag: inner chunks end with a crc32c, the header crc32c is set
FORMAT_VERSION = 1
EMPTY = np.uint64(2**64 - 1)

numcodecs.blosc.use_threads = False  # one frame per call: blosc's own threads only cost


def index_size(n_chunks: int) -> int:
    """Bytes of the shard index (16 B per inner chunk + 4 B crc32c)."""
    return 16 * n_chunks + 4


#: blosc block size (bytes) of the chunks of small fields (many rows per chunk): a row is
#: decoded with the block holding it, so a 32 KiB chunk of int64 actions costs a 4 KiB
#: decode per row, not a 32 KiB one (each blosc frame records its own block size, so
#: readers of any version decode either)
SMALL_BLOCK_BYTES = 4096


def _forced_block(target: int, typesize: int) -> int:
    """The ``blocksize`` to ask blosc for blocks of at most ``target`` bytes. Blosc (1.x,
    as numcodecs 0.16 bundles it) keeps a forced size only for blocks it does not split
    in byte planes: unshuffled, or of under 128 items; it takes a larger one to mean the
    whole chunk. So shuffled types get blocks of 127 items (1,016 B of int64, 508 B of
    float32); a 32 KiB chunk of int64 actions compresses to 4,982 B instead of 3,761."""
    if target <= 0:
        return 0
    t = max(1, typesize)
    return target if t == 1 else min(target, 127 * t)


def make_codec(cfg: dict[str, Any], itemsize: int, blocksize: int = 0) -> numcodecs.abc.Codec:
    """numcodecs codec for a field's codec dict (``blosc``, ``zstd``, ``none``);
    ``blocksize``: blosc's block size in bytes (0: blosc picks), unless ``cfg`` names one."""
    name = cfg.get("name", "blosc")
    if name == "blosc":
        return numcodecs.Blosc(
            cname=cfg.get("cname", "lz4"),
            clevel=int(cfg.get("clevel", 5)),
            shuffle=numcodecs.Blosc.NOSHUFFLE if itemsize == 1 else numcodecs.Blosc.SHUFFLE,
            blocksize=int(cfg.get("blocksize", _forced_block(blocksize, itemsize))),
        )
    if name == "zstd":
        return numcodecs.Zstd(level=int(cfg.get("level", 1)))
    if name == "none":
        return _Raw()
    raise ValueError(f"codec.name: expected 'blosc', 'zstd' or 'none', got {name!r}")


def _strip_crc(blob: Any) -> memoryview:
    """The chunk bytes before its crc32c, after checking it (:class:`ChecksumError`)."""
    mv = memoryview(blob)
    if len(mv) < 4 or crc32c.crc32c(mv[:-4]) != int.from_bytes(mv[-4:], "little"):
        raise ChecksumError("inner chunk fails its crc32c check")
    return mv[:-4]


class Checked(numcodecs.abc.Codec):
    """``inner`` followed by zarr's ``crc32c`` codec: 4 bytes of crc32c after each chunk."""

    codec_id = "expstore_crc32c"

    def __init__(self, inner: numcodecs.abc.Codec) -> None:
        self.inner = inner

    def encode(self, buf: Any) -> bytes:
        enc = self.inner.encode(buf)
        return bytes(enc) + struct.pack("<I", crc32c.crc32c(enc))

    def decode(self, buf: Any, out: Any = None) -> Any:
        return self.inner.decode(_strip_crc(buf), out=out)


def encoder(codec: numcodecs.abc.Codec) -> Callable[[np.ndarray], bytes]:
    """``encode(chunk)``: the bytes ``codec.encode(chunk)`` gives for a C-contiguous array.

    For Blosc (and ``Checked(Blosc)``) it calls ``numcodecs.blosc.compress`` directly,
    skipping numcodecs' per-call wrapping: an 84x84 frame encodes in ~6 instead of ~12 µs
    with lz4 (benchmarks/RESULTS.md, "Datasets: Dopamine import profile").
    """
    checked = isinstance(codec, Checked)
    inner = codec.inner if checked else codec
    if not isinstance(inner, numcodecs.Blosc):
        return codec.encode
    from numcodecs import blosc

    cname = inner.cname.encode() if isinstance(inner.cname, str) else inner.cname
    args = (cname, int(inner.clevel), int(inner.shuffle), int(inner.blocksize))
    compress = blosc.compress
    if not checked:
        return lambda chunk: compress(chunk, *args)

    def encode_checked(chunk: np.ndarray) -> bytes:
        enc = compress(chunk, *args)
        return enc + crc32c.crc32c(enc).to_bytes(4, "little")

    return encode_checked


def rows_encoder(codec: numcodecs.abc.Codec, dtype: np.dtype
                 ) -> Callable[[np.ndarray, int], tuple[bytes, np.ndarray]] | None:
    """``encode(rows, n)``: the first ``n`` chunks of ``rows`` (C-contiguous, equal-sized
    chunks along axis 0), each as ``encoder(codec)`` encodes it, in one C call without the
    GIL: ``(concatenated bytes, sizes)``. ``None`` without the C kernel or for other codecs.
    """
    from ..native import write_kernel

    native = write_kernel()
    checked = isinstance(codec, Checked)
    inner = codec.inner if checked else codec
    if native is None or \
            not isinstance(inner, numcodecs.Blosc):
        return None
    try:
        import ctypes

        from numcodecs import blosc

        fn = ctypes.cast(ctypes.CDLL(blosc.__file__).blosc_compress_ctx, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    cname = inner.cname.decode() if isinstance(inner.cname, bytes) else inner.cname
    args = (int(np.dtype(dtype).itemsize), int(inner.clevel), int(inner.shuffle), cname,
            int(inner.blocksize), checked)
    encode_rows = native.encode_rows

    def encode(rows: np.ndarray, n: int) -> tuple[bytes, np.ndarray]:
        blob, sizes = encode_rows(fn, rows, n, rows.nbytes // n, *args)
        return blob, np.frombuffer(sizes, np.int64)

    return encode


def decoder(cfg: dict[str, Any], checksum: bool = False) -> Callable[[bytes, np.ndarray], None]:
    """``decode_into(blob, dst)``: decompress ``blob`` into the uint8 buffer ``dst``.

    Calls blosc/zstd directly, skipping numcodecs' per-call wrapping (half the cost of a
    5 µs frame decode). ``checksum``: chunks end with a crc32c, checked first (~1 µs).
    """
    inner = _decoder(cfg)
    if not checksum:
        return inner

    def checked_into(blob: bytes, dst: np.ndarray) -> None:
        inner(_strip_crc(blob), dst)

    return checked_into


def _decoder(cfg: dict[str, Any]) -> Callable[[bytes, np.ndarray], None]:
    name = cfg.get("name", "blosc")
    if name == "blosc":
        from numcodecs import blosc

        return blosc.decompress  # (source, dest) fills dest in place
    if name == "zstd":
        from numcodecs import zstd

        def zstd_into(blob: bytes, dst: np.ndarray) -> None:
            dst[:] = np.frombuffer(zstd.decompress(blob), np.uint8)

        return zstd_into

    def raw_into(blob: bytes, dst: np.ndarray) -> None:
        dst[:] = np.frombuffer(blob, np.uint8)

    return raw_into


class _Raw(numcodecs.abc.Codec):
    codec_id = "raw"

    def encode(self, buf: Any) -> bytes:
        return bytes(memoryview(np.ascontiguousarray(buf)).cast("B"))

    def decode(self, buf: Any, out: Any = None) -> Any:
        if out is not None:
            np.frombuffer(out, np.uint8)[:] = np.frombuffer(buf, np.uint8)
            return out
        return buf


def zarr_codec(cfg: dict[str, Any], itemsize: int) -> Any:
    """The matching ``zarr.codecs`` object, used only to write array metadata."""
    from zarr.codecs import BloscCodec, ZstdCodec

    name = cfg.get("name", "blosc")
    if name == "blosc":
        return BloscCodec(
            cname=cfg.get("cname", "lz4"),
            clevel=int(cfg.get("clevel", 5)),
            shuffle="noshuffle" if itemsize == 1 else "shuffle",
            typesize=itemsize,
            blocksize=0,
        )
    if name == "zstd":
        return ZstdCodec(level=int(cfg.get("level", 1)))
    return None


@dataclass
class ShardHead:
    """Parsed header + index of one shard version."""

    first_step: int
    n_rows: int
    offsets: np.ndarray  # (n_chunks,) uint64, EMPTY where absent
    nbytes: np.ndarray  # (n_chunks,) uint64
    checksum: bool = False  # inner chunks end with a crc32c

    def holds(self, slot_in_shard: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Which requested rows (shard-local slot, lane step) this version contains."""
        return (steps == self.first_step + slot_in_shard) & (slot_in_shard < self.n_rows)


def _head_crc(head: bytes) -> int:
    """crc32c of a packed header without its crc field (bytes 20..24)."""
    return crc32c.crc32c(head[:20] + head[24:])


def assemble(chunks: list[bytes | None], first_step: int, n_rows: int,
             checksum: bool = False) -> bytes:
    """Shard bytes from encoded inner chunks (``None`` = not written).

    ``checksum``: the chunks already end with their crc32c (``Checked`` codec); the header
    says so. The header always carries its own crc32c and the index's.
    """
    n = len(chunks)
    index = np.full((n, 2), EMPTY, dtype="<u8")
    offset = index_size(n) + HEADER_SIZE
    for i, c in enumerate(chunks):
        if c is not None:
            index[i] = (offset, len(c))
            offset += len(c)
    parts = [_prefix(index, first_step, n_rows, checksum)]
    parts += [c for c in chunks if c is not None]
    return b"".join(parts)


def _prefix(index: np.ndarray, first_step: int, n_rows: int, checksum: bool) -> bytes:
    """Index, its crc32c and the header, bound to that index by its crc32c."""
    ib = index.tobytes()
    icrc = crc32c.crc32c(ib)
    flags = CHECKSUMS if checksum else 0
    head = HEADER.pack(MAGIC, FORMAT_VERSION, flags, first_step, n_rows, 0, icrc)
    head = HEADER.pack(MAGIC, FORMAT_VERSION, flags, first_step, n_rows, _head_crc(head), icrc)
    return ib + struct.pack("<I", icrc) + head


class ShardImage:
    """One field's shard object, assembled as rows arrive (``update``) instead of from
    scratch at every flush: each inner chunk is encoded once, when complete, and appended;
    the index is an array updated in place. A partial last chunk (a whole-shard chunk of a
    scalar field, usually) is encoded at each ``update`` and appended too, with its unused
    rows set to the fill value; the previous one stays behind as unreferenced bytes.

    So within one lap of a shard every version of the object is a prefix-extension of the
    one before, outside its first ``prefix`` bytes (index and header): a byte any version
    references holds the same value in all later ones. That is what lets a local backend
    rewrite a file in place that a reader may still hold open (``LocalBackend.put`` with a
    ``Rewrite``). ``compact()`` gives the object without unreferenced bytes.
    """

    def __init__(self, n_chunks: int, rows_per_chunk: int, encode: Callable[[np.ndarray], bytes],
                 fill: Any = 0, encode_many: Callable | None = None) -> None:
        self.n_chunks = n_chunks
        self.R = rows_per_chunk
        self.encode = encode
        self.encode_many = encode_many  # ``rows_encoder``: many chunks in one call
        self.fill = fill
        self.prefix = index_size(n_chunks) + HEADER_SIZE
        self.buf = bytearray(self.prefix)
        self.index = np.full((n_chunks, 2), EMPTY, dtype="<u8")
        self.done = 0  # complete chunks encoded
        self.n = 0  # rows covered by the last update
        self.loose = False  # unreferenced bytes (replaced partial chunks) in ``buf``
        self._partial = False  # the last chunk appended is a partial one

    def reset(self) -> None:
        del self.buf[self.prefix:]
        self.index.fill(EMPTY)
        self.done = self.n = 0
        self.loose = self._partial = False

    def update(self, rows: np.ndarray, n: int) -> None:
        """Cover the first ``n`` rows of ``rows`` (the shard's staging array)."""
        if n == self.n:
            return
        if self._partial:  # the partial chunk appended last is re-encoded below
            self.loose = True
            self._partial = False
        R, buf, index, encode = self.R, self.buf, self.index, self.encode
        full = n // R
        if full > self.done:  # (one index update for all new chunks: this runs per row)
            at = len(buf)
            if self.encode_many is not None and rows.flags.c_contiguous:
                blob, size = self.encode_many(rows[self.done * R: full * R], full - self.done)
                buf += blob
                size = size.astype(np.uint64)
            else:
                sizes = []
                one = R == 1 and rows.ndim > 1  # a row is a contiguous chunk as it is
                for c in range(self.done, full):
                    enc = encode(rows[c] if one
                                 else np.ascontiguousarray(rows[c * R:(c + 1) * R]))
                    sizes.append(len(enc))
                    buf += enc
                size = np.array(sizes, np.uint64)
            index[self.done:full, 1] = size
            index[self.done:full, 0] = at + np.cumsum(size) - size
        self.done = full
        if n % R:
            chunk = rows[full * R:(full + 1) * R].copy()
            chunk[n - full * R:] = self.fill  # rows not written read as the fill value
            enc = encode(chunk)
            index[full] = (len(buf), len(enc))
            buf += enc
            self._partial = True
        self.n = n

    def seal(self, first_step: int, n_rows: int, checksum: bool) -> memoryview:
        """The object's bytes (a view of ``buf``, valid until the next ``update``)."""
        self.buf[: self.prefix] = _prefix(self.index, first_step, n_rows, checksum)
        return memoryview(self.buf)

    def compact(self, first_step: int, n_rows: int, checksum: bool) -> bytes:
        """The object's bytes without unreferenced ones (a copy)."""
        if not self.loose:
            return bytes(self.seal(first_step, n_rows, checksum))
        buf = memoryview(self.buf)
        index = np.full_like(self.index, EMPTY)
        parts = []
        at = self.prefix
        for c in range(self.n_chunks):
            off, size = self.index[c]
            if off == EMPTY:
                continue
            parts.append(buf[int(off):int(off) + int(size)])
            index[c] = (at, size)
            at += int(size)
        return b"".join([_prefix(index, first_step, n_rows, checksum), *parts])


def parse_head(buf: bytes, n_chunks: int, where: str) -> ShardHead:
    """Parse the first ``index_size(n_chunks) + HEADER_SIZE`` bytes of a shard."""
    from ...errors import StoreCorruptError

    isz = index_size(n_chunks)
    if len(buf) < isz + HEADER_SIZE:
        raise StoreCorruptError(f"{where}: shard truncated ({len(buf)} bytes, need "
                                f"{isz + HEADER_SIZE} for its index)")
    ib = bytes(buf[: isz - 4])
    (index_crc,) = struct.unpack("<I", buf[isz - 4 : isz])
    if crc32c.crc32c(ib) != index_crc:
        raise StoreCorruptError(f"{where}: shard index fails its crc32c check")
    head = bytes(buf[isz : isz + HEADER_SIZE])
    magic, version, flags, first_step, n_rows, crc, icrc = HEADER.unpack(head)
    if magic != MAGIC:
        raise StoreCorruptError(f"{where}: not an expstore shard (bad header magic)")
    if (flags & CHECKSUMS or crc) and _head_crc(head) != crc:  # a flipped flag counts too
        raise StoreCorruptError(f"{where}: shard header fails its crc32c check")
    if icrc and icrc != index_crc:  # (older shards leave it 0)
        raise StoreCorruptError(f"{where}: shard header was written with another index (read "
                            "while the object was rewritten, or corrupted)")
    if version > FORMAT_VERSION:
        raise StoreCorruptError(f"{where}: shard format version {version} is newer than "
                                f"this expstore supports ({FORMAT_VERSION})")
    index = np.frombuffer(ib, dtype="<u8").reshape(n_chunks, 2)
    return ShardHead(int(first_step), int(n_rows), index[:, 0].copy(), index[:, 1].copy(),
                     bool(flags & CHECKSUMS))
