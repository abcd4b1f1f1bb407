"""Every storage backend against the conformance suite (``expstore.testing.backend``), the
scheme registry, and the refusal of leases where conditional writes are not atomic."""

from __future__ import annotations

import errno
import importlib.util
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Sequence

import pytest

import expstore as es
from expstore.errors import LeaseUnsupportedError, PreconditionFailed
from expstore.storage import Backend, backend_for, backends, native, register_backend
from expstore.storage.backends import (  # the backends subpackage's face
    AzureBackend,
    FsspecBackend,
    GCSBackend,
    LocalBackend,
    MemoryBackend,
    S3Backend,
    content_tag,
)
from expstore.storage.backends.shard_cache import ShardCache
from expstore.storage.ownership import LaneLease, acquire_all, lease_key
from expstore.testing import BackendTests, data

SPEC = data.spec()


class DictBackend(Backend):
    """A whole backend in a few lines: objects in a dict, handles hold the bytes they
    opened (so they pin versions), conditional writes under a lock (atomic)."""

    atomic_conditional_writes = True

    def __init__(self, url: str, storage_options: dict | None = None) -> None:
        self.url = url
        self.objects: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def open_object(self, key: str) -> bytes | None:
        return self.objects.get(key)

    def read_ranges(self, requests: Sequence[tuple[bytes, int, int]],
                    missing_ok: bool = False) -> list[bytes | None]:
        return [h[s:e] for h, s, e in requests]

    def get(self, key: str) -> bytes | None:
        return self.objects.get(key)

    def put(self, key: str, data: bytes) -> None:
        with self.lock:
            self.objects[key] = bytes(data)

    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        with self.lock:
            cur = self.objects.get(key)
            if (None if cur is None else content_tag(cur)) != match:
                raise PreconditionFailed(f"{self.url}/{key}")
            self.objects[key] = bytes(data)
            return content_tag(data)

    def delete(self, key: str) -> None:
        with self.lock:
            self.objects.pop(key, None)

    def size(self, key: str) -> int | None:
        cur = self.objects.get(key)
        return None if cur is None else len(cur)

    def list(self, prefix: str) -> list[str]:
        p = prefix.rstrip("/") + "/" if prefix else ""
        return sorted(k for k in self.objects if k.startswith(p))


class NoCasBackend(DictBackend):
    """A backend that declares no atomic conditional writes."""

    atomic_conditional_writes = False


# -- the conformance suite, once per backend ---------------------------------------------------
class TestLocalBackend(BackendTests):
    backend_cls = LocalBackend
    race_processes = True

    @pytest.fixture
    def backend(self, tmp_path):
        b = LocalBackend(str(tmp_path / "root"), fsync=False)
        yield b
        b.close()


class TestMemoryBackend(BackendTests):
    backend_cls = MemoryBackend

    @pytest.fixture
    def backend(self):
        b = backend_for(f"memory://expstore-conformance/{uuid.uuid4().hex}")
        yield b
        if b.fs.exists(b.root):
            b.fs.rm(b.root, recursive=True)


class TestFsspecBackend(BackendTests):
    """The generic backend on fsspec's local filesystem (``local://`` has no own backend)."""

    backend_cls = FsspecBackend

    @pytest.fixture
    def backend(self, tmp_path):
        b = backend_for(f"local://{tmp_path}/root", {"auto_mkdir": True})
        yield b
        b.close()


class TestFsspecBackendOnAsyncFs(BackendTests):
    """The generic backend on an asynchronous filesystem (s3fs, constructed explicitly)."""

    backend_cls = FsspecBackend

    @pytest.fixture
    def backend(self, s3_url):
        return FsspecBackend(*s3_url)


class TestS3Backend(BackendTests):
    backend_cls = S3Backend

    @pytest.fixture
    def backend(self, s3_url):
        return backend_for(*s3_url)


class TestGCSBackend(BackendTests):
    """GCS on fake-gcs-server, which honours generation preconditions: races between
    threads and processes, of which exactly one may win."""

    backend_cls = GCSBackend
    race_processes = True

    @pytest.fixture
    def backend(self, fake_gcs_url):
        return backend_for(*fake_gcs_url)


