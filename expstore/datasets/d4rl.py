"""D4RL HDF5 datasets <-> expstore, streamed in blocks of rows (``h5py`` imported lazily).

A D4RL file holds one row per transition: ``observations``, ``actions``, ``rewards``,
``terminals``, ``timeouts`` (bool), optionally ``next_observations``, per-step
``infos/<key>`` arrays and a ``metadata`` group. Episodes are the runs of rows ending
at a ``terminals`` or ``timeouts`` flag.

Import (one lane): each row becomes a step; an episode's final row holds
``next_observations`` of its last step. Where ``next_observations[i]`` differs from
``observations[i+1]`` inside an episode (a hidden reset), the episode is cut there as
*truncated* (counted in the summary's notes). Without ``next_observations``: a terminal
episode's final row is all zeros (it is never bootstrapped from); the last step of a
timeout episode — and of the file's unfinished last episode — is dropped and the step
before it ends the episode as truncated with the dropped step's observation as its final
observation (what ``d4rl.qlearning_dataset`` does). The unfinished last episode of a file
with ``next_observations`` ends truncated. ``infos/a/b`` becomes field ``infos.a.b``; other
top-level per-row arrays keep their name; ``metadata`` is not imported (noted).

Export writes every stored transition: ``terminals``/``timeouts`` from the terminated /
truncated flags, ``next_observations`` from the next row (the final row at episode end),
gzip-compressed by default, the store's spec in the file attribute ``expstore_spec`` (so
import restores frame stacking). An episode without final row (still open, or
interrupted) is written up to its last step that has a next observation, which is marked
as a timeout; the summary's notes count the steps left out.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import DatasetFormatError
from ..field import Field
from ..rows import FLAG_LAST
from ..spec import Spec
from .episodes import ExportReader, capacity_for, lane_rows
from .progress import Progress, ProgressArg, interruptible
from .streaming import Prefetch, blocks, check_block_rows
from .summary import ImportSummary, store_bytes

SPEC_ATTR = "expstore_spec"  # file attribute: the exported store's spec (JSON)
CORE = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")
_FLAG_KINDS = "biuf"


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - h5py is a test dependency
        raise ImportError("D4RL files need h5py: pip install 'expstore[d4rl]'") from e
    return h5py


def _datasets(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, dataset)`` of every dataset under an h5py group (or a dict of arrays)."""
    for key in group:
        item = group[key]
        path = f"{prefix}{key}"
        if hasattr(item, "shape"):
            yield path, item
        elif hasattr(item, "keys"):
            yield from _datasets(item, path + "/")


def _flag(src: Any, name: str, n: int, where: str) -> np.ndarray:
    if name not in src:
        return np.zeros(n, bool)
    a = np.asarray(src[name][()]).reshape(-1) if src[name].shape else None
    if a is None or len(a) != n or a.dtype.kind not in _FLAG_KINDS or not np.isin(a, (0, 1)).all():
        raise DatasetFormatError(f"{where}/{name}: expected {n} values of 0/1, got "
                                 f"{getattr(src[name], 'shape', None)} {src[name].dtype}")
    return a.astype(bool)


class _Plan:
    """Per-row decisions of an import: which rows are kept and where episodes end."""

    def __init__(self, src: Any, where: str, block_rows: int) -> None:
        obs = src["observations"]
        n = len(obs)
        self.n = n
        self.has_next = "next_observations" in src
        self.terminal = _flag(src, "terminals", n, where)
        timeout = _flag(src, "timeouts", n, where)
        done = self.terminal | timeout
        self.cut = np.zeros(n, bool)  # hidden resets: next_obs[i] != obs[i+1]
        if self.has_next:
            nxt = src["next_observations"]
            if nxt.shape != obs.shape:
                raise DatasetFormatError(f"{where}/next_observations: shape {nxt.shape} differs "
                                         f"from observations {obs.shape}")
            for a, b in blocks(0, n - 1, block_rows):
                o = np.asarray(obs[a + 1 : b + 1])
                x = np.asarray(nxt[a:b])
                same = (o == x) | (np.isnan(o) & np.isnan(x)) if o.dtype.kind == "f" else o == x
                self.cut[a:b] = ~same.reshape(b - a, -1).all(axis=1)
            self.cut &= ~done
            self.keep = np.ones(n, bool)
            self.end = done | self.cut
            if n:
                self.end[-1] = True
            self.trunc = self.end & ~self.terminal
        else:
            # a timeout step (and the unfinished last step) has no next observation: drop it
            self.keep = ~(timeout & ~self.terminal)
            if n and not done[-1]:
                self.keep[-1] = False
            nxt_dropped = np.append(~self.keep[1:], False)
            self.end = self.terminal | (self.keep & nxt_dropped)
            self.trunc = self.end & ~self.terminal
        self.steps = int(self.keep.sum())
        self.episodes = int((self.end & self.keep).sum())


