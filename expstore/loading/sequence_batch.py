"""Execute a :class:`~expstore.sampling.plans.SequencePlan`: rows -> ``(B, W, ...)``.

Like a transition batch, every row is read with the lane step the
plan expects (each distinct row once); a sequence any of whose rows was overwritten is
replaced by a spare or a delivered one and counted as stale. Masked positions (outside the
start row's episode) are zero-filled, never read from another episode.
"""

from __future__ import annotations

import numpy as np

from ..sampling.plans import SequencePlan
from ..storage.format import Layout
from .columns import RowSource, finish, read_unique


def assemble_sequences(plan: SequencePlan, layout: Layout,
                       source: RowSource) -> tuple[dict, int]:
    """Batch dict (every field ``(B, W, ...)``, ``mask``, ``is_first``, ``is_last``,
    ``index``, ``step_id``, ``weight``) and the number of stale sequences replaced."""
    spec = layout.spec
    n_all = len(plan.rows)
    ok = np.ones(n_all, bool)
    out: dict[str, np.ndarray] = {}
    K = plan.history + 1
    off = ~plan.mask
    for name, f in spec.fields.items():
        if name in spec.obs_names and f.stack:
            k = f.stack
            rows = plan.stack_rows[:, :, K - k:]
            steps = plan.stack_steps[:, :, K - k:]
            vals, good = read_unique(source, layout, name, rows, steps)
            if f.padding == "zero":
                vals[plan.stack_pad[:, :, K - k:]] = 0
        else:
            vals, good = read_unique(source, layout, name, plan.win_rows, plan.win_steps)
        ok &= good.reshape(n_all, -1).all(axis=1)
        vals[off] = 0
        out[name] = vals
    out["mask"] = plan.mask.copy()
    out["is_first"] = plan.is_first.copy()
    out["is_last"] = plan.is_last.copy()
    return finish(plan, out, ok)
