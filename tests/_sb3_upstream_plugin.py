"""pytest plugin: Stable-Baselines3's own test suite with SB3's replay buffers replaced by
:class:`~expstore.integrations.sb3.ExpstoreReplayBuffer`.

Loaded with ``-p _sb3_upstream_plugin`` by ``tests/test_sb3_upstream.py`` in a pytest run on
the ``tests/`` folder of SB3's source distribution. It

- binds ``ReplayBuffer``, ``DictReplayBuffer`` and ``NStepReplayBuffer`` to expstore classes
  in ``stable_baselines3.common.buffers`` while SB3's test modules are imported (so their
  ``from ... import ReplayBuffer`` and their parametrize lists get ours), and for good in
  ``stable_baselines3.common.off_policy_algorithm`` (so DQN/SAC/TD3/DDPG build ours when
  ``replay_buffer_class`` is ``None``);
- keeps only the tests that build a replay buffer (:data:`FILES`, :func:`_touches_buffer`;
  with ``$EXPSTORE_SB3_UPSTREAM_ALL`` set, every case of the files given that does not
  use A2C, PPO, HER or a rollout buffer);
- marks the deliberate differences (:data:`DIFFERENCES`) ``xfail(strict=True)``: when one
  starts passing, the run fails and the entry must go;
- writes a JSON report (path in ``$EXPSTORE_SB3_UPSTREAM_REPORT``): per test its outcome and
  how many expstore buffers it built, and the names in :data:`FILES` that matched no test.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import stable_baselines3.common.buffers as sb3_buffers
import stable_baselines3.common.off_policy_algorithm as sb3_off_policy
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.her import HerReplayBuffer

from expstore.integrations.sb3 import ExpstoreReplayBuffer

_built = {"count": 0}


class _Counting:
    """Counts the buffers built during the current test (the report's ``buffers``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _built["count"] += 1
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]


class ReplayBuffer(_Counting, ExpstoreReplayBuffer):
    """SB3's ``ReplayBuffer`` signature on an expstore buffer (temporary store)."""


class DictReplayBuffer(_Counting, ExpstoreReplayBuffer):
    """SB3's ``DictReplayBuffer``: the same expstore buffer (it takes Dict spaces itself)."""


class NStepReplayBuffer(_Counting, ExpstoreReplayBuffer):
    """SB3's ``NStepReplayBuffer`` defaults (``n_steps=3``, ``gamma=0.99``)."""

    def __init__(self, *args: Any, n_steps: int = 3, gamma: float = 0.99, **kwargs: Any) -> None:
        super().__init__(*args, n_steps=n_steps, gamma=gamma, **kwargs)


REPLACEMENTS = {"ReplayBuffer": ReplayBuffer, "DictReplayBuffer": DictReplayBuffer,
                "NStepReplayBuffer": NStepReplayBuffer}

#: SB3 test files that build replay buffers. ``None``: every test in the file that passes
#: :func:`_touches_buffer`; else the tests named (``test_x``: all its cases that pass
#: :func:`_touches_buffer`, ``test_x[id]``: that case only). The costly learning tests
#: (500-1000 steps on a 1e6-step buffer) run one or two cases each, to keep the run short.
FILES: dict[str, set[str] | None] = {
    "test_buffers.py": {"test_replay_buffer_normalization", "test_device_buffer",
                        "test_buffer_dtypes"},
    "test_n_step_replay.py": None,
    "test_run.py": {"test_deterministic_pg", "test_sac", "test_n_critics", "test_dqn",
                    "test_train_freq", "test_offpolicy_multi_env", "test_warn_dqn_multi_env"},
    "test_save_load.py": {"test_save_load", "test_set_env", "test_exclude_include_saved_params",
                          "test_save_load_pytorch_var", "test_save_load_replay_buffer",
                          "test_warn_buffer", "test_save_load_q_net",
                          "test_dqn_target_update_interval", "test_no_resource_warning",
                          "test_save_load_no_target_params"},
    "test_train_eval_mode.py": {"test_dqn_train_with_batch_norm",
                                "test_td3_train_with_batch_norm",
                                "test_offpolicy_collect_rollout_batch_norm"},
    "test_vec_normalize.py": {"test_offpolicy_normalization"},
    "test_dict_env.py": {"test_consistency", "test_dict_spaces", "test_vec_normalize",
                         "test_dict_vec_framestack[False-DQN]",
                         "test_dict_vec_framestack[True-SAC]"},
    "test_callbacks.py": {"test_callbacks[SAC]", "test_callbacks[DQN]",
                          "test_checkpoint_additional_info"},
    "test_deterministic.py": None,
    "test_identity.py": {"test_continuous[SAC]"},
    "test_sde.py": {"test_state_dependent_noise[True-False-SAC]"},
    "test_spaces.py": {"test_identity_spaces[env0-DQN]", "test_identity_spaces[env1-DQN]",
                       "test_identity_spaces[env2-DQN]", "test_action_spaces",
                       "test_float64_action_space"},
    "test_cnn.py": {"test_cnn[False-DQN]", "test_cnn[False-SAC]"},
}

