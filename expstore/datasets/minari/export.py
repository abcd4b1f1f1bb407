"""Writing a store's complete episodes as a Minari dataset: :func:`export_minari`."""

from __future__ import annotations

import os
import pathlib
import shutil
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...api import open as open_store
from ...errors import SpecError
from ...spaces import space_from_spec
from ...spec import BUILTIN, Spec
from ..episodes import store_episodes
from ..progress import Progress, ProgressArg
from ..summary import ImportSummary, human_bytes
from .paths import check_id, datasets_root, require_minari
from .values import stack_frames, tree_from_fields
from .write import ArrowWriter, Episode, Hdf5Writer, MinariNativeWriter, tree_nbytes

INFO_PREFIX = "info."
#: dataset metadata key holding the frame stacking of the exported store
FRAME_STACK_KEY = "expstore_frame_stack"


@dataclass(frozen=True)
class MinariExport:
    """What :func:`export_minari` wrote. Sizes in bytes."""

    dataset_id: str
    path: str  #: the dataset's ``data`` directory (``minari.MinariDataset(path)`` opens it)
    data_format: str
    compression: str | None
    episodes: int
    steps: int
    nbytes: int  #: bytes on disk under ``path``
    raw_nbytes: int  #: the same arrays uncompressed
    jpeg_nbytes: int | None = None  #: JPEG bytes of the image observations (compare_jpeg)
    image_nbytes: int | None = None  #: raw bytes of those image observations
    source: str = ""  #: the store's URL
    seconds: float = 0.0
    lanes: int = 1
    #: what was left out and why (open or damaged episodes), frame stacking kept
    notes: tuple[str, ...] = ()

    @property
    def ratio(self) -> float:
        """Uncompressed / on-disk size."""
        return self.raw_nbytes / self.nbytes if self.nbytes else float("nan")

    @property
    def rows(self) -> int:
        """Observation rows written (steps + one final observation per episode)."""
        return self.steps + self.episodes

    def summary(self) -> ImportSummary:
        """The same facts in the summary every import and export prints."""
        return ImportSummary(self.source, f"{self.dataset_id} ({self.path})", rows=self.rows,
                             steps=self.steps, episodes=self.episodes, lanes=self.lanes,
                             seconds=self.seconds, bytes_in=self.raw_nbytes,
                             notes=list(self.notes), outputs=[self.path],
                             kind="minari export", bytes_out=self.nbytes)

    def __str__(self) -> str:
        text = str(self.summary())
        if self.jpeg_nbytes is not None and self.image_nbytes:
            text += (f"\n  JPEG (lossy) would take {human_bytes(self.jpeg_nbytes)} for "
                     f"{human_bytes(self.image_nbytes)} of image observations")
        return text


def user_fields(spec: Spec) -> list[str]:
    return [n for n in spec.fields if n not in BUILTIN and n not in spec.obs_names
            and n not in spec.action_names]


def info_tree_of(names: list[str]) -> dict[str, Any]:
    """Nested ``{key: field name}`` for the infos of user fields (see module doc)."""
    tree: dict[str, Any] = {}
    for name in names:
        parts = (name[len(INFO_PREFIX):] if name.startswith(INFO_PREFIX) else name).split(".")
        node = tree
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise SpecError(f"field {name!r}: info {p!r} is both a value and a dict")
        if parts[-1] in node:
            raise SpecError(f"field {name!r}: info {'.'.join(parts)!r} given twice")
        node[parts[-1]] = name
    return tree


def _fill(tree: dict[str, Any], values: dict[str, np.ndarray]) -> dict[str, Any]:
    return {k: _fill(v, values) if isinstance(v, dict) else values[v] for k, v in tree.items()}


def _env_spec(env: Any) -> Any:
    if env is None:
        return None
    import gymnasium as gym
    from gymnasium.envs.registration import EnvSpec

    if isinstance(env, EnvSpec):
        return env
    if isinstance(env, str):
        return gym.spec(env)
    if getattr(env, "spec", None) is not None:
        return env.spec
    raise TypeError(f"env: expected a Gymnasium id, EnvSpec or env, got {type(env).__name__}")


def _namespaces(parent: pathlib.Path, dataset_id: str) -> None:
    """Write the ``namespace_metadata.json`` files Minari's ``create_namespace`` writes."""
    parts = dataset_id.split("/")[:-1]
    if not parts:
        return
    root = parent
    for _ in parts:
        root = root.parent
    path = root
    for p in parts:
        path = path / p
        f = path / "namespace_metadata.json"
        if not f.exists():
            f.write_text("{}")


