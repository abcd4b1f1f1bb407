"""A Dopamine checkpoint on disk: file names, array shapes, ring position, and the spec an
import creates (see :mod:`expstore.datasets.dopamine` for the format)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DatasetFormatError
from ...field import Field
from ...spec import Spec
from ..npy_gzip import NpyGzipReader
from ..source import SourceFolder

STORE_PREFIX = "$store$_"
#: Dopamine storage names -> expstore field names
CORE = {"observation": "obs", "action": "action", "reward": "reward", "terminal": "terminated"}


def ckpt_path(directory: str | os.PathLike, name: str, suffix: int) -> Path:
    """``<directory>/<name>_ckpt.<suffix>.gz`` (Dopamine's ``_generate_filename``)."""
    return Path(directory) / f"{name}_ckpt.{suffix}.gz"


def ckpt_name(name: str, suffix: int) -> str:
    """``<name>_ckpt.<suffix>.gz``: a checkpoint file's name."""
    return f"{name}_ckpt.{suffix}.gz"


def as_folder(directory: str | os.PathLike | SourceFolder,
              storage_options: dict[str, Any] | None = None) -> SourceFolder:
    """``directory`` (a path or any fsspec URL) as a :class:`SourceFolder`."""
    if isinstance(directory, SourceFolder):
        return directory
    return SourceFolder(directory, storage_options)


def find_suffixes(directory: str | os.PathLike | SourceFolder,
                  storage_options: dict[str, Any] | None = None) -> list[int]:
    """Checkpoint suffixes with an observation file in ``directory`` (a path or fsspec
    URL), ascending."""
    pat = re.compile(re.escape(STORE_PREFIX) + r"observation_ckpt\.(\d+)\.gz$")
    names = as_folder(directory, storage_options).names()
    return sorted(int(m.group(1)) for n in names if (m := pat.match(n)))


def dopamine_invalid_range(cursor: int, capacity: int, stack_size: int,
                           update_horizon: int = 1) -> np.ndarray:
    """Dopamine's ``invalid_range``: rows that cannot start a transition around the cursor."""
    return np.array([(cursor - update_horizon + i) % capacity
                     for i in range(stack_size + update_horizon)])


@dataclass
class Checkpoint:
    """One Dopamine checkpoint: its files' shapes and the ring position of its rows."""

    folder: SourceFolder
    suffix: int
    add_count: int
    invalid_range: np.ndarray
    capacity: int  # rows of every $store$ array
    arrays: dict[str, tuple[tuple[int, ...], np.dtype]]  # storage name -> (shape, dtype)
    update_horizon: int = 1

    @property
    def n(self) -> int:
        """Rows holding data (oldest first from :attr:`start`)."""
        return min(self.add_count, self.capacity)

    @property
    def wrapped(self) -> bool:
        return self.add_count > self.capacity

    @property
    def start(self) -> int:
        """File row of the oldest data row."""
        return self.add_count % self.capacity if self.wrapped else 0

    @property
    def directory(self) -> str:
        """The folder's path or URL."""
        return self.folder.url

    def path(self, name: str) -> str:
        """Path or URL of ``$store$_<name>`` (for messages)."""
        return self.folder.location(ckpt_name(STORE_PREFIX + name, self.suffix))

    def reader(self, name: str) -> NpyGzipReader:
        """A streaming reader of ``$store$_<name>``."""
        return open_npy_gz(self.folder, ckpt_name(STORE_PREFIX + name, self.suffix))

    def file_ranges(self) -> list[tuple[int, int]]:
        """File row ranges in chronological order."""
        if not self.wrapped:
            return [(0, self.n)]
        return [(r, s) for r, s in ((self.start, self.capacity), (0, self.start)) if s > r]

    def chrono(self, arr: np.ndarray) -> np.ndarray:
        """A whole file array reordered oldest-first and cut to the rows holding data."""
        if not self.wrapped:
            return arr[: self.n]
        return np.concatenate([arr[self.start:], arr[: self.start]])


_HEAD_BYTES = 1 << 16  # compressed bytes fetched for a look at a remote file's header


def open_npy_gz(folder: SourceFolder, name: str, head: bool = False) -> NpyGzipReader:
    """A streaming reader of file ``name`` of ``folder`` (``head``: reading little more
    than the header, so remote storage sends a few KiB, not a read-ahead block)."""
    if not folder.remote:
        return NpyGzipReader(folder.location(name))
    if head:
        return NpyGzipReader(folder.location(name), folder.open(name, _HEAD_BYTES),
                             chunk=_HEAD_BYTES)
    return NpyGzipReader(folder.location(name), folder.open(name))


def inspect_checkpoint(directory: str | os.PathLike | SourceFolder, suffix: int,
                       stack: int = 4, storage_options: dict[str, Any] | None = None
                       ) -> Checkpoint:
    """Read headers, ``add_count`` and ``invalid_range`` of checkpoint ``suffix``; check them.

    ``directory``: a path or any fsspec URL (``storage_options`` for fsspec). Raises
    ``FileNotFoundError`` naming a missing file and :class:`DatasetFormatError` naming a
    file whose shape, dtype or contents do not fit the format.
    """
    d = as_folder(directory, storage_options)
    need = [STORE_PREFIX + n for n in CORE] + ["add_count", "invalid_range"]
    for name in need:
        if not d.exists(ckpt_name(name, suffix)):
            raise FileNotFoundError(
                f"{d.location(ckpt_name(name, suffix))}: missing (a Dopamine checkpoint "
                f"{suffix} needs {', '.join(ckpt_name(n, suffix) for n in need)})")
    pat = re.compile(re.escape(STORE_PREFIX) + r"(.+)_ckpt\." + str(suffix) + r"\.gz$")
    names = sorted(m.group(1) for n in d.names() if (m := pat.match(n)))
    arrays: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for name in names:
        with open_npy_gz(d, ckpt_name(STORE_PREFIX + name, suffix), head=True) as r:
            arrays[name] = (r.shape, r.dtype)
    obs_path = d.location(ckpt_name(STORE_PREFIX + "observation", suffix))
    obs_shape, _ = arrays["observation"]
    if len(obs_shape) < 1:
        raise DatasetFormatError(f"{obs_path}: expected (capacity, *frame_shape), got a 0-d array")
    cap = obs_shape[0]
    for name, (shape, dtype) in arrays.items():
        p = d.location(ckpt_name(STORE_PREFIX + name, suffix))
        if not shape or shape[0] != cap:
            raise DatasetFormatError(f"{p}: expected {cap} rows like "
                                     f"{ckpt_name(STORE_PREFIX + 'observation', suffix)}, got "
                                     f"shape {shape}")
        if name in ("action", "reward", "terminal") and len(shape) != 1:
            raise DatasetFormatError(f"{p}: expected shape ({cap},), got {shape}")
        kinds = {"action": "iu", "terminal": "iub", "reward": "fiu"}.get(name, "fiub")
        if dtype.kind not in kinds:
            raise DatasetFormatError(f"{p}: expected a numeric dtype of kind {kinds!r}, got "
                                     f"{dtype}")
    ac_path = d.location(ckpt_name("add_count", suffix))
    with open_npy_gz(d, ckpt_name("add_count", suffix), head=True) as r:
        ac = r.read_all()
    if ac.size != 1 or ac.dtype.kind not in "iu" or int(ac.reshape(-1)[0]) < 0:
        raise DatasetFormatError(f"{ac_path}: expected one integer >= 0, got {ac!r}")
    add_count = int(ac.reshape(-1)[0])
    ir_path = d.location(ckpt_name("invalid_range", suffix))
    with open_npy_gz(d, ckpt_name("invalid_range", suffix), head=True) as r:
        ir = r.read_all()
    ck = Checkpoint(d, suffix, add_count, ir, cap, arrays)
    if add_count and cap:
        horizon = len(ir) - stack
        want = (dopamine_invalid_range(add_count % cap, cap, stack, horizon)
                if horizon >= 1 else None)
        if want is None or ir.shape != want.shape or not np.array_equal(ir, want):
            raise DatasetFormatError(
                f"{ir_path}: {ir.tolist()[:8]} is not Dopamine's invalid_range for "
                f"add_count={add_count}, capacity={cap}, stack_size={stack} (expected "
                f"{stack} + update_horizon entries around cursor {add_count % cap}); "
                "was the buffer written with another stack_size? (pass stack=...)")
        ck.update_horizon = horizon
    elif cap == 0:
        raise DatasetFormatError(f"{obs_path}: the buffer has capacity 0")
    return ck


def dopamine_spec(ck: Checkpoint, stack: int = 4, num_actions: int | None = None,
                  codec: dict | None = None) -> Spec:
    """The spec an import of ``ck`` creates: zero-padded frame stacks, integer actions."""
    obs_shape, obs_dtype = ck.arrays["observation"]
    extras = {}
    for name, (shape, dtype) in ck.arrays.items():
        if name not in CORE:
            extras[name] = Field(shape[1:], dtype)
    high = None if num_actions is None else int(num_actions) - 1
    return Spec.create(
        obs=Field(obs_shape[1:], obs_dtype, stack=stack if stack > 1 else None,
                  padding="zero", codec=codec),
        action=Field((), np.int64, low=0, high=high),
        reward=Field((), np.float32),
        extras=extras,
    )
