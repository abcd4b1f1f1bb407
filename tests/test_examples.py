"""The DQN example scripts run end to end with tiny settings: real envs, a real store on
disk, real DataLoader worker processes (and ``--num-workers 0``). Each run is checked
through its final JSON line and by reopening the store it kept."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import expstore as es

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def run_script(name: str, *args: str, timeout: float = 120) -> dict:
    """Run ``scripts/<name>`` in a fresh interpreter; its last stdout line as a dict."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{name} printed nothing; stderr:\n{proc.stderr[-3000:]}"
    out = json.loads(lines[-1])
    out["_stdout"] = proc.stdout
    return out


def check_store(url: Path, res: dict, wrapped: bool) -> None:
    """The kept store holds what the script reported writing."""
    with es.open(url) as store:
        assert store.episodes_written == res["episodes"]
        if wrapped:
            assert res["store_rows"] == len(store) <= store.capacity
        else:  # one row per step plus one final row per finished episode
            assert len(store) == res["store_rows"] == res["env_steps"] + res["episodes"]


CARTPOLE_TINY = ("--total-steps", "1500", "--learning-starts", "500", "--train-freq", "100",
                 "--gradient-steps", "20", "--batch-size", "32", "--solve-return", "0",
                 "--eval-episodes", "1", "--log-every", "500", "--keep")