def _read_episode(store, spec, lane, first, T, ep_id, obs_space, act_space, stacked, users,
                  info_tree) -> Episode:
    rows = store.index.lane_rows(lane, np.arange(first, first + T + 1))
    flat = {}
    for name in spec.obs_names:
        v = store.read(name, rows)
        f = spec.fields[name]
        flat[name] = stack_frames(v, f.stack, f.padding) if (stacked and f.stack) else v
    for name in spec.action_names:
        flat[name] = store.read(name, rows[:-1])
    values = {name: store.read(name, rows) for name in users}
    return Episode(
        id=ep_id,
        observations=tree_from_fields(spec, "obs", flat, obs_space),
        actions=tree_from_fields(spec, "action", flat, act_space),
        rewards=store.read("reward", rows[:-1]),
        terminations=store.read("terminated", rows[:-1]),
        truncations=store.read("truncated", rows[:-1]),
        infos=_fill(info_tree, values))


def _image_leaves(space: Any) -> list[tuple]:
    from minari.dataset.minari_storage import is_image_space

    kind = type(space).__name__
    if kind == "Dict":
        return [(k,) for k, s in space.spaces.items() if is_image_space(s)]
    if kind == "Tuple":
        return [(i,) for i, s in enumerate(space.spaces) if is_image_space(s)]
    return [()] if is_image_space(space) else []


def _leaf(tree: Any, path: tuple) -> np.ndarray:
    for p in path:
        tree = tree[p]
    return tree


def _jpeg_nbytes(frames: np.ndarray) -> int:
    from minari.dataset._storages.hdf5_storage import encode_frame

    return int(sum(len(encode_frame(f)) for f in frames))


def write_dataset(store: Any, dataset_id: str, root: Any, data_format: str,
                  compression: str | None, level: int | None, jpeg_encoding: bool,
                  stacked: bool, infos: bool, env: Any, metadata: dict[str, Any] | None,
                  overwrite: bool, compare_jpeg: bool, progress: Any = None) -> MinariExport:
    """The export behind :func:`expstore.datasets.minari.export_minari` (arguments checked)."""
    import minari
    from minari.dataset.minari_storage import MinariStorage

    spec = store.spec
    episodes = store_episodes(store)
    if not episodes:
        raise ValueError(f"{store.url}: no complete episode to export (an episode needs its "
                         "first and final rows intact)")
    obs_space = space_from_spec(spec, "obs", stacked)
    act_space = space_from_spec(spec, "action")
    users = user_fields(spec) if infos else []
    info_tree = info_tree_of(users)
    if data_format == "arrow" and compression is not None:
        nested = [k for k, v in info_tree.items() if isinstance(v, dict)]
        if nested:
            raise SpecError(f"infos {nested}: minari's arrow format reads nested info dicts "
                            "back as arrays of dicts; use data_format='hdf5' or infos=False")
    env_spec = _env_spec(env)
    saved_env_spec = spec.structure.get("minari", {}).get("env_spec") if env is None else None

    ds_dir = datasets_root(root) / dataset_id
    data_dir = ds_dir / "data"
    if data_dir.exists() and not overwrite:
        raise FileExistsError(f"{data_dir}: a Minari dataset {dataset_id!r} exists "
                              "(pass overwrite=True, or --overwrite, to replace it)")
    created_dir = not ds_dir.exists()
    ds_dir.mkdir(parents=True, exist_ok=True)
    tmp = ds_dir / f".data-tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        storage = MinariStorage.new(tmp, observation_space=obs_space, action_space=act_space,
                                    env_spec=env_spec, data_format=data_format,
                                    jpeg_encoding=jpeg_encoding)
        if compression is None:
            writer: Any = MinariNativeWriter(storage)
        elif data_format == "hdf5":
            writer = Hdf5Writer(tmp, compression, level)
        else:
            writer = ArrowWriter(tmp, obs_space, act_space, compression, level)
        image_leaves = _image_leaves(obs_space) if compare_jpeg else []
        raw = steps = jpeg = image = 0
        bar = Progress(sum(T + 1 for _, _, T in episodes), f"minari export {dataset_id}",
                       progress)
        try:
            for i, (lane, first, T) in enumerate(episodes):
                ep = _read_episode(store, spec, lane, first, T, i, obs_space, act_space,
                                   stacked, users, info_tree)
                writer.write(ep)
                steps += T
                raw += (tree_nbytes(ep.observations) + tree_nbytes(ep.actions)
                        + tree_nbytes(ep.infos) + ep.rewards.nbytes + 2 * T)
                for path in image_leaves:
                    frames = _leaf(ep.observations, path)
                    image += frames.nbytes
                    jpeg += _jpeg_nbytes(frames)
                bar.update(T + 1, tree_nbytes(ep.observations))
        finally:
            bar.close()
            writer.close()
        meta: dict[str, Any] = {"dataset_id": dataset_id, "minari_version": minari.__version__,
                                "total_steps": steps, "total_episodes": len(episodes)}
        stacks = frame_stacks(spec, stacked)
        if stacks:
            meta[FRAME_STACK_KEY] = stacks
        if saved_env_spec:
            meta["env_spec"] = saved_env_spec
        for k, v in (metadata or {}).items():
            meta[k] = {v} if k in ("author", "author_email") and isinstance(v, str) else v
        storage.update_metadata(meta)
        storage.update_metadata({"dataset_size": storage.get_size()})
        _namespaces(ds_dir.parent, dataset_id)
        if data_dir.exists():
            shutil.rmtree(data_dir)
        os.replace(tmp, data_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created_dir and not any(ds_dir.iterdir()):
            ds_dir.rmdir()
        raise
    nbytes = sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file())
    return MinariExport(dataset_id, str(data_dir), data_format, compression, len(episodes),
                        steps, nbytes, raw, jpeg if compare_jpeg else None,
                        image if compare_jpeg else None, source=str(store.url),
                        lanes=store.lanes, notes=tuple(_notes(store, steps, stacks)))


