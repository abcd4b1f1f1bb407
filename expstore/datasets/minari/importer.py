"""Reading a Minari dataset's episodes into a new store: :func:`import_minari`."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ...api import create
from ...errors import SpecError, ValidationError
from ...field import Field
from ...spaces import check_space, space_to_json
from ...spec import Spec
from ...store import Store
from ..progress import Progress, ProgressArg
from .paths import require_minari, resolve
from .values import stack_frames, tree_map
from .write import tree_nbytes


def flat_infos(infos: dict[str, Any], where: str, prefix: str = "info") -> dict[str, Any]:
    """``{info.<a>.<b>: array}``; arrow's arrays of dicts (nested infos) become dicts."""
    out: dict[str, Any] = {}
    for k, v in infos.items():
        k = str(k)
        if not k or "." in k or "/" in k:
            raise SpecError(f"{where}: info key {k!r} cannot name a field (no '.' or '/'); "
                            "import with infos=False to skip infos")
        name = f"{prefix}.{k}"
        if isinstance(v, dict):
            out.update(flat_infos(v, where, name))
            continue
        a = np.asarray(v)
        if a.dtype == object and a.size and isinstance(a.flat[0], dict):
            out.update(flat_infos(_dicts_to_tree(list(a)), where, name))
            continue
        if a.dtype.kind not in "biuf" or a.ndim == 0:
            raise SpecError(f"{where}: info {name[5:]!r} of dtype {a.dtype} and shape "
                            f"{a.shape} is not a per-step numeric array; import with "
                            "infos=False to skip infos")
        out[name] = a
    return out


def _dicts_to_tree(items: list[dict]) -> dict[str, Any]:
    return {k: (_dicts_to_tree([d[k] for d in items]) if isinstance(items[0][k], dict)
                else np.asarray([d[k] for d in items])) for k in items[0]}


def _frame_stack(meta: dict[str, Any], frame_stack: int | str | None, padding: str,
                 where: str) -> tuple[int | None, str, dict[str, dict[str, Any]]]:
    """``(frame_stack, padding, single-frame fields to stack)`` for ``frame_stack="auto"``:
    from the dataset metadata ``expstore_frame_stack`` (see ``export_minari``)."""
    if frame_stack != "auto":
        if frame_stack is not None and (isinstance(frame_stack, bool) or
                                        not isinstance(frame_stack, int) or frame_stack < 1):
            raise ValueError(f"frame_stack: expected 'auto', None or an int >= 1, got "
                             f"{frame_stack!r}")
        return frame_stack, padding, {}
    saved = meta.get("expstore_frame_stack") or {}
    if not isinstance(saved, dict):
        return None, padding, {}
    stacked = {n: s for n, s in saved.items() if s.get("stacked")}
    singles = {n: s for n, s in saved.items() if not s.get("stacked")}
    if stacked:
        ks = {int(s["stack"]) for s in stacked.values()}
        if len(ks) != 1:
            raise ValueError(f"{where}: fields stacked by different depths {stacked}; pass "
                             "frame_stack=")
        return ks.pop(), next(iter(stacked.values())).get("padding", padding), singles
    return None, padding, singles


def import_episode(store, spec, ep, where, infos, truncate_unfinished) -> None:
    T = len(ep.rewards)
    if T < 1:
        raise ValidationError(f"{where}: has no steps")
    term = np.asarray(ep.terminations).astype(bool).reshape(-1)
    trunc = np.asarray(ep.truncations).astype(bool).reshape(-1)
    if term.shape != (T,) or trunc.shape != (T,):
        raise ValidationError(f"{where}: terminations/truncations: expected {T} values, got "
                              f"{term.shape[0]}/{trunc.shape[0]}")
    done = term | trunc
    if done[:-1].any():
        t = int(np.flatnonzero(done[:-1])[0])
        raise ValidationError(f"{where}: step {t} of {T} is terminated/truncated before the "
                              "last step")
    if not done[-1]:
        if not truncate_unfinished:
            raise ValidationError(f"{where}: the last step is neither terminated nor "
                                  "truncated (pass truncate_unfinished=True to mark it "
                                  "truncated)")
        trunc = trunc.copy()
        trunc[-1] = True
    obs = tree_map(np.asarray, ep.observations)
    flat_obs = spec.flatten("obs", obs)
    for name, a in flat_obs.items():
        if len(a) != T + 1:
            raise ValidationError(f"{where}: observations ({name}): expected {T + 1} rows "
                                  f"for {T} steps, got {len(a)}")
        f = spec.fields[name]
        if f.stack and a.shape[1:] == (f.stack, *f.shape):
            rebuilt = stack_frames(a[:, -1], f.stack, f.padding)
            bad = np.flatnonzero((rebuilt != a).reshape(T + 1, -1).any(1))
            if len(bad):
                raise ValidationError(
                    f"{where}: observations ({name}) at step {int(bad[0])} are not a stack "
                    f"of the last {f.stack} frames with {f.padding!r} padding; import with "
                    "frame_stack=None to keep whole observations")
    batch: dict[str, Any] = {
        "obs": tree_map(lambda a: a[:-1], obs), "next_obs": tree_map(lambda a: a[1:], obs),
        "action": ep.actions, "reward": ep.rewards, "terminated": term, "truncated": trunc}
    if infos:
        for name, a in flat_infos(ep.infos or {}, where).items():
            if len(a) != T + 1:
                raise ValidationError(f"{where}: info {name[5:]!r}: expected {T + 1} values "
                                      f"(reset + one per step), got {len(a)}; import with "
                                      "infos=False to skip infos")
            batch[name], batch["next_" + name] = a[:-1], a[1:]
    try:
        store.extend(batch)
    except (ValidationError, SpecError) as e:
        raise type(e)(f"{where}: {e}") from e