class TestGCSBackendWithoutPreconditions(BackendTests):
    """GCS on gcp-storage-emulator, which ignores ``ifGenerationMatch``: the probe finds it
    out, and the backend declares neither atomic conditional writes nor pinned versions."""

    backend_cls = GCSBackend

    @pytest.fixture
    def backend(self, gcs_url):
        b = backend_for(*gcs_url)
        assert not b.atomic_conditional_writes and not b.pins_versions
        return b


class TestAzureBackend(BackendTests):
    """Azure on azurite, which honours If-None-Match / If-Match: races between threads and
    processes, of which exactly one may win."""

    backend_cls = AzureBackend
    race_processes = True

    @pytest.fixture
    def backend(self, az_url):
        return backend_for(*az_url)


class TestShardCacheOnS3(BackendTests):
    """The local shard cache in front of S3 (``storage_options["shard_cache"]``)."""

    backend_cls = ShardCache

    @pytest.fixture
    def backend(self, s3_url, tmp_path):
        url, so = s3_url
        b = backend_for(url, {**so, "shard_cache": {"path": str(tmp_path / "cache"),
                                                    "max_bytes": 1 << 20}})
        yield b
        b.close()


class TestDictBackend(BackendTests):
    """A backend defined outside the package passes the same suite."""

    backend_cls = DictBackend

    @pytest.fixture
    def backend(self):
        return DictBackend("dict://conformance")


def test_every_registered_backend_has_a_conformance_run():
    tested = {TestLocalBackend.backend_cls, TestMemoryBackend.backend_cls,
              TestFsspecBackend.backend_cls, TestS3Backend.backend_cls,
              TestGCSBackend.backend_cls, TestAzureBackend.backend_cls}
    registered = {backends._resolve(e) for e in backends.known_backends.values()}
    registered.add(backends._resolve(backends.DEFAULT_BACKEND))
    assert registered <= tested, registered - tested


def test_declared_atomicity():
    assert LocalBackend.atomic_conditional_writes and MemoryBackend.atomic_conditional_writes
    assert not FsspecBackend.atomic_conditional_writes


# -- the registry --------------------------------------------------------------------------------
@pytest.fixture
def registry():
    saved, hints = dict(backends.known_backends), dict(backends.install_hints)
    yield backends.known_backends
    backends.known_backends.clear()
    backends.known_backends.update(saved)
    backends.install_hints.clear()
    backends.install_hints.update(hints)