def d4rl_spec(src: Any, where: str = "", reject_nonfinite: bool = True) -> Spec:
    """Spec for a D4RL-layout mapping (h5py file or dict of arrays)."""
    for key in ("observations", "actions", "rewards"):
        if key not in src:
            raise DatasetFormatError(f"{where}: missing dataset {key!r} (a D4RL file has "
                                     f"{', '.join(CORE[:5])})")
    n = len(src["observations"])
    obs, act, rew = src["observations"], src["actions"], src["rewards"]
    if len(act) != n or len(rew) != n:
        raise DatasetFormatError(f"{where}: observations, actions and rewards have "
                                 f"{n}, {len(act)} and {len(rew)} rows")
    if rew.shape not in ((n,), (n, 1)):
        raise DatasetFormatError(f"{where}/rewards: expected shape ({n},), got {rew.shape}")
    extras = {}
    for path, ds in _datasets(src):
        if path in CORE or path.startswith("metadata/"):
            continue
        if not ds.shape or ds.shape[0] != n or ds.dtype.kind not in "biuf":
            continue
        extras[path.replace("/", ".")] = Field(ds.shape[1:], ds.dtype)
    return Spec.create(obs=Field(obs.shape[1:], obs.dtype), action=Field(act.shape[1:], act.dtype),
                       reward=Field((), np.float32 if rew.dtype.itemsize <= 4 else rew.dtype),
                       extras=extras, reject_nonfinite=reject_nonfinite)


def import_d4rl(src: str | os.PathLike | Any, url: str | os.PathLike, *,
                stack: int | str | None = "auto", padding: str | None = None,
                capacity: int | None = None, shard_rows: int | None = None,
                block_rows: int = 8192,
                reject_nonfinite: bool = True, overwrite: bool = False,
                storage_options: dict[str, Any] | None = None, fsync: bool = False,
                progress: ProgressArg = None, where: str | None = None) -> ImportSummary:
    """Import a D4RL HDF5 file (path, or an open h5py file / dict of arrays) into ``url``.

    ``stack``: frames per stacked observation (``observations`` holds one frame per row);
    ``"auto"`` (default) restores what the file's ``expstore_spec`` attribute says (written
    by :func:`export_d4rl`), else none. ``padding``: ``"reset"``/``"zero"`` (default: the
    file's, else ``"reset"``). Rows are read ``block_rows`` at a time (memory ~ one
    block). Ctrl-C stops at a block boundary with every row so far flushed, then raises
    ``KeyboardInterrupt``. ``where``: how messages name a mapping given as ``src``.
    """
    t0 = time.perf_counter()
    block_rows = check_block_rows(block_rows)
    if isinstance(src, (str, os.PathLike)):
        h5py = _h5py()
        where = os.fspath(src)
        try:
            f = h5py.File(where, "r")
        except OSError as e:
            raise DatasetFormatError(f"{where}: not a readable HDF5 file ({e})") from e
        with f:
            return _import(f, where, url, capacity, shard_rows, block_rows, reject_nonfinite,
                           overwrite, storage_options, fsync, progress, t0, stack, padding)
    return _import(src, where or "<arrays>", url, capacity, shard_rows, block_rows,
                   reject_nonfinite, overwrite, storage_options, fsync, progress, t0, stack,
                   padding)


def saved_spec(src: Any) -> dict[str, Any] | None:
    """The spec JSON :func:`export_d4rl` keeps in the file's ``expstore_spec`` attribute."""
    raw = getattr(src, "attrs", {}).get(SPEC_ATTR)
    if raw is None:
        return None
    try:
        return json.loads(raw if isinstance(raw, str) else bytes(raw).decode())
    except (ValueError, TypeError):
        return None


def _with_stack(spec: Spec, src: Any, stack: int | str | None, padding: str | None,
                summary: ImportSummary) -> Spec:
    """``spec`` with the observation's frame stacking: given, or the file's (``"auto"``)."""
    saved = (saved_spec(src) or {}).get("fields", {}).get("obs", {})
    if stack == "auto":
        stack = saved.get("stack")
        if stack:
            summary.notes.append(f"obs: stack={stack} restored from the file's {SPEC_ATTR} "
                                 "(import with stack=None for single frames)")
    elif stack is not None and (isinstance(stack, bool) or not isinstance(stack, int)
                                or stack < 1):
        raise ValueError(f"stack: expected 'auto', None or an int >= 1, got {stack!r}")
    if not stack or stack == 1:
        return spec
    padding = padding or saved.get("padding") or "reset"
    fields = dict(spec.fields)
    fields["obs"] = replace(fields["obs"], stack=int(stack), padding=padding)
    return replace(spec, fields=fields)


