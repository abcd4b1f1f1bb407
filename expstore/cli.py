"""The ``expstore`` command line.

::

    expstore --version
    expstore [-q] info URL [--json]
    expstore [-q] verify URL
    expstore [-q] repair URL [--dry-run]
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
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# a store's URL as every command prints it: file:///absolute/path for a local store (what
# store.url says), other URLs as given
from .storage.backends import canonical_url as store_url

EXIT_INTERRUPTED = 130


def _usage_error(msg: str) -> None:
    """Bad usage: the message on stderr, exit code 2 (as argparse does)."""
    print(f"expstore: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _kv(items: list[str] | None, flag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _usage_error(f"{flag} {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _human(n: float) -> str:
    from .datasets.summary import human_bytes

    return human_bytes(n)


# -- info -------------------------------------------------------------------------------
def store_info(url: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Facts about a store: spec, geometry, rows, episodes, bytes on disk, compression."""
    from .api import open as open_store
    from .storage.format import describe_import, import_is_partial, read_import_marker

    store = open_store(url, "r", storage_options=storage_options)
    try:
        lay = store.layout
        rows = len(store)
        raw_row = sum(f.row_nbytes for f in lay.fields.values())
        disk = store.backend.total_bytes()
        idx = store.index
        marker = read_import_marker(store.backend)
        return {
            "url": store.url,
            "capacity": store.capacity,
            "capacity_requested": lay.requested_capacity,
            "capacity_note": store.capacity_note,
            "lanes": store.lanes,
            "shard_rows": lay.shard_rows,
            "rows": rows,
            "transitions": store.num_transitions,
            "episodes": store.episodes_written,
            "episodes_held": store.num_episodes,
            "lane_rows": [int(r) for r in idx.held()],
            "lost_rows": int(idx.present().sum()) - rows,
            "bytes_on_disk": int(disk),
            "raw_bytes": int(rows * raw_row),
            "compression_ratio": (rows * raw_row / disk) if disk else None,
            "import": describe_import(marker),
            "partial_import": import_is_partial(marker),
            "fields": {n: {"shape": list(f.shape), "dtype": str(f.dtype), "stack": f.stack,
                           "padding": f.padding if f.stack else None,
                           "codec": f.resolved_codec(), "chunk_rows": lay.chunk_rows(n),
                           "bytes_per_row": f.row_nbytes}
                       for n, f in lay.spec.fields.items()},
        }
    finally:
        store.close()


def _print_info(info: dict[str, Any]) -> None:
    print(f"store       {info['url']}")
    print(f"rows        {info['rows']:,} of {info['capacity']:,} "
          f"({info['lanes']} lane(s), {info['shard_rows']} rows per shard)")
    if info["lost_rows"]:
        print(f"lost        {info['lost_rows']:,} row(s) quarantined (bad bytes, never "
              "sampled; not counted above)")
    if info["lanes"] > 1:
        print(f"lane rows   {', '.join(f'{r:,}' for r in info['lane_rows'])}")
    print(f"capacity    {info['capacity']:,} rows ({info['capacity_note']})")
    print(f"transitions {info['transitions']:,} env steps (rows count one more per finished "
          "episode: its final observation)")
    print(f"episodes    {info['episodes_held']:,} complete held, {info['episodes']:,} finished "
          "written")
    if info.get("import"):
        print(f"import      {info['import']}")
    ratio = info["compression_ratio"]
    print(f"on disk     {_human(info['bytes_on_disk'])} (raw {_human(info['raw_bytes'])}, "
          f"ratio {ratio:.1f}x)" if ratio else f"on disk     {_human(info['bytes_on_disk'])}")
    print("fields")
    for name, f in info["fields"].items():
        codec = f["codec"]
        cname = codec.get("cname", codec.get("name"))
        level = codec.get("clevel", codec.get("level", ""))
        extra = f"  stack={f['stack']} ({f['padding']})" if f["stack"] else ""
        print(f"  {name:<16} {str(tuple(f['shape'])):<14} {f['dtype']:<8} "
              f"{cname}-{level}{extra}")


# -- commands ---------------------------------------------------------------------------
def _cmd_info(args: argparse.Namespace) -> int:
    info = store_info(args.url, _kv(args.storage_option, "-S") or None)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_info(info)
    return 0


class _Bar:
    """A progress bar (rows, total set once known, ETA; plain lines when stderr is not a
    terminal), or nothing when ``quiet``."""

    def __init__(self, desc: str, quiet: bool) -> None:
        self._bar = None
        if not quiet:
            from .datasets.progress import progress_bar

            self._bar = progress_bar(desc)

    def total(self, n: int) -> None:
        if self._bar is not None:
            self._bar.total = n
            self._bar.refresh()

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()


