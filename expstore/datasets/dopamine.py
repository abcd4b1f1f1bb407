"""Dopamine replay checkpoints (the DQN Replay Dataset format) <-> expstore.

A checkpoint ``N`` of Dopamine's ``OutOfGraphReplayBuffer`` is a folder of gzip'd ``np.save``
files: ``$store$_observation_ckpt.N.gz`` (C, 84, 84) uint8 single frames,
``$store$_action_ckpt.N.gz`` (C,) int32, ``$store$_reward_ckpt.N.gz`` (C,) float32,
``$store$_terminal_ckpt.N.gz`` (C,) uint8, ``$store$_<extra>_ckpt.N.gz`` for extra storage
types, and ``add_count_ckpt.N.gz`` (0-d int64) / ``invalid_range_ckpt.N.gz`` (int64). ``C`` is
the replay capacity; the buffer is a ring, so when ``add_count > C`` the oldest row sits at
``add_count % C``. Dopamine's ``add()`` writes ``stack_size - 1`` all-zero *padding rows*
before every episode (after each terminal and at the start), stores no final observation
after a terminal, and ``invalid_range`` lists the rows around the write cursor that cannot
start a transition (the last row written and the ``stack_size`` rows after it).

Mapping (one checkpoint = one expstore lane, in chronological order):

* padding rows are dropped on import and written again on export; frame stacks are
  zero-padded at episode start (``Field(padding="zero")``), exactly Dopamine's stacks;
* ``terminal=1`` ends an episode as *terminated*; its final row holds an all-zero frame,
  which is what Dopamine's buffer holds after a terminal (its first padding row), so the
  stacked ``next_obs`` of a terminal transition equals Dopamine's ``next_state``;
* the newest episode (ending at the cursor without a terminal) stays open: its last row
  cannot start a transition, as in Dopamine;
* the oldest episode of a wrapped buffer continues one whose start was overwritten: it is
  stored at episode position ``stack_size - 1`` onward, so its first ``stack_size - 1`` rows
  (Dopamine's ``invalid_range`` after the cursor) cannot start transitions either. Leading
  all-zero rows of a wrapped buffer are taken as padding (a new episode starts after them).

Every stored row (all fields) survives import -> export -> import unchanged. Export writes
what Dopamine's ``save()`` writes (``np.save`` into ``gzip.GzipFile``, level 9), unwrapped,
one checkpoint suffix per lane (and per interrupted episode within a lane); episodes that
ended *truncated* are written with ``terminal=1`` (Dopamine's runner records episodes cut
at ``max_steps_per_episode`` the same way) and final observations are dropped (Dopamine
stores none). The arrays have ``capacity`` rows (default: the rows written + 1, so the buffer
is not "full" and every transition but the newest can be sampled by Dopamine).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..spec import Field, Spec
from ._npy import NpyGzipReader, load_gz
from .common import (
    DatasetFormatError,
    ImportSummary,
    Prefetch,
    Progress,
    ProgressArg,
    blocks,
    capacity_for,
    interruptible,
    set_episode_position,
)

STORE_PREFIX = "$store$_"
#: Dopamine storage names -> expstore field names
CORE = {"observation": "obs", "action": "action", "reward": "reward", "terminal": "terminated"}
_SMALL_ROW = 256  # arrays with rows up to this many bytes are loaded whole (C x 256 B)


def ckpt_path(directory: str | os.PathLike, name: str, suffix: int) -> Path:
    """``<directory>/<name>_ckpt.<suffix>.gz`` (Dopamine's ``_generate_filename``)."""
    return Path(directory) / f"{name}_ckpt.{suffix}.gz"


def find_suffixes(directory: str | os.PathLike) -> list[int]:
    """Checkpoint suffixes with an observation file in ``directory``, ascending."""
    pat = re.compile(re.escape(STORE_PREFIX) + r"observation_ckpt\.(\d+)\.gz$")
    found = [int(m.group(1)) for p in Path(directory).iterdir() if (m := pat.match(p.name))]
    return sorted(found)


def dopamine_invalid_range(cursor: int, capacity: int, stack_size: int,
                           update_horizon: int = 1) -> np.ndarray:
    """Dopamine's ``invalid_range``: rows that cannot start a transition around the cursor."""
    return np.array([(cursor - update_horizon + i) % capacity
                     for i in range(stack_size + update_horizon)])


@dataclass
class Checkpoint:
    """One Dopamine checkpoint: its files' shapes and the ring position of its rows."""

    directory: Path
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

    def path(self, name: str) -> Path:
        return ckpt_path(self.directory, STORE_PREFIX + name, self.suffix)

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


def inspect_checkpoint(directory: str | os.PathLike, suffix: int,
                       stack: int = 4) -> Checkpoint:
    """Read headers, ``add_count`` and ``invalid_range`` of checkpoint ``suffix``; check them.

    Raises ``FileNotFoundError`` naming a missing file and :class:`DatasetFormatError`
    naming a file whose shape, dtype or contents do not fit the format.
    """
    d = Path(directory)
    need = [STORE_PREFIX + n for n in CORE] + ["add_count", "invalid_range"]
    for name in need:
        p = ckpt_path(d, name, suffix)
        if not p.exists():
            raise FileNotFoundError(f"{p}: missing (a Dopamine checkpoint {suffix} needs "
                                    f"{', '.join(n + f'_ckpt.{suffix}.gz' for n in need)})")
    pat = re.compile(re.escape(STORE_PREFIX) + r"(.+)_ckpt\." + str(suffix) + r"\.gz$")
    names = sorted(m.group(1) for p in d.iterdir() if (m := pat.match(p.name)))
    arrays: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for name in names:
        with NpyGzipReader(ckpt_path(d, STORE_PREFIX + name, suffix)) as r:
            arrays[name] = (r.shape, r.dtype)
    obs_path = ckpt_path(d, STORE_PREFIX + "observation", suffix)
    obs_shape, _ = arrays["observation"]
    if len(obs_shape) < 1:
        raise DatasetFormatError(f"{obs_path}: expected (capacity, *frame_shape), got a 0-d array")
    cap = obs_shape[0]
    for name, (shape, dtype) in arrays.items():
        p = ckpt_path(d, STORE_PREFIX + name, suffix)
        if not shape or shape[0] != cap:
            raise DatasetFormatError(f"{p}: expected {cap} rows like {obs_path.name}, got shape "
                                     f"{shape}")
        if name in ("action", "reward", "terminal") and len(shape) != 1:
            raise DatasetFormatError(f"{p}: expected shape ({cap},), got {shape}")
        kinds = {"action": "iu", "terminal": "iub", "reward": "fiu"}.get(name, "fiub")
        if dtype.kind not in kinds:
            raise DatasetFormatError(f"{p}: expected a numeric dtype of kind {kinds!r}, got "
                                     f"{dtype}")
    ac_path = ckpt_path(d, "add_count", suffix)
    ac = load_gz(ac_path)
    if ac.size != 1 or ac.dtype.kind not in "iu" or int(ac.reshape(-1)[0]) < 0:
        raise DatasetFormatError(f"{ac_path}: expected one integer >= 0, got {ac!r}")
    add_count = int(ac.reshape(-1)[0])
    ir_path = ckpt_path(d, "invalid_range", suffix)
    ir = load_gz(ir_path)
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


def _load_small(ck: Checkpoint) -> dict[str, np.ndarray]:
    """Whole small arrays (action, reward, terminal, small extras), oldest row first."""
    out = {}
    for name, (shape, dtype) in ck.arrays.items():
        row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if name != "observation" and row <= _SMALL_ROW:
            out[name] = ck.chrono(load_gz(ck.path(name)))
    return out


def _padding(ck: Checkpoint, small: dict[str, np.ndarray], stack: int) -> tuple[np.ndarray, int]:
    """Padding mask from terminals (oldest first) and how many leading rows may be padding.

    Dopamine pads ``stack - 1`` zero rows after every terminal; a non-zero value there
    means the checkpoint was written with another ``stack_size``.
    """
    term = small["terminal"]
    n = len(term)
    pad = np.zeros(n, bool)
    ends = np.flatnonzero(term != 0)
    for k in range(1, stack):
        idx = ends + k
        pad[idx[idx < n]] = True
    pad &= term == 0  # a terminal right after a terminal would be a 1-step episode: keep
    for name, arr in small.items():
        flat = arr.reshape(n, -1)
        bad = np.flatnonzero(pad & (flat != 0).any(axis=1))
        if len(bad):
            j = int(bad[0])
            raise DatasetFormatError(
                f"{ck.path(name)}: row {(ck.start + j) % ck.capacity} should be padding "
                f"(Dopamine writes stack_size-1 = {stack - 1} zero rows after each terminal) "
                f"but holds {flat[j].tolist()}; was the buffer written with another "
                "stack_size? (pass stack=...)")
    zero = np.ones(n, bool)
    for arr in small.values():
        zero &= ~(arr.reshape(n, -1) != 0).any(axis=1)
    lead = 0
    while lead < min(stack - 1, n) and zero[lead] and not pad[lead]:
        lead += 1
    return pad, lead


def _count_rows(ck: Checkpoint, stack: int) -> tuple[int, int]:
    """Upper bound of store rows for a checkpoint and its episode count."""
    small = _load_small(ck)
    pad, _ = _padding(ck, small, stack)
    steps = int((~pad).sum())
    episodes = int(((small["terminal"] != 0) & ~pad).sum())
    return steps + episodes, episodes


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


def import_dopamine(src: str | os.PathLike, url: str | os.PathLike,
                    suffixes: list[int] | int | None = None, *, stack: int = 4,
                    num_actions: int | None = None, codec: dict | None = None,
                    capacity: int | None = None, shard_rows: int | None = None,
                    block_rows: int = 1024, overwrite: bool = False,
                    storage_options: dict[str, Any] | None = None, fsync: bool = False,
                    progress: ProgressArg = None) -> ImportSummary:
    """Import Dopamine checkpoint(s) from folder ``src`` into a new store at ``url``.

    ``suffixes``: which checkpoints (default: all found), one lane each, in that order.
    ``stack``: Dopamine's ``stack_size`` (the store's obs field gets ``stack`` and
    zero padding). ``codec`` for frames (default: the store's image codec). Frames are
    streamed ``block_rows`` at a time; memory stays near one block plus the small arrays
    (action/reward/terminal: 9 bytes per row). Ctrl-C stops at a block boundary with every
    row so far flushed, then raises ``KeyboardInterrupt``.
    """
    from ..store import create

    t0 = time.perf_counter()
    src = Path(src)
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: not a folder of Dopamine checkpoint files")
    if suffixes is None:
        suffixes = find_suffixes(src)
        if not suffixes:
            raise FileNotFoundError(f"{src}: no {STORE_PREFIX}observation_ckpt.<N>.gz files")
    elif isinstance(suffixes, int):
        suffixes = [suffixes]
    cks = [inspect_checkpoint(src, s, stack) for s in suffixes]
    spec = dopamine_spec(cks[0], stack, num_actions, codec)
    for ck in cks[1:]:
        other = dopamine_spec(ck, stack, num_actions, codec)
        if not other.same_as(spec):
            raise DatasetFormatError(f"{ck.path('observation')}: checkpoint {ck.suffix} holds "
                                     f"other arrays than checkpoint {cks[0].suffix}: "
                                     + "; ".join(spec.diff(other)))
    need = [_count_rows(ck, stack)[0] for ck in cks]
    cap = capacity_for(max(need), len(cks), capacity)
    summary = ImportSummary(str(src), str(url), lanes=len(cks))
    store = create(url, spec, cap, lanes=len(cks), shard_rows=shard_rows, overwrite=overwrite,
                   storage_options=storage_options, fsync=fsync)
    prog = Progress(sum(ck.n for ck in cks), f"dopamine {src.name}", progress)
    try:
        with interruptible() as intr:
            for lane, ck in enumerate(cks):
                if lane:
                    store = _reopen(store, url, lane, storage_options, fsync)
                _import_lane(store, lane, ck, stack, block_rows, prog, intr, summary)
    finally:
        prog.close()
        store.close()
        summary.seconds = time.perf_counter() - t0
    return summary


def _reopen(store: Any, url: Any, lane: int, storage_options: Any, fsync: bool) -> Any:
    from ..store import open as open_store

    store.close()
    return open_store(url, "r+", lane=lane, storage_options=storage_options, fsync=fsync)


def _stream(ck: Checkpoint, names: list[str], block_rows: int) -> Iterator[dict]:
    """Blocks of the streamed arrays, oldest rows first: ``{name: (b-a, ...) array}``."""
    readers = {name: NpyGzipReader(ck.path(name)) for name in names}
    try:
        for fa, fb in ck.file_ranges():
            for name, r in list(readers.items()):
                if r.pos > fa:  # second range of a wrapped buffer: start over
                    r.close()
                    readers[name] = r = NpyGzipReader(ck.path(name))
                r.skip(fa - r.pos)
            for a, b in blocks(fa, fb, block_rows):
                vals = {name: r.read(b - a) for name, r in readers.items()}
                if b == ck.capacity:
                    for r in readers.values():
                        r.check_end()
                yield vals
    finally:
        for r in readers.values():
            r.close()


def _import_lane(store: Any, lane: int, ck: Checkpoint, stack: int, block_rows: int,
                 prog: Progress, intr: Any, summary: ImportSummary) -> None:
    """Stream one checkpoint into ``lane`` (rows oldest first, padding dropped)."""
    if ck.n == 0:
        return
    small = _load_small(ck)
    pad, lead = _padding(ck, small, stack)
    big = [name for name in ck.arrays if name not in small]
    obs_shape, obs_dtype = ck.arrays["observation"]
    zeros = np.zeros((block_rows, *obs_shape[1:]), obs_dtype)  # lazily paged: stays free
    row_bytes = sum(int(np.prod(s[1:], dtype=np.int64)) * d.itemsize
                    for s, d in ck.arrays.values())
    q = 0  # chronological index of the next row
    with Prefetch(_stream(ck, big, block_rows)) as stream:
        for vals in stream:
            n = len(vals["observation"])
            qa, qb = q, q + n
            p = pad[qa:qb].copy()
            if qa == 0:
                # leading zero rows are padding: a new episode follows; otherwise the
                # oldest rows continue an episode whose start is gone
                lead = _leading_zero(vals, lead)
                p[:lead] = True
                set_episode_position(store, lane, stack - 1 if lead == 0 else 0)
            _check_padding(ck, vals, p, qa)
            keep = ~p
            term = small["terminal"][qa:qb] != 0
            T = int(keep.sum())
            if T:
                batch = {CORE.get(k, k): (v if keep.all() else v[keep]) for k, v in vals.items()}
                for k, v in small.items():
                    if k != "terminal":
                        batch[CORE.get(k, k)] = v[qa:qb][keep]
                batch["terminated"] = done = term[keep]
                batch["truncated"] = np.zeros(T, bool)
                if done.any():
                    batch["next_obs"] = zeros[:T]
                store.extend(batch, lane=lane)
                ends = int(done.sum())
                summary.steps += T
                summary.episodes += ends
                summary.rows += T + ends
            q = qb
            prog.update(n, n * row_bytes)
            summary.bytes_in += n * row_bytes
            intr.check()


def _leading_zero(vals: dict[str, np.ndarray], lead: int) -> int:
    """How many of the first ``lead`` rows are all zero in the streamed arrays too."""
    k = 0
    while k < min(lead, len(next(iter(vals.values())))) and not any(
            v[k].any() for v in vals.values()):
        k += 1
    return k


def _check_padding(ck: Checkpoint, vals: dict[str, np.ndarray], pad: np.ndarray,
                   q0: int) -> None:
    """Rows taken as padding must be all zero in the streamed arrays too."""
    at = np.flatnonzero(pad)
    if not len(at):
        return
    for name, v in vals.items():
        bad = np.flatnonzero(v[at].reshape(len(at), -1).any(axis=1))
        if len(bad):
            row = (ck.start + q0 + int(at[bad[0]])) % ck.capacity
            raise DatasetFormatError(
                f"{ck.path(name)}: row {row} should be zero padding (Dopamine writes "
                "stack_size-1 zero rows after each terminal) but is not; was the buffer "
                "written with another stack_size? (pass stack=...)")


from ._dopamine_export import export_dopamine  # noqa: E402  (uses the names above)

__all__ = ["Checkpoint", "STORE_PREFIX", "ckpt_path", "dopamine_invalid_range", "dopamine_spec",
           "export_dopamine", "find_suffixes", "import_dopamine", "inspect_checkpoint"]
