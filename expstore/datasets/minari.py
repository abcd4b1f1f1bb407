"""Minari offline-RL datasets <-> expstore stores (hdf5 and arrow data formats).

>>> from expstore.datasets.minari import export_minari, import_minari
>>> info = export_minari("runs/pong.zarr", "expstore/pong-v0")   # minari.load_dataset reads it
>>> store = import_minari("expstore/pong-v0", "runs/pong2.zarr")

How an episode of ``T`` steps maps (Minari's layout is observation-aligned, like rows):

* ``observations[0..T]`` are the ``obs`` fields of the episode's ``T + 1`` rows (row ``T``
  is the store's final row); ``actions``, ``rewards``, ``terminations``, ``truncations``
  ``[0..T-1]`` are rows ``0..T-1``.
* ``infos`` (``T + 1`` values per key, as ``DataCollector`` records them: the reset info,
  then each step's) are user fields ``info.<key>`` (nested dicts ``info.<a>.<b>``) on all
  ``T + 1`` rows. On export every user field becomes an info: an ``info.`` prefix is
  dropped and ``.`` nests (``logp`` -> ``infos["logp"]``).
* Frame stacks: a field with ``stack=k`` is exported one frame per observation (its
  stored form; lossless and ``k`` times smaller), or as ``(k, *shape)`` stacks with
  ``stacked=True`` (what ``FrameStackObservation`` returns). ``import_minari(...,
  frame_stack=k)`` stores stacked observations one frame per row after checking that
  every stack is the previous one shifted by a frame (else it refuses).
* Only complete episodes are exported (first row to final row intact in one lane), lane
  by lane in step order. Episode seeds/options are not kept by a store.

Pixels stay exact by default: the export writes chunked hdf5 datasets with the gzip
filter (or arrow with zstd buffer compression), which ``minari`` reads with no plugin;
``jpeg_encoding=True`` gives Minari's own lossy JPEG output instead.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import SpecError
from ..spec import Field, Spec
from ..store import Store, create
from ..store import open as open_store
from ._minari_export import MinariExport, check_id, store_episodes, write_dataset
from ._minari_import import flat_infos, import_episode, resolve
from ._minari_spaces import check_space, space_to_json
from .common import Progress, ProgressArg

__all__ = ["MinariExport", "export_minari", "import_minari", "store_episodes"]


def _minari():
    try:
        import minari
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("Minari datasets need the minari package: "
                          "pip install 'expstore[minari]'") from e
    return minari


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
    stacked fields as ``(k, *shape)`` stacks. ``env``: a Gymnasium id or EnvSpec recorded
    as the dataset's ``env_spec`` (default: the one an imported store remembers).
    ``metadata``: extra dataset metadata (``author``, ``description``, ...).
    ``compare_jpeg=True`` also JPEG-encodes the image observations the way Minari does
    and reports those bytes (``jpeg_nbytes``). ``progress``: ``True`` for a progress bar
    or a callback ``fn(rows, bytes)``. Fails if the dataset exists, unless
    ``overwrite=True``; a failed export leaves no dataset behind.
    """
    _minari()
    check_id(dataset_id)
    if data_format not in ("hdf5", "arrow"):
        raise ValueError(f"data_format: expected 'hdf5' or 'arrow', got {data_format!r}")
    if compression == "auto":
        compression = None if jpeg_encoding else ("gzip" if data_format == "hdf5" else "zstd")
    elif jpeg_encoding and compression is not None:
        raise ValueError("jpeg_encoding=True is Minari's own (lossy) writer; it takes "
                         "compression=None or 'auto'")
    store, opened = _open(store_or_url, storage_options)
    try:
        return write_dataset(store, dataset_id, root, data_format, compression,
                             compression_level, jpeg_encoding, stacked, infos, env, metadata,
                             overwrite, compare_jpeg, progress)
    finally:
        if opened:
            store.close()


def import_minari(src: str | os.PathLike, url: str | os.PathLike, *,
                  root: str | os.PathLike | None = None, frame_stack: int | None = None,
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
    (checked; see module doc). ``infos=False`` skips infos. ``capacity`` defaults to the
    rows needed (``create`` rounds it up to whole shards of ``shard_rows``, default
    automatic). ``reward_dtype`` defaults to the dataset's (Minari's are float64).
    An episode must end with a terminated or truncated step and have none before;
    ``truncate_unfinished=True`` marks an unflagged last step truncated instead of
    failing. ``progress``: ``True`` for a progress bar or a callback ``fn(rows, bytes)``.
    Returns the store, open for writing, flushed. An episode that fails its checks
    raises (naming it); the episodes before it stay in the store.
    """
    minari = _minari()
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
    try:
        spec = Spec.from_spaces(obs_space, act_space, frame_stack=frame_stack,
                                extras=info_fields, padding=padding)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from e
    raw_meta = MinariStorage.read_raw_metadata(data_dir)
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
            bar.update(len(ep.rewards) + 1)
        store.flush()
    except BaseException:
        store.close()
        raise
    finally:
        bar.close()
    return store