#: cases that stop before a replay buffer is built (SB3 refuses the action space)
NO_BUFFER = {"test_n_step_replay.py::test_n_steps_with_dict_obs[None]",
             "test_spaces.py::test_action_spaces[CartPole-v1-DDPG]",
             "test_spaces.py::test_action_spaces[CartPole-v1-SAC]",
             "test_spaces.py::test_action_spaces[CartPole-v1-TD3]",
             "test_spaces.py::test_action_spaces[Pendulum-v1-DQN]",
             "test_spaces.py::test_action_spaces[env2-DQN]"}

#: values of a parametrized test that mean no replay buffer of ours is built
_OTHER_BUFFERS = (A2C, PPO, HerReplayBuffer, sb3_buffers.RolloutBuffer,
                  sb3_buffers.DictRolloutBuffer)

#: deliberate differences: SB3 test id -> why ExpstoreReplayBuffer differs on purpose
DIFFERENCES: dict[str, str] = {
    "test_n_step_replay.py::test_nstep_no_terminations": (
        "`dones[pos] = True` (what SB3's learn() writes to end the stored stream before a new "
        "run) marks the step cut (truncated: it bootstraps), not terminated"),
}


def _touches_buffer(item: pytest.Item) -> bool:
    selected = FILES.get(item.path.name, set())
    if os.environ.get("EXPSTORE_SB3_UPSTREAM_ALL"):
        selected = None  # every off-policy case of the files given
    if selected is not None and not {item.originalname, item.name} & selected:
        return False
    if f"{item.path.name}::{item.name}" in NO_BUFFER:
        return False
    params = getattr(item, "callspec", None)
    values = params.params.values() if params is not None else ()
    return not any(v in _OTHER_BUFFERS for v in values if isinstance(v, type))


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session):  # noqa: ANN201
    """SB3's test modules import their buffer classes while collected: give them ours."""
    saved = {name: getattr(sb3_buffers, name) for name in REPLACEMENTS}
    for name, cls in REPLACEMENTS.items():
        setattr(sb3_buffers, name, cls)
        setattr(sb3_off_policy, name, cls)
    try:
        yield
    finally:
        # SB3's own classes go back: DictReplayBuffer (and HER on it) calls
        # ``super(ReplayBuffer, self)`` by the module's name
        for name, cls in saved.items():
            setattr(sb3_buffers, name, cls)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    named = {(f, n) for f, names in FILES.items() for n in names or ()}
    for item in items:
        named -= {(item.path.name, item.originalname), (item.path.name, item.name)}
        (keep if _touches_buffer(item) else drop).append(item)
        name = f"{item.path.name}::{item.name}"
        reason = DIFFERENCES.get(name) or DIFFERENCES.get(f"{item.path.name}::{item.originalname}")
        if reason:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
    # names of the selection that match no SB3 test (renamed upstream): the report says
    _unmatched.extend(sorted(f"{f}::{n}" for f, n in named))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(1)  # small MLPs: more threads only contend (and vary run times)


def pytest_report_header(config: pytest.Config) -> str:
    return ("expstore: SB3's ReplayBuffer/DictReplayBuffer/NStepReplayBuffer replaced by "
            "ExpstoreReplayBuffer")


_results: dict[str, dict[str, Any]] = {}
_unmatched: list[str] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    _built["count"] = 0


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "buffers": 0})
    if report.when == "call":
        entry["buffers"] = _built["count"]
        entry["duration_s"] = round(report.duration, 2)
    if report.outcome != "passed" or hasattr(report, "wasxfail"):
        if hasattr(report, "wasxfail"):
            entry["outcome"] = "xfailed" if report.skipped else "xpassed"
        elif entry["outcome"] == "passed":
            entry["outcome"] = report.outcome
        if report.longrepr is not None and report.outcome == "failed":
            entry["error"] = str(report.longrepr)[-2000:]


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("EXPSTORE_SB3_UPSTREAM_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"tests": _results, "unmatched": _unmatched}, f, indent=1, sort_keys=True)