CARTPOLE_GRADS = (1500 // 100 - 500 // 100) * 20  # train phases after step 500 x 20


def test_dqn_cartpole_workers_uniform(tmp_path):
    url = tmp_path / "replay.zarr"
    res = run_script("dqn_cartpole.py", *CARTPOLE_TINY, "--num-workers", "2",
                     "--url", str(url))
    assert res["env_steps"] == 1500 and res["episodes"] > 0
    assert res["solved"] is False and res["num_workers"] == 2
    assert res["gradient_steps"] == CARTPOLE_GRADS
    loader = res["loader"]
    # every batch the learner consumed was read by a worker (plus those read ahead)
    assert CARTPOLE_GRADS <= loader["batches"] <= 2 * CARTPOLE_GRADS
    assert loader["rows_read"] >= CARTPOLE_GRADS * 32  # workers read from the shards
    assert res["learner_wait_s"] > 0 and res["learner_compute_s"] > 0
    assert res["priority_rows_updated"] == 0
    assert len(res["eval_returns"]) == 1 and res["eval_returns"][0] >= 8
    assert res["mean_last10"] is not None and math.isfinite(res["mean_last10"])
    assert "step     500" in res["_stdout"]  # periodic progress lines
    check_store(url, res, wrapped=False)


def test_dqn_cartpole_per_nstep_wraps_ring(tmp_path):
    """PER + 3-step returns through one worker while the writer laps a 1,024-row ring."""
    url = tmp_path / "replay.zarr"
    res = run_script("dqn_cartpole.py", *CARTPOLE_TINY, "--num-workers", "1",
                     "--prioritized", "--n-step", "3", "--buffer", "1000",
                     "--url", str(url))
    assert res["prioritized"] is True and res["n_step"] == 3
    assert res["gradient_steps"] == CARTPOLE_GRADS
    # every sampled row got its |TD error| back (rows overwritten since are skipped)
    assert 0.5 * CARTPOLE_GRADS * 32 <= res["priority_rows_updated"] <= CARTPOLE_GRADS * 32
    assert res["loader"]["rows_read"] > 0
    assert res["store_rows"] <= 1024 < res["env_steps"]
    check_store(url, res, wrapped=True)


def test_dqn_cartpole_no_workers(tmp_path):
    """``--num-workers 0``: batches are read in the training process (staged rows too)."""
    url = tmp_path / "replay.zarr"
    res = run_script("dqn_cartpole.py", *CARTPOLE_TINY, "--num-workers", "0",
                     "--n-step", "3", "--url", str(url))
    assert res["num_workers"] == 0
    assert res["gradient_steps"] == CARTPOLE_GRADS
    assert res["loader"]["batches"] == CARTPOLE_GRADS  # no prefetch without workers
    check_store(url, res, wrapped=False)


@pytest.mark.slow  # ~14 s: trains a tiny DQN on Atari frames
def test_dqn_atari_tiny(tmp_path):
    pytest.importorskip("ale_py")
    url = tmp_path / "replay.zarr"
    steps, starts, freq, batch = 1200, 400, 4, 8
    res = run_script("dqn_atari.py", "--total-steps", str(steps), "--learning-starts",
                     str(starts), "--buffer", "3000", "--batch-size", str(batch),
                     "--flush-every", "200", "--log-every", "400", "--device", "cpu",
                     "--prioritized", "--n-step", "3", "--exploration-fraction", "0.5",
                     "--keep", "--url", str(url), timeout=180)
    grads = (steps - starts) // freq
    assert res["env_steps"] == steps and res["device"] == "cpu"
    assert res["gradient_steps"] == grads
    assert grads <= res["loader"]["batches"] <= 2 * grads
    # batches are (B, 4, 84, 84) stacks built from single stored frames
    assert res["loader"]["rows_read"] >= grads * batch * 4
    assert res["priority_rows_updated"] > 0
    assert res["wait_ms_per_batch"] > 0 and res["compute_ms_per_batch"] > 0
    assert "learner wait" in res["_stdout"] and "batches/s" in res["_stdout"]
    with es.open(url) as store:
        assert store.spec.fields["obs"].shape == (84, 84)
        assert store.spec.fields["obs"].stack == 4
        b = store.sample(4)
        assert b["obs"].shape == (4, 4, 84, 84) and str(b["obs"].dtype) == "uint8"
        assert len(store) == res["store_rows"] == steps + res["episodes"]
    # the same --url again: refused, naming the path and both flags; --resume goes on
    tiny = ("--learning-starts", str(starts), "--buffer", "3000", "--batch-size", str(batch),
            "--device", "cpu", "--prioritized", "--keep", "--url", str(url))
    proc = subprocess.run([sys.executable, str(SCRIPTS / "dqn_atari.py"), "--total-steps",
                           "100", *tiny], capture_output=True, text=True, timeout=120)
    err = proc.stderr.strip().splitlines()[-1]  # after ALE's banner
    assert proc.returncode != 0 and err.startswith("dqn_atari.py: error: ")
    assert str(url) in err and "--overwrite" in err and "--resume" in err
    more = run_script("dqn_atari.py", "--total-steps", "100", "--resume", *tiny)
    assert more["resumed_rows"] == res["store_rows"] and more["priorities_resumed"] is True
    assert more["gradient_steps"] == 100 // freq  # the store already holds learning_starts
    with es.open(url) as store:
        assert len(store) == more["store_rows"] == (res["store_rows"] + 100
                                                      + more["episodes"])


CARTPOLE_SHORT = ("--total-steps", "400", "--learning-starts", "200", "--train-freq", "100",
                  "--gradient-steps", "10", "--batch-size", "32", "--solve-return", "0",
                  "--eval-episodes", "1", "--num-workers", "0", "--prioritized", "--keep")


@pytest.mark.slow  # ~10 s: three training runs
def test_dqn_cartpole_refuses_an_existing_store_and_resumes_it(tmp_path):
    """A second run on the same ``--url`` stops with one line naming the path and both
    flags, the store untouched; ``--resume`` goes on writing it, from the priorities
    saved with it; ``--overwrite`` starts over."""
    url = tmp_path / "replay.zarr"
    first = run_script("dqn_cartpole.py", *CARTPOLE_SHORT, "--url", str(url))
    assert first["resumed_rows"] == 0 and first["priority_rows_updated"] > 0
    with es.open(url) as store:
        saved = store.load_priorities("priorities")  # persisted with a lasting store
        assert saved is not None and len(set(saved["leaves"][: len(store)].tolist())) > 1

    proc = subprocess.run([sys.executable, str(SCRIPTS / "dqn_cartpole.py"), *CARTPOLE_SHORT,
                           "--url", str(url)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and str(url) in err[0]
    assert "--overwrite" in err[0] and "--resume" in err[0]
    with es.open(url) as store:
        assert len(store) == first["store_rows"]

    resumed = run_script("dqn_cartpole.py", *CARTPOLE_SHORT, "--url", str(url), "--resume")
    assert resumed["resumed_rows"] == first["store_rows"]
    assert resumed["priorities_resumed"] is True
    # learning starts at once: the store already holds learning_starts rows
    assert resumed["gradient_steps"] == 400 // 100 * 10
    assert resumed["store_rows"] == (first["store_rows"] + resumed["env_steps"]
                                     + resumed["episodes"])
    with es.open(url) as store:
        assert len(store) == resumed["store_rows"]
        assert store.episodes_written == first["episodes"] + resumed["episodes"]

    fresh = run_script("dqn_cartpole.py", *CARTPOLE_SHORT, "--url", str(url), "--overwrite")
    assert fresh["resumed_rows"] == 0
    check_store(url, fresh, wrapped=False)
