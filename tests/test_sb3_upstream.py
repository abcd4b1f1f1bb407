"""Stable-Baselines3's own tests, run with SB3's replay buffers replaced by
``ExpstoreReplayBuffer``.

The tests come from SB3's source distribution on PyPI, for the installed SB3 version:
``scripts/test.sh`` downloads it into ``.cache/sb3-sdist/`` (this module downloads it too
when it is missing, and skips, saying why, when PyPI cannot be reached). Its ``tests/``
folder runs in a pytest subprocess with ``tests/_sb3_upstream_plugin.py``, which swaps the
buffer classes, keeps the tests that build a replay buffer and marks the deliberate
differences (``DIFFERENCES`` there, ``docs/sb3.md``) strict xfail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("stable_baselines3")

import _sb3_sdist as sdist  # noqa: E402
import _sb3_upstream_plugin as plugin  # noqa: E402

#: seconds the SB3 run may take before it counts as hung (it takes about a minute)
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the selected SB3 tests once; per test: outcome, buffers built, error text."""
    error = sdist.download()
    if error:
        pytest.skip(f"SB3 {sdist.sb3_version()} source distribution not in {sdist.SDIST_DIR} "
                    f"and the download from PyPI failed ({error}); run scripts/test.sh online")
    root = sdist.unpack_tests(tmp_path_factory.mktemp("sb3-upstream"))
    report = root / "report.json"
    here = Path(__file__).resolve().parent
    scratch = root / "tmp"  # SB3's logger makes a folder in the temp folder per model built
    scratch.mkdir()
    env = {**os.environ, "EXPSTORE_SB3_UPSTREAM_REPORT": str(report), "TMPDIR": str(scratch),
           "PYTHONPATH": os.pathsep.join([str(here), str(sdist.REPO),
                                          os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    env.pop("SB3_LOGDIR", None)  # (conftest's, for this process's models: SB3's own default)
    files = [f"tests/{name}" for name in plugin.FILES]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "_sb3_upstream_plugin", "--rootdir", str(root), "-W", "ignore::DeprecationWarning",
           *files]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert report.exists(), (
        f"SB3's test run wrote no report:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    results = json.loads(report.read_text())
    results["run"] = {"returncode": done.returncode, "tail": done.stdout[-1500:]}
    return results


def _tests(results: dict[str, Any]) -> dict[str, dict]:
    return results["tests"]


@pytest.mark.slow  # ~31 s: SB3's own test suite
def test_sb3_tests_pass_on_expstore_buffer(upstream: dict[str, Any]) -> None:
    """Every selected SB3 test passes; the documented differences fail as expected."""
    bad = {k: v for k, v in _tests(upstream).items()
           if v["outcome"] not in ("passed", "xfailed", "skipped")}
    assert not bad, "SB3 tests failing on ExpstoreReplayBuffer:\n" + "\n\n".join(
        f"{k}: {v['outcome']}\n{v.get('error', '')[-1200:]}" for k, v in bad.items())
    assert upstream["run"]["returncode"] == 0, upstream["run"]["tail"]


def test_each_sb3_test_builds_an_expstore_buffer(upstream: dict[str, Any]) -> None:
    """The swap took effect and the selection holds only tests that build a buffer."""
    idle = [k for k, v in _tests(upstream).items()
            if v["outcome"] in ("passed", "xfailed") and v["buffers"] == 0]
    assert not idle, f"SB3 tests that ran without building an ExpstoreReplayBuffer: {idle}"


def test_every_selected_file_ran(upstream: dict[str, Any]) -> None:
    """Each SB3 test file of the selection contributed tests (none renamed away), and the
    deliberate differences are still there to be documented."""
    ran = {k.split("::")[0].removeprefix("tests/") for k in _tests(upstream)}
    assert ran == set(plugin.FILES), f"files without tests: {set(plugin.FILES) - ran}"
    assert not upstream["unmatched"], f"selected names no SB3 test has: {upstream['unmatched']}"
    xfailed = {k for k, v in _tests(upstream).items() if v["outcome"] == "xfailed"}
    for name in plugin.DIFFERENCES:
        assert any(k.removeprefix("tests/").startswith(name) for k in xfailed), (
            f"{name}: listed as a deliberate difference but no such test ran")
    assert len(_tests(upstream)) >= 150, f"only {len(_tests(upstream))} SB3 tests ran"
