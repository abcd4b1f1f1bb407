"""The meters that say how warm a benchmark's "warm" reads were (``benchmarks/page_cache``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.baselines import drop_page_cache  # noqa: E402
from benchmarks.page_cache import DiskMeter, resident_fraction  # noqa: E402


def _file_system(path: Path) -> str:
    """The type of the file system holding ``path`` (the longest mount point above it)."""
    best, kind = "", ""
    with open("/proc/self/mounts") as f:
        for line in f:
            _, point, fs = line.split()[:3]
            if str(path).startswith(point) and len(point) > len(best):
                best, kind = point, fs
    return kind


def test_resident_fraction_follows_the_page_cache(tmp_path: Path) -> None:
    if _file_system(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("pages of this file system cannot be dropped from the cache")
    data = tmp_path / "store" / "a"
    data.parent.mkdir()
    data.write_bytes(os.urandom(1 << 20))
    (tmp_path / "store" / "empty").write_bytes(b"")
    os.sync()
    drop_page_cache(tmp_path / "store")
    assert resident_fraction(tmp_path / "store") < 0.5
    data.read_bytes()
    assert resident_fraction(tmp_path / "store") == 1.0
    # a half-read file is half resident (readahead may take a little more)
    fd = os.open(data, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(fd, 1 << 19, 0)
    finally:
        os.close(fd)
    assert 0.45 <= resident_fraction(tmp_path / "store") < 0.9


def test_disk_meter_counts_only_while_on() -> None:
    calls = []
    meter = DiskMeter(lambda: calls.append(1) or len(calls))
    assert meter() == 1
    meter.start()
    meter(), meter()
    meter.stop()
    meter()
    assert meter.calls == 2 and len(calls) == 4
    assert meter.bytes >= 0 and meter.kb_per_call == meter.bytes / 1e3 / 2
