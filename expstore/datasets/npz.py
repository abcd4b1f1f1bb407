"""A store as one ``.npz`` file (small data: everything is held in RAM) and back.

Layout (``expstore-npz/1``): one array per field, named like the field (``obs``,
``obs.pixels``, ``action``, ``reward``, ``terminated``, ``truncated``, user fields), holding
every intact row of every lane in write order — final rows included, so each episode of
``T`` steps is ``T + 1`` consecutive rows and the final observation is kept. Beside them:
``lane`` (int32), ``episode_step`` (int32: position in the episode), ``flags`` (uint8:
FIRST=1, LAST=2, TERMINATED=4, TRUNCATED=8), ``__spec__`` (the spec as JSON) and
``__format__``. Import rebuilds the same rows, lanes and episode structure.

:func:`import_npz` also reads a D4RL-style npz (``observations``, ``actions``, ``rewards``,
``terminals``, ``timeouts``, optional ``next_observations``) with the D4RL rules.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from ..errors import DatasetFormatError
from ..rows import FLAG_FIRST, FLAG_LAST
from ..spec import Spec
from .episodes import capacity_for, lane_rows
from .progress import ProgressArg
from .summary import ImportSummary

FORMAT = "expstore-npz/1"
_META = ("lane", "episode_step", "flags", "__spec__", "__format__")


def export_npz(url: str | os.PathLike, dst: str | os.PathLike, *, compressed: bool = True,
               storage_options: dict[str, Any] | None = None,
               progress: ProgressArg = None) -> ImportSummary:
    """Write every intact row of the store at ``url`` to ``dst`` (``.npz``)."""
    from ..store import open as open_store

    t0 = time.perf_counter()
    store = open_store(url, "r", storage_options=storage_options)
    summary = ImportSummary(str(url), os.fspath(dst))
    try:
        spec = store.spec
        parts: dict[str, list[np.ndarray]] = {n: [] for n in (*spec.fields, *_META[:3])}
        for lane in range(store.lanes):
            lr = lane_rows(store, lane)
            for name in spec.fields:
                parts[name].append(store.read(name, lr.rows, lr.steps))
            parts["lane"].append(np.full(len(lr.rows), lane, np.int32))
            parts["episode_step"].append(lr.episode_step.astype(np.int32))
            parts["flags"].append(lr.flags.astype(np.uint8))
            summary.episodes += int(((lr.flags & FLAG_LAST) != 0).sum())
        arrays = {k: np.concatenate(v) for k, v in parts.items()}
        arrays["__spec__"] = np.array(json.dumps(spec.to_json()))
        arrays["__format__"] = np.array(FORMAT)
        dst = os.fspath(dst)
        tmp = f"{dst}.{os.getpid()}.tmp.npz"
        (np.savez_compressed if compressed else np.savez)(tmp, **arrays)
        os.replace(tmp, dst)
        summary.rows = len(arrays["lane"])
        summary.steps = int(((arrays["flags"] & FLAG_LAST) == 0).sum())
        summary.lanes = store.lanes
        summary.outputs.append(dst)
    finally:
        store.close()
    summary.seconds = time.perf_counter() - t0
    return summary


def import_npz(src: str | os.PathLike, url: str | os.PathLike, *, capacity: int | None = None,
               shard_rows: int | None = None, overwrite: bool = False,
               storage_options: dict[str, Any] | None = None, fsync: bool = False,
               progress: ProgressArg = None) -> ImportSummary:
    """Create a store at ``url`` from an npz written by :func:`export_npz` (or D4RL-style)."""
    from ..store import create

    t0 = time.perf_counter()
    where = os.fspath(src)
    try:
        npz = np.load(where, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DatasetFormatError(f"{where}: not a readable .npz file ({e})") from e
    with npz:
        if "__spec__" not in npz.files:
            if "observations" in npz.files:
                from .d4rl import import_d4rl

                return import_d4rl(dict(npz), url, capacity=capacity, shard_rows=shard_rows,
                                   overwrite=overwrite, storage_options=storage_options,
                                   fsync=fsync, progress=progress)
            raise DatasetFormatError(f"{where}: neither an expstore npz (no '__spec__') nor a "
                                     f"D4RL-style npz (no 'observations'); keys: {npz.files}")
        fmt = str(npz["__format__"]) if "__format__" in npz.files else "?"
        if fmt != FORMAT:
            raise DatasetFormatError(f"{where}: format {fmt!r}, expected {FORMAT!r}")
        try:
            spec = Spec.from_json(json.loads(str(npz["__spec__"])))
        except (ValueError, KeyError) as e:
            raise DatasetFormatError(f"{where}: '__spec__' is not a valid spec ({e})") from e
        missing = [k for k in (*spec.fields, *_META[:3]) if k not in npz.files]
        if missing:
            raise DatasetFormatError(f"{where}: missing arrays {missing}")
        data = {k: npz[k] for k in (*spec.fields, *_META[:3])}
    n = len(data["lane"])
    for k, v in data.items():
        want = spec.fields[k].shape if k in spec.fields else ()
        if len(v) != n or v.shape[1:] != want:
            raise DatasetFormatError(f"{where}: array {k!r} has shape {v.shape}, expected "
                                     f"({n}, *{want})")
    lanes = int(data["lane"].max()) + 1 if n else 1
    per_lane = np.bincount(data["lane"], minlength=lanes) if n else np.zeros(1, int)
    cap = capacity_for(int(per_lane.max()), lanes, capacity)
    summary = ImportSummary(where, str(url), lanes=lanes)
    store = create(url, spec, cap, lanes=lanes, shard_rows=shard_rows, overwrite=overwrite,
                   storage_options=storage_options, fsync=fsync)
    try:
        for lane in range(lanes):
            idx = np.flatnonzero(data["lane"] == lane)
            _import_lane(store, spec, lane, {k: v[idx] for k, v in data.items()}, where,
                         summary)
    finally:
        store.close()
    summary.seconds = time.perf_counter() - t0
    return summary


def _import_lane(store: Any, spec: Spec, lane: int, d: dict[str, np.ndarray], where: str,
                 summary: ImportSummary) -> None:
    flags, ep = d["flags"], d["episode_step"]
    n = len(flags)
    if n == 0:
        return
    last = (flags & FLAG_LAST) != 0
    first = (flags & FLAG_FIRST) != 0
    if last[0]:
        raise DatasetFormatError(f"{where}: lane {lane} starts with a final row")
    # pieces start at the lane start and where a new episode follows an unfinished one
    starts = np.flatnonzero(first & np.concatenate([[True], ~last[:-1]]))
    starts = np.union1d([0], starts)
    for lo, hi in zip(starts, np.append(starts[1:], n)):
        step = np.arange(lo, hi)[~last[lo:hi]]
        done = d["terminated"][step] | d["truncated"][step]
        fin = step[done] + 1
        if len(fin) and (fin.max() >= n or not last[fin].all()):
            raise DatasetFormatError(f"{where}: lane {lane}: an episode-ending row is not "
                                     "followed by its final row")
        batch = {name: d[name][step] for name in spec.fields if name not in spec.obs_names}
        for name in spec.obs_names:
            batch[name] = d[name][step]
            nxt = np.zeros_like(batch[name])
            nxt[done] = d[name][fin]
            batch["next_" + name] = nxt
        obs = {k[4:]: batch.pop(k) for k in list(batch) if k.startswith("obs.")}
        nxt_obs = {k[9:]: batch.pop(k) for k in list(batch) if k.startswith("next_obs.")}
        if obs:
            batch["obs"], batch["next_obs"] = obs, nxt_obs
        act = {k[7:]: batch.pop(k) for k in list(batch) if k.startswith("action.")}
        if act:
            batch["action"] = act
        store.set_episode_position(lane, int(ep[lo]))
        store.extend(batch, lane=lane, check_next_obs=False)
        summary.steps += len(step)
        summary.episodes += int(done.sum())
        summary.rows += len(step) + int(done.sum())
