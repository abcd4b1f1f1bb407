"""RLDS (TFDS) datasets -> a store: :func:`import_rlds` (shards decoded in parallel, one lane
each, streamed one episode at a time, resumable)."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import numpy as np

from ...api import create
from ...api import open as open_store
from ...errors import DatasetFormatError
from ...storage.backends import backend_for
from ...storage.format import read_state, write_import_marker
from ..dopamine.importer import import_shard_rows
from ..episodes import capacity_for
from ..lanes import LaneResult, import_lanes, new_marker
from ..progress import ProgressArg
from ..resume import resumable_marker, rewind_lane
from ..source import SourceFolder
from ..streaming import check_block_rows
from ..summary import ImportSummary
from .features import decode
from .records import parse_features, read_records
from .source import DatasetDir, FieldPlan, field_plan

FORMAT = "rlds"


def episode_steps(feats: dict[str, Any], where: str) -> int:
    """Steps of one serialized episode (its ``steps/is_first`` values)."""
    f = feats.get("steps/is_first")
    if f is None:
        raise DatasetFormatError(f"{where}: no steps/is_first feature")
    return len(f.int64_list.value)


def episode_rows(n: int) -> int:
    """Store rows of an episode of ``n`` RLDS steps: ``n - 1`` transitions and a final
    row (the last step's observation); a one-step episode has no transition: none."""
    return n if n >= 2 else 0


def count_rows(ds: DatasetDir, shard: str) -> int:
    """Store rows one shard becomes (parses every record; images stay encoded)."""
    where = ds.folder.location(shard)
    with ds.folder.open(shard) as f:
        return sum(episode_rows(episode_steps(parse_features(r, f"{where}: record {i}"),
                                              where)) for i, r in
                   enumerate(read_records(f, where)))


def import_rlds(src: str | os.PathLike, url: str | os.PathLike, *, split: str | None = None,
                codec: dict | None = None, capacity: int | None = None,
                shard_rows: int | None = None, block_rows: int = 256,
                workers: int | None = None, reject_nonfinite: bool = True,
                overwrite: bool = False, storage_options: dict[str, Any] | None = None,
                source_options: dict[str, Any] | None = None, fsync: bool = False,
                progress: ProgressArg = None) -> ImportSummary:
    """Import the RLDS dataset in the TFDS directory ``src`` (a path, or any fsspec URL such
    as ``gs://gresearch/robotics/<dataset>/<version>``: ``dataset_info.json``,
    ``features.json``, TFRecord shards) into a store at ``url``. No TensorFlow needed.

    ``split``: one split (default: every split, in ``dataset_info.json`` order). Each
    shard file is one lane; shards are decoded by ``workers`` processes (default one per
    core; ``1``: in this process), one episode at a time, images (PNG/JPEG) decoded once,
    ``block_rows`` steps stored at a time. ``codec``: the image fields' codec.
    ``capacity``: default what the shards need (a first pass counts the steps of every
    shard; give it to skip that pass: each lane then holds ``capacity / shards`` rows).
    The store is a partial import until every shard is in; the same import resumes it
    without duplicating a row. The mapping (and what is dropped) is in docs/datasets.md
    and the summary's notes.
    """
    t0 = time.perf_counter()
    block_rows = check_block_rows(block_rows)
    ds = DatasetDir(src, source_options)
    plan = field_plan(ds.leaves, ds.folder.location("features.json"), codec,
                      reject_nonfinite, ds.saved_spec())
    shards = ds.shards(split)
    url = os.fspath(url)
    summary = ImportSummary(str(src), url, lanes=len(shards), kind="rlds import")
    options = {"split": split, "codec": codec}
    marker = resumable_marker(url, FORMAT, ds.folder.url, options, storage_options, overwrite)
    if marker is None:
        if capacity is None:
            capacity = capacity_for(max(count_rows(ds, s) for s in shards), len(shards))
        if shard_rows is None:
            shard_rows = import_shard_rows(plan.spec, capacity, len(shards))
        store = create(url, plan.spec, capacity, lanes=len(shards), shard_rows=shard_rows,
                       overwrite=overwrite, storage_options=storage_options, fsync=fsync,
                       mode="r")
        try:
            marker = new_marker(FORMAT, ds.folder.url, options, [{"shard": s} for s in shards])
            write_import_marker(store.backend, marker)
        finally:
            store.close()
            del store
    summary.notes.append("mapped: " + ", ".join(f"{k} -> {v}" for k, v in plan.mapping()
                                                 if not v.startswith("dropped")))
    if plan.dropped:
        summary.notes.append("dropped (a store holds numbers of a fixed shape per row): "
                             + ", ".join(plan.dropped))
    summary.notes.append("each episode's last step is its final row (observation and user "
                         "fields); its action and reward are not stored (RLDS: not valid "
                         "after a terminal step)")
    counts: Counter = Counter()
    try:
        import_lanes(url, marker, shards, shard_lane,
                     (ds.folder.url, source_options, url, plan, block_rows, storage_options,
                      fsync), summary,
                     total=lambda lanes: sum(ds.episodes.get(shards[i], 0) for i in lanes),
                     desc=f"rlds {ds.name or ds.folder.name} (episodes)", workers=workers,
                     progress=progress, storage_options=storage_options, report_rows=1,
                     name=lambda lane: shards[lane], unit="shard(s)", counts=counts)
    finally:
        summary.seconds = time.perf_counter() - t0
    for key, text in _COUNTED.items():
        if counts[key]:
            summary.notes.append(text.format(n=counts[key]))
    return summary


_COUNTED = {
    "last_action": "{n} episode(s) had a non-zero action or reward on their last step "
                   "(dropped: the store's final row holds none)",
    "one_step": "{n} episode(s) of one step (no transition) were skipped",
    "no_last": "{n} episode(s) did not end with is_last: stored as truncated",
}


def shard_lane(lane: int, shard: str, src: str, source_options: Any, url: str,
               plan: FieldPlan, block_rows: int, storage_options: Any, fsync: bool, *,
               report: Any, stop: Any) -> LaneResult:
    """Import one shard into ``lane`` (the call form of ``lanes.run_lanes``), going on
    after the episodes the lane already holds. ``report(1, bytes)`` per record (episode;
bytes: encoded)."""
    folder = SourceFolder(src, source_options)
    where = folder.location(shard)
    res = LaneResult(lane, counts={})
    backend = backend_for(url, storage_options, fsync=False)
    try:
        committed = read_state(backend, lane).count
    finally:
        backend.close()
    res.resumed_rows = committed
    row_bytes = sum(f.row_nbytes for f in plan.spec.fields.values())
    rows = 0
    store = None
    try:
        with folder.open(shard) as f:
            for i, data in enumerate(read_records(f, where)):
                at = f"{where}: record {i}"
                feats = parse_features(data, at)
                n_rows = episode_rows(episode_steps(feats, at))
                if rows + n_rows <= committed:  # stored by an earlier run (or no rows)
                    rows += n_rows
                    report(1, len(data))
                    continue
                if store is None:
                    if rows < committed:  # the lane stopped inside this episode: redo it
                        rewind_lane(url, lane, rows, storage_options)
                        res.resumed_rows = rows
                    store = open_store(url, "r+", lane=lane, storage_options=storage_options,
                                       fsync=fsync, index_all=False)
                    store.set_episode_position(lane, 0)
                _write_episode(store, lane, plan, feats, at, block_rows, res)
                rows += n_rows
                res.bytes_in += n_rows * row_bytes  # decoded
                report(1, len(data))
                if stop is not None and stop.is_set():
                    res.stopped = True
                    break
        if store is not None:
            store.flush()
    finally:
        if store is not None:
            store.close()
    return res


def _write_episode(store: Any, lane: int, plan: FieldPlan, feats: dict[str, Any], at: str,
                   block_rows: int, res: LaneResult) -> None:
    """One RLDS episode (``n`` steps) -> ``n - 1`` transitions and a final row, stored
    ``block_rows`` steps at a time (images decoded per block)."""
    n = len(feats["steps/is_first"].int64_list.value)
    small: dict[str, np.ndarray] = {}
    images = []
    for r in plan.roles:
        if r.role == "dropped":
            continue
        f = feats.get(r.leaf.key)
        if f is None:
            raise DatasetFormatError(f"{at}: feature {r.leaf.key} (in features.json) is "
                                     "missing")
        if r.role == "episode":
            small[r.store] = np.broadcast_to(decode(r.leaf, f, 1, at), (n, *r.leaf.shape))
        elif r.leaf.kind == "image":
            images.append((r, f))
        else:
            small[r.store] = decode(r.leaf, f, n, at)
    first, last, term = (small[k].astype(bool) for k in ("is_first", "is_last", "is_terminal"))
    if n < 2:
        res.counts["one_step"] = res.counts.get("one_step", 0) + 1
        return
    if not first[0] or first[1:].any():
        raise DatasetFormatError(f"{at}: is_first must be set on step 0 only, got steps "
                                 f"{np.flatnonzero(first).tolist()[:8]}")
    if last[:-1].any() or (term & ~last).any():
        bad = np.flatnonzero(last[:-1] | (term & ~last))[0]
        raise DatasetFormatError(f"{at}: step {bad} of {n} has is_last/is_terminal before "
                                 "the episode's last step")
    if not last[-1]:
        res.counts["no_last"] = res.counts.get("no_last", 0) + 1
    if any(np.any(small[r.store][-1]) for r in plan.roles if r.role in ("action", "reward")):
        res.counts["last_action"] = res.counts.get("last_action", 0) + 1
    T = n - 1
    names = [r.store for r in plan.roles if r.role in ("obs", "action", "reward", "user",
                                                        "episode")]
    for a in range(0, T, block_rows):
        b = min(a + block_rows, T)
        ends = b == T
        end = b + 1 if ends else b  # the last block also takes the final step
        vals = {name: small[name][a:end] for name in names if name in small}
        for r, f in images:
            vals[r.store] = _images(r, f, n, a, end, at)
        batch: dict[str, Any] = {"obs": {}, "next_obs": {}}
        for name, v in vals.items():
            if name == "obs" or name.startswith("obs."):
                batch["obs"][name[4:]] = v[:b - a]
                if ends:
                    batch["next_obs"][name[4:]] = v[1:]
            else:
                batch[name] = v[:b - a]
                if ends and name in plan.spec.fields and name not in ("reward",) \
                        and not name.startswith("action"):
                    batch["next_" + name] = v[1:]
        for k in ("obs", "next_obs"):
            if "" in batch[k]:
                batch[k] = batch[k][""]
        if not ends:
            del batch["next_obs"]
        batch["terminated"] = np.zeros(b - a, bool)
        batch["truncated"] = np.zeros(b - a, bool)
        if ends:
            batch["terminated"][-1] = bool(term[-1])
            batch["truncated"][-1] = not term[-1]
        store.extend(batch, lane=lane, check_next_obs=False)
    res.steps += T
    res.episodes += 1
    res.rows += T + 1


def _images(r: Any, feature: Any, n: int, a: int, b: int, at: str) -> np.ndarray:
    """Steps ``a..b-1`` of an image leaf, decoded."""
    from .features import decode_image

    vals = feature.bytes_list.value
    if len(vals) != n:
        raise DatasetFormatError(f"{at}: {r.leaf.key}: expected {n} encoded images, got "
                                 f"{len(vals)}")
    out = np.empty((b - a, *r.leaf.shape), r.leaf.dtype)
    for i in range(a, b):
        out[i - a] = decode_image(vals[i], r.leaf, at)
    return out
