"""Lane leases: one writer per lane, across processes and hosts (no lock server).

A writer of lane ``i`` holds ``_state/lane_<i>.lease``, a small JSON object naming its owner
(host, pid, boot id, a random id) and an expiry time (wall clock, seconds since the epoch).
It is taken when a store is opened with ``mode="r+"`` for that lane, renewed whenever
a third of its ``ttl`` has passed (checked on every add and before every flush) and
released on ``close()``, when its ``Store`` is garbage-collected and when the process
exits. Another writer gets :class:`~expstore.errors.StoreLockedError` naming the lane, the
owner and the expiry. A lease may be taken over when it has expired, was released, or
belongs to a dead process of the same machine, or to this process: a second ``Store``
object opening a lane (a re-run notebook cell) takes it from the first at once, which then
fails at its next add, extend or flush (the registry of leases held by this process).

A writer that lost its lease must never commit. On object stores its lease carries a
:class:`~expstore.storage.ownership.fence.Fence`: taking a lane over bumps the lane state
conditionally, and every shard upload and state commit of the lane is conditional on the
version this writer last saw, so the server refuses the old writer's writes (``fence.py``).
On local disk, before the first write of each shard and before every lane state commit,
:class:`LeasedBackend` reads the lease object back and compares its version with the one
this writer wrote last, so a takeover by another process is seen before anything of this
writer reaches storage.

Every change is a conditional write (:meth:`Backend.put_if`): ``If-None-Match: *`` to
create, ``If-Match: <tag read>`` to renew or take over, so two racing writers cannot both
win on S3 (AWS, moto, MinIO), on local disk (``flock``) and in ``memory://`` (a lock). Each
write is read back. Backends without atomic conditional writes
(``atomic_conditional_writes = False``: generic fsspec filesystems, S3-compatible servers
answering 501 to conditions) cannot keep two writers apart: leases are refused there with
:class:`~expstore.errors.LeaseUnsupportedError` (one writer opens with ``lease_ttl=None``).

Limits (documented race windows):
- Expiry compares wall clocks of different hosts: keep them within a small fraction of
  ``ttl`` (NTP). On local disk a writer that stalls longer than its remaining lease (at
  least 2/3 of ``ttl`` at the start of a flush) between its check and its write can
  overlap with a new owner; on object stores the fence refuses its writes.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
import weakref
from dataclasses import dataclass

from ...errors import LeaseUnsupportedError, PreconditionFailed, StoreLockedError
from ..backends import Backend
from ..format import state_key
from .fence import Fence, fences

DEFAULT_TTL = 60.0  # seconds


def lease_key(lane: int) -> str:
    return f"_state/lane_{lane}.lease"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Owner:
    """Who holds a lease: host, process, boot of that host, and a random id per holder."""

    host: str
    pid: int
    boot: str
    id: str

    @classmethod
    def here(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), _boot_id(), uuid.uuid4().hex)

    def describe(self) -> str:
        return f"{self.host} pid {self.pid} (lease id {self.id[:8]})"

    def same_machine(self, other: Owner) -> bool:
        return self.host == other.host and self.boot == other.boot and bool(self.boot)

    def alive(self) -> bool:
        """Whether the process still runs (only meaningful on its own machine); a zombie
        (killed, not yet reaped by its parent) counts as dead."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            return state not in ("Z", "X")
        except (OSError, IndexError):
            return True


#: Leases this process holds: (store URL, lane) -> the holder. A new holder of the same
#: lane (another Store object of this process) marks the previous one lost at once.
_HELD: dict[tuple[str, int], weakref.ref[LaneLease]] = {}
_HELD_LOCK = threading.Lock()


def _register(lease: LaneLease) -> None:
    key = (lease.backend.url, lease.lane)
    with _HELD_LOCK:
        ref = _HELD.get(key)
        prev = ref() if ref is not None else None
        _HELD[key] = weakref.ref(lease)
    if prev is not None and prev is not lease and prev.held:
        prev.held = False
        prev.lost = (f"another Store object of this process (pid {os.getpid()}) opened lane "
                     f"{lease.lane} for writing and took its lease")


def _unregister(lease: LaneLease) -> None:
    key = (lease.backend.url, lease.lane)
    with _HELD_LOCK:
        ref = _HELD.get(key)
        if ref is not None and ref() in (lease, None):
            del _HELD[key]


def require_atomic_writes(backend: Backend) -> None:
    """Raise :class:`LeaseUnsupportedError` unless ``backend`` has atomic conditional writes."""
    if backend.atomic_conditional_writes:
        return
    caps = getattr(backend, "capabilities", None)  # servers probed for preconditions
    why = f" (the server {caps().reason})" if callable(caps) else ""
    raise LeaseUnsupportedError(
        f"{backend.url}: cannot take lane leases on this storage ({type(backend).__name__}): "
        f"it has no atomic conditional writes{why}, so a lease cannot keep two writers of a "
        "lane apart. If this process is the only writer, open with lease_ttl=None")


