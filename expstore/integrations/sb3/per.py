"""Prioritized replay for SB3 (which has none, DLR-RM/stable-baselines3#1242).

``PrioritizedDQN(policy, env, replay_buffer_kwargs={"url": path})`` is SB3's DQN with an
:class:`PrioritizedExpstoreReplayBuffer`: the loss is weighted by importance weights and
``|TD error|`` goes back to the buffer as priorities after every gradient step; ``beta``
anneals from the buffer's ``beta`` to ``beta_final`` over the training run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import DQN
from torch.nn import functional as F

from ...sampling.by_priority import BetaSchedule
from .buffer import ExpstoreReplayBuffer
from .mirror import RamMirror


class PrioritizedExpstoreReplayBuffer(ExpstoreReplayBuffer):
    """:class:`ExpstoreReplayBuffer` sampling by priority (``(|δ| + eps) ** alpha``).

    ``beta`` is the importance-sampling exponent (``beta_final``/``beta_steps``: linear
    annealing per batch, see :class:`~expstore.PrioritizedSampler`). With the RAM mirror,
    priorities live in a sum-tree over the mirror's transitions (index = ``pos * n_envs +
    env``) and travel with the buffer's pickle; without it they are saved with the store
    on flush and reloaded when the store is reopened.
    """

    def __init__(self, *args: Any, alpha: float = 0.6, beta: float = 0.4,
                 beta_final: float = 1.0, beta_steps: int | None = None, eps: float = 1e-6,
                 **kwargs: Any) -> None:
        self._per = dict(alpha=alpha, beta=beta, beta_final=beta_final,
                         beta_steps=beta_steps, eps=eps)
        super().__init__(*args, **kwargs)

    def _make_mirror(self, mirror: bool | None) -> RamMirror | None:
        m = super()._make_mirror(mirror)
        if m is not None:
            self._enable_priorities(m)
        return m

    def _enable_priorities(self, m: RamMirror | None = None) -> None:
        p = self._per
        (m or self._mirror).enable_priorities(  # type: ignore[union-attr]
            p["alpha"], p["eps"], BetaSchedule(p["beta"], p["beta_final"], p["beta_steps"]))

    def _make_sampler(self, seed: int) -> Any:
        from ...sampling.prioritized import PrioritizedSampler

        return PrioritizedSampler(self.store, n_step=self.n_steps, gamma=self.gamma, seed=seed,
                                  **self._per)

    def set_beta(self, beta: float) -> None:
        """Use ``beta`` for the next batches (constant until set again)."""
        if self._mirror is not None:
            self._mirror.schedule = BetaSchedule(float(beta))
        else:
            self.sampler.beta_schedule = BetaSchedule(float(beta))


class PrioritizedDQN(DQN):
    """SB3 ``DQN`` with prioritized experience replay on an expstore store.

    Arguments as for ``DQN``; ``replay_buffer_class`` defaults to
    :class:`PrioritizedExpstoreReplayBuffer` (pass ``alpha``, ``beta``, ``eps``, ``url`` in
    ``replay_buffer_kwargs``). ``beta_final``: ``beta`` reached at the end of ``learn``
    (linear in training progress; ``None`` leaves ``beta`` to the buffer).
    """

    def __init__(self, *args: Any, beta_final: float | None = 1.0, **kwargs: Any) -> None:
        kwargs.setdefault("replay_buffer_class", PrioritizedExpstoreReplayBuffer)
        self.beta_final = beta_final
        super().__init__(*args, **kwargs)

    def _setup_model(self) -> None:
        super()._setup_model()
        if not hasattr(self.replay_buffer, "update_priorities"):
            raise TypeError(f"PrioritizedDQN: replay_buffer_class must be an expstore buffer "
                            f"(with update_priorities), got {type(self.replay_buffer).__name__}")
        self._beta0 = float(getattr(self.replay_buffer, "_per", {}).get("beta", 0.4))

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        buf = self.replay_buffer
        if self.beta_final is not None and hasattr(buf, "set_beta"):
            done = min(max(1.0 - self._current_progress_remaining, 0.0), 1.0)
            buf.set_beta(self._beta0 + done * (self.beta_final - self._beta0))
        losses = []
        for _ in range(gradient_steps):
            data = buf.sample(batch_size, env=self._vec_normalize_env)
            discounts = data.discounts if data.discounts is not None else self.gamma
            with th.no_grad():
                next_q, _ = self.q_net_target(data.next_observations).max(dim=1)
                target = data.rewards + (1 - data.dones) * discounts * next_q.reshape(-1, 1)
            current = th.gather(self.q_net(data.observations), dim=1, index=data.actions.long())
            per_sample = F.smooth_l1_loss(current, target, reduction="none")
            loss = (data.weights * per_sample).mean()
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            td = (current - target).detach().abs().cpu().numpy().reshape(-1)
            buf.update_priorities(data.index, td, data.step_id)
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", float(np.mean(losses)))
