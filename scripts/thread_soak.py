"""Thread soak: a learner thread samples a store while an actor thread of the same
process adds to it at full speed (``expstore.testing.thread_race``), on fresh stores
until the time is up; prints per run the batches read, the rows added and each sample
that was not its own transition (exit code 1 when there was one).

    python scripts/thread_soak.py [--seconds 120] [--run-seconds 20] [--switch 1e-5]

``--switch``: the interpreter's switch interval (s) between the threads. The default 5 ms
lets the actor run for a while whenever the learner releases the GIL; 1e-5 lands adds
between any two steps of a sample.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from expstore.testing import scratch_dir  # noqa: E402
from expstore.testing.thread_race import race  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="in all")
    ap.add_argument("--run-seconds", type=float, default=20.0, help="per store")
    ap.add_argument("--switch", type=float, default=None,
                    help="switch interval (s) while sampling; default: the interpreter's")
    ap.add_argument("--chunk-rows", type=int, default=8, help="rows per inner chunk")
    args = ap.parse_args()
    end = time.monotonic() + args.seconds
    runs = wrong_runs = 0
    while time.monotonic() < end:
        with scratch_dir() as d:
            batches, added, wrong = race(f"{d}/s.zarr", args.run_seconds, runs,
                                         args.chunk_rows, None if args.switch is None else 0,
                                         args.switch or 0.005)
        runs += 1
        wrong_runs += bool(wrong)
        print(f"run {runs}: {batches:,} batches of 32, {added:,} rows added "
              f"({added / 256:,.0f} laps), {len(wrong)} wrong samples", flush=True)
        for w in wrong[:3]:
            print("  wrong:", w, flush=True)
    print(f"{runs} runs of {args.run_seconds:g} s, switch interval "
          f"{args.switch or sys.getswitchinterval():g} s: {wrong_runs} with a wrong sample")
    sys.exit(1 if wrong_runs else 0)


if __name__ == "__main__":
    main()
