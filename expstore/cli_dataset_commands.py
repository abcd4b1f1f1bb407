"""The ``expstore`` dataset commands (``cli.py``): ``import`` and ``export`` (options checked
against the format's function, one summary printed) and ``formats`` (each format's ``-o``
options, also the epilog of ``import --help`` / ``export --help``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from typing import Any

from .cli_common import EXIT_INTERRUPTED, parse_kv, usage_error

# a store's URL as every command prints it: file:///absolute/path for a local store (what
# store.url says), other URLs as given
from .storage.backends import canonical_url as store_url


def _call(fn: Any, *pos: Any, options: dict[str, Any], args: argparse.Namespace) -> Any:
    params = inspect.signature(fn).parameters
    kw = dict(options)
    if "progress" in params and "progress" not in kw:
        kw["progress"] = not args.quiet
    if args.overwrite:
        if "overwrite" not in params:
            usage_error(f"{args.command} {args.format}: --overwrite is not an option of this "
                         "format")
        kw["overwrite"] = True
    so = parse_kv(args.storage_option, "-S")
    if so:
        kw["storage_options"] = so
    unknown = [k for k in kw if k not in params and not any(
        p.kind == p.VAR_KEYWORD for p in params.values())]
    if unknown:
        from .datasets.registry import get_format

        known = ", ".join(name for name, _, _ in get_format(args.format).options(args.command))
        usage_error(f"-o {unknown[0]}: not an option of {args.format} {args.command} (its "
                     f"options: {known or 'none'}; 'expstore {args.command} --help' says "
                     "what each takes)")
    from .datasets.registry import check_option_types

    try:
        check_option_types(fn, options)
    except ValueError as e:
        usage_error(f"{e} ({args.format} {args.command})")
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


def cmd_import(args: argparse.Namespace) -> int:
    from .datasets.registry import get_format

    imp, _ = get_format(args.format).functions()
    t0 = time.perf_counter()
    try:
        res = _call(imp, args.src, args.url, options=parse_kv(args.option, "-o"), args=args)
    except KeyboardInterrupt:
        again = ("; run the same command again to resume"
                 if args.format in ("dopamine", "lerobot") else "")
        print(f"\ninterrupted: {store_url(args.url)} holds the rows flushed so far{again}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    print(_summary(res, args, time.perf_counter() - t0))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .datasets.registry import get_format

    _, exp = get_format(args.format).functions()
    try:
        res = _call(exp, args.url, args.dst, options=parse_kv(args.option, "-o"), args=args)
    except KeyboardInterrupt:
        print("\ninterrupted: nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(_summary(res, args, 0.0))
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
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


def formats_epilog(which: str) -> str:
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