def import_minari(src: str | os.PathLike, url: str | os.PathLike, *,
                  root: str | os.PathLike | None = None, frame_stack: int | str | None = "auto",
                  padding: str = "reset", infos: bool = True,
                  episode_indices: Sequence[int] | None = None, capacity: int | None = None,
                  shard_rows: int | None = None, reward_dtype: Any = None,
                  truncate_unfinished: bool = False, reject_nonfinite: bool = True,
                  overwrite: bool = False, progress: ProgressArg = None,
                  storage_options: dict[str, Any] | None = None) -> Store:
    """Read a Minari dataset (a dataset id, or its directory) into a new store at ``url``.

    Any dataset ``minari`` loads works: hdf5 or arrow, JPEG-encoded or not, written by
    ``DataCollector``, ``create_dataset_from_buffers`` or :func:`export_minari`.
    ``frame_stack=k``: observations of shape ``(k, ...)`` are stored one frame per row
    (checked; see module doc); ``"auto"`` (default) restores the stacking an
    :func:`export_minari` dataset keeps in its metadata (``expstore_frame_stack``), else
    stores whole observations (``None``). ``infos=False`` skips infos. ``capacity`` defaults to the
    rows needed (``create`` rounds it up to whole shards of ``shard_rows``, default
    automatic). ``reward_dtype`` defaults to the dataset's (Minari's are float64).
    An episode must end with a terminated or truncated step and have none before;
    ``truncate_unfinished=True`` marks an unflagged last step truncated instead of
    failing. ``progress``: ``True`` for a progress bar or a callback ``fn(rows, bytes)``.
    Returns the store, open for writing, flushed. An episode that fails its checks
    raises (naming it); the episodes before it stay in the store.
    """
    minari = require_minari()
    from minari.dataset.minari_storage import MinariStorage

    data_dir = resolve(src, root)
    where = f"Minari dataset {os.fspath(src)!r}"
    ds = minari.MinariDataset(str(data_dir))
    obs_space, act_space = ds.observation_space, ds.action_space
    check_space(obs_space, f"{where}: observation space")
    check_space(act_space, f"{where}: action space")
    indices = [int(i) for i in (ds.episode_indices if episode_indices is None
                                else episode_indices)]
    if not indices:
        raise ValueError(f"{where}: no episodes to import")
    metas = list(ds.storage.get_episode_metadata(indices))
    needed = sum(int(m.get("total_steps", 0)) + 1 for m in metas)
    it = iter(ds.iterate_episodes(indices))
    first = next(it)
    info_fields = ({n: Field(a.shape[1:], a.dtype) for n, a in
                    flat_infos(first.infos or {}, f"{where} episode {first.id}").items()}
                   if infos else {})
    raw_meta = MinariStorage.read_raw_metadata(data_dir)
    frame_stack, padding, singles = _frame_stack(raw_meta, frame_stack, padding, where)
    try:
        spec = Spec.from_spaces(obs_space, act_space, frame_stack=frame_stack,
                                extras=info_fields, padding=padding)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from e
    if singles:  # exported as single frames: stack them again
        spec = replace(spec, fields={n: replace(f, stack=singles[n]["stack"],
                                                padding=singles[n]["padding"])
                                     if n in singles else f for n, f in spec.fields.items()})
    structure = dict(spec.structure)
    structure["obs"] = {**structure["obs"], "gym": space_to_json(obs_space)}
    structure["action"] = {**structure["action"], "gym": space_to_json(act_space)}
    structure["minari"] = {"env_spec": raw_meta.get("env_spec")}  # restored on export
    fields = dict(spec.fields)
    rdt = np.dtype(reward_dtype) if reward_dtype is not None else np.asarray(first.rewards).dtype
    if rdt.kind != "f":
        rdt = np.dtype(np.float32)
    fields["reward"] = Field((), rdt)
    spec = replace(spec, fields=fields, structure=structure, reject_nonfinite=reject_nonfinite)
    capacity = needed if capacity is None else int(capacity)  # create() rounds up to shards
    if capacity < needed:
        raise ValueError(f"capacity: {capacity} rows < {needed} the episodes need "
                         "(steps + one final row per episode)")
    store = create(url, spec, capacity, shard_rows=shard_rows, overwrite=overwrite,
                   storage_options=storage_options)
    bar = Progress(needed, f"minari import {os.fspath(src)}", progress)
    try:
        for ep in itertools.chain([first], it):
            import_episode(store, spec, ep, f"{where} episode {ep.id}", infos,
                           truncate_unfinished)
            bar.update(len(ep.rewards) + 1, tree_nbytes(ep.observations))
        store.flush()
    except BaseException:
        store.close()
        raise
    finally:
        bar.close()
    return store
