"""Dopamine replay checkpoints (the DQN Replay Dataset format) <-> expstore.

A checkpoint ``N`` of Dopamine's ``OutOfGraphReplayBuffer`` is a folder of gzip'd ``np.save``
files: ``$store$_observation_ckpt.N.gz`` (C, 84, 84) uint8 single frames,
``$store$_action_ckpt.N.gz`` (C,) int32, ``$store$_reward_ckpt.N.gz`` (C,) float32,
``$store$_terminal_ckpt.N.gz`` (C,) uint8, ``$store$_<extra>_ckpt.N.gz`` for extra storage
types, and ``add_count_ckpt.N.gz`` (0-d int64) / ``invalid_range_ckpt.N.gz`` (int64). ``C`` is
the replay capacity; the buffer is a ring, so when ``add_count > C`` the oldest row sits at
``add_count % C``. Dopamine's ``add()`` writes ``stack_size - 1`` all-zero *padding rows*
before every episode (after each terminal and at the start), stores no final observation
after a terminal, and ``invalid_range`` lists the rows around the write cursor that cannot
start a transition (the last row written and the ``stack_size`` rows after it).

Mapping (one checkpoint = one expstore lane, in chronological order):

* padding rows are dropped on import and written again on export; frame stacks are
  zero-padded at episode start (``Field(padding="zero")``), exactly Dopamine's stacks;
* ``terminal=1`` ends an episode as *terminated*; its final row holds an all-zero frame,
  which is what Dopamine's buffer holds after a terminal (its first padding row), so the
  stacked ``next_obs`` of a terminal transition equals Dopamine's ``next_state``;
* the newest episode (ending at the cursor without a terminal) stays open: its last row
  cannot start a transition, as in Dopamine;
* the oldest episode of a wrapped buffer continues one whose start was overwritten: it is
  stored at episode position ``stack_size - 1`` onward, so its first ``stack_size - 1`` rows
  (Dopamine's ``invalid_range`` after the cursor) cannot start transitions either. Leading
  all-zero rows of a wrapped buffer are taken as padding (a new episode starts after them).

A whole run imports straight from a local folder or any fsspec URL (the DQN Replay
Dataset: ``gs://atari-replay-datasets/dqn/<Game>/<run>/replay_logs``): files are streamed,
never copied; checkpoints are decoded in parallel, one worker process per core
(:mod:`expstore.datasets.lanes`); gzip inflates with ``isal`` when installed. The store is
marked as a partial import until every checkpoint is in, and the same import resumes it
(:mod:`.lane`: source rows map to store rows deterministically).

Every stored row (all fields) survives import -> export -> import unchanged. Export writes
what Dopamine's ``save()`` writes (``np.save`` into ``gzip.GzipFile``, level 9), unwrapped,
one checkpoint suffix per lane (and per interrupted episode within a lane); episodes that
ended *truncated* are written with ``terminal=1`` (Dopamine's runner records episodes cut
at ``max_steps_per_episode`` the same way) and final observations are dropped (Dopamine
stores none). The arrays have ``capacity`` rows (default: the rows written + 1, so the buffer
is not "full" and every transition but the newest can be sampled by Dopamine).
"""

from __future__ import annotations

from ..source import SourceFolder
from .checkpoint import (
    STORE_PREFIX,
    Checkpoint,
    ckpt_name,
    ckpt_path,
    dopamine_invalid_range,
    dopamine_spec,
    find_suffixes,
    inspect_checkpoint,
)
from .export import export_dopamine
from .importer import import_dopamine, parse_suffixes

__all__ = ["Checkpoint", "STORE_PREFIX", "SourceFolder", "ckpt_name", "ckpt_path",
           "dopamine_invalid_range", "dopamine_spec", "export_dopamine", "find_suffixes",
           "import_dopamine", "inspect_checkpoint", "parse_suffixes"]