def frame_stacks(spec: Spec, stacked: bool) -> dict[str, dict[str, Any]]:
    """``{field: {stack, padding, stacked}}`` of the frame-stacked observation fields: what
    :func:`~expstore.datasets.minari.import_minari` reads back (``frame_stack="auto"``)."""
    return {n: {"stack": int(f.stack), "padding": f.padding, "stacked": bool(stacked)}
            for n, f in spec.fields.items() if n in spec.obs_names and f.stack}


def _notes(store: Any, steps: int, stacks: dict[str, Any]) -> list[str]:
    notes = []
    left = store.num_transitions - steps
    if left > 0:
        notes.append(f"{left:,} step(s) not in a complete episode left out (an episode still "
                     "open, or one whose first rows were overwritten or are quarantined): "
                     "Minari episodes run from reset to a terminated or truncated step")
    for name, st in stacks.items():
        how = "stacks" if st["stacked"] else "single frames"
        notes.append(f"{name}: stack={st['stack']} ({st['padding']}) kept in the dataset's "
                     f"metadata ({FRAME_STACK_KEY}), written as {how}")
    return notes


def _open(store_or_url: Any, storage_options: dict[str, Any] | None) -> tuple[Any, bool]:
    if isinstance(store_or_url, (str, os.PathLike)):
        return open_store(store_or_url, "r", storage_options=storage_options), True
    return store_or_url, False


def export_minari(store_or_url: Any, dataset_id: str, *, root: str | os.PathLike | None = None,
                  data_format: str = "hdf5", compression: str | None = "auto",
                  compression_level: int | None = None, jpeg_encoding: bool = False,
                  stacked: bool = False, infos: bool = True, env: Any = None,
                  metadata: dict[str, Any] | None = None, overwrite: bool = False,
                  compare_jpeg: bool = False, progress: ProgressArg = None,
                  storage_options: dict[str, Any] | None = None) -> MinariExport:
    """Write the complete episodes of a store as a Minari dataset ``dataset_id``.

    The dataset goes to ``<root>/<dataset_id>/data`` (``root`` defaults to Minari's
    datasets directory, ``MINARI_DATASETS_PATH`` or ``~/.minari/datasets``), so
    ``minari.load_dataset(dataset_id)`` loads it. ``data_format``: ``"hdf5"`` or
    ``"arrow"``. ``compression``: ``"auto"`` (gzip level 6 for hdf5, zstd level 9 for
    arrow), ``"gzip"``/``"lzf"`` (hdf5), ``"zstd"``/``"lz4"`` (arrow) — all lossless — or
    ``None`` for Minari's own uncompressed writer; ``jpeg_encoding=True`` uses Minari's
    own writer with its lossy JPEG encoding of image spaces. ``stacked=True`` writes
    stacked fields as ``(k, *shape)`` stacks; either way the stacking is kept in the
    dataset's metadata (``expstore_frame_stack``) and ``import_minari`` restores it.
    The result's ``notes`` count the steps left out (an episode still open). ``env``: a
    Gymnasium id or EnvSpec recorded as the dataset's ``env_spec`` (default: the one an
    imported store remembers).
    ``metadata``: extra dataset metadata (``author``, ``description``, ...).
    ``compare_jpeg=True`` also JPEG-encodes the image observations the way Minari does
    and reports those bytes (``jpeg_nbytes``). ``progress``: ``True`` for a progress bar
    or a callback ``fn(rows, bytes)``. Fails if the dataset exists, unless
    ``overwrite=True``; a failed export leaves no dataset behind.
    """
    require_minari()
    check_id(dataset_id)
    if data_format not in ("hdf5", "arrow"):
        raise ValueError(f"data_format: expected 'hdf5' or 'arrow', got {data_format!r}")
    if compression == "auto":
        compression = None if jpeg_encoding else ("gzip" if data_format == "hdf5" else "zstd")
    elif jpeg_encoding and compression is not None:
        raise ValueError("jpeg_encoding=True is Minari's own (lossy) writer; it takes "
                         "compression=None or 'auto'")
    t0 = time.perf_counter()
    store, opened = _open(store_or_url, storage_options)
    try:
        out = write_dataset(store, dataset_id, root, data_format, compression,
                            compression_level, jpeg_encoding, stacked, infos, env, metadata,
                            overwrite, compare_jpeg, progress)
        return replace(out, seconds=time.perf_counter() - t0)
    finally:
        if opened:
            store.close()
