"""A learner thread sampling a store while another thread of the same process adds to it
and flushes every 1,500 rows: every sampled transition checked against the step its obs
names. Found in issue 26's twenty-third round: about half of the 30 s runs delivered one or
two rows of a batch of 256 with wrong values (an obs of zeros, an action never stored) and
no error. The writing thread forgot each shard it wrote (``Store._forget_shard``), freeing
its hot-set slot one array at a time, while the learner's sample claimed and filled slots;
forgetting now takes the store's read lock (16 runs here, none wrong). The same race, in
seconds: ``tests/test_hot_set.py``'s
``test_a_learner_thread_samples_while_another_thread_adds_and_flushes``.

Usage (from the repository root)::

    python scripts/learner_thread_probe.py [--hot-bytes N] [--runs 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading

import numpy as np

sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", "tests"),
                os.path.join(os.path.dirname(__file__), "..")]

from test_scalar_codes import action_of, make_store, transition_of, write  # noqa: E402

import expstore as es  # noqa: E402


def run(hot_bytes: int | None) -> tuple[int, int]:
    """One run: (batches, batches with a wrong row)."""
    root = tempfile.mkdtemp()
    path = os.path.join(root, "s.zarr")
    try:
        store = make_store(path, capacity=16384, shard_rows=256)
        write(store, 0, 17000)  # (wraps; the transitions' obs name them up to 65,535)
        store.close()
        store = es.open(path, "r+", fsync=False, hot_bytes=hot_bytes)
        done = []

        def add() -> None:
            g = 17000
            while g < 62000:
                write(store, g, 500)
                g += 500
                if g % 1500 == 0:
                    store.flush()
            done.append(g)

        actor = threading.Thread(target=add)
        actor.start()
        batches = bad = 0
        while not done:
            b = store.sample(256)
            g = transition_of(b["obs"].reshape(len(b["obs"]), -1))
            right = (transition_of(b["next_obs"].reshape(len(g), -1)) == g + 1) & (
                b["action"] == np.array([action_of(int(x)) for x in g]))
            if not right.all():
                bad += 1
                i = int(np.flatnonzero(~right)[0])
                print(f"  wrong row: step {int(b['step_id'][i])}, obs names {int(g[i])}, "
                      f"action {b['action'][i]}", flush=True)
            batches += 1
        actor.join()
        store.close()
        return batches, bad
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hot-bytes", type=int, default=None)
    p.add_argument("--runs", type=int, default=6)
    a = p.parse_args()
    for k in range(a.runs):
        batches, bad = run(a.hot_bytes)
        print(f"run {k}: {batches} batches of 256, {bad} with a wrong row", flush=True)


if __name__ == "__main__":
    main()
