"""Thread soak: a learner thread samples a store while an actor thread of the same
process adds to it at full speed, lapping a 256-row ring many times a second; every
sampled transition is checked against the one its obs names.

    python scripts/thread_soak.py [--seconds 120] [--run-seconds 20] [--switch 1e-5]

``--switch``: the interpreter's switch interval (s) between the threads. The default 5 ms
lets the actor run for a while whenever the learner releases the GIL; 1e-5 lands adds
between any two steps of a sample. Runs fresh stores of ``--run-seconds`` each until
``--seconds`` pass, and prints per run the batches read, the rows added and each sample
that was not its own transition (exit code 1 when there was one). This is the harness
behind ``tests/test_hot_set.py``'s race test, run longer.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import expstore as es  # noqa: E402
from expstore.testing import scratch_dir  # noqa: E402

EP_LEN = 23  # steps per episode (one final row each)


def key(g: int) -> float:
    """Transition ``g``'s obs value: episode * 100 + position (next_obs: + 1)."""
    return float((g // EP_LEN) * 100 + g % EP_LEN)


def write(store: es.Store, start: int, n: int) -> None:
    for g in range(start, start + n):
        k = key(g)
        store.add(np.full(5, k, np.float32), np.array([k, -k], np.float32), float(k),
                  np.full(5, k + 1, np.float32), g % EP_LEN == EP_LEN - 1, False)


def wrong_samples(batch: dict) -> np.ndarray:
    """Indices of samples whose fields are not all of the transition their obs names."""
    k = batch["obs"][:, 0]
    ok = (batch["obs"] == k[:, None]).all(1) & (batch["next_obs"] == k[:, None] + 1).all(1)
    ok &= (batch["action"][:, 0] == k) & (batch["action"][:, 1] == -k)
    ok &= (batch["reward"] == k) & (k % 100 < EP_LEN)  # (not a final row's obs)
    return np.flatnonzero(~ok)


def run(seconds: float, seed: int, chunk_rows: int | None) -> tuple[int, int, list[dict]]:
    """One store: ``(batches, rows added, wrong samples)``."""
    with scratch_dir() as d:
        spec = es.Spec.create(obs=es.Field((5,), np.float32, chunk_rows=chunk_rows),
                              action=es.Field((2,), np.float32, chunk_rows=chunk_rows))
        store = es.create(f"{d}/s.zarr", spec, capacity=256, shard_rows=32, fsync=False)
        write(store, 0, 64)
        done = threading.Event()
        errors: list[BaseException] = []

        def adding() -> None:
            g = 64
            try:
                while not done.is_set():
                    write(store, g, 5)
                    g += 5
            except BaseException as e:  # reported below
                errors.append(e)

        sampler = es.UniformSampler(store, seed=seed)
        thread = threading.Thread(target=adding)
        thread.start()
        batches, wrong = 0, []
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                batch = sampler.sample(32)
                batches += 1
                for i in wrong_samples(batch):
                    wrong.append({k: v[i].tolist() for k, v in batch.items()})
        finally:
            done.set()
            thread.join()
        if errors:
            raise errors[0]
        added = store.writers[0].count
        store.close()
    return batches, added, wrong


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="in all")
    ap.add_argument("--run-seconds", type=float, default=20.0, help="per store")
    ap.add_argument("--switch", type=float, default=None,
                    help="sys.setswitchinterval (s) while sampling; default: 5 ms")
    ap.add_argument("--chunk-rows", type=int, default=8, help="rows per inner chunk")
    args = ap.parse_args()
    if args.switch is not None:
        sys.setswitchinterval(args.switch)
    total_end = time.monotonic() + args.seconds
    runs = wrong_runs = 0
    while time.monotonic() < total_end:
        batches, added, wrong = run(args.run_seconds, runs, args.chunk_rows)
        runs += 1
        wrong_runs += bool(wrong)
        print(f"run {runs}: {batches:,} batches of 32, {added:,} rows added "
              f"({added / 256:,.0f} laps), {len(wrong)} wrong samples", flush=True)
        for w in wrong[:3]:
            print("  wrong:", w, flush=True)
    print(f"{runs} runs of {args.run_seconds:g} s, switch interval "
          f"{sys.getswitchinterval():g} s: {wrong_runs} with a wrong sample")
    sys.exit(1 if wrong_runs else 0)


if __name__ == "__main__":
    main()
