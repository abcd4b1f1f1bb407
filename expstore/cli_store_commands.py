"""The ``expstore`` commands on one store (``cli.py``): ``info`` (:func:`store_info`),
``verify``, ``repair`` and ``upgrade``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .cli_common import ProgressBar, human, parse_kv


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


def print_info(info: dict[str, Any]) -> None:
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
    print(f"on disk     {human(info['bytes_on_disk'])} (raw {human(info['raw_bytes'])}, "
          f"ratio {ratio:.1f}x)" if ratio else f"on disk     {human(info['bytes_on_disk'])}")
    print("fields")
    for name, f in info["fields"].items():
        codec = f["codec"]
        cname = codec.get("cname", codec.get("name"))
        level = codec.get("clevel", codec.get("level", ""))
        extra = f"  stack={f['stack']} ({f['padding']})" if f["stack"] else ""
        print(f"  {name:<16} {str(tuple(f['shape'])):<14} {f['dtype']:<8} "
              f"{cname}-{level}{extra}")


def cmd_info(args: argparse.Namespace) -> int:
    info = store_info(args.url, parse_kv(args.storage_option, "-S") or None)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print_info(info)
    return 0


REPAIR_HINT = ("run 'expstore repair {url}' to rebuild lost metadata and state files and "
               "quarantine the bad rows, then keep training on the rest")


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify_store

    with ProgressBar("verify", args.quiet) as bar:
        rep = verify_store(args.url, parse_kv(args.storage_option, "-S") or None,
                           progress=bar.update, total=bar.total)
    for p in rep.problems:
        print(f"CORRUPT {p}")
    status = "OK" if rep.ok else f"{len(rep.problems)} problem(s)"
    print(f"{rep.url}: {status}: {rep.rows:,} rows in {rep.lanes} lane(s), {rep.shards:,} "
          f"shard objects, {human(rep.bytes)} read")
    if rep.quarantined:
        print(f"{rep.quarantined:,} row(s) quarantined by an earlier repair (lost, never "
              "sampled)")
    if rep.partial_import:
        print(rep.partial_import)
    if not rep.ok:
        print(REPAIR_HINT.format(url=rep.url))
    return 0 if rep.ok else 1


def cmd_repair(args: argparse.Namespace) -> int:
    from .repair import repair_store

    with ProgressBar("repair: verify", args.quiet) as bar:
        rep = repair_store(args.url, parse_kv(args.storage_option, "-S") or None,
                           progress=bar.update, dry_run=args.dry_run, total=bar.total,
                           release_intact=args.release_intact)
    for p in rep.found.problems if rep.found is not None else []:
        print(f"CORRUPT {p}")
    for p in rep.remaining:
        print(f"UNFIXED {p}")
    print(f"{rep.url}: {rep.summary()}")
    return 0 if rep.ok else 1


def cmd_upgrade(args: argparse.Namespace) -> int:
    from .upgrade import upgrade_store

    with ProgressBar("upgrade: index snapshot", args.quiet) as bar:
        rep = upgrade_store(args.url, parse_kv(args.storage_option, "-S") or None,
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
