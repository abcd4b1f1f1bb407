"""Conformance tests every storage backend must pass (modelled on ``zarr.testing.store``).

Subclass :class:`BackendTests` in a test module, set ``backend_cls`` and provide a
``backend`` fixture giving a fresh, empty store root per test::

    class TestMine(BackendTests):
        backend_cls = MyBackend

        @pytest.fixture
        def backend(self, tmp_path):
            return MyBackend(str(tmp_path))

Every :class:`~expstore.storage.backends.Backend` method's contract is checked: missing
keys, overwrite, keys as stores name them, multi-MiB objects, batched ranges, recursive
listing under a prefix, ``total_bytes``, ``get_many`` order, version tags and chains of
conditional writes, version-pinned handles
(``pins_versions``) and ``close``. Backends declaring ``atomic_conditional_writes`` also
face races: many threads (and, with ``race_processes``, forked processes) calling
``put_if`` on one key at once, of which exactly one may win, for several rounds.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Callable
from typing import Any

import pytest

from ..errors import ObjectChanged, PreconditionFailed
from ..storage.backends import Backend


def _blob(n: int, seed: int = 0) -> bytes:
    """``n`` bytes that differ at every offset (so a misplaced range shows)."""
    return bytes((i * 31 + seed * 7 + (i >> 8)) & 0xFF for i in range(n))


def _conditional_write(backend: Backend, key: str, data: bytes, match: str | None) -> bool:
    """One racer: True when its ``put_if`` won, False on ``PreconditionFailed``."""
    try:
        backend.put_if(key, data, match)
    except PreconditionFailed:
        return False
    return True


def _race_child(backend: Backend, key: str, data: bytes, match: str | None,
                barrier: Any, results: Any) -> None:
    barrier.wait(30)
    try:
        results.put((data, _conditional_write(backend, key, data, match)))
    except BaseException as e:  # reported, so the parent fails with the reason
        results.put((data, repr(e)))


class BackendTests:
    """The contract of :class:`~expstore.storage.backends.Backend`; see the module doc."""

    #: the class the ``backend`` fixture returns
    backend_cls: type[Backend]
    #: racers per round and rounds of the conditional-write races
    race_workers: int = 8
    race_rounds: int = 4
    #: also race forked processes (where objects are shared between processes)
    race_processes: bool = False

    @pytest.fixture
    def backend(self) -> Backend:
        """A backend on a fresh, empty root (subclasses provide it)."""
        raise NotImplementedError("subclasses of BackendTests provide a backend fixture")

    # -- identity ---------------------------------------------------------------------------
    def test_backend_type(self, backend: Backend) -> None:
        assert type(backend) is self.backend_cls
        assert isinstance(backend.url, str) and backend.url
        assert isinstance(backend.atomic_conditional_writes, bool)
        assert isinstance(backend.pins_versions, bool)
        assert isinstance(backend.is_local, bool)

    # -- whole objects ----------------------------------------------------------------------
    def test_missing_key(self, backend: Backend) -> None:
        assert backend.get("nope/x") is None
        assert backend.get_tagged("nope/x") is None
        assert backend.size("nope/x") is None
        assert backend.get_many(["nope/x", "nope/y"]) == [None, None]
        assert backend.list("nope") == []
        assert backend.total_bytes("nope") == 0
        backend.delete("nope/x")  # deleting a missing key is no error

    def test_put_get_roundtrip(self, backend: Backend) -> None:
        objs = {"a": b"top", "f/c/0/1": _blob(5000), "f/c/0/2": b"", "_state/lane_0": b"\0" * 9}
        for k, v in objs.items():
            backend.put(k, v)
        for k, v in objs.items():
            assert backend.get(k) == v, k
            assert backend.size(k) == len(v), k

    def test_put_many_writes_every_object(self, backend: Backend) -> None:
        objs = {f"f/c/{i}/0": _blob(200 + 37 * i, i) for i in range(12)}
        objs["f/c/3/0"] = b""
        backend.put("f/c/0/0", b"old")
        backend.put_many(list(objs.items()))
        assert backend.get_many(list(objs)) == list(objs.values())
        backend.put_many([])

    def test_overwrite_replaces(self, backend: Backend) -> None:
        backend.put("k", _blob(300, 1))
        backend.put("k", b"short")
        assert backend.get("k") == b"short" and backend.size("k") == 5
        backend.put("k", _blob(7000, 2))
        assert backend.get("k") == _blob(7000, 2)

    def test_delete(self, backend: Backend) -> None:
        backend.put("d/a", b"1")
        backend.put("d/b", b"2")
        backend.delete("d/a")
        assert backend.get("d/a") is None and backend.size("d/a") is None
        assert backend.list("d") == ["d/b"]
        backend.delete("d/a")

    def test_get_many_keeps_order(self, backend: Backend) -> None:
        for i in range(6):
            backend.put(f"m/{i}", _blob(10 + i, i))
        keys = ["m/3", "m/missing", "m/0", "m/5", "m/0", "x/none", "m/1"]
        want = [backend.get(k) for k in keys]
        assert backend.get_many(keys) == want
        assert want[1] is None and want[2] == _blob(10, 0)
        assert backend.get_many([]) == []

    def test_keys_as_stores_name_them(self, backend: Backend) -> None:
        """Dots, dashes, underscores, ``=`` and ``+`` in keys (field names, lease and state
        files, probe folders) survive URL quoting."""
        keys = ["obs.pixels/c/12/0/0", "_state/lane_3.lease", ".hidden/x-1_2", "a=b+c/d"]
        for i, k in enumerate(keys):
            backend.put(k, _blob(40 + i, i))
        for i, k in enumerate(keys):
            assert backend.get(k) == _blob(40 + i, i), k
            assert backend.size(k) == 40 + i, k
        assert backend.list("") == sorted(keys)
        h = backend.open_object(keys[0])
        assert backend.read_ranges([(h, 3, 9)]) == [_blob(40)[3:9]]
        backend.close_object(h)

    def test_large_object_ranges(self, backend: Backend) -> None:
        """A multi-MiB object: far-apart ranges (more than ``max_gap`` apart) and its tail."""
        big = _blob(5 << 20, 3)
        backend.put("big/obj", big)
        assert backend.size("big/obj") == len(big)
        h = backend.open_object("big/obj")
        want = [(0, 10), (len(big) - 100, len(big)), (3 << 20, (3 << 20) + 4096),
                (1 << 20, 2 << 20)]
        assert backend.read_ranges([(h, s, e) for s, e in want]) == [big[s:e] for s, e in want]
        backend.close_object(h)
        assert backend.get("big/obj") == big

    def test_get_many_of_many_keys(self, backend: Backend) -> None:
        keys = [f"many/{i:03d}" for i in range(60)]
        for i, k in enumerate(keys):
            backend.put(k, i.to_bytes(2, "little"))
        got = backend.get_many(keys[::-1] + ["many/none"])
        assert got == [i.to_bytes(2, "little") for i in range(59, -1, -1)] + [None]

    # -- listing ----------------------------------------------------------------------------
    def test_list_is_recursive_under_a_folder_prefix(self, backend: Backend) -> None:
        keys = ["a/b/c", "a/d", "ab/e", "z", "a/b/f/g"]
        for k in keys:
            backend.put(k, k.encode())
        assert backend.list("") == sorted(keys)
        assert backend.list("a") == ["a/b/c", "a/b/f/g", "a/d"]  # not "ab/e"
        assert backend.list("a/b") == ["a/b/c", "a/b/f/g"]
        assert backend.list("ab") == ["ab/e"]
        assert backend.list("q") == []

    def test_total_bytes(self, backend: Backend) -> None:
        assert backend.total_bytes() == 0
        sizes = {"t/a": 1000, "t/b/c": 20000, "u": 300}
        for k, n in sizes.items():
            backend.put(k, _blob(n))
        if backend.is_local:  # bytes allocated: at least one block per object
            assert backend.total_bytes("t") > 0
            assert backend.total_bytes() >= backend.total_bytes("t")
        else:
            assert backend.total_bytes("t") == 21000
            assert backend.total_bytes() == 21300
        assert backend.total_bytes("none") == 0

    # -- ranges through handles -------------------------------------------------------------
    def _gaps(self, backend: Backend) -> list[Any]:
        """Span-merging settings to try (backends that merge nearby ranges)."""
        return [getattr(backend, "max_gap", None), 0, -1] if hasattr(backend, "max_gap") \
            else [None]

    def test_read_ranges(self, backend: Backend) -> None:
        a, b = _blob(70000, 1), _blob(3000, 2)
        backend.put("r/a", a)
        backend.put("r/b", b)
        want_ranges = [("a", 100, 200), ("b", 0, 3000), ("a", 0, 1), ("a", 150, 160),
                       ("a", 69000, 70000), ("b", 10, 10), ("a", 200, 300), ("a", 5, 5)]
        for gap in self._gaps(backend):
            if gap is not None:
                backend.max_gap = gap  # type: ignore[attr-defined]
            ha, hb = backend.open_object("r/a"), backend.open_object("r/b")
            assert ha is not None and hb is not None
            try:
                handles = {"a": ha, "b": hb}
                got = backend.read_ranges([(handles[o], s, e) for o, s, e in want_ranges])
                data = {"a": a, "b": b}
                assert got == [data[o][s:e] for o, s, e in want_ranges], f"max_gap={gap}"
                assert backend.read_ranges([]) == []
            finally:
                backend.close_object(ha)
                backend.close_object(hb)

    def test_read_ranges_of_a_missing_object(self, backend: Backend) -> None:
        backend.put("r/there", b"0123456789")
        h = backend.open_object("r/gone")
        if h is None:  # backends that look on open say so there
            return
        there = backend.open_object("r/there")
        got = backend.read_ranges([(h, 0, 4), (there, 2, 5)], missing_ok=True)
        assert got == [None, b"234"]
        with pytest.raises(FileNotFoundError):
            backend.read_ranges([(h, 0, 4)])
        backend.close_object(h)
        backend.close_object(there)

    def test_handle_reads_one_version(self, backend: Backend) -> None:
        """Where ``pins_versions``: after an object is replaced, a handle that has read it
        returns the old bytes or raises ObjectChanged naming it, never the new bytes."""
        if not backend.pins_versions:
            pytest.skip("this backend does not pin versions (readers re-check instead)")
        old, new = _blob(4096, 1), _blob(4096, 2)
        backend.put("v/obj", old)
        h = backend.open_object("v/obj")
        assert backend.read_ranges([(h, 0, 64)]) == [old[:64]]
        backend.put("v/obj", new)
        try:
            got = backend.read_ranges([(h, 100, 200), (h, 4000, 4096)])
        except ObjectChanged as e:
            assert h in e.handles
        else:
            assert got == [old[100:200], old[4000:4096]]
        backend.close_object(h)
        h2 = backend.open_object("v/obj")  # a new handle sees the new version
        assert backend.read_ranges([(h2, 0, 64)]) == [new[:64]]
        backend.close_object(h2)

    # -- version tags and conditional writes ------------------------------------------------
    def test_get_tagged(self, backend: Backend) -> None:
        backend.put("g/k", b"one")
        data, tag = backend.get_tagged("g/k")
        assert data == b"one" and isinstance(tag, str) and tag
        backend.put("g/k", b"two")
        data2, tag2 = backend.get_tagged("g/k")
        assert data2 == b"two" and tag2 != tag

    def test_put_if_creates_only_when_missing(self, backend: Backend) -> None:
        tag = backend.put_if("c/lease", b"first", None)
        assert backend.get_tagged("c/lease") == (b"first", tag)
        with pytest.raises(PreconditionFailed):
            backend.put_if("c/lease", b"second", None)
        assert backend.get("c/lease") == b"first"

    def test_put_if_matches_the_current_tag(self, backend: Backend) -> None:
        backend.put("c/k", b"v1")
        tag1 = backend.get_tagged("c/k")[1]
        tag2 = backend.put_if("c/k", b"v2", tag1)
        assert backend.get_tagged("c/k") == (b"v2", tag2) and tag2 != tag1
        with pytest.raises(PreconditionFailed):
            backend.put_if("c/k", b"v3", tag1)  # stale tag
        with pytest.raises(PreconditionFailed):
            backend.put_if("c/k", b"v3", "not-a-tag")
        assert backend.get("c/k") == b"v2"
        backend.put("c/k", b"by another writer")
        with pytest.raises(PreconditionFailed):
            backend.put_if("c/k", b"v3", tag2)  # replaced meanwhile
        assert backend.get("c/k") == b"by another writer"

    def test_tags_change_with_every_conditional_write(self, backend: Backend) -> None:
        """A chain of conditional writes, each naming the tag the last one returned (a lease
        renewed again and again); a refused write changes neither bytes nor tag."""
        tag = backend.put_if("c/chain", b"0", None)
        for i in range(1, 6):
            new = backend.put_if("c/chain", str(i).encode(), tag)
            assert new != tag and backend.get_tagged("c/chain") == (str(i).encode(), new)
            with pytest.raises(PreconditionFailed):
                backend.put_if("c/chain", b"stale", tag)
            assert backend.get_tagged("c/chain") == (str(i).encode(), new)
            tag = new

    def test_put_if_with_a_tag_on_a_missing_key_fails(self, backend: Backend) -> None:
        backend.put("c/tmp", b"x")
        tag = backend.get_tagged("c/tmp")[1]
        backend.delete("c/tmp")
        with pytest.raises(PreconditionFailed):
            backend.put_if("c/tmp", b"y", tag)
        assert backend.get("c/tmp") is None

    # -- races (atomic conditional writes only) ---------------------------------------------
    def _need_atomic(self, backend: Backend) -> None:
        if not backend.atomic_conditional_writes:
            pytest.skip("no atomic conditional writes declared: races are not guaranteed")

    def _race_threads(self, backend: Backend, key: str, match: str | None) -> list[bytes]:
        barrier = threading.Barrier(self.race_workers)
        wins: list[bytes] = []
        errors: list[BaseException] = []

        def one(i: int) -> None:
            data = f"{key}:{match}:thread {i}".encode()  # unique: content tags see changes
            try:
                barrier.wait(30)
                if _conditional_write(backend, key, data, match):
                    wins.append(data)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(self.race_workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        return wins

    def _race_processes(self, backend: Backend, key: str, match: str | None) -> list[bytes]:
        ctx = mp.get_context("fork")
        barrier, results = ctx.Barrier(self.race_workers), ctx.Queue()
        procs = [ctx.Process(target=_race_child,
                             args=(backend, key, f"{key}:{match}:proc {i}".encode(), match,
                                   barrier, results))
                 for i in range(self.race_workers)]
        for p in procs:
            p.start()
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        assert all(isinstance(won, bool) for _, won in got), got
        return [data for data, won in got if won]

    def _race(self, backend: Backend, racer: Callable[..., list[bytes]], name: str) -> None:
        for rnd in range(self.race_rounds):
            key = f"race/{name}-{rnd}"
            wins = racer(backend, key, None)  # create-only: one creator
            assert len(wins) == 1, f"round {rnd}: {len(wins)} writers created {key}"
            assert backend.get(key) == wins[0]
            tag = backend.get_tagged(key)[1]
            wins = racer(backend, key, tag)  # all hold the same tag: one replaces
            assert len(wins) == 1, f"round {rnd}: {len(wins)} writers replaced {key}"
            assert backend.get(key) == wins[0]

    def test_put_if_race_between_threads(self, backend: Backend) -> None:
        self._need_atomic(backend)
        self._race(backend, self._race_threads, "threads")

    def test_put_if_race_between_processes(self, backend: Backend) -> None:
        self._need_atomic(backend)
        if not self.race_processes:
            pytest.skip("objects of this backend are not shared between processes")
        self._race(backend, self._race_processes, "procs")

    # -- lifetime ---------------------------------------------------------------------------
    def test_close(self, backend: Backend) -> None:
        backend.put("z", b"1")
        h = backend.open_object("z")
        backend.close_object(h)
        backend.close()
        backend.close()  # idempotent