def _import(src: Any, where: str, url: Any, capacity: int | None, shard_rows: int | None,
            block_rows: int, reject_nonfinite: bool, overwrite: bool, storage_options: Any,
            fsync: bool, progress: ProgressArg, t0: float, stack: int | str | None = None,
            padding: str | None = None) -> ImportSummary:
    from ..api import create

    summary = ImportSummary(where, str(url), lanes=1, kind="d4rl import")
    spec = _with_stack(d4rl_spec(src, where, reject_nonfinite), src, stack, padding, summary)
    plan = _Plan(src, where, block_rows)
    need = plan.steps + plan.episodes
    cap = capacity_for(need, 1, capacity)
    if plan.cut.any():
        summary.notes.append(f"{int(plan.cut.sum())} episode(s) cut where next_observations "
                             "differs from the next row's observations (stored as truncated)")
    dropped = plan.n - plan.steps
    if dropped:
        summary.notes.append(f"{dropped} step(s) without a next observation dropped (no "
                             "next_observations in the file)")
    if any(p.startswith("metadata/") for p, _ in _datasets(src)):
        summary.notes.append("metadata/* is not imported")
    extras = {n: n.replace(".", "/") for n in spec.fields if n not in (
        "obs", "action", "reward", "terminated", "truncated")}
    names = {"obs": "observations", "action": "actions", "reward": "rewards", **extras}
    store = create(url, spec, cap, shard_rows=shard_rows, overwrite=overwrite,
                   storage_options=storage_options, fsync=fsync)
    row_bytes = sum(f.row_nbytes for f in spec.fields.values())
    prog = Progress(plan.n, f"d4rl {os.path.basename(where)}", progress)

    def read() -> Iterator[tuple[int, int, dict]]:
        for a, b in blocks(0, plan.n, block_rows):
            vals = {k: np.asarray(src[path][a:b]) for k, path in names.items()}
            vals["reward"] = vals["reward"].reshape(b - a)
            vals["_obs_next"] = np.asarray(src["observations"][b : b + 1])
            if plan.has_next:
                vals["_next"] = np.asarray(src["next_observations"][a:b])
            yield a, b, vals

    try:
        with interruptible() as intr, Prefetch(read()) as stream:
            store.set_episode_position(0, 0)
            for a, b, vals in stream:
                keep = plan.keep[a:b]
                end = plan.end[a:b]
                if plan.has_next:
                    nxt = vals["_next"]
                else:  # final obs: zeros after a terminal, else the (dropped) next row's obs
                    obs_next = np.concatenate([vals["obs"][1:], vals["_obs_next"]])
                    if len(obs_next) < b - a:
                        obs_next = np.concatenate([obs_next, np.zeros_like(vals["obs"][:1])])
                    nxt = np.where(plan.terminal[a:b].reshape(-1, *[1] * (vals["obs"].ndim - 1)),
                                   0, obs_next).astype(vals["obs"].dtype)
                batch = {k: v[keep] for k, v in vals.items() if not k.startswith("_")}
                batch["terminated"] = (plan.terminal[a:b] & end)[keep]
                batch["truncated"] = plan.trunc[a:b][keep]
                batch["next_obs"] = nxt[keep]
                T = int(keep.sum())
                if T:
                    store.extend(batch, lane=0, check_next_obs=False)
                ends = int(end[keep].sum())
                summary.steps += T
                summary.episodes += ends
                summary.rows += T + ends
                summary.bytes_in += (b - a) * row_bytes
                prog.update(b - a, (b - a) * row_bytes)
                intr.check()
    finally:
        prog.close()
        store.close()
        summary.seconds = time.perf_counter() - t0
    summary.bytes_out = store_bytes(url, storage_options)
    return summary


# -- export ------------------------------------------------------------------------------
def _transitions(store: Any) -> list[tuple[Any, np.ndarray, np.ndarray, int]]:
    """Per lane: (lane rows, indexes of exported steps, timeout override mask, steps left
    out because their next observation is not stored)."""
    out = []
    for lane in range(store.lanes):
        lr = lane_rows(store, lane)
        n = len(lr.steps)
        if n == 0:
            continue
        last = (lr.flags & FLAG_LAST) != 0
        step = ~last
        nxt_exists = np.append(np.ones(n - 1, bool), False)
        nxt_first = np.append((lr.episode_step[1:] == 0) & ~last[:-1] & ~last[1:], False)
        # a step exports when its next row is in the same episode (a step or its final row)
        ok = step & nxt_exists & ~nxt_first
        # an episode without final row: its last exported step becomes a timeout
        dangling = step & ~ok
        force = np.zeros(n, bool)
        prev = np.flatnonzero(dangling) - 1
        prev = prev[prev >= 0]
        force[prev[ok[prev]]] = True
        out.append((lr, np.flatnonzero(ok), force, int(dangling.sum())))
    return out


