"""Memories as SLM Lab specifies them, on expstore.

``Replay`` and ``PrioritizedReplay`` (off-policy) keep their experience in a disk store;
``OnPolicyReplay`` (whole episodes) and ``OnPolicyBatchReplay`` (every
``training_frequency`` steps) hold one training batch in RAM and are cleared when it is
sampled. Every memory has ``update(state, action, reward, next_state, done)``,
``sample()`` (SLM keys ``states, actions, rewards, next_states, dones``) and ``to_train``.
:func:`make_memory` builds one from SLM's memory spec dict::

    make_memory({"name": "PrioritizedReplay", "alpha": 0.6, "epsilon": 1e-4,
                 "batch_size": 32, "max_size": 10000, "use_cer": True}, url="runs/mem.zarr")
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..api import create
from ..errors import NotEnoughData, ValidationError
from ..field import Field
from ..sampling.prioritized import PrioritizedSampler
from ..sampling.uniform import UniformSampler
from ..spec import Spec

__all__ = ["OnPolicyBatchReplay", "OnPolicyReplay", "PrioritizedReplay", "Replay", "make_memory"]


def _field_for(name: str, value: Any) -> Field:
    arr = np.asarray(value)
    if arr.dtype == object:
        raise ValidationError(f"{name}: expected a numeric array, got {type(value).__name__}")
    dtype = arr.dtype
    if dtype.kind == "i":
        dtype = np.dtype(np.int64)
    return Field(arr.shape, dtype)


def _episode_done(done: Any, truncated: Any) -> bool:
    return bool(done) or bool(truncated)


class Replay:
    """SLM ``Replay``: uniform sampling of ``batch_size`` transitions from the newest
    ``max_size`` (at least) kept in a store; ``use_cer`` puts the newest one in every batch.

    The store is ``store``, or created at ``url`` (a temporary folder removed on
    :meth:`close` when omitted) from ``spec`` or from the first :meth:`update`'s values.
    ``to_train`` is true once ``max(batch_size, training_start_step)`` transitions are held
    and ``training_frequency`` updates happened since the last :meth:`sample`.
    """

    def __init__(self, batch_size: int = 32, max_size: int = 10000, use_cer: bool = False,
                 *, store: Any = None, url: str | os.PathLike | None = None,
                 spec: Spec | None = None, shard_rows: int | None = None,
                 training_frequency: int = 1, training_start_step: int = 0,
                 n_step: int = 1, gamma: float = 0.99, seed: int | None = None,
                 overwrite: bool = False) -> None:
        if int(batch_size) < 1:
            raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
        if int(max_size) < 1:
            raise ValueError(f"max_size: expected >= 1, got {max_size}")
        if int(training_frequency) < 1:
            raise ValueError(f"training_frequency: expected >= 1, got {training_frequency}")
        self.batch_size = int(batch_size)
        self.max_size = int(max_size)
        self.use_cer = bool(use_cer)
        self.training_frequency = int(training_frequency)
        self.training_start_step = int(training_start_step)
        # CER from the store would give the newest transition *with a stored next row*;
        # SLM's CER means the latest update, whose next_state is only in RAM until the next
        # step: the memory puts it in itself (one-step returns only).
        self._own_cer = self.use_cer and n_step == 1
        self._sampler_kw = dict(n_step=n_step, gamma=gamma, seed=seed,
                                cer=self.use_cer and not self._own_cer)
        self._latest: dict[str, Any] | None = None
        self._tmpdir: str | None = None
        self._url = None if url is None else os.fspath(url)
        self._overwrite = overwrite
        self._shard_rows = shard_rows or int(min(1024, max(16, 1 << (max(self.max_size, 1)
                                                                     // 8).bit_length())))
        if store is not None and store.lanes != 1:
            raise ValueError(f"store: a memory writes one env's steps; expected a store with "
                             f"1 lane, got {store.lanes}")
        self.store = store
        self.sampler: Any = None
        self.batch: dict[str, np.ndarray] | None = None
        self._since_train = 0
        self._open_episode = False
        self._last_next: Any = None
        self.seen_size = 0
        if store is None and spec is not None:
            self._create(spec)
        elif store is not None:
            self.sampler = self._make_sampler()

    # -- store -----------------------------------------------------------------------------
    def _create(self, spec: Spec) -> None:
        if self._url is None:
            self._tmpdir = tempfile.mkdtemp(prefix="expstore-memory-")
            self._url = os.path.join(self._tmpdir, "memory.zarr")
        self.store = create(self._url, spec, self.max_size, shard_rows=self._shard_rows,
                            overwrite=self._overwrite, headroom_rows=self._shard_rows)
        self.sampler = self._make_sampler()

    def _make_sampler(self) -> Any:
        return UniformSampler(self.store, **self._sampler_kw)

    # -- SLM API ---------------------------------------------------------------------------
    def update(self, state: Any, action: Any, reward: Any, next_state: Any, done: Any,
               truncated: Any = False) -> None:
        """Add one transition; ``done`` = terminated, ``truncated`` = cut off (bootstrap)."""
        if self.store is None:
            self._create(Spec.create(obs=_field_for("state", state),
                                     action=_field_for("action", action)))
        if self._open_episode and self._last_next is not None and \
                not np.array_equal(np.asarray(state), np.asarray(self._last_next)):
            raise ValidationError("state: differs from the previous step's next_state, but "
                                  "that step did not end the episode (pass done=True or "
                                  "truncated=True at episode ends)")
        self.store.add(obs=state, action=action, reward=reward, next_obs=next_state,
                       terminated=bool(done), truncated=bool(truncated))
        ended = _episode_done(done, truncated)
        step = int(self.store.index.count[0]) - (2 if ended else 1)
        self._latest = {"obs": state, "next_obs": next_state, "action": action,
                        "reward": reward, "terminated": bool(done),
                        "truncated": bool(truncated), "step": step}
        self._open_episode = not ended
        self._last_next = None if ended else next_state
        self._since_train += 1
        self.seen_size += 1

    def __len__(self) -> int:
        return 0 if self.store is None else len(self.store)

    @property
    def size(self) -> int:
        """Rows held (transitions plus one final row per finished episode)."""
        return len(self)

    @property
    def to_train(self) -> bool:
        return (len(self) >= max(self.batch_size, self.training_start_step)
                and self._since_train >= self.training_frequency)

    def sample(self) -> dict[str, Any]:
        """``batch_size`` transitions: SLM keys plus ``index``, ``step_id``, ``weight``."""
        if self.sampler is None:
            raise NotEnoughData("the memory is empty")
        b = self.sampler.sample(self.batch_size)
        if self._own_cer and self._latest is not None:
            self._put_latest(b)
        self.batch = b
        self._since_train = 0
        return _slm_batch(b)

    def _put_latest(self, b: dict[str, np.ndarray]) -> None:
        """CER: the last sample becomes the latest update (incl. its next_state)."""
        x = self._latest
        assert x is not None
        spec = self.store.spec
        vals = {**spec.flatten("obs", x["obs"]), **spec.flatten("action", x["action"])}
        vals.update({"next_" + k: v for k, v in spec.flatten("obs", x["next_obs"]).items()})
        vals.update(reward=x["reward"], terminated=x["terminated"], truncated=x["truncated"])
        for k, v in vals.items():
            b[k][-1] = v
        b["index"][-1] = self.store.index.lane_rows(0, np.array([x["step"]]))[0]
        b["step_id"][-1] = x["step"]
        b["weight"][-1] = 1.0

    def flush(self) -> None:
        if self.store is not None:
            self.store.flush()

    def close(self) -> None:
        """Close the store; a temporary one is deleted."""
        if self.store is not None:
            self.store.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


def _slm_batch(b: dict[str, np.ndarray]) -> dict[str, Any]:
    def group(prefix: str) -> Any:
        if prefix in b:
            return b[prefix]
        return {k[len(prefix) + 1:]: v for k, v in b.items() if k.startswith(prefix + ".")}

    out: dict[str, Any] = {
        "states": group("obs"), "actions": group("action"), "rewards": b["reward"],
        "next_states": group("next_obs"), "dones": b["terminated"].astype(np.float32),
        "truncateds": b["truncated"].astype(np.float32),
    }
    for k in ("index", "step_id", "weight", "horizon", "discount"):
        if k in b:
            out[k] = b[k]
    return out


class PrioritizedReplay(Replay):
    """SLM ``PrioritizedReplay``: proportional PER with ``alpha``, ``epsilon`` (and IS
    weights with ``beta`` in ``batch["weight"]``). After training on a batch call
    ``update_priorities(errors)``; it applies to the last sampled batch."""

    def __init__(self, batch_size: int = 32, max_size: int = 10000, use_cer: bool = False,
                 alpha: float = 0.6, epsilon: float = 1e-4, beta: float = 0.4,
                 beta_steps: int | None = None, **kwargs: Any) -> None:
        self.alpha = float(alpha)
        self.epsilon = float(epsilon)
        self.beta = float(beta)
        self.beta_steps = beta_steps
        super().__init__(batch_size, max_size, use_cer, **kwargs)

    def _make_sampler(self) -> Any:
        return PrioritizedSampler(self.store, alpha=self.alpha, eps=self.epsilon,
                                  beta=self.beta, beta_steps=self.beta_steps,
                                  **self._sampler_kw)

    def update_priorities(self, errors: Any, index: Any = None, step_id: Any = None) -> int:
        """Priorities from ``|errors|`` for the last sampled batch (or ``index``)."""
        if index is None:
            if self.batch is None:
                raise ValueError("update_priorities: no batch sampled yet (or pass index)")
            index, step_id = self.batch["index"], self.batch["step_id"]
        return self.sampler.update_priorities(index, errors, step_id)


class OnPolicyReplay:
    """SLM ``OnPolicyReplay``: whole episodes in RAM; ``to_train`` once
    ``training_frequency`` episodes finished; :meth:`sample` returns them (one array per
    episode under each key) and clears the memory."""

    keys = ("states", "actions", "rewards", "next_states", "dones", "truncateds")

    def __init__(self, training_frequency: int = 1, batch_size: int | None = None) -> None:
        if int(training_frequency) < 1:
            raise ValueError(f"training_frequency: expected >= 1, got {training_frequency}")
        self.training_frequency = int(training_frequency)
        self.batch_size = batch_size
        self.seen_size = 0
        self.reset()

    def reset(self) -> None:
        self.episodes: list[dict[str, list[Any]]] = []
        self.current: dict[str, list[Any]] = {k: [] for k in self.keys}
        self.to_train = False

    def __len__(self) -> int:
        """Transitions held (finished episodes and the open one)."""
        return sum(len(e["rewards"]) for e in self.episodes) + len(self.current["rewards"])

    @property
    def size(self) -> int:
        return len(self)

    def _add(self, state: Any, action: Any, reward: Any, next_state: Any, done: Any,
             truncated: Any) -> None:
        for k, v in zip(self.keys, (state, action, reward, next_state, float(bool(done)),
                                    float(bool(truncated)))):
            self.current[k].append(np.asarray(v))
        self.seen_size += 1

    def update(self, state: Any, action: Any, reward: Any, next_state: Any, done: Any,
               truncated: Any = False) -> None:
        self._add(state, action, reward, next_state, done, truncated)
        if _episode_done(done, truncated):
            self.episodes.append(self.current)
            self.current = {k: [] for k in self.keys}
            if len(self.episodes) >= self.training_frequency:
                self.to_train = True

    def sample(self) -> dict[str, list[np.ndarray]]:
        """Finished episodes: ``{key: [array per episode]}``; clears the memory."""
        batch = {k: [np.stack(e[k]) for e in self.episodes] for k in self.keys}
        current = self.current
        self.reset()
        self.current = current  # an unfinished episode stays for the next batch
        return batch


class OnPolicyBatchReplay(OnPolicyReplay):
    """SLM ``OnPolicyBatchReplay``: ``to_train`` every ``training_frequency`` steps;
    :meth:`sample` returns the steps as flat arrays and clears the memory."""

    def __init__(self, training_frequency: int = 32, batch_size: int | None = None) -> None:
        super().__init__(training_frequency, batch_size)

    def reset(self) -> None:
        super().reset()
        self.steps: dict[str, list[Any]] = {k: [] for k in self.keys}

    def __len__(self) -> int:
        return len(self.steps["rewards"])

    def update(self, state: Any, action: Any, reward: Any, next_state: Any, done: Any,
               truncated: Any = False) -> None:
        self.current = self.steps
        self._add(state, action, reward, next_state, done, truncated)
        if len(self) >= self.training_frequency:
            self.to_train = True

    def sample(self) -> dict[str, np.ndarray]:
        """Steps since the last sample: ``{key: array (T, ...)}``; clears the memory."""
        batch = {k: np.stack(v) if v else np.zeros(0) for k, v in self.steps.items()}
        self.reset()
        return batch


MEMORIES: dict[str, type] = {
    "Replay": Replay,
    "PrioritizedReplay": PrioritizedReplay,
    "OnPolicyReplay": OnPolicyReplay,
    "OnPolicyBatchReplay": OnPolicyBatchReplay,
}
_SPEC_KEYS = {
    "Replay": ("batch_size", "max_size", "use_cer"),
    "PrioritizedReplay": ("batch_size", "max_size", "use_cer", "alpha", "epsilon", "beta",
                          "beta_steps"),
    "OnPolicyReplay": ("training_frequency", "batch_size"),
    "OnPolicyBatchReplay": ("training_frequency", "batch_size"),
}


def make_memory(memory_spec: Mapping[str, Any], **kwargs: Any) -> Any:
    """A memory from SLM Lab's memory spec dict (``{"name": ..., ...}``); ``kwargs`` add
    expstore options (``url``, ``store``, ``spec``, ``seed``, ``training_frequency``...)."""
    if not isinstance(memory_spec, Mapping) or "name" not in memory_spec:
        raise ValueError(f"memory_spec: expected a dict with a 'name' (one of "
                         f"{list(MEMORIES)}), got {memory_spec!r}")
    d = dict(memory_spec)
    name = d.pop("name")
    if name not in MEMORIES:
        raise ValueError(f"memory_spec['name']: unknown memory {name!r}; expected one of "
                         f"{list(MEMORIES)}")
    unknown = [k for k in d if k not in _SPEC_KEYS[name]]
    if unknown:
        raise ValueError(f"memory_spec: unknown key(s) {unknown} for {name}; expected "
                         f"{list(_SPEC_KEYS[name])}")
    if name.startswith("OnPolicy"):
        allowed = {"training_frequency", "batch_size"}
        bad = [k for k in kwargs if k not in allowed]
        if bad:
            raise ValueError(f"{name} keeps its batch in RAM; it takes no {bad}")
    return MEMORIES[name](**{**d, **kwargs})
