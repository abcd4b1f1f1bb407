"""The ``expstore`` command line.

::

    expstore info URL [--json]
    expstore verify URL
    expstore repair URL [--dry-run]
    expstore import FORMAT SRC URL [--overwrite] [-o KEY=VALUE ...]
    expstore export URL FORMAT DST [-o KEY=VALUE ...]
    expstore formats
    expstore bench [NAME ...] [--dir DIR] [--list]

``FORMAT`` is one of ``expstore formats`` (dopamine, d4rl, npz, minari). ``-o`` passes
options to the importer/exporter (values are JSON when they parse, else strings:
``-o stack=4 -o suffixes=[0,1] -o codec='{"name":"blosc","cname":"lz4"}'``). Long work
shows a progress bar; Ctrl-C stops an import at a block boundary leaving a store that
opens with every row flushed so far (exit code 130).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

EXIT_INTERRUPTED = 130


def _kv(items: list[str] | None, flag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"expstore: error: {flag} {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n):,} B"
        n /= 1024
    return str(n)


# -- info -------------------------------------------------------------------------------
def store_info(url: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Facts about a store: spec, geometry, rows, episodes, bytes on disk, compression."""
    from .storage.import_marker import describe_import, import_is_partial, read_import_marker
    from .store import open as open_store

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
            "lanes": store.lanes,
            "shard_rows": lay.shard_rows,
            "rows": rows,
            "episodes": store.episodes,
            "lane_rows": [int(c - v) for c, v in zip(idx.count, idx.lower_bound())],
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
    if info["lanes"] > 1:
        print(f"lane rows   {', '.join(f'{r:,}' for r in info['lane_rows'])}")
    print(f"episodes    {info['episodes']:,}")
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


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify_store

    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(desc="verify", unit="row", unit_scale=True, dynamic_ncols=True)
    try:
        rep = verify_store(args.url, _kv(args.storage_option, "-S") or None,
                           progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
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
    if not rep.ok and rep.lost:
        print("run 'expstore repair URL' to quarantine the bad rows and keep training on the "
              "rest")
    return 0 if rep.ok else 1


def _cmd_repair(args: argparse.Namespace) -> int:
    from .repair import repair_store

    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(desc="verify", unit="row", unit_scale=True, dynamic_ncols=True)
    try:
        rep = repair_store(args.url, _kv(args.storage_option, "-S") or None,
                           progress=bar.update if bar is not None else None,
                           dry_run=args.dry_run)
    finally:
        if bar is not None:
            bar.close()
    for p in rep.found.problems if rep.found is not None else []:
        print(f"CORRUPT {p}")
    for p in rep.remaining:
        print(f"UNFIXED {p}")
    print(f"{rep.url}: {rep.summary()}")
    return 0 if rep.ok else 1


def _call(fn: Any, *pos: Any, options: dict[str, Any], args: argparse.Namespace) -> Any:
    params = inspect.signature(fn).parameters
    kw = dict(options)
    if "progress" in params and "progress" not in kw:
        kw["progress"] = not args.no_progress
    if getattr(args, "overwrite", False):
        kw["overwrite"] = True
    so = _kv(args.storage_option, "-S")
    if so:
        kw["storage_options"] = so
    unknown = [k for k in kw if k not in params and not any(
        p.kind == p.VAR_KEYWORD for p in params.values())]
    if unknown:
        raise SystemExit(f"expstore: error: {fn.__name__} has no option(s) {unknown}; options: "
                         + ", ".join(p for p in params if p not in ("src", "url", "dst")))
    return fn(*pos, **kw)


def _cmd_import(args: argparse.Namespace) -> int:
    from .datasets.registry import get_format

    imp, _ = get_format(args.format).functions()
    try:
        res = _call(imp, args.src, args.url, options=_kv(args.option, "-o"), args=args)
    except KeyboardInterrupt:
        again = "; run the same command again to resume" if args.format == "dopamine" else ""
        print(f"\ninterrupted: {args.url} holds the rows flushed so far{again}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    print(res)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .datasets.registry import get_format

    _, exp = get_format(args.format).functions()
    try:
        res = _call(exp, args.url, args.dst, options=_kv(args.option, "-o"), args=args)
    except KeyboardInterrupt:
        print("\ninterrupted: nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(res)
    return 0


def _cmd_formats(args: argparse.Namespace) -> int:
    from .datasets.registry import FORMATS

    for f in FORMATS.values():
        print(f"{f.name:<10} {f.help}")
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="expstore", description="Inspect, check, import and "
                                "export expstore replay stores.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def storage(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-S", "--storage-option", action="append", metavar="KEY=VALUE",
                        help="fsspec storage option for remote URLs (repeatable)")

    sp = sub.add_parser("info", help="spec, capacity, rows, episodes, size on disk")
    sp.add_argument("url")
    sp.add_argument("--json", action="store_true", help="print JSON")
    storage(sp)
    sp.set_defaults(fn=_cmd_info)

    sp = sub.add_parser("verify", help="read and check every shard; exit 1 if any is bad")
    sp.add_argument("url")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    storage(sp)
    sp.set_defaults(fn=_cmd_verify)

    sp = sub.add_parser("repair", help="quarantine rows verify finds bad (never sampled "
                        "again), rebuild lost lane states; exit 1 if problems remain")
    sp.add_argument("url")
    sp.add_argument("-n", "--dry-run", action="store_true", help="report, change nothing")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    storage(sp)
    sp.set_defaults(fn=_cmd_repair)

    for name, helptext, order in (("import", "create a store from a dataset",
                                   ("format", "src", "url")),
                                  ("export", "write a store as a dataset",
                                   ("url", "format", "dst"))):
        sp = sub.add_parser(name, help=helptext)
        for arg in order:
            sp.add_argument(arg, help="dataset format (see 'expstore formats')"
                            if arg == "format" else None)
        sp.add_argument("-o", "--option", action="append", metavar="KEY=VALUE",
                        help="importer/exporter option, JSON value (repeatable)")
        sp.add_argument("--no-progress", action="store_true", help="no progress bar")
        if name == "import":
            sp.add_argument("--overwrite", action="store_true", help="replace a store at URL")
        storage(sp)
        sp.set_defaults(fn=_cmd_import if name == "import" else _cmd_export)

    sp = sub.add_parser("formats", help="list dataset formats")
    sp.set_defaults(fn=_cmd_formats)

    sp = sub.add_parser("bench", help="run the benchmark scripts in benchmarks/")
    sp.add_argument("names", nargs="*", help="benchmarks to run (default: all bench_*.py)")
    sp.add_argument("--dir", help="benchmarks folder")
    sp.add_argument("--list", action="store_true", help="list them and exit")
    sp.add_argument("--args", nargs=argparse.REMAINDER, default=[],
                    help="arguments passed to every script")
    sp.set_defaults(fn=_cmd_bench)
    return p


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
        print(f"expstore: error: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
