"""Nothing a user saves is destroyed by loading it: a real SB3 DQN learns on a store built
with ``overwrite=True`` and is saved (``save`` and ``save_replay_buffer``) by one process;
another process loads it in every order SB3 allows and must find the store's rows, keep
them on disk and go on learning into them. Pickles and copies keep rows too.

``overwrite=True`` applies once, in the buffer's constructor; SB3's ``load()`` rebuilds
the buffer from the saved kwargs (``overwrite`` included) and reattaches the store."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
import expstore as es  # noqa: E402
from expstore.integrations.sb3 import ExpstoreReplayBuffer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STEPS = 600  # env steps learned before saving

LEARN = """
import json, os, sys
import torch
torch.set_num_threads(1)
from stable_baselines3 import DQN
from expstore.integrations.sb3 import ExpstoreReplayBuffer
mirror = sys.argv[1] == "1"  # in the run folder: the url is relative
model = DQN("MlpPolicy", "CartPole-v1", learning_starts=100, buffer_size=1_000, seed=0,
            replay_buffer_class=ExpstoreReplayBuffer,
            replay_buffer_kwargs={"url": "rb.zarr", "overwrite": True, "mirror": mirror})
model.learn(STEPS)
model.save("model")
model.save_replay_buffer("rb.pkl")  # every step written and flushed
buf = model.replay_buffer
print(json.dumps({"rows": len(buf.store), "size": buf.size()}), flush=True)
os._exit(0)  # killed: nothing closed
""".replace("STEPS", str(STEPS))

LOAD = """
import copy, json, os, pickle, sys
import torch
torch.set_num_threads(1)
from stable_baselines3 import DQN
import expstore as es
order = sys.argv[1]
out = {}
import gymnasium as gym
model = DQN.load("model", env=gym.make("CartPole-v1"))
if order in ("touch", "touch_then_buffer"):
    out["after_load"] = [len(model.replay_buffer.store), model.replay_buffer.size()]
if order in ("buffer", "touch_then_buffer"):
    model.load_replay_buffer("rb.pkl")
    out["after_load_buffer"] = [len(model.replay_buffer.store), model.replay_buffer.size()]
if order == "pickle":
    buf = pickle.loads(pickle.dumps(model.replay_buffer))
    model.replay_buffer = buf
    out["after_pickle"] = [len(buf.store), buf.size()]
if order == "deepcopy":
    try:
        twin = copy.deepcopy(model.replay_buffer)
    except TypeError as e:  # a buffer sampling from its store is not copied
        out["copy_error"] = str(e)
    else:
        out["copy_size"] = twin.size()
        twin.close()
    out["after_copy"] = [len(model.replay_buffer.store), model.replay_buffer.size()]
model.learn(100, reset_num_timesteps=False)  # goes on writing into the same store
model.replay_buffer.close()
with es.open("rb.zarr") as store:
    out["on_disk"] = len(store)
print(json.dumps(out), flush=True)
"""


def run(code: str, folder: Path, *args: str) -> dict:
    """``code`` in a new interpreter, in ``folder`` (the store's url is relative to it, so
    a copied folder is a separate run); its last stdout line as a dict."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=240, env=env, cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=[True, False], ids=["mirror", "no_mirror"])
def saved(request, tmp_path_factory):
    """One learn-and-save run per mirror setting, in its own process: (folder, counts)."""
    d = tmp_path_factory.mktemp("saved")
    res = run(LEARN, d, "1" if request.param else "0")
    assert res["size"] == STEPS
    assert res["rows"] > STEPS  # one row per step plus a final row per episode
    return d, res


