"""``.npy`` arrays inside gzip files, read and written a block of rows at a time.

Dopamine checkpoints are ``np.save`` output wrapped in ``gzip.GzipFile``; a 1M-frame
observation file inflates to 7 GB. :class:`NpyGzipReader` parses the ``.npy`` header from
the decompressed stream and hands out fixed-size row blocks, so memory stays at one block
(``zlib`` inflates with a bounded output size; multi-member gzip files are supported and the
gzip CRC/length trailer is checked when the stream is read to its end).
:class:`NpyGzipWriter` writes the bytes ``np.save(gzip.GzipFile(...), arr)`` writes, block by
block, to a temporary file renamed into place on :meth:`~NpyGzipWriter.close`.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import DatasetFormatError

_IN_CHUNK = 1 << 20  # compressed bytes read from disk at a time
_OUT_MAX = 8 << 20  # most decompressed bytes produced per zlib call


def _inflater() -> Any:
    """``zlib``-compatible module: ``isal.isal_zlib`` (faster inflate) when installed."""
    try:
        from isal import isal_zlib

        return isal_zlib
    except ImportError:
        return zlib


class NpyGzipReader:
    """Rows of an ``np.save``'d array inside a gzip file, read in order.

    ``shape``/``dtype`` come from the header; :meth:`read` returns the next ``n`` rows,
    :meth:`skip` discards rows. Errors name the file and what was expected. ``fileobj``:
    read from this open binary file instead (``path`` then only names it in messages).
    ``chunk``: compressed bytes read at a time (small for a header-only look at a remote
    file).
    """

    def __init__(self, path: str | os.PathLike, fileobj: BinaryIO | None = None,
                 chunk: int = _IN_CHUNK) -> None:
        self.path = path if fileobj is not None else Path(path)  # for messages
        if fileobj is not None:
            self._f = fileobj  # e.g. an fsspec file of a bucket; closed in close()
        else:
            try:
                self._f = open(self.path, "rb")  # noqa: SIM115 - closed in close()
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.path}: file not found") from None
        self._chunk = int(chunk)
        self._z = _inflater()
        self._d = self._z.decompressobj(31)
        self._tail = b""  # compressed input not yet consumed
        self._buf = memoryview(b"")  # decompressed bytes not yet handed out
        self._eof = False
        self.compressed_read = 0
        self.pos = 0  # rows handed out so far
        self.shape: tuple[int, ...] | None = None
        self.dtype: np.dtype | None = None
        try:
            self._parse_header()
        except BaseException:
            self.close()
            raise

    # -- raw stream ----------------------------------------------------------------------
    def _read_in(self) -> bytes:
        chunk = self._f.read(self._chunk)
        self.compressed_read += len(chunk)
        return chunk

    def _fill(self, want: int) -> bytes:
        """Up to ``want`` (>0) more decompressed bytes; ``b""`` at the end of the stream."""
        while True:
            if self._d.eof:  # a gzip member ended: another may follow (NUL padding allowed)
                nxt = self._tail.lstrip(b"\x00")
                while not nxt:
                    chunk = self._read_in()
                    if not chunk:
                        self._eof = True
                        return b""
                    nxt = chunk.lstrip(b"\x00")
                self._d = self._z.decompressobj(31)
                self._tail = nxt
            if not self._tail:
                self._tail = self._read_in()
                if not self._tail:
                    raise DatasetFormatError(
                        f"{self.path}: gzip stream is truncated (ends inside a compressed "
                        f"block, {self._where()})")
            try:
                out = self._d.decompress(self._tail, min(want, _OUT_MAX))
            except Exception as e:  # zlib.error / isal error
                raise DatasetFormatError(f"{self.path}: not valid gzip data ({e})") from e
            self._tail = self._d.unused_data if self._d.eof else self._d.unconsumed_tail
            if out:
                return out

    def _read_bytes(self, n: int, into: memoryview | None = None) -> memoryview:
        """Exactly ``n`` decompressed bytes (into ``into`` when given)."""
        dst = into if into is not None else memoryview(bytearray(n))
        got = 0
        while got < n:
            if not len(self._buf):
                chunk = self._fill(n - got)
                if not chunk:
                    raise DatasetFormatError(f"{self.path}: data ends early ({self._where()})")
                self._buf = memoryview(chunk)
            k = min(len(self._buf), n - got)
            dst[got : got + k] = self._buf[:k]
            self._buf = self._buf[k:]
            got += k
        return dst

    def _where(self) -> str:
        if self.shape is None:
            return "inside the .npy header"
        return f"after {self.pos} of the {self.rows} rows of shape {self.shape} it announces"

    # -- header --------------------------------------------------------------------------
    def _parse_header(self) -> None:
        fmt = np.lib.format
        head = bytes(self._read_bytes(10))
        if head[:6] != b"\x93NUMPY":
            raise DatasetFormatError(f"{self.path}: not a .npy array inside gzip (bad magic "
                                     f"{head[:6]!r})")
        major = head[6]
        if major == 1:
            hlen = int.from_bytes(head[8:10], "little")
            rest = b""
        elif major in (2, 3):
            rest = bytes(self._read_bytes(2))
            hlen = int.from_bytes(head[8:10] + rest, "little")
        else:
            raise DatasetFormatError(f"{self.path}: unsupported .npy format version {major}")
        body = bytes(self._read_bytes(hlen))
        bio = io.BytesIO(head + rest + body)
        try:
            version = fmt.read_magic(bio)
            reader = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = reader(bio)
        except ValueError as e:
            raise DatasetFormatError(f"{self.path}: bad .npy header ({e})") from e
        if dtype.hasobject:
            raise DatasetFormatError(f"{self.path}: holds Python objects (dtype {dtype}); "
                                     "expected a numeric array")
        if len(shape) == 0:
            shape = ()
        if fortran and len(shape) > 1:
            raise DatasetFormatError(f"{self.path}: Fortran-ordered arrays cannot be streamed "
                                     "by rows")
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_nbytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize

    # -- rows ----------------------------------------------------------------------------
    def read(self, n: int, out: np.ndarray | None = None) -> np.ndarray:
        """The next ``n`` rows (fewer only at the end), as ``(n, *row_shape)``."""
        n = max(0, min(int(n), self.rows - self.pos))
        if out is None:
            out = np.empty((n, *self.row_shape), self.dtype)
        else:
            out = out[:n]
        if n:
            self._read_bytes(n * self.row_nbytes, memoryview(out.reshape(-1).view(np.uint8)))
        self.pos += n
        return out

    def read_all(self) -> np.ndarray:
        """The whole array (for small arrays); checks the stream ends cleanly."""
        if not self.shape:
            out = np.empty((), self.dtype)
            self._read_bytes(self.dtype.itemsize, memoryview(out.reshape(-1).view(np.uint8)))
            self.pos = 1
        else:
            out = self.read(self.rows)
        self.check_end()
        return out

    def skip(self, n: int, block: int = 4096) -> None:
        """Discard the next ``n`` rows."""
        buf = np.empty((min(block, max(n, 1)), *self.row_shape), self.dtype)
        while n > 0:
            k = min(n, len(buf))
            self.read(k, buf)
            n -= k

    def check_end(self) -> None:
        """All rows were read: make sure the gzip stream ends here (checks its trailer)."""
        if self.pos < self.rows:
            return
        extra = len(self._buf) or len(self._fill(1))
        if extra:
            raise DatasetFormatError(f"{self.path}: data continues after the {self.rows} rows "
                                     "its header announces")

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> NpyGzipReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def npy_header(shape: tuple[int, ...], dtype: Any) -> bytes:
    """The exact header ``np.save`` writes for a C-ordered array of ``shape``/``dtype``."""
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
         "shape": tuple(int(s) for s in shape)}
    bio = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(bio, d)
    except ValueError:
        bio = io.BytesIO()
        np.lib.format.write_array_header_2_0(bio, d)
    return bio.getvalue()


class NpyGzipWriter:
    """Writes ``shape``/``dtype`` rows block by block as ``np.save`` into ``gzip.GzipFile``.

    ``compresslevel=9`` is GzipFile's default, which Dopamine's ``save()`` uses.
    The file appears at ``path`` only when :meth:`close` finds every row written.
    """

    def __init__(self, path: str | os.PathLike, shape: tuple[int, ...], dtype: Any,
                 compresslevel: int = 9) -> None:
        self.path = Path(path)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.rows = self.shape[0] if self.shape else 1
        self.pos = 0
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self._raw = open(self._tmp, "wb")  # noqa: SIM115 - closed in close()/abort()
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=compresslevel)
        self._gz.write(npy_header(self.shape, self.dtype))

    def write(self, rows: np.ndarray) -> None:
        """Append rows (leading axis = rows; a 0-d array for a 0-d file)."""
        a = np.ascontiguousarray(rows, dtype=self.dtype)
        n = len(a) if self.shape else 1
        if self.shape and a.shape[1:] != self.shape[1:]:
            raise ValueError(f"{self.path}: rows of shape {a.shape[1:]}, expected "
                             f"{self.shape[1:]}")
        if self.pos + n > self.rows:
            raise ValueError(f"{self.path}: more than {self.rows} rows written")
        self._gz.write(memoryview(a.reshape(-1).view(np.uint8)))
        self.pos += n

    def close(self) -> None:
        if self._gz is None:
            return
        if self.pos != self.rows:
            self.abort()
            raise ValueError(f"{self.path}: {self.pos} of {self.rows} rows written")
        self._gz.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        self._gz = None
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop the partial file."""
        if self._gz is not None:
            try:
                self._gz.close()
            finally:
                self._raw.close()
                self._gz = None
        self._tmp.unlink(missing_ok=True)


def save_gz(path: str | os.PathLike, arr: Any, compresslevel: int = 9) -> None:
    """``np.save`` of a small array into a gzip file (atomic)."""
    arr = np.asarray(arr)
    w = NpyGzipWriter(path, arr.shape, arr.dtype, compresslevel)
    try:
        w.write(arr if arr.shape else arr.reshape(()))
        w.close()
    except BaseException:
        w.abort()
        raise


def load_gz(path: str | os.PathLike, fileobj: BinaryIO | None = None) -> np.ndarray:
    """A small ``np.save``'d array from a gzip file (clear errors naming the file)."""
    with NpyGzipReader(path, fileobj) as r:
        return r.read_all()
