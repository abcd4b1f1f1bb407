"""The ``expstore`` command line.

::

    expstore --version
    expstore [-q] info URL [--json]
    expstore [-q] verify URL
    expstore [-q] repair URL [--dry-run] [--release-intact]
    expstore [-q] import FORMAT SRC URL [--overwrite] [-o KEY=VALUE ...]
    expstore [-q] export URL FORMAT DST [--overwrite] [-o KEY=VALUE ...]
    expstore formats
    expstore bench [NAME ...] [--dir DIR] [--list]

``FORMAT`` is one of ``expstore formats`` (dopamine, d4rl, npz, minari, rlds), which also lists
each format's ``-o`` options. ``-o`` passes options to the importer/exporter (values are
JSON when they parse, else strings: ``-o stack=4 -o suffixes=[0,1]
-o codec='{"name":"blosc","cname":"lz4"}'``). Every import and export prints one summary:
steps, rows, episodes, lanes, bytes (decimal units: 1 MB = 10**6 bytes), time and rate,
and notes on anything left out. Long work shows a progress bar with a total and an ETA
(``-q``, before or after the command, hides it); where stderr is not a terminal (a log, a
pipe) it is one plain line every 10 s and one at the end instead. A local store is named
``file:///absolute/path`` in everything printed (its ``store.url``), errors included.
A bad ``-o`` value or name is one line naming the option and what it takes (exit 2).
Ctrl-C stops an import at a block boundary leaving a store that opens with every row
flushed so far (exit code 130). Exit codes: 0 done, 1 failed (or problems
found), 2 bad usage, 130 interrupted.

This module holds the parser, ``main`` and ``bench``; the commands on one store are in
``cli_store_commands.py``, the dataset commands in ``cli_dataset_commands.py``, what they
share in ``cli_common.py``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from .cli_common import EXIT_INTERRUPTED
from .cli_dataset_commands import cmd_export, cmd_formats, cmd_import, formats_epilog, store_url
from .cli_store_commands import (
    REPAIR_HINT,
    UPGRADE_TEXT,
    cmd_info,
    cmd_repair,
    cmd_upgrade,
    cmd_verify,
    store_info,
)

__all__ = ["EXIT_INTERRUPTED", "REPAIR_HINT", "UPGRADE_TEXT", "build_parser", "main",
           "store_info", "store_url"]


def _bench_dir(given: str | None) -> Path | None:
    cands = [Path(given)] if given else [Path.cwd() / "benchmarks",
                                          Path(__file__).resolve().parent.parent / "benchmarks"]
    return next((p for p in cands if p.is_dir()), None)


def _cmd_bench(args: argparse.Namespace) -> int:
    d = _bench_dir(args.dir)
    if d is None:
        print("expstore: error: no benchmarks/ folder here (run from the repository root or "
              "pass --dir)", file=sys.stderr)
        return 2
    scripts = sorted(d.glob("bench_*.py"))
    if args.names:
        want = {n.removeprefix("bench_").removesuffix(".py") for n in args.names}
        missing = want - {s.stem.removeprefix("bench_") for s in scripts}
        if missing:
            print(f"expstore: error: no benchmark(s) {sorted(missing)} in {d}", file=sys.stderr)
            return 2
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in want]
    if args.list:
        for s in scripts:
            print(s.stem.removeprefix("bench_"))
        return 0
    failed = []
    for s in scripts:
        print(f"== {s.name}", flush=True)
        try:
            rc = subprocess.call([sys.executable, str(s), *args.args], cwd=d.parent)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        if rc:
            failed.append(s.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="expstore", description="Inspect, check, repair, import "
                                "and export expstore replay stores.")
    p.add_argument("--version", action="version", version=f"expstore {__version__}")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars (also accepted after the command)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    store_url = "a folder or fsspec URL (s3://bucket/run.zarr, memory://x)"

    def storage(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-S", "--storage-option", action="append", metavar="KEY=VALUE",
                        help="fsspec storage option for remote URLs (repeatable)")

    def quiet(sp: argparse.ArgumentParser, what: str = "no progress bar") -> None:
        # SUPPRESS: an absent -q leaves the value ``expstore -q COMMAND`` set
        sp.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help=what)

    sp = sub.add_parser("info", help="spec, capacity, rows, episodes, size on disk",
                        description="Spec, capacity, rows, transitions, episodes and size on "
                        "disk of a store.")
    sp.add_argument("url", metavar="URL", help="the store: " + store_url)
    sp.add_argument("--json", action="store_true", help="print JSON")
    quiet(sp, "accepted for symmetry (info shows no progress bar)")
    storage(sp)
    sp.set_defaults(fn=cmd_info)

    sp = sub.add_parser("verify", help="read and check every shard; exit 1 if any is bad",
                        description="Read and check every committed row, every shard and "
                        "every array's zarr.json; exit 1 if anything is bad.")
    sp.add_argument("url", metavar="URL", help="the store: " + store_url)
    quiet(sp)
    storage(sp)
    sp.set_defaults(fn=cmd_verify)

    sp = sub.add_parser("repair", help="rebuild lost metadata and lane states, quarantine "
                        "bad rows; exit 1 if problems remain",
                        description="Rebuild a lost or corrupt zarr.json and lost lane state "
                        "files, quarantine rows verify finds bad (never sampled again); exit "
                        "1 if problems remain.")
    sp.add_argument("url", metavar="URL", help="the store: " + store_url)
    sp.add_argument("-n", "--dry-run", action="store_true", help="report, change nothing")
    sp.add_argument("--release-intact", action="store_true",
                    help="also read the quarantined rows again and release those that pass "
                         "every check (rows an earlier repair quarantined wrongly)")
    quiet(sp)
    storage(sp)
    sp.set_defaults(fn=cmd_repair)

    sp = sub.add_parser("upgrade", help="give an older store an id and write its index "
                        "snapshot (opens in seconds)", description=UPGRADE_TEXT,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("url", metavar="URL", help="the store: " + store_url)
    quiet(sp)
    storage(sp)
    sp.set_defaults(fn=cmd_upgrade)

    for name, helptext in (("import", "create a store from a dataset"),
                           ("export", "write a store as a dataset")):
        sp = sub.add_parser(name, help=helptext, description=helptext[0].upper() +
                            helptext[1:] + ".", epilog=formats_epilog(name),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        fmt_help = "dataset format: dopamine, d4rl, npz, minari, rlds (see 'expstore formats')"
        if name == "import":
            sp.add_argument("format", metavar="FORMAT", help=fmt_help)
            sp.add_argument("src", metavar="SRC", help="the dataset to read (per format: "
                            "see below)")
            sp.add_argument("url", metavar="URL", help="the store to create: " + store_url)
        else:
            sp.add_argument("url", metavar="URL", help="the store to read: " + store_url)
            sp.add_argument("format", metavar="FORMAT", help=fmt_help)
            sp.add_argument("dst", metavar="DST", help="where to write (per format: see "
                            "below)")
        sp.add_argument("-o", "--option", action="append", metavar="KEY=VALUE",
                        help="importer/exporter option, JSON value (repeatable; listed "
                        "below)")
        sp.add_argument("--overwrite", action="store_true",
                        help="replace a store at URL" if name == "import"
                        else "replace the dataset at DST")
        quiet(sp)
        sp.add_argument("--no-progress", dest="quiet", action="store_true",
                        default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        storage(sp)
        sp.set_defaults(fn=cmd_import if name == "import" else cmd_export)

    sp = sub.add_parser("formats", help="list dataset formats and their -o options")
    sp.add_argument("--brief", action="store_true", help="names and descriptions only")
    quiet(sp, "accepted for symmetry (formats shows no progress bar)")
    sp.set_defaults(fn=cmd_formats)

    sp = sub.add_parser("bench", help="run the benchmark scripts in benchmarks/")
    sp.add_argument("names", nargs="*", metavar="NAME",
                    help="benchmarks to run (default: all bench_*.py)")
    sp.add_argument("--dir", help="benchmarks folder")
    sp.add_argument("--list", action="store_true", help="list them and exit")
    quiet(sp, "accepted for symmetry (the scripts print their own output)")
    sp.add_argument("--args", nargs=argparse.REMAINDER, default=[],
                    help="arguments passed to every script")
    sp.set_defaults(fn=_cmd_bench)
    return p


def _flag_names(msg: str) -> str:
    """Library advice in a message as the CLI's own flag."""
    return (msg.replace("pass overwrite=True, or --overwrite,", "pass --overwrite")
            .replace("overwrite=True", "--overwrite"))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import ExpstoreError

    try:
        return int(args.fn(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # pragma: no cover - e.g. `expstore info | head`
        os._exit(0)
    except (ExpstoreError, FileNotFoundError, FileExistsError, ImportError, KeyError,
            ValueError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"expstore: error: {_flag_names(str(msg))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
