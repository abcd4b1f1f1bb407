"""Where Minari datasets live (datasets root, ids, data directories) and the minari check."""

from __future__ import annotations

import os
import pathlib
from typing import Any


def require_minari() -> Any:
    """The ``minari`` module, or an ImportError saying how to install it."""
    try:
        import minari
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("Minari datasets need the minari package: "
                          "pip install 'expstore[minari]'") from e
    return minari


def check_id(dataset_id: str) -> None:
    """Raise ``ValueError`` unless ``dataset_id`` is a Minari id (``namespace/name-v0``)."""
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError) as e:
        raise ValueError(f"dataset_id {dataset_id!r}: expected '(namespace/)name-v<version>', "
                         "e.g. 'expstore/pong-v0'") from e


def datasets_root(root: str | os.PathLike | None) -> pathlib.Path:
    """``root``, or Minari's datasets directory (``MINARI_DATASETS_PATH``)."""
    if root is not None:
        return pathlib.Path(root)
    from minari.storage.datasets_root_dir import get_dataset_path

    return pathlib.Path(get_dataset_path())


def resolve(src: str | os.PathLike, root: str | os.PathLike | None) -> pathlib.Path:
    """The ``data`` directory of a dataset given by id (under ``root``) or directory."""
    p = pathlib.Path(src)
    if p.is_dir():
        for d in (p / "data", p):
            if (d / "metadata.json").exists():
                return d
        raise FileNotFoundError(f"{p}: not a Minari dataset directory (no metadata.json "
                                f"in {p / 'data'} or {p})")
    base = datasets_root(root)
    d = base / os.fspath(src) / "data"
    if not (d / "metadata.json").exists():
        raise FileNotFoundError(
            f"Minari dataset {os.fspath(src)!r} not found: no {d / 'metadata.json'} "
            f"(datasets root {base}; set MINARI_DATASETS_PATH, pass root=, or give the "
            "dataset's directory; remote datasets are not downloaded)")
    return d
