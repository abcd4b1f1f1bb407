"""TFDS ``features.json``: the leaves of a dataset's features, their Example encoding, and
the JSON an export writes.

How TFDS serializes a leaf (tensorflow_datasets/core/example_serializer.py): integers and
bools as an ``int64_list``, floats as a ``float_list`` (float64 through float32), strings
as a ``bytes_list``; a ``Tensor`` with ``encoding`` ``bytes``/``zlib`` as one raw (zlib'd)
bytes value per item; an ``Image`` as one encoded PNG/JPEG per item. The leaves of a
``Dataset``/``Sequence`` feature (RLDS's ``steps``) are keyed ``steps/<path>`` with the
values of every step concatenated.
"""

from __future__ import annotations

import io
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import DatasetFormatError

_PKG = "tensorflow_datasets.core.features."
CLASS = {"dict": _PKG + "features_dict.FeaturesDict", "dataset": _PKG + "dataset_feature.Dataset",
         "tensor": _PKG + "tensor_feature.Tensor", "scalar": _PKG + "scalar.Scalar",
         "image": _PKG + "image_feature.Image", "text": _PKG + "text_feature.Text"}


@dataclass(frozen=True)
class Leaf:
    """One leaf feature: ``key`` as in the Example (``steps/observation/image``); ``kind``
    ``tensor``, ``image``, ``text`` or ``unsupported``; ``encoding``: ``none``/``bytes``/
    ``zlib`` (tensor) or ``png``/``jpeg`` (image); ``step``: under ``steps``."""

    key: str
    kind: str
    shape: tuple[int, ...] = ()
    dtype: Any = None
    encoding: str = "none"
    step: bool = True
    why: str = ""  # for unsupported leaves: what they are

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def parse_features(doc: dict[str, Any], where: str) -> list[Leaf]:
    """The leaves of a ``features.json`` document (top level: a FeaturesDict with a
    ``steps`` Dataset, as RLDS has)."""
    top = doc.get("featuresDict", {}).get("features")
    if not isinstance(top, dict) or "steps" not in top:
        raise DatasetFormatError(f"{where}: expected a FeaturesDict with a 'steps' Dataset "
                                 "feature (an RLDS dataset)")
    steps = top["steps"].get("sequence")
    if not isinstance(steps, dict) or "feature" not in steps:
        raise DatasetFormatError(f"{where}: 'steps' is not a Dataset/Sequence feature")
    out: list[Leaf] = []
    _walk(steps["feature"], "steps", True, out, where)
    for name, node in top.items():
        if name != "steps":
            _walk(node, name, False, out, where)
    return out


def _walk(node: dict[str, Any], key: str, step: bool, out: list[Leaf], where: str) -> None:
    if "featuresDict" in node:
        for name, sub in node["featuresDict"].get("features", {}).items():
            if "." in name or "/" in name:
                raise DatasetFormatError(f"{where}: feature {key}/{name}: names with '.' or "
                                         "'/' cannot name a store field")
            _walk(sub, f"{key}/{name}", step, out, where)
        return
    cls = node.get("pythonClassName", "?").rsplit(".", 1)[-1]
    if "tensor" in node or "classLabel" in node:
        t = node.get("tensor", {"dtype": "int64", "shape": {}})
        dims = tuple(int(d) for d in t.get("shape", {}).get("dimensions", []))
        if any(d < 0 for d in dims):
            out.append(Leaf(key, "unsupported", step=step,
                            why=f"{cls} of variable shape {list(dims)}"))
            return
        dtype = np.dtype(t.get("dtype", "float32"))
        if dtype.kind not in "biuf":
            out.append(Leaf(key, "text" if dtype.kind in "SUO" else "unsupported",
                            step=step, why=f"{cls} of dtype {dtype}"))
            return
        out.append(Leaf(key, "tensor", dims, dtype, t.get("encoding", "none"), step))
    elif "image" in node:
        im = node["image"]
        dims = tuple(int(d) for d in im.get("shape", {}).get("dimensions", []))
        if len(dims) != 3 or any(d < 0 for d in dims):
            out.append(Leaf(key, "unsupported", step=step,
                            why=f"Image of variable shape {list(dims)}"))
            return
        out.append(Leaf(key, "image", dims, np.dtype(im.get("dtype", "uint8")),
                        im.get("encodingFormat", "png"), step))
    elif "text" in node:
        out.append(Leaf(key, "text", step=step, why="Text"))
    else:
        out.append(Leaf(key, "unsupported", step=step, why=cls))


def decode(leaf: Leaf, feature: Any, n: int, where: str) -> np.ndarray:
    """``(n, *shape)`` values of ``leaf`` from its Example ``feature`` (``n`` items)."""
    kind = feature.WhichOneof("kind")
    if leaf.kind == "image" or leaf.encoding in ("bytes", "zlib"):
        vals = list(feature.bytes_list.value) if kind == "bytes_list" else None
        if vals is None or len(vals) != n:
            raise DatasetFormatError(f"{where}: {leaf.key}: expected {n} encoded values "
                                     f"(bytes_list), got {len(vals) if vals else kind}")
        out = np.empty((n, *leaf.shape), leaf.dtype)
        for i, v in enumerate(vals):
            out[i] = (decode_image(v, leaf, where) if leaf.kind == "image" else
                      _raw(v, leaf, where))
        return out
    want = "float_list" if leaf.dtype.kind == "f" else "int64_list"
    if kind != want and not (kind is None and n == 0):
        raise DatasetFormatError(f"{where}: {leaf.key}: expected a {want} for "
                                 f"{leaf.dtype}, got {kind}")
    src = np.asarray(getattr(feature, want).value,
                     np.float32 if want == "float_list" else np.int64)
    if src.size != n * leaf.size:
        raise DatasetFormatError(f"{where}: {leaf.key}: expected {n} x {leaf.size} values "
                                 f"(shape {list(leaf.shape)}), got {src.size}")
    if leaf.dtype == np.uint64:
        src = src.view(np.uint64)
    return src.reshape(n, *leaf.shape).astype(leaf.dtype, copy=False)


