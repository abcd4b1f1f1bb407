"""A numpy-only port of Dopamine's ``OutOfGraphReplayBuffer`` (circular_replay_buffer.py).

Reference behaviour for the Dopamine import/export tests: ``add`` pads ``stack_size - 1``
zero transitions before every episode, ``save``/``load`` use ``np.save``/``np.load`` inside
``gzip.GzipFile`` with the ``$store$_`` prefix, and ``is_valid_transition`` /
``sample_transition_batch`` decide what Dopamine would train on. Only TensorFlow file I/O
(``tf.gfile``) is replaced by plain ``open``.
"""

from __future__ import annotations

import gzip
import os
import pickle

import numpy as np

STORE_FILENAME_PREFIX = "$store$_"


def invalid_range(cursor, replay_capacity, stack_size, update_horizon):
    assert cursor < replay_capacity
    return np.array([(cursor - update_horizon + i) % replay_capacity
                     for i in range(stack_size + update_horizon)])


class OutOfGraphReplayBuffer:
    def __init__(self, observation_shape, stack_size, replay_capacity, update_horizon=1,
                 gamma=0.99, extra_storage_types=None, observation_dtype=np.uint8):
        self._observation_shape = tuple(observation_shape)
        self._stack_size = stack_size
        self._replay_capacity = replay_capacity
        self._update_horizon = update_horizon
        self._gamma = gamma
        self._observation_dtype = observation_dtype
        self._extra_storage_types = list(extra_storage_types or [])  # (name, shape, dtype)
        self._store = {name: np.empty((replay_capacity, *shape), dtype=dtype)
                       for name, shape, dtype in self.get_storage_signature()}
        self.add_count = np.array(0)
        self.invalid_range = np.zeros(self._stack_size)
        self._cumulative_discount_vector = np.array(
            [gamma ** n for n in range(update_horizon)], dtype=np.float32)

    def get_storage_signature(self):
        return [("observation", self._observation_shape, self._observation_dtype),
                ("action", (), np.int32), ("reward", (), np.float32),
                ("terminal", (), np.uint8)] + self._extra_storage_types

    def _add_zero_transition(self):
        self._add(*[np.zeros(shape, dtype) for _, shape, dtype in self.get_storage_signature()])

    def add(self, observation, action, reward, terminal, *args):
        if self.is_empty() or self._store["terminal"][self.cursor() - 1] == 1:
            for _ in range(self._stack_size - 1):
                self._add_zero_transition()
        self._add(observation, action, reward, terminal, *args)

    def _add(self, *args):
        cursor = self.cursor()
        for (name, _, _), arg in zip(self.get_storage_signature(), args):
            self._store[name][cursor] = arg
        self.add_count += 1
        self.invalid_range = invalid_range(self.cursor(), self._replay_capacity,
                                           self._stack_size, self._update_horizon)

    def is_empty(self):
        return self.add_count == 0

    def is_full(self):
        return self.add_count >= self._replay_capacity

    def cursor(self):
        return int(self.add_count % self._replay_capacity)

    def get_range(self, array, start_index, end_index):
        assert end_index > start_index
        if start_index % self._replay_capacity < end_index % self._replay_capacity:
            return array[start_index:end_index, ...]
        indices = [(start_index + i) % self._replay_capacity
                   for i in range(end_index - start_index)]
        return array[indices, ...]

    def get_observation_stack(self, index):
        state = self.get_range(self._store["observation"], index - self._stack_size + 1,
                               index + 1)
        return np.moveaxis(state, 0, -1)

    def get_terminal_stack(self, index):
        return self.get_range(self._store["terminal"], index - self._stack_size + 1, index + 1)

    def is_valid_transition(self, index):
        if index < 0 or index >= self._replay_capacity:
            return False
        if not self.is_full():
            if index >= self.cursor() - self._update_horizon:
                return False
            if index < self._stack_size - 1:
                return False
        if index in set(self.invalid_range):
            return False
        if self.get_terminal_stack(index)[:-1].any():
            return False
        return True

    def sample_transition(self, state_index):
        """(state, action, reward, next_state, terminal) as sample_transition_batch builds."""
        traj = [(state_index + j) % self._replay_capacity for j in range(self._update_horizon)]
        terms = self._store["terminal"][traj]
        is_terminal = terms.any()
        length = self._update_horizon if not is_terminal else int(np.argmax(terms.astype(bool))) + 1
        nxt = state_index + length
        rewards = self.get_range(self._store["reward"], state_index, nxt)
        reward = self._cumulative_discount_vector[:length].dot(rewards)
        return (self.get_observation_stack(state_index),
                self._store["action"][state_index], reward,
                self.get_observation_stack(nxt % self._replay_capacity), int(is_terminal))

    def _filename(self, checkpoint_dir, name, suffix):
        return os.path.join(checkpoint_dir, f"{name}_ckpt.{suffix}.gz")

    def _checkpointable(self):
        out = {}
        for member_name, member in self.__dict__.items():
            if member_name == "_store":
                for array_name, array in self._store.items():
                    out[STORE_FILENAME_PREFIX + array_name] = array
            elif not member_name.startswith("_"):
                out[member_name] = member
        return out

    def save(self, checkpoint_dir, iteration_number, compresslevel=9):
        for attr in self._checkpointable():
            filename = self._filename(checkpoint_dir, attr, iteration_number)
            with open(filename, "wb") as f, \
                    gzip.GzipFile(fileobj=f, mode="wb", compresslevel=compresslevel) as outfile:
                if attr.startswith(STORE_FILENAME_PREFIX):
                    np.save(outfile, self._store[attr[len(STORE_FILENAME_PREFIX):]],
                            allow_pickle=False)
                elif isinstance(self.__dict__[attr], np.ndarray):
                    np.save(outfile, self.__dict__[attr], allow_pickle=False)
                else:
                    pickle.dump(self.__dict__[attr], outfile)

    def load(self, checkpoint_dir, suffix):
        for attr in self._checkpointable():
            filename = self._filename(checkpoint_dir, attr, suffix)
            if not os.path.exists(filename):
                raise FileNotFoundError(f"Missing file: {filename}")
        for attr in self._checkpointable():
            filename = self._filename(checkpoint_dir, attr, suffix)
            with open(filename, "rb") as f, gzip.GzipFile(fileobj=f) as infile:
                if attr.startswith(STORE_FILENAME_PREFIX):
                    self._store[attr[len(STORE_FILENAME_PREFIX):]] = np.load(
                        infile, allow_pickle=False)
                elif isinstance(self.__dict__[attr], np.ndarray):
                    self.__dict__[attr] = np.load(infile, allow_pickle=False)
                else:
                    self.__dict__[attr] = pickle.load(infile)