def _run_python(code: str) -> str:
    """``code`` run in a fresh interpreter that imports this checkout; its stdout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(es.__file__)))
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path}, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_expstore_imports_no_remote_backend():
    """Backends load on first use: ``import expstore`` pulls in no S3/GCS/Azure/fsspec code."""
    out = _run_python(
        "import sys, expstore\n"
        "remote = ('azure', 'gcs', 's3', 'fsspec', 'memory', 'versioned')\n"
        "print(*[m for m in [f'expstore.storage.backends.{r}' for r in remote] +\n"
        "        ['fsspec', 's3fs', 'gcsfs', 'adlfs'] if m in sys.modules])\n"
        "from expstore.storage.backends import S3Backend  # the face still names it\n"
        "print(S3Backend.__module__)\n")
    assert out.splitlines() == ["", "expstore.storage.backends.s3"]


def test_a_missing_dependency_names_the_scheme_and_the_install_command():
    if not importlib.util.find_spec("s3fs"):
        pytest.skip("needs fsspec's s3 entry to fail on s3fs, not on fsspec itself")
    out = _run_python(
        "import sys\n"
        "sys.modules['s3fs'] = None  # as if not installed\n"
        "from expstore.storage.backends import backend_for\n"
        "try:\n"
        "    backend_for('s3://bucket/x', {'anon': True})\n"
        "except ImportError as e:\n"
        "    print(e)\n")
    assert 's3://bucket/x: the s3:// backend (expstore.storage.backends.s3:S3Backend)' in out
    assert out.rstrip().endswith('install it with: pip install "expstore[s3]"'), out


def test_a_registered_backend_that_fails_to_import_says_its_hint(registry):
    register_backend("broken", "expstore_no_such_plugin.backend:Broken",
                     install_hint="pip install expstore-no-such-plugin")
    with pytest.raises(ImportError, match=r"^broken://x: the broken:// backend "
                       r"\(expstore_no_such_plugin.backend:Broken\) needs a package that failed "
                       r".*expstore_no_such_plugin.*install it with: pip install "
                       r"expstore-no-such-plugin$"):
        backend_for("broken://x")
    register_backend("nohint", "expstore_no_such_plugin.backend:Broken")
    with pytest.raises(ImportError, match="expstore_no_such_plugin") as caught:
        backend_for("nohint://x")
    assert "install it with" not in str(caught.value)


def test_a_scheme_is_not_replaced_without_clobber(registry):
    register_backend("dict", DictBackend)
    register_backend("dict", DictBackend)  # the same entry again: fine
    register_backend("DICT", f"{__name__}:DictBackend")  # the same class, by name
    with pytest.raises(ValueError, match=r"dict:// is already served by "
                       r".*:DictBackend; pass clobber=True to replace it with .*:NoCasBackend"):
        register_backend("dict", NoCasBackend)
    assert type(backend_for("dict://x")) is DictBackend
    with pytest.raises(ValueError, match=r"s3:// is already served by "
                       r"expstore.storage.backends.s3:S3Backend"):
        register_backend("s3", DictBackend)
    assert registry["s3"] == "expstore.storage.backends.s3:S3Backend"


def test_clobber_replaces_a_scheme_and_drops_its_old_install_hint(registry):
    register_backend("s3", DictBackend, clobber=True)
    assert type(backend_for("s3://bucket/x")) is DictBackend
    assert "s3" not in backends.install_hints  # the hint was about S3Backend's s3fs
    register_backend("dict", DictBackend)
    register_backend("dict", f"{__name__}:NoCasBackend", clobber=True)
    assert type(backend_for("dict://x")) is NoCasBackend


def test_schemes_map_to_their_backends(tmp_path):
    assert type(backend_for(tmp_path)) is LocalBackend
    assert type(backend_for(f"file://{tmp_path}")) is LocalBackend
    assert backend_for(f"file://{tmp_path}").root == str(tmp_path)
    assert type(backend_for("memory://expstore-conformance/x")) is MemoryBackend
    if importlib.util.find_spec("s3fs"):  # building it issues no request
        s3 = backend_for("s3://bucket/x", {"anon": True, "endpoint_url": "http://127.0.0.1:9"})
        assert type(s3) is S3Backend and s3.pins_versions
    if importlib.util.find_spec("gcsfs"):
        for scheme in ("gs", "gcs"):
            gcs = backend_for(f"{scheme}://bucket/x", {"token": "anon"})
            assert type(gcs) is GCSBackend and gcs.root == "bucket/x"
    if importlib.util.find_spec("adlfs"):
        for scheme in ("az", "abfs", "abfss"):
            az = backend_for(f"{scheme}://container/x", {"account_name": "acct", "anon": True})
            assert type(az) is AzureBackend and az.root == "container/x"
    assert type(backend_for(f"local://{tmp_path}")) is FsspecBackend  # no entry: generic


def test_a_registered_custom_backend_is_found(registry):
    register_backend("dict", DictBackend)
    b = backend_for("dict://somewhere/store.zarr")
    assert type(b) is DictBackend and b.url == "dict://somewhere/store.zarr"
    register_backend("lazydict", f"{__name__}:NoCasBackend")  # imported on first use
    assert registry["lazydict"] == f"{__name__}:NoCasBackend"
    assert type(backend_for("lazydict://x")) is NoCasBackend
    with pytest.raises(TypeError, match="Backend subclass"):
        register_backend("bad", dict)  # type: ignore[arg-type]


# -- leases need atomic conditional writes -------------------------------------------------------
def test_leases_are_refused_without_atomic_conditional_writes():
    b = NoCasBackend("nocas://bucket/store.zarr")
    with pytest.raises(LeaseUnsupportedError, match=r"nocas://bucket/store.zarr.*NoCasBackend"
                       r".*no atomic conditional writes.*two writers.*lease_ttl=None"):
        acquire_all(b, [0, 1], 60.0)
    assert b.list("") == []  # refused before writing anything
    assert LaneLease(b, 0).holder() is None  # reading leases still works


def test_a_lease_is_given_back_when_the_write_reveals_no_atomicity():
    """An S3-compatible server answering 501 to conditions is only found out by a write."""

    class Degrading(DictBackend):
        def put_if(self, key, data, match):
            self.atomic_conditional_writes = False
            return super().put_if(key, data, match)

    b = Degrading("degrading://x")
    with pytest.raises(LeaseUnsupportedError, match="degrading://x"):
        LaneLease(b, 0, 60.0).acquire()
    assert LaneLease(b, 0).holder() is None  # released: expired record


def test_s3_without_conditional_writes_refuses_leases(s3_url):
    b = backend_for(*s3_url)
    assert b.atomic_conditional_writes
    b._cas = False  # what a 501 answer to a conditional PUT leaves behind
    with pytest.raises(LeaseUnsupportedError, match="s3://"):
        acquire_all(b, [0], 60.0)


def test_s3_server_ignoring_conditions_is_found_out_and_refuses_leases(s3_url, monkeypatch):
    """A server answering 501 to If-None-Match / If-Match: the first conditional write
    falls back (no retries), the backend stops declaring atomicity, writers are refused."""
    from botocore.exceptions import ClientError

    url, so = s3_url
    es.create(url, SPEC, capacity=64, shard_rows=16, storage_options=so, lease_ttl=None).close()
    real = S3Backend._s3_put

    async def no_conditions(self, path, data, **cond):
        if cond:
            raise ClientError({"Error": {"Code": "NotImplemented", "Message": "no"},
                               "ResponseMetadata": {"HTTPStatusCode": 501}}, "PutObject")
        return await real(self, path, data)

    monkeypatch.setattr(S3Backend, "_s3_put", no_conditions)
    b = backend_for(url, so)
    tag = b.put_if("x", b"1", None)  # read, compare, write
    assert b.get_tagged("x") == (b"1", tag) and b.requests["retried"] == 0
    assert not b.atomic_conditional_writes
    with pytest.raises(LeaseUnsupportedError, match=r"s3://.*S3Backend.*lease_ttl=None"):
        es.open(url, mode="r+", storage_options=so)
    assert LaneLease(backend_for(url, so), 0).holder() is None  # the lease was given back
    assert int(es.open(url, storage_options=so).index.count[0]) == 0  # reads unaffected


def test_store_on_a_generic_fsspec_url_needs_lease_ttl_none(tmp_path):
    url, so = f"local://{tmp_path}/s.zarr", {"auto_mkdir": True}
    store = es.create(url, SPEC, capacity=64, shard_rows=16, storage_options=so, lease_ttl=None)
    batch, nxt = data.make_steps(0, 0, 20, 1)
    store.extend(batch, lane=0)
    store.close()
    with pytest.raises(LeaseUnsupportedError, match=r"local://.*lease_ttl=None"):
        es.open(url, mode="r+", storage_options=so)
    r = es.open(url, storage_options=so)  # reading needs no lease
    assert int(r.index.count[0]) == nxt
    data.check_lane(r, 0)
    w = es.open(url, mode="r+", storage_options=so, lease_ttl=None)  # the only writer
    assert w.backend.get(lease_key(0)) is None
    w.close()
    with pytest.raises(LeaseUnsupportedError, match="lease_ttl=None"):
        es.create(f"local://{tmp_path}/t.zarr", SPEC, capacity=64, storage_options=so)


# -- local disk: a shard's objects in one kernel call --------------------------------------
def _no_temp_files(root: str) -> bool:
    return not [f for _, _, files in os.walk(root) for f in files if f.endswith(".tmp")]


def _bytes(n: int, seed: int) -> bytes:
    return bytes((seed * 31 + i) % 251 for i in range(n))


def test_local_put_many_is_one_kernel_call_not_a_put_per_object(tmp_path, monkeypatch):
    kernel = native.write_kernel()
    if kernel is None:
        pytest.skip("the write kernel was not built")
    b = LocalBackend(str(tmp_path / "root"), fsync=True)
    calls, real = [], kernel.replace_files
    monkeypatch.setattr(kernel, "replace_files", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(b, "replace", lambda *a, **k: pytest.fail("a put per object"))
    objs = {f"obs/c/{i}/0": _bytes(1000 + i, i) for i in range(3)}
    objs["action/c/0"] = b"actions"
    b.put_many(list(objs.items()))
    assert len(calls) == 1 and calls[0][3] is True  # (synced: fsync on)
    assert b.get_many(list(objs)) == list(objs.values())  # new folders made by the kernel
    assert _no_temp_files(b.root)


def test_local_put_many_that_fails_names_the_object_and_changes_nothing(tmp_path):
    if native.write_kernel() is None:
        pytest.skip("the write kernel was not built (objects are then put one by one)")
    b = LocalBackend(str(tmp_path / "root"), fsync=False)
    b.put("obs/c/0/0", b"old obs")
    b.put("action/c/0", b"old action")
    b.put("reward/c", b"a file where the next key needs a folder")
    with pytest.raises(OSError) as e:
        b.put_many([("obs/c/0/0", b"new obs"), ("reward/c/0", b"new reward"),
                    ("action/c/0", b"new action")])
    assert e.value.filename == "reward/c/0" and e.value.errno == errno.ENOTDIR
    assert b.get("obs/c/0/0") == b"old obs" and b.get("action/c/0") == b"old action"
    assert _no_temp_files(b.root)


def test_a_sync_that_fails_on_its_own_thread_names_its_file_and_replaces_nothing(tmp_path):
    """The kernel syncs a shard's files at once, one thread each: a sync that fails on any
    of them (here the third file's: its temp name links to /dev/null, which refuses fsync
    with EINVAL) is reported by its index, and no object is replaced, not even the ones
    whose syncs succeeded; every temp name is removed (the link, not /dev/null)."""
    kernel = native.write_kernel()
    if kernel is None:
        pytest.skip("the write kernel was not built")
    objs = [str(tmp_path / f"obj{i}") for i in range(5)]
    for i, path in enumerate(objs):
        with open(path, "wb") as f:
            f.write(b"old %d" % i)
    tmps = [p + ".tmp" for p in objs]
    os.symlink("/dev/null", tmps[2])
    assert kernel.replace_files(tmps, objs, [b"new %d" % i for i in range(5)], True) == \
        (2, errno.EINVAL)
    assert [open(p, "rb").read() for p in objs] == [b"old %d" % i for i in range(5)]
    assert not [p for p in tmps if os.path.lexists(p)] and os.path.exists("/dev/null")
    # the same call with every file syncable replaces all five
    assert kernel.replace_files(tmps, objs, [b"new %d" % i for i in range(5)], True) is None
    assert [open(p, "rb").read() for p in objs] == [b"new %d" % i for i in range(5)]


def test_local_put_many_without_the_kernel_puts_each_object(tmp_path, monkeypatch):
    monkeypatch.setattr(native.kernels, "write", None)
    b = LocalBackend(str(tmp_path / "root"), fsync=False)
    puts = []
    real = b.put
    monkeypatch.setattr(b, "put", lambda k, d: puts.append(k) or real(k, d))
    b.put_many([("x/c/0", b"1"), ("y/c/0/0", b"22")])
    assert puts == ["x/c/0", "y/c/0/0"] and b.get("y/c/0/0") == b"22"


def test_local_put_many_makes_its_temp_files_in_the_folder_given(tmp_path, monkeypatch):
    """A lane writer's temp files go to its own folder (which the lane's next writer clears
    after a crash), not beside the objects; a failure leaves none there either."""
    kernel = native.write_kernel()
    if kernel is None:
        pytest.skip("the write kernel was not built")
    b = LocalBackend(str(tmp_path / "root"), fsync=False)
    seen, real = [], kernel.replace_files
    monkeypatch.setattr(kernel, "replace_files", lambda *a: seen.extend(a[0]) or real(*a))
    b.put_many([("obs/c/0/0", b"obs"), ("action/c/0", b"act")], temp_folder="w/tmp")
    assert b.get("obs/c/0/0") == b"obs" and b.get("action/c/0") == b"act"
    assert all(t.startswith(b.path("w/tmp") + os.sep) for t in seen) and len(seen) == 2
    assert os.listdir(b.path("w/tmp")) == []
    b.put("reward/c", b"a file where a folder should be")
    with pytest.raises(OSError) as e:
        b.put_many([("obs/c/0/0", b"new"), ("reward/c/0", b"new")], temp_folder="w/tmp")
    # written and synced, then renamed in order: the rename that failed stops the others
    assert e.value.filename == "reward/c/0" and b.get("obs/c/0/0") == b"new"
    assert _no_temp_files(b.root)
