"""Stable-Baselines3's source distribution (for its ``tests/`` folder), from PyPI, for the
installed SB3 version: downloaded once into ``.cache/sb3-sdist/``.

``python tests/_sb3_sdist.py`` downloads it if missing (``scripts/test.sh`` does this);
prints the path, or the reason it could not, and exits 1.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SDIST_DIR = REPO / ".cache" / "sb3-sdist"


def sb3_version() -> str:
    return metadata.version("stable-baselines3")


def sdist_path() -> Path:
    return SDIST_DIR / f"stable_baselines3-{sb3_version()}.tar.gz"


def download(timeout_s: float = 180) -> str | None:
    """Fetch the sdist into ``SDIST_DIR`` unless it is there; the error text if that failed.
    Tries the venv's setuptools first (no build environment to install), then pip's
    isolated build (a fresh venv may have no setuptools)."""
    if sdist_path().exists():
        return None
    SDIST_DIR.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
            "--no-binary", ":all:", "--no-deps", f"stable-baselines3=={sb3_version()}",
            "-d", str(SDIST_DIR)]
    error = ""
    for extra in (["--no-build-isolation"], []):
        try:
            done = subprocess.run(base + extra, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            error = f"pip download timed out after {timeout_s:.0f} s"
            continue
        if done.returncode == 0 and sdist_path().exists():
            return None
        lines = [ln for ln in (done.stderr + done.stdout).splitlines()
                 if ln.strip() and not ln.startswith("WARNING: Location")]
        error = "\n".join(lines)[-500:] or f"no {sdist_path().name} after pip download"
    return error


def unpack_tests(dest: Path) -> Path:
    """SB3's ``tests/`` and ``pyproject.toml`` (its pytest settings) into ``dest``; not its
    package source, so that the tests import the installed ``stable_baselines3``."""
    top = f"stable_baselines3-{sb3_version()}/"
    with tarfile.open(sdist_path()) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and (
            m.name.startswith(top + "tests/") or m.name == top + "pyproject.toml")]
        for m in members:
            m.name = m.name[len(top):]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **safe)
    return dest


if __name__ == "__main__":
    failure = download()
    if failure:
        print(f"SB3 source distribution not downloaded: {failure}", file=sys.stderr)
        sys.exit(1)
    print(sdist_path())
