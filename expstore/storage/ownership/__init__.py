"""Ownership: who may write a lane. Leases name one writer per lane across processes and
hosts; fences stop a writer whose lease was lost from writing a version it has not seen.
"""

from .lease import (
    DEFAULT_TTL,
    LaneLease,
    LeasedBackend,
    acquire_all,
    lease_key,
    live_holders,
    losses,
    require_atomic_writes,
)

__all__ = ["DEFAULT_TTL", "LaneLease", "LeasedBackend", "acquire_all", "lease_key",
           "live_holders", "losses", "require_atomic_writes"]
