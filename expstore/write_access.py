"""Who may write through one open store: its lanes' leases, and the checks run before
every write (the store is open, opened for writing, the lane is one it writes, the lane's
lease is held and renewed when due)."""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from collections.abc import Iterable
from typing import NoReturn

from .errors import ReadOnlyError
from .storage.backends import Backend, RetryPolicy
from .storage.ownership import LaneLease, acquire_all
from .storage.ownership import losses as lease_losses
from .storage.write import LaneWriter


def check_writable(backend: Backend) -> None:
    """Refuse ``mode="r+"`` up front on a local store this process cannot write."""
    folder = os.path.join(getattr(backend, "root", ""), "_state")
    if backend.is_local and os.path.isdir(folder) and not os.access(folder, os.W_OK):
        why = "read-only file system" if _read_only_mount(folder) else "permission denied"
        raise ReadOnlyError(f"{backend.url}/_state: cannot open for writing ({why}); "
                            "open with mode='r' to read")


def _read_only_mount(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def acquire_leases(backend: Backend, lanes: list[int], ttl: float | None
                   ) -> dict[int, LaneLease]:
    """The leases of ``lanes`` (none without ``lanes`` or a ``ttl``, in seconds), after
    :func:`check_writable`; ``ReadOnlyError`` where the storage refuses writes."""
    if lanes:
        check_writable(backend)
    if not (ttl and lanes):
        return {}
    try:
        return acquire_all(backend, lanes, ttl)
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        raise ReadOnlyError(f"{backend.url}: cannot open for writing, the storage refuses "
                            f"writes ({e.strerror or e}); open with mode='r' to read") from e


def release_all(leases: Iterable[LaneLease]) -> None:
    """Release leases, never raising (also run by the finalizer of a collected Store and at
    exit; a lease lost to another holder, or taken by the parent of a fork, is left be)."""
    for lease in leases:
        try:
            lease.release()
        except Exception:  # noqa: BLE001 - storage gone: the lease expires by itself
            pass


def release_at_end(leases: list[LaneLease]) -> None:
    """Finalizer of a collected Store, also run at exit: release its leases with a short
    retry budget (at exit the storage may be gone; a lease left behind expires by itself).
    Rows not flushed are not committed: nothing is written but the lease objects."""
    for lease in leases:
        retry = getattr(lease.backend, "retry", None)
        if isinstance(retry, RetryPolicy):
            lease.backend.retry = dataclasses.replace(retry, attempts=min(retry.attempts, 3),
                                                      deadline=min(retry.deadline, 5.0),
                                                      timeout=min(retry.timeout, 5.0))
    release_all(leases)


@dataclasses.dataclass(eq=False)
class WriteAccess:
    """The checks before a write through one store: ``mode`` (``"r"``: none), the lanes
    it writes (``writers``: lane -> LaneWriter) and their ``leases``; ``closed`` once the
    store is closed."""

    url: str
    mode: str
    write_lanes: list[int]
    writers: dict[int, LaneWriter]
    leases: dict[int, LaneLease]
    closed: bool = dataclasses.field(default=False, init=False)
    #: ``time.monotonic()`` when the first lease is due for renewal (0: check them now)
    _lease_due: float = dataclasses.field(default=0.0, init=False)
    #: ``lease_losses()`` when every lease was last checked
    _lease_losses: int = dataclasses.field(default=0, init=False)

    def refuse_closed(self) -> NoReturn:
        raise ValueError(f"{self.url}: the store is closed; open it again "
                         "(es.open(url, mode='r+')) to write")

    def writer(self, lane: int) -> LaneWriter:
        """The writer of ``lane``, its lease renewed when due; raises, naming why, when
        the lane cannot be written here."""
        if self.closed:
            self.refuse_closed()
        if self.mode == "r":
            raise ReadOnlyError(f"{self.url}: store opened read-only (mode='r')")
        if lane not in self.writers:
            raise ReadOnlyError(f"{self.url}: lane {lane} is not open for writing here "
                                f"(writable lanes: {self.write_lanes})")
        lease = self.leases.get(lane)
        if lease is not None:
            lease.ensure()  # renews when a third of its ttl has passed
        return self.writers[lane]

    def ensure_leases(self) -> None:
        """``lease.ensure()`` for every lane (a vector ``add``), skipped while every lease
        is held and none is due for renewal (a third of its ttl after its last renewal)."""
        leases = self.leases
        if not leases:
            return
        if time.monotonic() < self._lease_due and lease_losses() == self._lease_losses:
            return  # none due, and no lease of this process was lost since the last check
        losses = lease_losses()
        for lease in leases.values():
            lease.ensure()  # raises if lost; renews when a third of its ttl has passed
        self._lease_due = min(lease.renewed_at + lease.ttl / 3 for lease in leases.values())
        self._lease_losses = losses

    def ensure_held(self) -> None:
        """Raise, naming who and why, if another writer took a lane's lease."""
        for lease in self.leases.values():
            if not lease.held:
                lease.ensure()

    def release(self) -> None:
        """Release every lease, never raising."""
        release_all(self.leases.values())
