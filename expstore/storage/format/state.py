"""The lane state file: what a reader may trust (docs/architecture.md §4).

One small JSON object per lane, ``_state/lane_<i>.json``, replaced atomically after the
data shards it covers. Steps ``[valid_from, count)`` of the lane are committed and intact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...errors import StoreCorruptError
from ..backends import Backend
from .envelope import seal, unseal

STATE_VERSION = 1


def state_key(lane: int) -> str:
    return f"_state/lane_{lane}.json"


@dataclass
class LaneState:
    """Committed position of one lane (all counts in rows / lane steps)."""

    lane: int
    count: int = 0  # rows ever committed = step id of the next row
    valid_from: int = 0  # oldest step still intact on storage
    episodes: int = 0  # finished episodes (final rows written)
    generation: int = 0  # commits so far

    def encode(self) -> bytes:
        return seal("state", STATE_VERSION, asdict(self))

    @classmethod
    def decode(cls, raw: bytes, where: str) -> LaneState:
        body = unseal(raw, "state", STATE_VERSION, where, "lane state file")
        try:
            st = cls(**body)
        except TypeError as e:
            raise StoreCorruptError(f"{where}: lane state file is not valid ({e})") from e
        if not 0 <= st.valid_from <= st.count:
            raise StoreCorruptError(f"{where}: lane state has valid_from={st.valid_from} "
                                    f"outside [0, count={st.count}]")
        return st


def read_state(backend: Backend, lane: int) -> LaneState:
    """Committed state of ``lane``; a missing or corrupt file is a clear error naming it."""
    key = state_key(lane)
    raw = backend.get(key)
    if raw is None:
        raise StoreCorruptError(f"{backend.url}/{key}: lane state file is missing")
    return _decode(backend, key, raw)


def read_states(backend: Backend, lanes: list[int]) -> list[LaneState]:
    """States of several lanes, fetched together (concurrently on remote stores)."""
    out = []
    for lane, raw in zip(lanes, backend.get_many([state_key(i) for i in lanes])):
        if raw is None:
            raise StoreCorruptError(f"{backend.url}/{state_key(lane)}: lane state file is "
                                    "missing")
        out.append(_decode(backend, state_key(lane), raw))
    return out


def _decode(backend: Backend, key: str, raw: bytes) -> LaneState:
    """A local writer rewrites its lane state in place (``backends/local.py``): a read that
    raced a rewrite fails its checksum, and is read again."""
    where = f"{backend.url}/{key}"
    for _ in range(3 if backend.is_local else 0):
        try:
            return LaneState.decode(raw, where)
        except StoreCorruptError:
            again = backend.get(key)
            if again is None or again == raw:
                break
            raw = again
    return LaneState.decode(raw, where)


def write_state(backend: Backend, state: LaneState) -> None:
    state.generation += 1
    backend.put(state_key(state.lane), state.encode())
