"""The file format of saved priorities: one object ``_index/<name>.bin`` per sampler.

``MAGIC`` (8 bytes), the length of a JSON header (uint32 little-endian), the header, then the
leaves: float32, one per row, compressed with blosc-lz4 (byte-shuffled) in pieces of at most
``2**24`` values (blosc takes at most 2 GiB per call). The header holds the payload's
metadata (``name``, ``kind``, ``alpha``, ``eps``, ``max_priority``, ``capacity``, ``lanes``,
``count``, ``valid_from``), ``version``, the compressed size of each piece and the crc32 of
all of them.

:func:`encode` and :func:`decode` convert between those bytes and a payload: a dict of that
metadata plus ``leaves`` (see :meth:`expstore.index.priorities.PriorityIndex.payload`).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...errors import StoreCorruptError

MAGIC = b"EXPRIO01"
FORMAT_VERSION = 1
_PIECE = 1 << 24  # float32 values per compressed piece (64 MiB; blosc limit is 2 GiB)


def priority_key(name: str) -> str:
    """Object key of the persisted priorities called ``name``."""
    return f"_index/{name}.bin"


def encode(payload: Mapping[str, Any]) -> bytes:
    """The bytes of the file holding ``payload`` (metadata + float32 ``leaves``)."""
    import numcodecs

    leaves = np.ascontiguousarray(payload["leaves"], np.float32)
    codec = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    pieces = [codec.encode(leaves[i:i + _PIECE]) for i in range(0, len(leaves), _PIECE)]
    data = b"".join(pieces)
    header: dict[str, Any] = {"version": FORMAT_VERSION}
    for k, v in payload.items():
        if k != "leaves":
            header[k] = v.tolist() if isinstance(v, np.ndarray) else v
    header.update(pieces=[len(b) for b in pieces], crc32=zlib.crc32(data))
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + data


def decode(raw: bytes, where: str) -> dict[str, Any]:
    """The payload held by ``raw`` (the header's fields, with ``leaves`` a float32 array);
    :class:`StoreCorruptError` naming ``where`` if it is not one this version reads."""
    try:
        if raw[:8] != MAGIC:
            raise ValueError("bad magic bytes")
        (n,) = struct.unpack("<I", raw[8:12])
        header = json.loads(raw[12:12 + n])
        data = memoryview(raw)[12 + n:]
    except (ValueError, struct.error) as e:
        raise StoreCorruptError(f"{where}: not an expstore priority file ({e})") from e
    if header.get("version", 0) > FORMAT_VERSION:
        raise StoreCorruptError(f"{where}: priority format version {header['version']} is "
                                f"newer than this expstore reads ({FORMAT_VERSION})")
    if zlib.crc32(data) != header.get("crc32"):
        raise StoreCorruptError(f"{where}: priority file fails its checksum")
    import numcodecs

    codec = numcodecs.Blosc()
    parts, at = [], 0
    for size in header["pieces"]:
        parts.append(np.frombuffer(codec.decode(data[at:at + size]), np.float32))
        at += size
    leaves = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if leaves.size != header["capacity"]:
        raise StoreCorruptError(f"{where}: holds {leaves.size} priorities, expected "
                                f"{header['capacity']}")
    header["leaves"] = leaves
    return header
