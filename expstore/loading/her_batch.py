"""Execute a :class:`~expstore.sampling.plans.HERPlan`: transitions and goal rows, relabeled.

The achieved goal of each chosen goal row is read with the step the plan expects; a sample
whose goal row was overwritten counts as stale like any other row of the sample.
"""

from __future__ import annotations

import numpy as np

from ..sampling.plans import HERPlan
from ..storage.format import Layout
from .columns import RowSource, finish, read_unique
from .transition_batch import read_columns


def assemble_her(plan: HERPlan, layout: Layout, source: RowSource) -> tuple[dict, int]:
    """Relabeled batch (with ``relabeled`` bool per sample) and the stale count."""
    out, ok = read_columns(plan.base, layout, source)
    r = plan.relabel
    if r.any():
        goals, good = read_unique(source, layout, plan.achieved, plan.goal_rows[r],
                                   plan.goal_steps[r])
        ok[np.flatnonzero(r)[~good]] = False
        des = plan.desired
        spec = layout.spec
        keys = [des]
        if des in spec.obs_names:
            keys = ["obs" + des[3:], "next_obs" + des[3:]]
        for key in keys:
            out[key][r] = goals
        achieved_next = out["next_obs" + plan.achieved[3:]][r]
        info = {k: v[r] for k, v in out.items() if k in spec.fields and k not in (
            "reward", "terminated", "truncated") and not k.startswith(("obs", "action"))}
        reward = np.asarray(plan.compute_reward(achieved_next, goals, info))
        want = out["reward"][r].shape
        if reward.shape != want:
            reward = reward.reshape(want) if reward.size == int(np.prod(want)) else reward
        if reward.shape != want:
            raise ValueError(f"compute_reward returned shape {reward.shape}, expected {want} "
                             "(one reward per relabeled sample)")
        out["reward"][r] = reward
    out["relabeled"] = r.copy()
    return finish(plan.base, out, ok)
