"""Which LeRobot feature becomes which store field (and back): :func:`import_plan`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...errors import DatasetFormatError
from ...field import Field
from ...spec import BUILTIN, RESERVED, Spec
from .layout import NUMERIC, Meta, feature_shape

#: LeRobot per-frame columns kept as store fields of the same name
FRAME_COLUMNS = ("timestamp", "frame_index", "episode_index", "task_index")


@dataclass
class Column:
    """One LeRobot feature and the store field it fills (``kind``: ``image``, ``video``,
    ``value``, ``reward``; ``done`` fills the episode ends)."""

    key: str
    field: str | None
    kind: str
    shape: tuple[int, ...] = ()
    dtype: Any = None


@dataclass
class Plan:
    spec: Spec
    columns: list[Column]
    notes: list[str] = field(default_factory=list)
    from_sidecar: bool = False

    @property
    def done(self) -> Column | None:
        return next((c for c in self.columns if c.kind == "done"), None)


def _field_name(key: str) -> str:
    if key.startswith("observation."):
        return "obs." + key[len("observation."):]
    if key in RESERVED or key in BUILTIN or key.startswith("_") or key.startswith("next_obs"):
        return "lerobot." + key
    return key


def import_plan(meta: Meta, codec: dict | None, reject_nonfinite: bool) -> Plan:
    """The spec a dataset imports into and how its features map (notes say what is
    dropped and why). A dataset written by ``export_lerobot`` carries the spec it came from
    (``meta/expstore.json``) and gets it back exactly."""
    side = meta.sidecar or {}
    if "spec" in side and "columns" in side:
        return _sidecar_plan(meta, side, codec)
    obs: dict[str, Field] = {}
    extras: dict[str, Field] = {}
    action = reward = None
    cols: list[Column] = []
    notes: list[str] = []
    for key, ft in meta.features.items():
        dt = str(ft.get("dtype"))
        shape = feature_shape(key, ft)
        if key == "index":
            notes.append("dropped index: a frame's position in the dataset (export writes it)")
            continue
        if dt in ("image", "video"):
            name = _field_name(key if key.startswith("observation.") else "observation." + key)
            obs[name[4:]] = Field(shape, np.uint8, codec=codec)
            cols.append(Column(key, name, dt, shape, np.uint8))
            how = "PNG/JPEG in parquet" if dt == "image" else "MP4, decoded with PyAV"
            notes.append(f"{key} -> {name} (uint8 {shape}, {how})")
            continue
        if dt not in NUMERIC:
            notes.append(f"dropped {key}: dtype {dt!r} is not numeric")
            continue
        if key == "next.done":
            cols.append(Column(key, None, "done", shape, np.bool_))
            notes.append("next.done -> terminated on an episode's last frame (else truncated)")
            continue
        f = Field(shape, np.dtype(dt))
        if key == "action":
            action = f
            cols.append(Column(key, "action", "value", shape, f.dtype))
        elif key == "next.reward":
            rdt = f.dtype if f.dtype.kind == "f" else np.dtype(np.float32)
            reward = Field((), rdt) if shape in ((), (1,)) else None
            if reward is None:
                notes.append(f"dropped next.reward: shape {list(shape)} is not a scalar")
                continue
            cols.append(Column(key, "reward", "reward", (), rdt))
        elif key.startswith("observation."):
            name = _field_name(key)
            obs[name[4:]] = f
            cols.append(Column(key, name, "value", shape, f.dtype))
        else:
            name = _field_name(key)
            extras[name] = f
            cols.append(Column(key, name, "value", shape, f.dtype))
        last = cols[-1]
        notes.append(f"{key} -> {last.field} ({np.dtype(last.dtype)} {last.shape})")
    if action is None:
        raise DatasetFormatError("meta/info.json: no 'action' feature (a store needs actions)")
    if not obs:
        raise DatasetFormatError("meta/info.json: no observation.* feature")
    if reward is None:
        notes.append("no next.reward: rewards stored as 0")
    if not any(c.kind == "done" for c in cols):
        notes.append("no next.done: every episode ends truncated")
    notes.append("final row of each episode (the observation after the last frame, which "
                 "LeRobot does not store): a copy of the last frame's")
    spec = Spec.create(obs, action, reward, extras, reject_nonfinite=reject_nonfinite)
    spec = replace(spec, structure={**spec.structure, "lerobot": _origin(meta, cols)})
    return Plan(spec, cols, notes)


def _origin(meta: Meta, cols: list[Column]) -> dict[str, Any]:
    """What an export restores: fps, robot type, tasks, the source's feature entries and
    names (``structure["lerobot"]`` of the store)."""
    return {"fps": meta.info.get("fps"), "robot_type": meta.info.get("robot_type"),
            "codebase_version": meta.info.get("codebase_version"), "tasks": meta.tasks,
            "features": meta.features,
            "columns": {c.field: c.key for c in cols if c.field is not None}}


def _sidecar_plan(meta: Meta, side: dict[str, Any], codec: dict | None) -> Plan:
    spec = Spec.from_json(side["spec"])
    if codec is not None:  # given: for the cameras, as in any import
        cams = {n for n, k in side["columns"].items()
                if meta.features.get(k, {}).get("dtype") in ("image", "video")}
        spec = replace(spec, fields={n: replace(f, codec=codec) if n in cams else f
                                     for n, f in spec.fields.items()})
    cols = []
    for name, key in side["columns"].items():
        ft = meta.features.get(key)
        if ft is None:
            raise DatasetFormatError(f"meta/expstore.json: column {key!r} (field {name!r}) "
                                     "is not a feature in meta/info.json")
        f = spec.fields[name]
        kind = ft["dtype"] if ft["dtype"] in ("image", "video") else (
            "reward" if name == "reward" else "value")
        cols.append(Column(key, name, kind, f.shape, f.dtype))
    if "next.done" in meta.features:
        cols.append(Column("next.done", None, "done", (), np.bool_))
    notes = ["the spec and final rows written by expstore's export (meta/expstore.json)"]
    notes += [f"{c.key} -> {c.field}" for c in cols if c.field]
    return Plan(spec, cols, notes, from_sidecar=True)
