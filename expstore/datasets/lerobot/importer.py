"""A LeRobot v3 dataset -> a store: :func:`import_lerobot` (data files streamed one after
another in blocks, videos decoded forward, resumable)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ...api import create
from ...api import open as open_store
from ...errors import DatasetFormatError
from ...storage.backends import backend_for
from ...storage.format import write_import_marker
from ..dopamine.importer import import_shard_rows
from ..progress import Progress, ProgressArg, interruptible
from ..resume import committed_rows, episode_position, resumable_marker, resume_point, rewind_lane
from ..streaming import Prefetch, check_block_rows
from ..summary import ImportSummary
from .frames import VideoReader, decode_images
from .layout import FINAL_ROWS_PATH, Episode, Meta, Source, read_meta, read_parquet
from .mapping import Column, Plan, import_plan

FORMAT = "lerobot"
#: decoded bytes a block of frames holds at most (480x640 RGB cameras: 54-frame blocks)
BLOCK_BYTES = 48 << 20


def import_lerobot(src: str | os.PathLike, url: str | os.PathLike, *,
                   capacity: int | None = None, shard_rows: int | None = None,
                   block_rows: int = 256, codec: dict | None = None,
                   tolerance_s: float = 1e-4, reject_nonfinite: bool = True,
                   overwrite: bool = False, storage_options: dict[str, Any] | None = None,
                   source_options: dict[str, Any] | None = None, fsync: bool = False,
                   progress: ProgressArg = None) -> ImportSummary:
    """Import the LeRobot v3 dataset at ``src`` (a local root or an fsspec URL, e.g.
    ``hf://datasets/lerobot/pusht`` with ``huggingface_hub`` installed) into a store at
    ``url``, one lane, episodes in order.

    Each frame is one step: ``observation.<k>`` -> ``obs.<k>`` (cameras decoded to uint8
    HWC: PNG/JPEG structs with Pillow, MP4 with PyAV, the frame at ``from_timestamp +
    timestamp`` within ``tolerance_s``), ``action`` -> ``action``, ``next.reward`` ->
    ``reward``, ``next.done`` -> terminated on the last frame (else truncated), other
    numeric features (``timestamp``, ``frame_index``, ``episode_index``, ``task_index``, ...)
    -> fields of their name; ``index`` and non-numeric features are dropped (the summary's
    notes list every mapping). fps, robot type, tasks and the feature entries are kept in
    the store's ``spec.structure["lerobot"]`` for :func:`export_lerobot`.

    Streamed: ``block_rows`` frames at a time, fewer for large cameras (a block holds at
    most :data:`BLOCK_BYTES` of decoded frames; memory ~ three blocks).
    The store is marked as a partial import until every frame is in; running the same
    import again resumes it where it stopped. Ctrl-C stops at a block boundary.
    """
    t0 = time.perf_counter()
    block_rows = check_block_rows(block_rows)
    source = Source(src, source_options)
    meta = read_meta(source)
    plan = import_plan(meta, codec, reject_nonfinite)
    eps = meta.episodes
    frames = sum(e.length for e in eps)
    url = os.fspath(url)
    summary = ImportSummary(source.url, url, lanes=1, kind="lerobot import")
    summary.notes += plan.notes
    options = {"codec": codec, "tolerance_s": tolerance_s}
    marker = resumable_marker(url, FORMAT, source.url, options, storage_options, overwrite)
    if marker is None:
        cap = capacity if capacity is not None else frames + len(eps)
        if cap < frames + len(eps):
            raise ValueError(f"capacity: {cap} rows < {frames + len(eps)} the episodes need "
                             "(frames + one final row per episode)")
        if shard_rows is None:
            shard_rows = import_shard_rows(plan.spec, cap, 1)
        store = create(url, plan.spec, cap, shard_rows=shard_rows, overwrite=overwrite,
                       storage_options=storage_options, fsync=fsync, mode="r")
        try:
            marker = {"format": FORMAT, "source": source.url, "status": "partial",
                      "options": options}
            write_import_marker(store.backend, marker)
        finally:
            store.close()
            del store
    keep = np.ones(frames, bool)
    term = np.zeros(frames, bool)
    term[np.cumsum([e.length for e in eps]) - 1] = True
    committed = committed_rows(url, 0, storage_options)
    q_from, rows = resume_point(keep, term, committed)
    if rows < committed:
        rewind_lane(url, 0, rows, storage_options)
    if rows:
        summary.notes.append(f"resumed a partial import after its {rows:,} stored rows")
    finals = _final_rows(source, meta, plan)
    prog = Progress(frames - q_from, f"lerobot {source.folder.name}", progress)
    store = open_store(url, "r+", storage_options=storage_options, fsync=fsync)
    backend = backend_for(url, storage_options, fsync=True)
    try:
        store.set_episode_position(0, episode_position(keep, term, q_from, 0))
        writer = _Writer(store, plan, finals, summary)
        row_bytes = _row_bytes(plan)
        with interruptible() as intr:
            block = max(1, min(block_rows, BLOCK_BYTES // max(row_bytes, 1)))
            blocks = _blocks(source, meta, plan, q_from, block, tolerance_s)
            with Prefetch(blocks, depth=1) as stream:
                for ep, vals, last in stream:
                    n = writer.write(ep, vals, last)
                    prog.update(n, n * row_bytes)
                    summary.bytes_in += n * row_bytes
                    if intr.requested:
                        break
            store.flush()
            intr.check()
        marker["status"] = "complete"
        write_import_marker(backend, marker)
    finally:
        prog.close()
        store.close()
        backend.close()
        summary.seconds = time.perf_counter() - t0
    return summary


def _row_bytes(plan: Plan) -> int:
    return sum(plan.spec.fields[c.field].row_nbytes for c in plan.columns if c.field)


class _Writer:
    """Frames of one episode -> steps (and its final row with its last frame)."""

    def __init__(self, store: Any, plan: Plan, finals: dict[int, dict[str, np.ndarray]],
                 summary: ImportSummary) -> None:
        self.store = store
        self.plan = plan
        self.finals = finals
        self.summary = summary
        self.names = [n for n in plan.spec.fields if n not in ("reward", "terminated",
                                                               "truncated")]
        self.users = [n for n in self.names if n not in plan.spec.obs_names
                      and n not in plan.spec.action_names]

    def write(self, ep: Episode, vals: dict[str, np.ndarray], last: bool) -> int:
        """Store ``vals`` (frames of ``ep``; ``last``: they end it) as steps; returns how many."""
        spec = self.plan.spec
        n = len(next(iter(vals.values())))
        cols = dict(vals)
        cols.setdefault("reward", np.zeros(n, spec.fields["reward"].dtype))
        done = cols.pop("@done", None)
        inner = done[:n - 1] if last and done is not None else done
        if inner is not None and inner.any():
            t = int(np.flatnonzero(inner)[0])
            at = int(cols["frame_index"][t]) if "frame_index" in cols else t
            raise DatasetFormatError(f"episode {ep.index}: next.done is set on frame {at}, "
                                     "before its last")
        term = np.zeros(n, bool)
        trunc = np.zeros(n, bool)
        batch: dict[str, Any] = {}
        if last:
            final = self.finals.get(ep.index) or {}
            ended = bool(done[-1]) if done is not None else False
            ended = bool(final.get("@terminated", ended))
            term[-1], trunc[-1] = ended, not ended
            nxt = {}
            for name in self.names:
                if name in spec.action_names:
                    continue
                v = cols[name]
                f = final.get(name, v[-1])
                nxt[name] = np.concatenate([v[1:], np.asarray(f, v.dtype)[None]])
            batch["next_obs"] = _pack(spec, "obs", nxt)
            batch.update({"next_" + k: nxt[k] for k in self.users})
        batch["obs"] = _pack(spec, "obs", cols)
        batch["action"] = _pack(spec, "action", cols)
        batch.update({k: cols[k] for k in [*self.users, "reward"]})
        batch["terminated"], batch["truncated"] = term, trunc
        self.store.extend(batch, check_next_obs=False)
        self.summary.steps += n
        self.summary.rows += n + int(last)
        self.summary.episodes += int(last)
        return n


def _pack(spec: Any, prefix: str, cols: dict[str, np.ndarray]) -> Any:
    """Field arrays -> the ``obs``/``action`` value ``extend`` takes (array or dict)."""
    st = spec.structure.get(prefix, {"kind": "single"})
    if st["kind"] == "single":
        return cols[prefix]
    return {k: cols[f"{prefix}.{k}"] for k in st["keys"]}


def _final_rows(source: Source, meta: Meta, plan: Plan) -> dict[int, dict[str, np.ndarray]]:
    """``{episode_index: {field: final row value, "@terminated": bool}}`` from an expstore
    export's ``meta/expstore_final_rows.parquet`` (empty for other datasets)."""
    if not plan.from_sidecar or not source.exists(FINAL_ROWS_PATH):
        return {}
    t = read_parquet(source, FINAL_ROWS_PATH)
    spec = plan.spec
    out: dict[int, dict[str, np.ndarray]] = {}
    idx = t.column("episode_index").to_pylist()
    vals: dict[str, np.ndarray] = {}
    for name in t.column_names:
        if name == "episode_index":
            continue
        if name == "@terminated":
            vals[name] = np.asarray(t.column(name).to_pylist(), bool)
            continue
        f = spec.fields[name]
        col = t.column(name)
        if len(f.shape) >= 2:
            vals[name] = decode_images(col.to_pylist(), _hwc(f.shape), FINAL_ROWS_PATH) \
                .reshape(len(idx), *f.shape)
        else:
            vals[name] = _numeric(col, f.shape, f.dtype, f"{FINAL_ROWS_PATH}: {name}")
    for i, e in enumerate(idx):
        out[int(e)] = {k: v[i] for k, v in vals.items()}
    return out


def _hwc(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape if len(shape) == 3 else (*shape, 1)


def _numeric(col: Any, shape: tuple[int, ...], dtype: Any, where: str) -> np.ndarray:
    """A parquet column (scalars or (nested) lists) -> ``(n, *shape)`` of ``dtype``."""
    import pyarrow as pa

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(col)
    flat = col
    while pa.types.is_list(flat.type) or pa.types.is_fixed_size_list(flat.type) \
            or pa.types.is_large_list(flat.type):
        flat = flat.flatten()
    a = flat.to_numpy(zero_copy_only=False)
    size = int(np.prod(shape, dtype=np.int64))
    if a.size != n * size:
        raise DatasetFormatError(f"{where}: {a.size} values for {n} frames of shape "
                                 f"{list(shape) or [1]}")
    return a.reshape(n, *shape).astype(dtype, copy=False)


def _blocks(source: Source, meta: Meta, plan: Plan, q_from: int, block_rows: int,
            tolerance_s: float):
    """``(episode, {field: values, "@done": next.done}, ends the episode)`` for every frame
    from global position ``q_from`` on, at most ``block_rows`` frames at a time."""
    import pyarrow.parquet as pq

    cols = [c for c in plan.columns if c.kind != "video"]
    videos = [c for c in plan.columns if c.kind == "video"]
    read = sorted({c.key for c in cols} | {"episode_index"}
                  | ({"timestamp"} if videos else set()))
    readers: dict[str, tuple[Any, VideoReader]] = {}
    by_file: dict[tuple[int, int], list[Episode]] = {}
    for e in meta.episodes:
        by_file.setdefault(e.data_file, []).append(e)
    g = 0  # global frame position of the file's first row
    try:
        for data_file in sorted(by_file, key=lambda k: by_file[k][0].start):
            file_eps = by_file[data_file]
            n_file = sum(e.length for e in file_eps)
            if g + n_file <= q_from:
                g += n_file
                continue
            path = meta.data_path(data_file)
            where = source.location(path)
            ep_of_row = np.repeat(np.arange(len(file_eps)), [e.length for e in file_eps])
            first_row = file_eps[0].start
            with source.open(path) as fh:
                pf = pq.ParquetFile(fh)
                missing = [k for k in read if k not in pf.schema_arrow.names]
                if missing:
                    raise DatasetFormatError(f"{where}: missing column(s) {missing}")
                r = 0  # row in the file
                for batch in pf.iter_batches(batch_size=block_rows, columns=read):
                    n = batch.num_rows
                    lo = max(0, q_from - g - r)
                    if lo >= n:
                        r += n
                        continue
                    got = np.asarray(batch.column("episode_index").to_numpy(
                        zero_copy_only=False), np.int64)
                    want = np.array([file_eps[i].index for i in ep_of_row[r:r + n]])
                    if len(want) != n or not np.array_equal(got, want):
                        raise DatasetFormatError(
                            f"{where}: rows {r}..{r + n} hold episode_index "
                            f"{sorted(set(got.tolist()))[:4]}, meta/episodes says "
                            f"{sorted(set(want.tolist()))[:4]} (frames "
                            f"{first_row + r}.. of the dataset)")
                    for a, b in _runs(ep_of_row[r:r + n], lo):
                        ep = file_eps[ep_of_row[r + a]]
                        vals = {}
                        for c in cols:
                            v = batch.column(c.key).slice(a, b - a)
                            if c.kind == "image":
                                vals[c.field] = decode_images(v.to_pylist(), c.shape,
                                                              f"{where}: {c.key}")
                            elif c.kind == "done":
                                vals["@done"] = _numeric(v, (), bool, f"{where}: {c.key}")
                            else:
                                vals[c.field] = _numeric(v, c.shape, c.dtype,
                                                         f"{where}: {c.key}")
                        if videos:
                            ts = _numeric(batch.column("timestamp").slice(a, b - a), (),
                                          np.float64, f"{where}: timestamp")
                            for c in videos:
                                vals[c.field] = _video_frames(source, meta, c, ep, ts,
                                                              readers, tolerance_s)
                        end = r + b == (ep.start - first_row) + ep.length
                        yield ep, vals, end
                    r += n
            g += n_file
    finally:
        for _, rd in readers.values():
            rd.close()


def _runs(ep_rows: np.ndarray, lo: int) -> list[tuple[int, int]]:
    """``[a, b)`` runs of one episode each in ``ep_rows[lo:]``."""
    cuts = np.flatnonzero(np.diff(ep_rows[lo:])) + 1 + lo
    edges = [lo, *cuts.tolist(), len(ep_rows)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _video_frames(source: Source, meta: Meta, c: Column, ep: Episode, ts: np.ndarray,
                  readers: dict[str, tuple[Any, VideoReader]], tol: float) -> np.ndarray:
    file, start = ep.videos[c.key]
    have = readers.get(c.key)
    if have is None or have[0] != file:
        if have is not None:
            have[1].close()
        path = meta.video_path(c.key, file)
        rd = VideoReader(lambda p=path: source.open(p), source.location(path), tol)
        readers[c.key] = have = (file, rd)
    out = np.empty((len(ts), *c.shape), np.uint8)
    for i, t in enumerate(ts):
        a = have[1].frame(start + float(t))  # RGB: a gray camera's channel is its first
        out[i] = a[..., 0] if len(c.shape) == 2 else a[..., :1] if c.shape[-1] == 1 else a
    return out
