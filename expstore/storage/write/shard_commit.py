"""Committing one shard of a lane (docs/architecture.md §4): every field's object written
(a partial flush on local disk: in place through a spare link, ``rewrite.Rewrite``;
otherwise all fields at once, ``put_many``: on local disk one call of the write kernel, on
object stores concurrent uploads), then the lane state that commits it. The
commit half of :class:`~.writer.LaneWriter`, run on the caller's thread (``flush``) or on
the lane's background writing thread; it reads and updates the writer's lane state.
``w`` is that writer (typed ``Any``: importing ``writer.py`` here would be a circle).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import WriteFailedError
from ...rows import FLAG_LAST
from .. import faults
from ..format import LaneState, ShardImage, state_key, write_state
from .background import check_lease
from .rewrite import Lineage, Rewrite, RewritingPuts
from .shard_buffer import ShardBuffer


def commit_shard(w: Any, sh: ShardBuffer, partial: bool, background: bool = False
                 ) -> None:
    """Write ``sh`` (every field's object) and the lane state covering it (§4) for the
    lane of ``w``; ``background``: on the lane's writing thread. Raises
    :class:`WriteFailedError` naming the object that could not be written."""
    L = w.layout
    st = w._disk
    end = sh.first_step + sh.n
    # replacing the shard object drops the previous lap's rows in all its slots
    valid_from = max(st.valid_from, sh.first_step + L.shard_rows - L.lane_capacity,
                     min(w._lost_to, sh.first_step))
    shard = w.shard_index(sh.first_step)
    backend = _background_backend(w) if background else w.backend
    states = (RewritingPuts(backend, w._state_lineage) if w._local
              else backend)
    key = "_state"
    try:
        if background:  # (the caller's thread: LeasedBackend checks it)
            _check_lease(w)
        if valid_from > st.valid_from:
            if faults.ARMED:
                faults.hit("flush.drop")
            key = state_key(w.lane)
            drop = min(valid_from, st.count)
            write_state(states, LaneState(st.lane, st.count, drop, st.episodes,
                                          st.generation))
            st.valid_from = drop
            st.generation += 1
        sh.clean = False
        if w._local and partial:  # in place, field by field (rewrite.py)
            for i, name in enumerate(L.fields):
                key = L.shard_key(name, shard)
                img = sh.images[name]
                img.update(sh.staging[name], sh.n)
                _put_partial(w, backend, key, name, img, sh)
                if faults.ARMED and i == 0:
                    faults.hit("flush.shards")
        else:  # every field's object of the shard at once (local disk: one kernel call)
            objects = []
            for name in L.fields:
                img = sh.images[name]
                img.update(sh.staging[name], sh.n)
                if w._local and not img.loose:  # the image as it is, without a copy
                    img.seal(sh.first_step, sh.n, L.checksum)
                    objects.append((L.shard_key(name, shard), img.buf))
                else:
                    objects.append((L.shard_key(name, shard),
                                    img.compact(sh.first_step, sh.n, L.checksum)))
            key = f"{objects[0][0]} (and the shard's other fields)"
            # local disk: temp files in the writer's own folder (its lane's next writer
            # clears it), so a writer killed mid-write leaves none beside the objects
            local = {"temp_folder": f"{w._spare_root}/{w._session}/tmp"} if w._local else {}
            if w._local and faults.ARMED:  # (the crash point between a shard's fields)
                key = objects[0][0]
                backend.put_many(objects[:1], **local)
                faults.hit("flush.shards")
                objects = objects[1:]
            try:
                backend.put_many(objects, **local)
            except OSError as e:  # (local disk names the object that failed)
                if any(e.filename == k for k, _ in objects):
                    key = e.filename
                raise
        if faults.ARMED:
            faults.hit("flush.state")
        key = state_key(w.lane)
        if background and not hasattr(backend, "commit_state"):  # (a fence refuses a
            _check_lease(w)  # commit after a takeover: no check needed)
        new_rows = slice(max(st.count - sh.first_step, 0), sh.n)
        finals = int(np.count_nonzero(sh.staging["_flags"][new_rows] & FLAG_LAST))
        new = LaneState(st.lane, end, valid_from, st.episodes + finals, st.generation)
        write_state(states, new)
    except OSError as e:
        raise WriteFailedError(
            e.errno, f"{w.backend.url}/{key}: write failed ({e.strerror or e}); lane "
            f"{w.lane} keeps {w.count - st.count} uncommitted rows in RAM for the "
            f"next flush(); committed rows are intact") from e
    w._disk = new
    if w.shared is not None:
        w.shared.set_committed(end)
    if not partial and w.snapshot is not None:  # (after the commit: §4)
        w.snapshot.committed(backend, sh.first_step,
                                sh.staging["_episode_step"][:sh.n],
                                sh.staging["_flags"][:sh.n])
    if faults.ARMED:
        faults.hit("flush.done")
    if not partial and sh.spare_dir is not None:
        for lin in sh.lineages:
            lin.close()
        backend.remove_tree(sh.spare_dir)  # the shard's next lap starts from new files
        sh.spare_dir, sh.lineages = None, []


def _put_partial(w: Any, backend: Any, key: str, name: str, img: ShardImage,
                 sh: ShardBuffer) -> None:
    """Write one field's object of ``sh`` in place, for a partial flush on local disk."""
    lin = w._spares.get(name)
    if lin is None:
        lin = w._spares[name] = Lineage(f"{w._spare_dir(sh)}/{name.replace('/', '%')}")
        w._regate()
    img.seal(sh.first_step, sh.n, w.layout.checksum)
    backend.put(key, Rewrite(img.buf, len(img.buf), img.prefix, lin))


def _background_backend(w: Any) -> Any:
    """The backend for the background thread: a lane lease is checked there
    (:func:`check_lease`), not renewed (the caller's thread renews it on every add; two
    threads renewing at once would see each other's renewal as a takeover). On object
    stores, the lease's fence: shard uploads and the state commit are conditional."""
    lease = getattr(w.backend, "lease", None)
    if lease is None:
        return w.backend
    return lease.fence if lease.fence is not None else w.backend._backend


def _check_lease(w: Any) -> None:
    check_lease(getattr(w.backend, "lease", None), w.backend.url, w.lane)