REPAIR_HINT = ("run 'expstore repair {url}' to rebuild lost metadata and state files and "
               "quarantine the bad rows, then keep training on the rest")


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify_store

    with _Bar("verify", args.quiet) as bar:
        rep = verify_store(args.url, _kv(args.storage_option, "-S") or None,
                           progress=bar.update, total=bar.total)
    for p in rep.problems:
        print(f"CORRUPT {p}")
    status = "OK" if rep.ok else f"{len(rep.problems)} problem(s)"
    print(f"{rep.url}: {status}: {rep.rows:,} rows in {rep.lanes} lane(s), {rep.shards:,} "
          f"shard objects, {_human(rep.bytes)} read")
    if rep.quarantined:
        print(f"{rep.quarantined:,} row(s) quarantined by an earlier repair (lost, never "
              "sampled)")
    if rep.partial_import:
        print(rep.partial_import)
    if not rep.ok:
        print(REPAIR_HINT.format(url=rep.url))
    return 0 if rep.ok else 1


def _cmd_repair(args: argparse.Namespace) -> int:
    from .repair import repair_store

    with _Bar("repair: verify", args.quiet) as bar:
        rep = repair_store(args.url, _kv(args.storage_option, "-S") or None,
                           progress=bar.update, dry_run=args.dry_run, total=bar.total)
    for p in rep.found.problems if rep.found is not None else []:
        print(f"CORRUPT {p}")
    for p in rep.remaining:
        print(f"UNFIXED {p}")
    print(f"{rep.url}: {rep.summary()}")
    return 0 if rep.ok else 1


def _cmd_upgrade(args: argparse.Namespace) -> int:
    from .upgrade import upgrade_store

    with _Bar("upgrade: index snapshot", args.quiet) as bar:
        rep = upgrade_store(args.url, _kv(args.storage_option, "-S") or None,
                            progress=bar.update)
    print(f"{rep.url}: {rep.summary()}")
    return 0


UPGRADE_TEXT = """\
Bring a store made by an older expstore up to date, so that it opens in seconds.

What it changes:
  * a store without an id gets one: the "expstore" attribute of the group's zarr.json
    and the layout copy in every array's zarr.json ("expstore_layout") gain "store_id";
    each file is replaced atomically, everything else in it kept;
  * it writes the index snapshot, _index/lane_<i>/block_<j> (each lane's episode
    positions and flags in blocks of up to 65,536 rows, ~5 bytes per row), from a scan
    of the metadata shards; blocks already there and valid are kept.
No row, shard or lane state is changed or deleted. Run it again to finish an interrupted
upgrade or to refresh the snapshot. It takes every lane's write lease while it runs:
a store a writer holds is refused. Stores not upgraded open as before (slower)."""


def _call(fn: Any, *pos: Any, options: dict[str, Any], args: argparse.Namespace) -> Any:
    params = inspect.signature(fn).parameters
    kw = dict(options)
    if "progress" in params and "progress" not in kw:
        kw["progress"] = not args.quiet
    if args.overwrite:
        if "overwrite" not in params:
            _usage_error(f"{args.command} {args.format}: --overwrite is not an option of this "
                         "format")
        kw["overwrite"] = True
    so = _kv(args.storage_option, "-S")
    if so:
        kw["storage_options"] = so
    unknown = [k for k in kw if k not in params and not any(
        p.kind == p.VAR_KEYWORD for p in params.values())]
    if unknown:
        from .datasets.registry import get_format

        known = ", ".join(name for name, _, _ in get_format(args.format).options(args.command))
        _usage_error(f"-o {unknown[0]}: not an option of {args.format} {args.command} (its "
                     f"options: {known or 'none'}; 'expstore {args.command} --help' says "
                     "what each takes)")
    from .datasets.registry import check_option_types

    try:
        check_option_types(fn, options)
    except ValueError as e:
        _usage_error(f"{e} ({args.format} {args.command})")
    return fn(*pos, **kw)


def _options_text(fmt: str, which: str, indent: str = "  ") -> str:
    from .datasets.registry import get_format

    opts = get_format(fmt).options(which)
    if not opts:
        return f"{indent}(none)"
    return "\n".join(f"{indent}{name}={json.dumps(default)}".ljust(30) + f" {text}"
                     for name, default, text in opts)


