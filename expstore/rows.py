"""The row model: how env steps become the rows of a store.

* **One row per env step**: ``obs``, ``action``, ``reward``, ``terminated``, ``truncated`` and
  the user fields of the step. Each lane of a store is a ring of rows written in order.
* **One extra final row per finished episode**, right after the episode's last step: it
  holds the final observation (``next_obs`` of that step; a user field's ``next_<field>``
  when given, else zeros) and no action (zeros), flagged :data:`FLAG_LAST`.
* ``next_obs`` is not stored otherwise: the ``next_obs`` of a row is the ``obs`` of the next
  row of its lane (the final row for an episode's last step).
* **Step ids**: rows of a lane are numbered ``0, 1, 2...`` in the order written, final rows
  included; the step id of a row is its lane position counted over everything ever written
  (a ring slot is reused by step ``s + lane_capacity``).
* **Episode positions**: a row's position in its episode counts up from 0 at its episode's
  first row (:data:`FLAG_FIRST`) through the final row. An episode left open at the end of a
  write continues in the lane's next write.
* **Flags** (uint8 bit set per row): :data:`FLAG_FIRST`, :data:`FLAG_LAST`,
  :data:`FLAG_TERMINATED` / :data:`FLAG_TRUNCATED` (on the episode's last step, not on the
  final row), and :data:`FLAG_BAD` (in RAM only: the row's bytes are lost).

:func:`encode_steps` turns a batch of validated steps of one lane into its rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

FLAG_FIRST = np.uint8(1)  # first row of an episode
FLAG_LAST = np.uint8(2)  # final row: holds the final observation, no action
FLAG_TERMINATED = np.uint8(4)  # this row's transition ended the episode (no bootstrap)
FLAG_TRUNCATED = np.uint8(8)  # this row's transition was cut off (bootstrap)
FLAG_BAD = np.uint8(16)  # RAM only: the row's bytes are lost (quarantined); never read it
NO_ANCHOR = FLAG_LAST | FLAG_BAD  # rows no sample may start at


def encode_steps(values: Mapping[str, np.ndarray], names: Iterable[str],
                 open_episode_step: int, first_step: int = 0, ends: np.ndarray | None = None
                 ) -> tuple[dict[str, np.ndarray], int, int]:
    """The rows of ``T`` consecutive steps of one lane.

    ``values``: per name, an array with leading axis ``T`` (``terminated``/``truncated``
    bool; ``next_<name>`` optional, read at steps that end an episode). ``names``: the
    fields to write (each of ``values``). ``open_episode_step``: position in its episode of
    the lane's next row (0: a new episode). ``first_step``: step id of the first row.
    ``ends``: steps followed by a final row (default: terminated or truncated ones; more
    where the caller closes an episode the stream broke off).

    Returns ``(rows, next_open_episode_step, n_final)``: ``rows`` holds every name plus
    ``_episode_step`` (int32), ``_flags`` (uint8) and ``_step_id`` (int64), ``T + n_final``
    rows each (with no final row, ``rows[name]`` is ``values[name]`` itself);
    ``next_open_episode_step`` is ``open_episode_step`` for the write after this one;
    ``n_final``: episodes finished (final rows added).
    """
    T = len(values["reward"])
    term, trunc = values["terminated"], values["truncated"]
    done = (term | trunc) if ends is None else ends
    n_final = int(np.count_nonzero(done))
    n_rows = T + n_final
    flags = np.zeros(n_rows, np.uint8)
    if n_final == 0:  # no final row: the values are the rows (the caller copies them)
        rows: dict[str, np.ndarray] = {name: values[name] for name in names}
        flags |= term.astype(np.uint8) * FLAG_TERMINATED
        flags |= trunc.astype(np.uint8) * FLAG_TRUNCATED
        if open_episode_step == 0 and T:
            flags[0] |= FLAG_FIRST
        rows["_episode_step"] = np.arange(open_episode_step, open_episode_step + T,
                                          dtype=np.int32)
        rows["_flags"] = flags
        rows["_step_id"] = np.arange(first_step, first_step + T, dtype=np.int64)
        return rows, open_episode_step + T, 0
    # row position of each step: steps shift by one for each final row before them
    step_pos = np.arange(T) + np.concatenate([[0], np.cumsum(done)[:-1]])
    final_pos = step_pos[done] + 1
    rows = {}
    for name in names:
        v = values[name]
        arr = np.empty((n_rows, *v.shape[1:]), v.dtype)
        arr[step_pos] = v
        nxt = values.get("next_" + name)
        arr[final_pos] = 0 if nxt is None else nxt[done]  # obs; user fields when given
        rows[name] = arr
    flags[step_pos] |= term.astype(np.uint8) * FLAG_TERMINATED
    flags[step_pos] |= trunc.astype(np.uint8) * FLAG_TRUNCATED
    flags[final_pos] = FLAG_LAST
    # episode positions: count up from the lane's open episode, restart after final rows
    idx = np.arange(n_rows, dtype=np.int64)
    prev_final = np.maximum.accumulate(np.where(flags & FLAG_LAST, idx, -1))
    prev_final = np.concatenate([[-1], prev_final[:-1]])
    ep = idx - (prev_final + 1) + np.where(prev_final < 0, open_episode_step, 0)
    flags[ep == 0] |= FLAG_FIRST
    rows["_episode_step"] = ep.astype(np.int32)
    rows["_flags"] = flags
    rows["_step_id"] = np.arange(first_step, first_step + n_rows, dtype=np.int64)
    next_open = 0 if flags[-1] & FLAG_LAST else int(ep[-1]) + 1
    return rows, next_open, n_final