def pong_frames(n: int, seed: int = 0, shape=(84, 84)) -> np.ndarray:
    """``n`` Pong-like uint8 frames (grey background, walls, paddles, ball): they compress
    like preprocessed Atari frames and are never all zero."""
    rng = np.random.default_rng(seed)
    h, w = shape
    out = np.full((n, h, w), 87, np.uint8)
    out[:, 12:14, :] = out[:, h - 5:h - 3, :] = 236
    t = np.arange(n)
    p1 = (20 + 25 * (1 + np.sin(t / 17.0))).astype(int) % (h - 30) + 14
    p2 = (20 + 25 * (1 + np.cos(t / 23.0 + rng.random()))).astype(int) % (h - 30) + 14
    bx = (np.abs((t * 3 + int(rng.integers(0, 100))) % 140 - 70) + 7).clip(0, w - 3)
    by = (np.abs((t * 2 + int(rng.integers(0, 100))) % 110 - 55) + 16).clip(0, h - 6)
    for i in range(n):
        out[i, p1[i]:p1[i] + 8, 8:10] = 147
        out[i, p2[i]:p2[i] + 8, w - 10:w - 8] = 123
        out[i, by[i]:by[i] + 2, bx[i]:bx[i] + 1] = 236
    return out


def write_repeated_checkpoint(directory, suffix: int, repeats: int, episode: int = 1997,
                              stack_size: int = 4, compresslevel: int = 1, seed: int = 0):
    """A large, valid Dopamine checkpoint written fast: one block of ``stack_size - 1``
    padding rows + an ``episode``-step terminated episode, repeated ``repeats`` times.

    The observation file is a header gzip member followed by the same compressed member
    ``repeats`` times (a multi-member gzip stream, which ``gzip``/``np.load`` read as one);
    ``add_count == capacity`` so the buffer is exactly full. Returns the capacity.
    """
    pad = stack_size - 1
    block = pad + episode
    cap = block * repeats
    frames = np.zeros((block, 84, 84), np.uint8)
    frames[pad:] = pong_frames(episode, seed)
    member = gzip.compress(frames.tobytes(), compresslevel)
    from expstore.datasets.npy_gzip import npy_header  # internals: the .npy.gz codec

    path = os.path.join(directory, f"{STORE_FILENAME_PREFIX}observation_ckpt.{suffix}.gz")
    with open(path, "wb") as f:
        f.write(gzip.compress(npy_header((cap, 84, 84), np.uint8), compresslevel))
        for _ in range(repeats):
            f.write(member)
    rng = np.random.default_rng(seed)
    action = np.zeros(block, np.int32)
    action[pad:] = rng.integers(0, 6, episode)
    reward = np.zeros(block, np.float32)
    reward[pad:] = rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0], episode)
    terminal = np.zeros(block, np.uint8)
    terminal[-1] = 1
    arrays = {"action": np.tile(action, repeats), "reward": np.tile(reward, repeats),
              "terminal": np.tile(terminal, repeats), "add_count": np.array(cap),
              "invalid_range": invalid_range(0, cap, stack_size, 1)}
    for name, arr in arrays.items():
        prefix = "" if name in ("add_count", "invalid_range") else STORE_FILENAME_PREFIX
        with open(os.path.join(directory, f"{prefix}{name}_ckpt.{suffix}.gz"), "wb") as f, \
                gzip.GzipFile(fileobj=f, mode="wb", compresslevel=compresslevel) as g:
            np.save(g, arr, allow_pickle=False)
    return cap
