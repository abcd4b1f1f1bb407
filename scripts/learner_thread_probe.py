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

sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", "tests"),
                os.path.join(os.path.dirname(__file__), "..")]

from test_hot_set import race_adds_and_flushes  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hot-bytes", type=int, default=None)
    p.add_argument("--runs", type=int, default=6)
    a = p.parse_args()
    for k in range(a.runs):
        root = tempfile.mkdtemp()
        try:
            batches, wrong = race_adds_and_flushes(os.path.join(root, "s.zarr"), end=62000,
                                                   switch=None, hot_bytes=a.hot_bytes)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"run {k}: {batches} batches of 256, {wrong} wrong rows", flush=True)


if __name__ == "__main__":
    main()
