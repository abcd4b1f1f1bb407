"""TFRecord files and ``tf.train.Example`` / ``SequenceExample`` messages, without TensorFlow.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data[length] |
    uint32 masked_crc32c(data)

with ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32), crc32c being
the Castagnoli CRC (tensorflow/core/lib/io/record_writer.cc). Every CRC is checked on read:
a bad one is a :class:`~expstore.errors.DatasetFormatError` naming the file and record.

The message classes are built at import from a descriptor written here (the fields of
tensorflow/core/example/{feature,example}.proto), in a private descriptor pool, so they
coexist with TensorFlow's own classes in one process; the ``protobuf`` package parses them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

import crc32c as _crc32c

from ...errors import DatasetFormatError

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's masked crc32c of ``data``."""
    crc = _crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One record's bytes as written in a TFRecord file (header, data, footer)."""
    length = struct.pack("<Q", len(data))
    return length + _FOOTER.pack(masked_crc(length)) + data + _FOOTER.pack(masked_crc(data))


def read_records(f: BinaryIO, where: str) -> Iterator[bytes]:
    """The records of an open TFRecord file, CRCs checked (``where`` names the file in
    errors)."""
    i = 0
    while True:
        head = f.read(_HEADER.size)
        if not head:
            return
        if len(head) < _HEADER.size:
            raise DatasetFormatError(f"{where}: record {i}: the file ends inside its "
                                     f"{_HEADER.size}-byte header (truncated file?)")
        n, crc = _HEADER.unpack(head)
        if masked_crc(head[:8]) != crc:
            raise DatasetFormatError(f"{where}: record {i}: bad length crc32c ({crc:#010x}; "
                                     "not a TFRecord file, or corrupted)")
        data = f.read(n)
        foot = f.read(_FOOTER.size)
        if len(data) < n or len(foot) < _FOOTER.size:
            raise DatasetFormatError(f"{where}: record {i}: the file ends inside its {n:,} "
                                     "bytes (truncated file?)")
        if masked_crc(data) != _FOOTER.unpack(foot)[0]:
            raise DatasetFormatError(f"{where}: record {i}: bad data crc32c (the record's "
                                     f"{n:,} bytes are corrupted)")
        yield data
        i += 1


# -- tf.train.Example and SequenceExample ------------------------------------------------
def _messages() -> dict[str, Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="expstore/tf_example.proto",
                                            package="expstore.tf", syntax="proto3")

    def message(name: str, *fields: tuple, parent: Any = None) -> Any:
        m = (parent.nested_type if parent is not None else fd.message_type).add(name=name)
        for fname, number, ftype, label, type_name, *oneof in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
            if oneof:
                f.oneof_index = oneof[0]
        return m

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    msg = F.TYPE_MESSAGE
    message("BytesList", ("value", 1, F.TYPE_BYTES, rep, None))
    message("FloatList", ("value", 1, F.TYPE_FLOAT, rep, None))
    message("Int64List", ("value", 1, F.TYPE_INT64, rep, None))
    feat = message("Feature", ("bytes_list", 1, msg, opt, ".expstore.tf.BytesList", 0),
                   ("float_list", 2, msg, opt, ".expstore.tf.FloatList", 0),
                   ("int64_list", 3, msg, opt, ".expstore.tf.Int64List", 0))
    feat.oneof_decl.add(name="kind")
    for outer, entry, value in (("Features", "FeatureEntry", ".expstore.tf.Feature"),
                                ("FeatureLists", "FeatureListEntry",
                                 ".expstore.tf.FeatureList")):
        if outer == "FeatureLists":
            message("FeatureList", ("feature", 1, msg, rep, ".expstore.tf.Feature"))
        m = message(outer, ("feature" if outer == "Features" else "feature_list", 1, msg, rep,
                            f".expstore.tf.{outer}.{entry}"))
        e = message(entry, ("key", 1, F.TYPE_STRING, opt, None), ("value", 2, msg, opt, value),
                    parent=m)
        e.options.map_entry = True
    message("Example", ("features", 1, msg, opt, ".expstore.tf.Features"))
    message("SequenceExample", ("context", 1, msg, opt, ".expstore.tf.Features"),
            ("feature_lists", 2, msg, opt, ".expstore.tf.FeatureLists"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(
        f"expstore.tf.{name}")) for name in ("Feature", "Features", "Example",
                                             "SequenceExample")}


_CLASSES = _messages()
Feature = _CLASSES["Feature"]
Features = _CLASSES["Features"]
Example = _CLASSES["Example"]
SequenceExample = _CLASSES["SequenceExample"]


def parse_features(data: bytes, where: str) -> dict[str, Any]:
    """``{key: Feature}`` of a serialized Example, or of a SequenceExample (its context
    features, and each feature list as one Feature: the steps' values concatenated)."""
    from google.protobuf.message import DecodeError

    try:  # an Example's field 1 (features) is a SequenceExample's field 1 (context)
        seq = SequenceExample.FromString(data)
    except DecodeError as e:
        raise DatasetFormatError(f"{where}: not a tf.train.Example ({e})") from None
    out = dict(seq.context.feature)
    for key, flist in seq.feature_lists.feature_list.items():
        merged = Feature()
        for f in flist.feature:
            merged.MergeFrom(f)  # repeated values append
        out[key] = merged
    return out
