"""Result reporting: markdown tables, named sections in RESULTS.md, JSON dumps.

A section in ``benchmarks/RESULTS.md`` is delimited by HTML comments
``<!-- section: NAME -->`` / ``<!-- end section: NAME -->``; writing a section
replaces only that block (or appends it), under a file lock, atomically.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_MD = BENCH_DIR / "RESULTS.md"
RESULTS_DIR = BENCH_DIR / "results"
_HEADER = ("# expstore benchmark results\n\n"
           "Sections are (re)written by the scripts in `benchmarks/`.\n")


#: where the benchmarks that write stores make them (default: the current directory)
WORK_DIR_ENV = "EXPSTORE_BENCH_DIR"


def work_dir() -> str:
    """The folder benchmarks make their scratch stores in: ``$EXPSTORE_BENCH_DIR``, else
    the current directory. Where a store's files go changes what writing them costs: on
    this machine a shard of a 1M-row CartPole store took its writer 5-8 ms in a folder
    under the repository and 2.7-2.9 ms in another folder of the same ext4 disk (the
    file system's free space is not alike in every place). Two runs compared with each
    other write in one folder (``compare_revisions.py`` sets it for both checkouts)."""
    return os.environ.get(WORK_DIR_ENV) or "."


def machine_info() -> dict[str, Any]:
    """nproc, RAM (GiB), CPU model, OS and library versions of this machine."""
    info: dict[str, Any] = {"nproc": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform()}
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        info["ram_gib"] = round(pages / 2**30, 1)
    except (ValueError, OSError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    for mod in ("numpy", "torch", "torchrl", "tensordict", "zarr", "numcodecs"):
        m = sys.modules.get(mod)
        if m is not None:
            info[mod] = getattr(m, "__version__", "?")
    return info


def command_line() -> str:
    """The command that started this process, shell-quoted (``python -m`` aware), with
    ``EXPSTORE_BENCH_DIR=...`` before it where that was set (:func:`work_dir`)."""
    argv = list(sys.argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and not argv[0].endswith(".py"):
        argv = ["-m", spec.name, *argv[1:]]
    elif argv and os.path.isabs(argv[0]):
        try:
            argv[0] = os.path.relpath(argv[0])
        except ValueError:
            pass
    work = os.environ.get(WORK_DIR_ENV)
    return (f"{WORK_DIR_ENV}={shlex.quote(work)} " if work else "") + shlex.join(["python", *argv])


def fmt(x: Any, digits: int = 3) -> str:
    """Human format: ints with thousands separators, floats to ``digits`` significant."""
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if abs(x) >= 10 ** digits:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                   headers: Mapping[str, str] | None = None) -> str:
    """Markdown table of ``rows`` (dicts); ``columns`` picks/orders keys,
    ``headers`` renames them. Missing cells are blank."""
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    headers = headers or {}
    head = [headers.get(c, c) for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r[c]) if c in r else "" for c in columns) + " |")
    return "\n".join(lines)


def ratio(new: float, base: float) -> float:
    """``new / base`` (nan when base is 0)."""
    return new / base if base else float("nan")


def ratios(new: Mapping[str, Any], base: Mapping[str, Any],
           keys: Iterable[str] | None = None) -> dict[str, float]:
    """Per-key ``new[k] / base[k]`` for numeric keys present in both."""
    keys = keys if keys is not None else [k for k in new if k in base]
    return {k: ratio(new[k], base[k]) for k in keys
            if isinstance(new.get(k), int | float) and isinstance(base.get(k), int | float)}


def section_meta(command: str | None = None, source: str | None = None,
                 extra: Mapping[str, Any] | None = None) -> str:
    """Provenance lines for a section: command, date, machine, data source, extras."""
    m = machine_info()
    machine = f"{m.get('nproc')} CPUs ({m.get('cpu', '?')}), {m.get('ram_gib', '?')} GiB RAM"
    versions = ", ".join(f"{k} {m[k]}" for k in ("python", "numpy", "torch", "torchrl",
                                                 "tensordict", "zarr") if k in m)
    lines = [f"- command: `{command or command_line()}`",
             f"- date: {_dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
             f"- machine: {machine}; {m.get('platform', '')}",
             f"- versions: {versions}"]
    if source:
        lines.append(f"- data: {source}")
    for k, v in (extra or {}).items():
        lines.append(f"- {k}: {v}")
    return "\n".join(lines)


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- section: {name} -->", f"<!-- end section: {name} -->"


def write_section(name: str, body: str, *, command: str | None = None,
                  source: str | None = None, extra: Mapping[str, Any] | None = None,
                  path: str | Path = RESULTS_MD) -> str:
    """Replace (or append) section ``name`` in ``path``; other sections are kept.

    The section is ``## name``, provenance lines (see :func:`section_meta`),
    then ``body`` (markdown). Returns the section text.
    """
    path = Path(path)
    begin, end = _markers(name)
    text = (f"{begin}\n## {name}\n\n{section_meta(command, source, extra)}\n\n"
            f"{body.strip()}\n{end}\n")
    with _locked(path):
        old = path.read_text() if path.exists() else _HEADER
        pat = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
        if pat.search(old):
            new = pat.sub(lambda _: text, old, count=1)
        else:
            new = old.rstrip("\n") + "\n\n" + text
        _atomic_write(path, new)
    return text


def read_section(name: str, path: str | Path = RESULTS_MD) -> str | None:
    """Text of section ``name`` (markers included) or None."""
    path = Path(path)
    if not path.exists():
        return None
    begin, end = _markers(name)
    m = re.search(re.escape(begin) + r".*?" + re.escape(end), path.read_text(), re.S)
    return m.group(0) if m else None


def save_json(name: str, obj: Any, results_dir: str | Path = RESULTS_DIR) -> Path:
    """Write ``obj`` (with numpy scalars/arrays converted) to ``results_dir/<name>.json``."""
    d = Path(results_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.json"
    tmp = d / f"{name}.json.{os.getpid()}.tmp"

    def default(o: Any) -> Any:
        if hasattr(o, "tolist"):
            return o.tolist()
        if isinstance(o, Path):
            return str(o)
        raise TypeError(f"not JSON serializable: {type(o)}")

    tmp.write_text(json.dumps(obj, indent=2, default=default) + "\n")
    os.replace(tmp, path)
    return path
