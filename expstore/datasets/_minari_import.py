"""Reading a Minari dataset's episodes into a store (see ``datasets.minari``)."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np

from ..errors import SpecError, ValidationError
from ._minari_export import datasets_root
from ._minari_spaces import stack_frames, tree_map


def resolve(src: str | os.PathLike, root: str | os.PathLike | None) -> pathlib.Path:
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