def _raw(v: bytes, leaf: Leaf, where: str) -> np.ndarray:
    if leaf.encoding == "zlib":
        v = zlib.decompress(v)
    a = np.frombuffer(v, leaf.dtype)
    if a.size != leaf.size:
        raise DatasetFormatError(f"{where}: {leaf.key}: a {leaf.encoding} value of {a.size} "
                                 f"items, expected shape {list(leaf.shape)}")
    return a.reshape(leaf.shape)


_PNG = b"\x89PNG\r\n\x1a\n"


def _cv2() -> Any:
    try:
        import cv2
    except ImportError:
        return None
    return cv2


def decode_image(data: bytes, leaf: Leaf, where: str) -> np.ndarray:
    """One PNG/JPEG image as an array of ``leaf.shape``. PNG (lossless: every decoder gives
    the same pixels) goes through OpenCV where it is installed (2.5x faster than Pillow on
    84x84 frames), everything else through Pillow."""
    cv2 = _CV2 if data[:8] == _PNG else None
    a = None
    if cv2 is not None:
        a = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if a is not None and a.ndim == 3:  # OpenCV's channel order: BGR(A)
            a = a[..., [2, 1, 0, 3][:a.shape[2]]] if a.shape[2] in (3, 4) else a
    if a is None:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as im:
                a = np.asarray(im)
        except Exception as e:  # noqa: BLE001 - PIL raises many kinds
            raise DatasetFormatError(f"{where}: {leaf.key}: cannot decode the image "
                                     f"({e})") from None
    if a.ndim == 2:
        a = a[:, :, None]
    if a.shape != leaf.shape:
        raise DatasetFormatError(f"{where}: {leaf.key}: decoded image of shape {a.shape}, "
                                 f"features.json says {leaf.shape}")
    return a


_CV2 = _cv2()


def encode(leaf: Leaf, values: np.ndarray, feature: Any, png_level: int = 6) -> None:
    """Fill Example ``feature`` with ``values`` (``(n, *shape)``) as TFDS writes them."""
    if leaf.kind == "image":
        feature.bytes_list.value.extend(encode_image(v, leaf.encoding, png_level)
                                        for v in values)
    elif leaf.encoding in ("bytes", "zlib"):
        vals = (np.ascontiguousarray(v).tobytes() for v in values)
        feature.bytes_list.value.extend(zlib.compress(v) if leaf.encoding == "zlib" else v
                                        for v in vals)
    elif leaf.dtype.kind == "f":
        feature.float_list.value.extend(np.asarray(values, np.float32).reshape(-1).tolist())
    else:
        v = np.asarray(values)
        v = v.view(np.int64) if v.dtype == np.uint64 else v.astype(np.int64)
        feature.int64_list.value.extend(v.reshape(-1).tolist())


def encode_image(frame: np.ndarray, fmt: str = "png", png_level: int = 6) -> bytes:
    """One ``(H, W, C)`` frame as PNG (lossless) or JPEG bytes."""
    from PIL import Image

    a = frame[:, :, 0] if frame.shape[-1] == 1 else frame
    buf = io.BytesIO()
    if fmt == "png":
        Image.fromarray(a).save(buf, format="PNG", compress_level=png_level)
    else:
        Image.fromarray(a).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def features_json(leaves: list[Leaf]) -> dict[str, Any]:
    """The ``features.json`` document of ``leaves`` (a FeaturesDict with a ``steps``
    Dataset): what TFDS's ``FeaturesDict.to_json`` writes."""
    top: dict[str, Any] = {}
    steps: dict[str, Any] = {}
    for leaf in leaves:
        parts = leaf.key.split("/")
        node = steps if leaf.step else top
        for p in parts[1 if leaf.step else 0:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = _leaf_json(leaf)
    top["steps"] = {"pythonClassName": CLASS["dataset"],
                    "sequence": {"feature": _dict_json(steps), "length": "-1"}}
    return _dict_json(top)


def _dict_json(tree: dict[str, Any]) -> dict[str, Any]:
    feats = {k: (v if "pythonClassName" in v else _dict_json(v)) for k, v in tree.items()}
    return {"featuresDict": {"features": feats}, "pythonClassName": CLASS["dict"]}


def _leaf_json(leaf: Leaf) -> dict[str, Any]:
    shape = {"dimensions": [str(d) for d in leaf.shape]} if leaf.shape else {}
    if leaf.kind == "image":
        return {"image": {"dtype": str(leaf.dtype), "encodingFormat": leaf.encoding,
                          "shape": shape}, "pythonClassName": CLASS["image"]}
    scalar = not leaf.shape and leaf.encoding == "none"  # TFDS's Scalar takes no encoding
    return {"pythonClassName": CLASS["scalar" if scalar else "tensor"],
            "tensor": {"dtype": str(np.dtype(leaf.dtype)), "encoding": leaf.encoding,
                       "shape": shape}}