#: Times a lease of this process stopped being held (lost, taken over or released); a
#: store that saw the same count since its last check knows all its leases still hold
#: without looking at each (:meth:`LaneLease.held` is cheap, 64 of them per add are not).
_LOSSES = [0]


def losses() -> int:
    """How many times a lease of this process stopped being held so far."""
    return _LOSSES[0]


class LaneLease:
    """The lease of one lane held (or wanted) by this process's store."""

    @property
    def held(self) -> bool:
        """Whether this holder still holds the lane (as far as it knows without I/O)."""
        return self._held

    @held.setter
    def held(self, value: bool) -> None:
        if not value and getattr(self, "_held", False):
            _LOSSES[0] += 1
        self._held = value

    def __init__(self, backend: Backend, lane: int, ttl: float = DEFAULT_TTL,
                 owner: Owner | None = None) -> None:
        if ttl <= 0:
            raise ValueError(f"lease_ttl: expected seconds > 0, got {ttl}")
        self.backend = backend
        self.lane = lane
        self.ttl = float(ttl)
        self.owner = owner or Owner.here()
        self.key = lease_key(lane)
        self.tag: str | None = None  # version of the lease object we wrote last
        self.renewed_at = 0.0  # time.monotonic() of our last successful write
        self.held = False
        self.lost: str | None = None  # why this holder lost the lease, when it knows
        self.pid = os.getpid()  # a forked child's copy never writes the lease
        #: conditional writes of the lane's state and shards (object stores, ``fence.py``)
        self.fence: Fence | None = None
        self._seq = 0

    @property
    def where(self) -> str:
        return f"{self.backend.url}/{self.key}"

    def _doc(self, expires: float) -> bytes:
        self._seq += 1
        o = self.owner
        return json.dumps({"lane": self.lane, "owner": {"host": o.host, "pid": o.pid,
                           "boot": o.boot, "id": o.id}, "expires": expires, "ttl": self.ttl,
                           "seq": self._seq}, sort_keys=True).encode()

    @staticmethod
    def _parse(raw: bytes) -> tuple[Owner, float] | None:
        try:
            d = json.loads(raw)
            o = d["owner"]
            return Owner(str(o["host"]), int(o["pid"]), str(o["boot"]), str(o["id"])), \
                float(d["expires"])
        except (ValueError, KeyError, TypeError):
            return None  # unreadable lease: treat as free

    def holder(self) -> tuple[Owner, float] | None:
        """Current owner and expiry (epoch seconds) on storage, or ``None`` if free."""
        cur = self.backend.get_tagged(self.key)
        if cur is None:
            return None
        parsed = self._parse(cur[0])
        if parsed is None or self._free(*parsed):
            return None
        return parsed

    def _free(self, owner: Owner, expires: float) -> bool:
        me = self.owner
        if owner.id == me.id or expires <= time.time():
            return True
        if owner.same_machine(me) and (owner.pid == me.pid or not owner.alive()):
            return True  # this process (an earlier Store) or a dead one
        return False

    def acquire(self) -> None:
        """Take the lease or raise :class:`StoreLockedError` naming the holder
        (:class:`LeaseUnsupportedError` where the backend cannot keep writers apart)."""
        for _ in range(8):
            require_atomic_writes(self.backend)
            cur = self.backend.get_tagged(self.key)
            match = None
            if cur is not None:
                parsed = self._parse(cur[0])
                if parsed is not None and not self._free(*parsed):
                    self._locked(*parsed)
                match = cur[1]
            body = self._doc(time.time() + self.ttl)
            try:
                self.backend.put_if(self.key, body, match)
            except PreconditionFailed:
                continue  # changed since we read it: look again
            if self._confirm(body):
                if not self.backend.atomic_conditional_writes:  # learnt from this write
                    self.release()
                    require_atomic_writes(self.backend)
                self.lost = None
                self.pid = os.getpid()
                if fences(self.backend):
                    try:
                        self.fence = Fence(self.backend, self)
                        self.fence.take()  # the previous holder's commits fail from now
                    except BaseException:
                        self.release()
                        raise
                _register(self)
                return
        cur = self.backend.get_tagged(self.key)
        parsed = self._parse(cur[0]) if cur else None
        if parsed is not None:
            self._locked(*parsed)
        raise StoreLockedError(f"{self.where}: lane {self.lane}: could not take the lease "
                               "(it kept changing under concurrent writers)")

    def _confirm(self, body: bytes) -> bool:
        """Read back: ours only if the stored object is exactly what we wrote."""
        back = self.backend.get_tagged(self.key)
        if back is None or back[0] != body:
            return False
        self.tag = back[1]
        self.renewed_at = time.monotonic()
        self.held = True
        return True

    def _locked(self, owner: Owner, expires: float) -> None:
        left = expires - time.time()
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expires))
        raise StoreLockedError(
            f"{self.where}: lane {self.lane} is being written by {owner.describe()}; its "
            f"lease expires {when} (in {left:.0f} s) unless renewed. Open the store with "
            f"mode='r', write another lane (lane=...), or wait for the lease to expire")

    def renew(self) -> None:
        """Extend the lease; :class:`StoreLockedError` if another writer took it over."""
        body = self._doc(time.time() + self.ttl)
        try:
            self.backend.put_if(self.key, body, self.tag)
        except PreconditionFailed:
            if self._confirm(body):  # our write landed, its reply was lost
                return
            self._lost_to(self.backend.get_tagged(self.key))
        if not self._confirm(body):
            self.held = False
            raise StoreLockedError(f"{self.where}: lane {self.lane}: lease renewal was "
                                   "overwritten by another writer")

    def _lost_to(self, cur: tuple[bytes, str] | None) -> None:
        """Mark the lease lost to whoever holds the object ``cur`` now, and raise."""
        self.held = False
        parsed = self._parse(cur[0]) if cur else None
        who = parsed[0].describe() if parsed else "nobody (lease deleted)"
        self.lost = (f"this writer lost its lease to {who} (it expired, or the lane was "
                     "opened for writing elsewhere)")
        raise StoreLockedError(f"{self.where}: lane {self.lane}: {self.lost}; rows not "
                               "flushed by this writer were not committed") from None

    def verify(self) -> None:
        """One GET: raise :class:`StoreLockedError` unless the lease object on storage is
        still the version this writer wrote last (nobody took the lane over since)."""
        self.ensure()
        cur = self.backend.get_tagged(self.key)
        if cur is None or cur[1] != self.tag:
            self._lost_to(cur)

    def ensure(self, fraction: float = 1 / 3) -> bool:
        """Renew when more than ``fraction * ttl`` seconds passed since the last write;
        whether it renewed (a renewal proves ownership: it is a conditional write)."""
        if not self.held:
            why = self.lost or "released (the store was closed) or lost"
            raise StoreLockedError(f"{self.where}: lane {self.lane}: this writer does not "
                                   f"hold the lane's lease: {why}; rows it had not flushed "
                                   "were not committed")
        if time.monotonic() - self.renewed_at > fraction * self.ttl:
            self.renew()
            return True
        return False

    def release(self) -> None:
        """Give the lease up (an expired record naming us); no-op if no longer ours, or in
        a forked child of the process that took it."""
        if not self.held or os.getpid() != self.pid:
            return
        self.held = False
        _unregister(self)
        try:
            self.backend.put_if(self.key, self._doc(0.0), self.tag)
        except PreconditionFailed:
            pass


