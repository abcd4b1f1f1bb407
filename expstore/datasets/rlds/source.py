"""A TFDS dataset directory as an import reads it: ``dataset_info.json`` (splits and their
shard files), ``features.json`` (:mod:`.features`) and the field mapping into a store
(:func:`field_plan`)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import DatasetFormatError
from ...field import Field
from ...spec import Spec
from ..source import SourceFolder
from .features import Leaf, parse_features

#: TFDS's default shard file name template (dataset_info.json's ``filepathTemplate``)
TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
#: the spec an export writes beside the TFDS files (stacking, bounds, codecs)
SPEC_FILE = "expstore_spec.json"
#: RLDS step features with a fixed meaning in the store
FLAGS = ("is_first", "is_last", "is_terminal")


def shard_names(name: str, split: str, shards: int, template: str = TEMPLATE) -> list[str]:
    """File names of a split's TFRecord shards: ``<name>-<split>.tfrecord-00000-of-00004``."""
    return [template.replace("{DATASET}", name).replace("{SPLIT}", split)
            .replace("{FILEFORMAT}", "tfrecord")
            .replace("{SHARD_X_OF_Y}", f"{i:05d}-of-{shards:05d}") for i in range(shards)]


@dataclass
class Role:
    """Where one leaf goes: ``store`` field name (None: dropped), ``role``: obs, action,
    reward, flag, user (a user field per row) or episode (per episode, on every row)."""

    leaf: Leaf
    role: str
    store: str | None = None


@dataclass
class FieldPlan:
    spec: Spec
    roles: list[Role]
    dropped: list[str] = field(default_factory=list)  # "key (why)"

    def mapping(self) -> list[tuple[str, str]]:
        """``(RLDS key, store field or 'dropped: why')`` per leaf, for the summary."""
        out = [(r.leaf.key, r.store or f"dropped ({r.leaf.why or r.role})")
               for r in self.roles if r.role != "flag"]
        return out + [("steps/is_last+is_terminal", "terminated"),
                      ("steps/is_last alone", "truncated")]


def field_plan(leaves: list[Leaf], where: str, codec: dict | None = None,
               reject_nonfinite: bool = True, saved: Spec | None = None) -> FieldPlan:
    """Store fields for an RLDS dataset's leaves (the mapping of docs/datasets.md, RLDS):
    ``steps/observation[/a/b]`` -> ``obs`` / ``obs.a.b``, ``steps/action[/..]`` ->
    ``action[...]``, ``steps/reward`` -> ``reward``, flags -> terminated/truncated, other
    numeric step features (``discount``, ...) -> user fields named by their path (``/`` ->
    ``.``), numeric episode features -> user fields ``episode_metadata.<key>`` on every row
    of the episode; strings and variable-shape features are dropped. ``saved``: the spec
    an expstore export wrote: its fields' stacking, bounds and codecs where shape and dtype
    match."""
    roles: list[Role] = []
    obs: dict[str, Field] = {}
    act: dict[str, Field] = {}
    extras: dict[str, Field] = {}
    reward: Field | None = None
    for leaf in leaves:
        path = leaf.key.split("/")[1:] if leaf.step else leaf.key.split("/")
        if leaf.kind in ("text", "unsupported"):
            roles.append(Role(leaf, "dropped"))
            continue
        f = Field(leaf.shape, leaf.dtype, codec=codec if leaf.kind == "image" else None)
        head = path[0]
        if leaf.step and head in FLAGS and len(path) == 1:
            roles.append(Role(leaf, "flag", head))
        elif leaf.step and head in ("observation", "action"):
            prefix = "obs" if head == "observation" else "action"
            key = ".".join(path[1:])
            (obs if prefix == "obs" else act)[key] = f
            roles.append(Role(leaf, prefix, f"{prefix}.{key}" if key else prefix))
        elif leaf.step and path == ["reward"]:
            if leaf.shape != ():
                raise DatasetFormatError(f"{where}: steps/reward has shape {list(leaf.shape)}; "
                                         "the store's reward is one number per step")
            reward = Field((), leaf.dtype if leaf.dtype.kind == "f" else "float32")
            roles.append(Role(leaf, "reward", "reward"))
        else:
            name = ".".join(path)
            extras[name] = f
            roles.append(Role(leaf, "user" if leaf.step else "episode", name))
    for what, fields in (("steps/observation", obs), ("steps/action", act)):
        if not fields:
            raise DatasetFormatError(f"{where}: no numeric {what} feature (an RLDS step "
                                     "needs one)")
    missing = [k for k in FLAGS if not any(r.role == "flag" and r.store == k for r in roles)]
    if missing:
        raise DatasetFormatError(f"{where}: RLDS steps need is_first, is_last and "
                                 f"is_terminal; missing {missing}")
    if saved is not None:
        for fields in (obs, act, extras):
            for k, f in fields.items():
                name = k if fields is extras else (
                    ("obs" if fields is obs else "action") + (f".{k}" if k else ""))
                old = saved.fields.get(name)
                if old is not None and old.shape == f.shape and old.dtype == f.dtype:
                    fields[k] = old if codec is None or not f.is_image else replace(
                        old, codec=codec)
    spec = Spec.create(obs[""] if "" in obs else obs, act[""] if "" in act else act,
                       reward=reward, extras=extras, reject_nonfinite=reject_nonfinite)
    rlds = {"keys": {r.store: r.leaf.key for r in roles if r.role in
                     ("obs", "action", "reward", "user", "episode")},
            "episode_fields": [r.store for r in roles if r.role == "episode"],
            "encodings": {r.store: r.leaf.encoding for r in roles if r.store and
                          r.role not in ("flag",)}}
    spec = replace(spec, structure={**spec.structure, "rlds": rlds})
    dropped = [f"{r.leaf.key} ({r.leaf.why})" for r in roles if r.role == "dropped"]
    return FieldPlan(spec, roles, dropped)


