"""One benchmark on two checkouts, alternately, in one run: did a change move its numbers?

Usage (from the repository root)::

    git worktree add /tmp/before <rev> && (cd /tmp/before && python setup.py build_ext --inplace)
    python benchmarks/compare_revisions.py /tmp/before . --repeats 3 \\
        --json add.json -- bench_add.py --steps 20000 --no-write

Runs ``python benchmarks/<script> <args>`` in each checkout (its own code on
``PYTHONPATH``), before and after alternating, ``--repeats`` times each, reads the
``benchmarks/results/<json>`` the script writes there after each run (and puts the
committed file back), and prints, per case row and numeric column, the medians of the
two checkouts and after / before. The machine's load average is printed with them.
Both checkouts make their scratch stores in one folder (``--work``, default: a new one in
the system's temp folder; ``EXPSTORE_BENCH_DIR``): what writing a file costs depends on
where on the disk it goes (``report.work_dir``), and runs compared must not differ in that.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_once(checkout: Path, script: list[str], result: str, work: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "EXPSTORE_BENCH_DIR": str(work)}
    subprocess.run([sys.executable, f"benchmarks/{script[0]}", *script[1:]], cwd=checkout,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    path = checkout / "benchmarks" / "results" / result
    saved = json.loads(path.read_text())
    rows = saved["rows"] if "rows" in saved else saved["results"]
    subprocess.run(["git", "checkout", "--", str(path.relative_to(checkout))], cwd=checkout,
                   check=False, capture_output=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--repeats", type=int, default=3, help="runs per checkout (medians)")
    ap.add_argument("--json", required=True, help="the results/<file> the benchmark writes")
    ap.add_argument("--key", default="case",
                    help="the column naming a row, or columns joined by commas (data,op)")
    ap.add_argument("--work", type=Path, default=None,
                    help="the folder both checkouts make their scratch stores in "
                         "(default: a new temp folder)")
    argv = sys.argv[1:]
    if "--" not in argv:
        ap.error("give the benchmark after --: -- SCRIPT [ARGS...]")
    cut = argv.index("--")
    a = ap.parse_args(argv[:cut])
    script = argv[cut + 1:]
    work = (a.work or Path(tempfile.mkdtemp(prefix="compare-revisions-"))).resolve()
    try:
        compare(a, script, work)
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)


def compare(a: argparse.Namespace, script: list[str], work: Path) -> None:
    """Run both checkouts alternately and print the medians' table."""
    runs: dict[str, list[list[dict]]] = {"before": [], "after": []}
    for i in range(a.repeats):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for side in order:
            runs[side].append(run_once(getattr(a, side).resolve(), script, a.json, work))
            print(f"run {i + 1}/{a.repeats} {side} done, load {os.getloadavg()[0]:.2f}",
                  file=sys.stderr)
    print(f"`{' '.join(script)}`, {a.repeats} runs per checkout alternating, medians; "
          f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| case | column | before | after | after / before |\n|---|---|---|---|---|")
    keys = a.key.split(",")

    def name_of(row: dict) -> str:
        return " ".join(str(row.get(k)) for k in keys)

    for row in runs["before"][0]:
        name = name_of(row)
        for col, v in row.items():
            if col in keys or not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            med = {}
            for side in runs:
                vals = [r[col] for rs in runs[side] for r in rs
                        if name_of(r) == name and isinstance(r.get(col), (int, float))]
                med[side] = statistics.median(vals) if vals else float("nan")
            ratio = med["after"] / med["before"] if med["before"] else float("nan")
            print(f"| {name} | {col} | {med['before']:.4g} | {med['after']:.4g} | "
                  f"{ratio:.2f} |")


if __name__ == "__main__":
    main()
