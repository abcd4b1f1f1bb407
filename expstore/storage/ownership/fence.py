"""Fencing: a lane writer on an object store writes only versions it has seen.

A lease (``lease.py``) says who *should* write a lane; it cannot stop a writer that checked
its lease a moment before another process took the lane over (its lease expired while it
stalled). On object stores with atomic conditional writes every write of a lane holder is
therefore conditional on the version of the object this holder last wrote or read:

- **Lane state**: ``put_if(state, body, match=<tag of the state as this holder last wrote
  it>)``. Taking a lane over (:meth:`Fence.take`, right after the lease is won) rewrites
  the lane state conditionally with ``generation + 1`` (a *fencing bump*: new bytes, so a
  new tag even where tags are content hashes, S3 ETags). The old holder's next commit
  names a tag that is gone and fails with :class:`~expstore.errors.StoreLockedError`
  ("lost its lease"): it never commits after a takeover.
- **Shard objects**: each upload names the tag this holder last saw for the object
  (``If-None-Match: *`` for one it has not seen: creating a missing object overwrites
  nothing). An upload refused because the object changed reads the object's current tag
  (HEAD), *then* checks the lane state is still this holder's (one GET), then uploads
  naming that tag. A new holder bumps the state before it writes anything, so either the
  check sees the bump (the old holder fails) or every write of the new holder comes after
  that HEAD and the old holder's upload is refused: a fenced writer never replaces an
  object the new holder wrote. (Objects it replaces before the new holder writes them
  hold its own rows; none of them is committed beyond the state it last committed, and
  the new holder rewrites the object before committing rows in it.)

Local disks keep their own mechanism (``backends/local.py``: the lease is verified, one
read, before each commit; ``flock`` orders lease writes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ...errors import PreconditionFailed, StoreLockedError
from .. import faults
from ..backends import Backend
from ..format import LaneState, state_key

#: upload rounds (the last naming tags just read) before a lane's uploads give up
UPLOAD_ROUNDS = 3


class Holder(Protocol):
    """What a fence needs of the lease it backs (``lease.LaneLease``)."""

    lane: int
    key: str  # the lease object's key

    def _lost_to(self, cur: tuple[bytes, str] | None) -> None: ...


def fences(backend: Backend) -> bool:
    """Whether writers of ``backend`` fence their writes (remote, atomic conditions)."""
    return backend.atomic_conditional_writes and not backend.is_local


class Fence:
    """Conditional writes of one lane by the holder of its lease (see the module doc).

    Used like a backend by the lane's writer (:meth:`put`, :meth:`put_many`); every other
    attribute is the wrapped backend's. ``state_tag``: version of the lane state this
    holder wrote or read last; ``tags``: of the shard objects it wrote or read.
    """

    def __init__(self, backend: Backend, lease: Holder) -> None:
        self._backend = backend
        self.lease = lease
        self.key = state_key(lease.lane)
        self.state_tag: str | None = None
        self.tags: dict[str, str] = {}

    @property
    def where(self) -> str:
        return f"{self._backend.url}/{self.key}"

    def take(self) -> None:
        """The fencing bump of a new holder: rewrite the lane state with ``generation + 1``,
        conditional on the version read (a previous holder committing meanwhile: read
        again). A missing state (a store being created) is left missing."""
        b = self._backend
        for _ in range(8):
            cur = b.get_tagged(self.key)
            if cur is None:
                self.state_tag = None
                return
            st = LaneState.decode(cur[0], self.where)
            st.generation += 1
            try:
                self.state_tag = self._put_if(self.key, st.encode(), cur[1])
                return
            except PreconditionFailed:
                continue
        raise StoreLockedError(f"{self.where}: lane {self.lease.lane}: could not take the "
                               "lane over (its state kept changing under another writer)")

    def _put_if(self, key: str, data: bytes, match: str | None) -> str:
        """``put_if``; a refusal of a write that landed (its reply lost, the retry refused)
        is recognised by reading the object back."""
        try:
            return self._backend.put_if(key, data, match)
        except PreconditionFailed:
            cur = self._backend.get_tagged(key)
            if cur is not None and cur[0] == data:
                return cur[1]
            raise

    # -- the writer's writes --------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        """Commit the lane state, or upload one shard object, conditionally."""
        if key == self.key:
            self.commit_state(data)
        else:
            self.put_objects([(key, data)])

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Upload shard objects concurrently, conditionally (a lane state among them is
        committed after them)."""
        objects = [(k, d) for k, d in items if k != self.key]
        if objects:
            self.put_objects(objects)
        for k, d in items:
            if k == self.key:
                self.commit_state(d)

    def commit_state(self, data: bytes) -> None:
        """The lane state, only over the version this holder last wrote: a takeover since
        (a fencing bump) raises :class:`StoreLockedError` and commits nothing."""
        if faults.ARMED:
            faults.hit("commit.state")
        try:
            self.state_tag = self._put_if(self.key, data, self.state_tag)
        except PreconditionFailed:
            self._lost()

    def put_objects(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Shard objects, each over the version this holder last saw (see the module doc);
        :class:`StoreLockedError` when the lane was taken over."""
        if faults.ARMED:
            faults.hit("commit.shards")
        b = self._backend
        todo = [(k, bytes(d), self.tags.get(k)) for k, d in items]
        for _ in range(UPLOAD_ROUNDS):
            refused = []
            for (k, d, _m), got in zip(todo, b.put_many_if(todo)):
                if isinstance(got, PreconditionFailed):
                    self.tags.pop(k, None)
                    refused.append((k, d))
                else:
                    self.tags[k] = got
            if not refused:
                return
            tags = [b.tag_of(k) for k, _ in refused]  # first the versions there now,
            self.verify()  # then: is the lane still ours (every later write is refused)
            todo = [(k, d, t) for (k, d), t in zip(refused, tags)]
        raise StoreLockedError(
            f"{b.url}: lane {self.lease.lane}: shard uploads kept being refused although the "
            f"lane state is still this writer's: another process writes {todo[0][0]} "
            "without holding the lane's lease (opened with lease_ttl=None?)")

    def verify(self) -> None:
        """One GET: :class:`StoreLockedError` unless the lane state is still the version
        this holder wrote last."""
        cur = self._backend.get_tagged(self.key)
        if cur is None or cur[1] != self.state_tag:
            self._lost()

    def _lost(self) -> None:
        self.lease._lost_to(self._backend.get_tagged(self.lease.key))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)