class LeasedBackend:
    """A lane writer's view of the backend: every write first makes sure the lane's lease
    has at least 2/3 of its ttl left (renewing it), so a writer that lost its lane stops
    before touching storage. Then, with a fence (object stores), the write is conditional
    (:class:`~expstore.storage.ownership.fence.Fence`); without (local disk), before the first write
    after a lane state commit (a shard) and before every lane state commit it checks the
    lease object is still its own (:meth:`LaneLease.verify`, one read, unless it just
    renewed): a writer whose lease was taken over never overwrites the new owner's shards
    nor commits a state."""

    def __init__(self, backend: Backend, lease: LaneLease) -> None:
        self._backend = backend
        self.lease = lease
        self._state_key = state_key(lease.lane)
        self._checked = False  # ownership verified since the last lane state commit

    def put(self, key: str, data: bytes) -> None:
        commit = key == self._state_key
        fence = self.lease.fence
        if fence is not None:  # conditional writes: a takeover is refused by the server
            self.lease.ensure()
            fence.put(key, data)
            return
        if not self.lease.ensure() and (commit or not self._checked):
            self.lease.verify()
        self._checked = not commit
        self._backend.put(key, data)

    def put_many(self, items, **local) -> None:
        """Shard objects written together (never the lane state): checked like one
        :meth:`put`, then written concurrently by the wrapped backend (``local``: its
        options on local disk, ``temp_folder``)."""
        fence = self.lease.fence
        if fence is not None:
            self.lease.ensure()
            fence.put_many(items)
            return
        if any(key == self._state_key for key, _ in items):
            for key, data in items:
                self.put(key, data)
            return
        if not self.lease.ensure() and not self._checked:
            self.lease.verify()
        self._checked = True
        self._backend.put_many(items, **local)

    def __getattr__(self, name: str):
        return getattr(self._backend, name)


def acquire_all(backend: Backend, lanes: list[int], ttl: float) -> dict[int, LaneLease]:
    """Leases of ``lanes`` for one holder, all or none (taken ones are released on failure)."""
    owner = Owner.here()
    got: dict[int, LaneLease] = {}
    try:
        for lane in lanes:
            lease = LaneLease(backend, lane, ttl, owner)
            lease.acquire()
            got[lane] = lease
    except BaseException:
        for lease in got.values():
            lease.release()
        raise
    return got


def live_holders(backend: Backend, lanes: int) -> list[tuple[int, Owner, float]]:
    """Lanes whose lease another live writer holds: ``(lane, owner, expires)``."""
    out = []
    for lane in range(lanes):
        h = LaneLease(backend, lane, owner=Owner.here()).holder()
        if h is not None:
            out.append((lane, *h))
    return out