def copy_of(saved, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(saved[0], d)
    return d, saved[1]


@pytest.mark.parametrize("order", ["buffer", "touch", "touch_then_buffer"])
def test_loading_a_model_in_a_new_process_keeps_its_store(saved, tmp_path, order):
    """``load`` then ``load_replay_buffer``; ``load``, touch the buffer, then
    ``load_replay_buffer``; ``load`` alone, then touch: the saved rows are there (and on
    disk) at every step, and learning goes on adding to them."""
    d, res = copy_of(saved, tmp_path)
    out = run(LOAD, d, order)
    for key in ("after_load", "after_load_buffer"):
        if key in out:
            assert out[key] == [res["rows"], res["size"]], (key, out, res)
    assert out["on_disk"] >= res["rows"] + 100


def test_pickle_of_a_loaded_buffer_keeps_rows(saved, tmp_path):
    d, res = copy_of(saved, tmp_path)
    out = run(LOAD, d, "pickle")
    assert out["after_pickle"] == [res["rows"], res["size"]]
    assert out["on_disk"] >= res["rows"] + 100


def test_deepcopy_of_a_loaded_buffer_keeps_rows(saved, tmp_path):
    """With a RAM mirror the copy holds the rows (in its own store); without one a copy
    is refused, naming why. Either way the store keeps its rows."""
    d, res = copy_of(saved, tmp_path)
    out = run(LOAD, d, "deepcopy")
    if "copy_error" in out:
        assert "mirror=False" in out["copy_error"]
    else:
        assert out["copy_size"] == res["size"]
    assert out["after_copy"] == [res["rows"], res["size"]]
    assert out["on_disk"] >= res["rows"] + 100


SPACE = gym.spaces.Box(-1, 1, (3,), np.float32)


def rows(url):
    with es.open(url) as store:
        return len(store)


def add_steps(buf, n, start=0):
    o = np.zeros((1, 3), np.float32)
    for t in range(start, start + n):
        buf.add(o + t, o + t + 1, np.array([t % 2]), np.array([1.0]), np.array([False]),
                [{}])


@pytest.mark.parametrize("mirror", [True, False])
def test_overwrite_applies_once_at_creation(tmp_path, mirror):
    """A buffer pickled or copied before it first wrote carries no pending wipe: rows
    written after it was made survive unpickling and copying it."""
    url = tmp_path / "b.zarr"
    first = ExpstoreReplayBuffer(64, SPACE, gym.spaces.Discrete(2), url=url, mirror=mirror)
    add_steps(first, 20)
    first.close()
    assert rows(url) == 21  # 20 steps, the last one ended truncated

    buf = ExpstoreReplayBuffer(64, SPACE, gym.spaces.Discrete(2), url=url, overwrite=True,
                               mirror=mirror)
    assert rows(url) == 0  # replaced here, at creation
    blob = pickle.dumps(buf)
    twin = copy.deepcopy(buf) if mirror else None
    add_steps(buf, 10)
    buf.close()
    assert rows(url) == 11

    again = pickle.loads(blob)
    assert len(again.store) == 11
    add_steps(again, 5, start=10)
    again.close()
    assert rows(url) == 17
    if twin is not None:
        twin.store  # noqa: B018  (opens its own store)
        twin.close()
        assert rows(url) == 17


def test_reset_empties_the_store_at_once(tmp_path):
    """``reset()`` is the deliberate way to empty a buffer: done then, and a pickle taken
    after it does not empty the store again once rows were written."""
    url = tmp_path / "r.zarr"
    buf = ExpstoreReplayBuffer(64, SPACE, gym.spaces.Discrete(2), url=url, mirror=False)
    add_steps(buf, 10)
    buf.flush()
    buf.reset()
    assert rows(url) == 0
    blob = pickle.dumps(buf)
    add_steps(buf, 10)
    buf.close()
    assert rows(url) == 11
    again = pickle.loads(blob)
    assert len(again.store) == 11
    again.close()


def test_loading_while_the_trainer_writes_takes_no_write_lease(tmp_path):
    """Another process loads the model (to evaluate it) while this one still trains on
    the store: the loaded buffer's mirror is read from the store read-only, so the load
    does not fail on the trainer's write lease, and the trainer goes on writing."""
    from stable_baselines3 import DQN

    url = tmp_path / "rb.zarr"
    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=100, buffer_size=1_000, seed=0,
                replay_buffer_class=ExpstoreReplayBuffer,
                replay_buffer_kwargs={"url": str(url), "overwrite": True, "mirror": True})
    model.learn(600)
    model.replay_buffer.flush()
    model.save(tmp_path / "model")
    out = run("import json; from stable_baselines3 import DQN; m = DQN.load('model'); "
              "print(json.dumps({'size': m.replay_buffer.size()}))", tmp_path)
    assert out["size"] > 500  # every step flushed so far (the newest ones still held)
    model.learn(100)
    model.replay_buffer.close()
    assert rows(url) >= 700