def export_d4rl(url: str | os.PathLike, dst: str | os.PathLike, *, block_rows: int = 2048,
                compression: str | None = "gzip", compression_level: int | None = None,
                overwrite: bool = False, storage_options: dict[str, Any] | None = None,
                progress: ProgressArg = None) -> ImportSummary:
    """Write every transition of the store at ``url`` as a D4RL HDF5 file ``dst``.

    Lanes are written one after the other. ``compression``: h5py dataset compression,
    ``"gzip"`` (default, level ``compression_level``, default 4), ``"lzf"`` or ``None``
    (uncompressed). Fields ``infos.x`` become ``infos/x``. The store's spec is kept in the
    file's ``expstore_spec`` attribute, so :func:`import_d4rl` restores frame stacking.
    The last step of an episode still open has no stored next observation: it is left out
    (the summary's notes count such steps) and the step before it is marked a timeout.
    Fails if ``dst`` exists unless ``overwrite=True``; the file appears at ``dst`` only
    when complete.
    """
    from ..api import open as open_store

    h5py = _h5py()
    if compression not in (None, "gzip", "lzf"):
        raise ValueError(f"compression: expected 'gzip', 'lzf' or None, got {compression!r}")
    block_rows = check_block_rows(block_rows)
    dst = os.fspath(dst)
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst}: exists (pass overwrite=True, or --overwrite, to "
                              "replace it)")
    t0 = time.perf_counter()
    store = open_store(url, "r", storage_options=storage_options)
    tmp = f"{dst}.{os.getpid()}.tmp"
    summary = ImportSummary(str(url), dst, kind="d4rl export")
    try:
        spec = store.spec
        if spec.obs_names != ["obs"] or spec.action_names != ["action"]:
            raise DatasetFormatError(f"{store.url}: D4RL stores one observation and one action "
                                     f"array; this store has {spec.obs_names} and "
                                     f"{spec.action_names}")
        plans = _transitions(store)
        total = sum(len(s) for _, s, _, _ in plans)
        left = {lr.lane: n for lr, _, _, n in plans if n}
        if left:
            summary.notes.append(
                f"{sum(left.values()):,} step(s) of open episodes left out: their next "
                "observation is not stored yet (" + ", ".join(
                    f"lane {k}: {v}" for k, v in sorted(left.items())) + "); the step "
                "before each is written as a timeout")
        extras = [n for n in spec.fields if n not in ("obs", "action", "reward", "terminated",
                                                      "truncated")]
        cols = {"observations": "obs", "actions": "action", "rewards": "reward",
                **{n.replace(".", "/"): n for n in extras}}
        prog = Progress(total, f"d4rl export {os.path.basename(dst)}", progress)
        row_bytes = sum(spec.fields[n].row_nbytes for n in cols.values()) + \
            spec.fields["obs"].row_nbytes + 2
        reader = ExportReader(store)
        with h5py.File(tmp, "w") as f:
            f.attrs[SPEC_ATTR] = json.dumps(spec.to_json())
            kw: dict[str, Any] = {}
            if compression and total:
                kw["compression"] = compression
                if compression == "gzip":
                    kw["compression_opts"] = 4 if compression_level is None else \
                        int(compression_level)
            ds = {}
            for key, name in [*cols.items(), ("next_observations", "obs")]:
                fld = spec.fields[name]
                ds[key] = f.create_dataset(key, (total, *fld.shape), fld.dtype, **kw)
            for key in ("terminals", "timeouts"):
                ds[key] = f.create_dataset(key, (total,), bool, **kw)
            pos = 0
            for lr, sel, force, _ in plans:
                for a, b in blocks(0, len(sel), block_rows):
                    idx = sel[a:b]
                    rows, steps = lr.rows[idx], lr.steps[idx]
                    nrows, nsteps = lr.rows[idx + 1], lr.steps[idx + 1]
                    for key, name in cols.items():
                        ds[key][pos : pos + b - a] = reader.read(name, rows, steps)
                    ds["next_observations"][pos : pos + b - a] = reader.read("obs", nrows,
                                                                             nsteps)
                    ds["terminals"][pos : pos + b - a] = reader.read("terminated", rows, steps)
                    trunc = reader.read("truncated", rows, steps) | force[idx]
                    ds["timeouts"][pos : pos + b - a] = trunc
                    summary.episodes += int(((lr.flags[idx + 1] & FLAG_LAST) != 0).sum())
                    pos += b - a
                    prog.update(b - a, (b - a) * row_bytes)
        prog.close()
        reader.close()
        os.replace(tmp, dst)
        summary.steps = summary.rows = total
        summary.lanes = store.lanes
        summary.bytes_in = total * row_bytes
        summary.bytes_out = os.path.getsize(dst)
        summary.outputs.append(dst)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    finally:
        store.close()
    summary.seconds = time.perf_counter() - t0
    return summary