def _summary(res: Any, args: argparse.Namespace, seconds: float) -> str:
    """The summary an import or export prints (a store some importers return becomes one);
    the store is named by its URL in the form every command prints (:func:`store_url`)."""
    from .datasets.summary import ImportSummary
    from .store import Store

    if isinstance(res, ImportSummary):
        if not res.kind:
            res.kind = f"{args.format} {args.command}"
        if args.command == "import":
            res.target = store_url(args.url)
        else:
            res.source = store_url(args.url)
    if not isinstance(res, Store):
        return str(res)
    try:
        return str(ImportSummary(
            args.src, res.url, rows=len(res), steps=res.num_transitions,
            episodes=res.num_episodes, lanes=res.lanes, seconds=seconds,
            bytes_out=int(res.backend.total_bytes()), kind=f"{args.format} import"))
    finally:
        res.close()


def _cmd_import(args: argparse.Namespace) -> int:
    from .datasets.registry import get_format

    imp, _ = get_format(args.format).functions()
    t0 = time.perf_counter()
    try:
        res = _call(imp, args.src, args.url, options=_kv(args.option, "-o"), args=args)
    except KeyboardInterrupt:
        again = ("; run the same command again to resume"
                 if args.format in ("dopamine", "lerobot") else "")
        print(f"\ninterrupted: {store_url(args.url)} holds the rows flushed so far{again}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    print(_summary(res, args, time.perf_counter() - t0))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .datasets.registry import get_format

    _, exp = get_format(args.format).functions()
    try:
        res = _call(exp, args.url, args.dst, options=_kv(args.option, "-o"), args=args)
    except KeyboardInterrupt:
        print("\ninterrupted: nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(_summary(res, args, 0.0))
    return 0


def _cmd_formats(args: argparse.Namespace) -> int:
    from .datasets.registry import FORMATS

    for f in FORMATS.values():
        print(f"{f.name:<10} {f.help}")
        if args.brief:
            continue
        for which in ("import", "export"):
            try:
                text = _options_text(f.name, which, "    ")
            except ImportError as e:  # an optional dependency is missing
                text = f"    ({e})"
            print(f"  {which} -o options:\n{text}")
    return 0


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


def _formats_epilog(which: str) -> str:
    from .datasets.registry import FORMATS

    lines = [f"formats and their -o options ({which}):"]
    for f in FORMATS.values():
        lines.append(f"  {f.name}: {f.help}")
        lines.append(f"    {'SRC' if which == 'import' else 'DST'}: "
                     f"{f.src_help if which == 'import' else f.dst_help}")
        try:
            lines.append(_options_text(f.name, which, "    "))
        except ImportError as e:  # an optional dependency is missing
            lines.append(f"    ({e})")
    return "\n".join(lines)


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
    sp.set_defaults(fn=_cmd_info)

    sp = sub.add_parser("verify", help="read and check every shard; exit 1 if any is bad",
                        description="Read and check every committed row, every shard and "
                        "every array's zarr.json; exit 1 if anything is bad.")
    sp.add_argument("url", metavar="URL", help="the store: " + store_url)
    quiet(sp)
    storage(sp)
    sp.set_defaults(fn=_cmd_verify)

    sp = sub.add_parser("repair", help="rebuild lost metadata and lane states, quarantine "
                        "bad rows; exit 1 if problems remain",
                        description="Rebuild a lost or corrupt zarr.json and lost lane state "
                        "files, quarantine rows verify finds bad (never sampled again); exit "
                        "1 if problems remain.")
    sp.add_argument("url", metavar="URL", help="the store: " + store_url)
    sp.add_argument("-n", "--dry-run", action="store_true", help="report, change nothing")
    quiet(sp)
    storage(sp)
    sp.set_defaults(fn=_cmd_repair)

    sp = sub.add_parser("upgrade", help="give an older store an id and write its index "
                        "snapshot (opens in seconds)", description=UPGRADE_TEXT,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("url", metavar="URL", help="the store: " + store_url)
    quiet(sp)
    storage(sp)
    sp.set_defaults(fn=_cmd_upgrade)

    for name, helptext in (("import", "create a store from a dataset"),
                           ("export", "write a store as a dataset")):
        sp = sub.add_parser(name, help=helptext, description=helptext[0].upper() +
                            helptext[1:] + ".", epilog=_formats_epilog(name),
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
        sp.set_defaults(fn=_cmd_import if name == "import" else _cmd_export)

    sp = sub.add_parser("formats", help="list dataset formats and their -o options")
    sp.add_argument("--brief", action="store_true", help="names and descriptions only")
    quiet(sp, "accepted for symmetry (formats shows no progress bar)")
    sp.set_defaults(fn=_cmd_formats)

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