class DatasetDir:
    """A TFDS dataset directory (local or fsspec URL): its info, features and shards."""

    def __init__(self, src: str | os.PathLike, source_options: dict[str, Any] | None = None):
        self.folder = SourceFolder(src, source_options)
        if not self.folder.is_dir():
            raise FileNotFoundError(f"{src}: not a TFDS dataset directory")
        self.info = self._json("dataset_info.json")
        self.features_doc = self._json("features.json")
        self.name = str(self.info.get("name") or "")
        fmt = self.info.get("fileFormat", "tfrecord")
        if fmt != "tfrecord":
            raise DatasetFormatError(f"{self.folder.location('dataset_info.json')}: file format "
                                     f"{fmt!r}; expstore reads TFRecord datasets")
        self.episodes: dict[str, int] = {}  # shard file -> episodes (dataset_info.json)
        self.leaves = parse_features(self.features_doc, self.folder.location("features.json"))

    def _json(self, name: str) -> dict[str, Any]:
        if not self.folder.exists(name):
            raise FileNotFoundError(f"{self.folder.location(name)}: missing (a TFDS dataset "
                                    "directory has dataset_info.json, features.json and "
                                    "TFRecord shards)")
        with self.folder.open(name) as f:
            try:
                return json.loads(f.read())
            except ValueError as e:
                raise DatasetFormatError(f"{self.folder.location(name)}: not JSON ({e})") from None

    def saved_spec(self) -> Spec | None:
        """The spec an expstore export left beside the dataset (``None``: not one)."""
        if not self.folder.exists(SPEC_FILE):
            return None
        return Spec.from_json(self._json(SPEC_FILE))

    def splits(self) -> list[str]:
        return [s["name"] for s in self.info.get("splits", [])]

    def shards(self, split: str | None) -> list[str]:
        """Shard file names of ``split`` (``None``: every split, in dataset_info order),
        each checked to exist."""
        known = {s["name"]: s for s in self.info.get("splits", [])}
        chosen = list(known) if split is None else [split]
        out: list[str] = []
        for name in chosen:
            if name not in known:
                raise ValueError(f"split: {name!r} is not a split of {self.folder.url} "
                                 f"(splits: {', '.join(known) or 'none listed'})")
            s = known[name]
            n = len(s.get("shardLengths", []))
            files = shard_names(self.name, name, n, s.get("filepathTemplate", TEMPLATE))
            self.episodes.update(zip(files, (int(x) for x in s.get("shardLengths", []))))
            if not n:  # no shard list: what the folder holds for this split
                pat = re.compile(re.escape(f"{self.name}-{name}.tfrecord-") + r"\d{5}-of-\d{5}$")
                files = [f for f in self.folder.names() if pat.match(f)]
            for f in files:
                if not self.folder.exists(f):
                    raise FileNotFoundError(f"{self.folder.location(f)}: missing (listed in "
                                            "dataset_info.json)")
            out += files
        if not out:
            raise FileNotFoundError(f"{self.folder.url}: no TFRecord shards for split "
                                    f"{split or 'any'}")
        return out
