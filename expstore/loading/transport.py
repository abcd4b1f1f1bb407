"""How a batch crosses from a DataLoader worker to the training process: shared slots.

PyTorch's default moves every tensor a worker returns into a fresh shared-memory segment
and passes its file descriptor to the main process: per batch, one segment per field,
first-touch page faults for every page written (a 32-frame-stack batch is 1.8 MB, ~450
faults, ~2 ms here), and a socket round trip per descriptor.

Instead each worker keeps a few shared-memory *slots* and writes batches straight into
them (frame stacks are gathered into the slot, not copied afterwards). A slot's buffer is
sent to the main process once; later messages only name the slot. The main process
hands out tensors that are views of the slot, and the slot is free again when the last
of them is gone (tracked through a per-batch lease object that the views keep alive),
or right after the copy when batches are pinned. A slot table in shared memory tells
the worker which slots are free; with none free it falls back to a one-off buffer.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

_ALIGN = 64  # bytes: every field starts aligned for any dtype view
FREE, BUSY = 0, 1


def _shared(nbytes: int) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(max(int(nbytes), 1))
    return torch.empty(0, dtype=torch.uint8).set_(storage)


#: a field of one or more batches, stored back to back: (batches, name, numpy dtype str,
#: shape of one batch's array, byte offset of the first, bytes of each)
Block = tuple[tuple[int, ...], str, str, tuple[int, ...], int, int]


def _layout(specs: list[dict[str, tuple[tuple[int, ...], np.dtype]]]
            ) -> tuple[tuple[Block, ...], int]:
    """Byte layout of batches in a slot, field by field: a field every batch has with the
    same shape is one block, which the main process opens as one tensor and splits in one
    call. Memoized (messages of a loader look alike)."""
    key = tuple(tuple((name, tuple(int(x) for x in shape), np.dtype(dtype).str)
                      for name, (shape, dtype) in batch.items()) for batch in specs)
    hit = _LAYOUTS.get(key)
    if hit is None:
        members: dict[tuple, list[int]] = {}
        for i, batch in enumerate(key):
            for entry in batch:
                members.setdefault(entry, []).append(i)
        blocks, total = [], 0
        for (name, shape, dtype), ids in members.items():
            total = -(-total // _ALIGN) * _ALIGN
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            blocks.append((tuple(ids), name, dtype, shape, total, n))
            total += n * len(ids)
        if len(_LAYOUTS) > 64:
            _LAYOUTS.clear()
        hit = _LAYOUTS[key] = (tuple(blocks), total)
    return hit


_LAYOUTS: dict[tuple, tuple[tuple[Block, ...], int]] = {}


def _views(raw: np.ndarray, blocks: tuple[Block, ...], n_batches: int
           ) -> list[dict[str, np.ndarray]]:
    out: list[dict[str, np.ndarray]] = [{} for _ in range(n_batches)]
    for ids, name, dtype, shape, off, n in blocks:
        arr = raw[off : off + n * len(ids)].view(dtype).reshape(len(ids), *shape)
        for j, i in enumerate(ids):
            out[i][name] = arr[j]
    return out


@dataclass
class Message:
    """What a worker returns for one batch (small unless it carries a new buffer)."""

    key: tuple[int, int]  # (loader token, worker pid)
    slot: int  # -1: a one-off buffer, carried in ``buffer``
    blocks: tuple  # the layout (see ``Block``)
    n_batches: int
    nbytes: int
    buffer: torch.Tensor | None = None  # the slot's buffer when new (or grown), or one-off
    control: torch.Tensor | None = None  # the worker's slot table, sent with its first batch
    pinned: torch.Tensor | None = field(default=None, repr=False)  # copy_out's own buffer
    #: set where a message is unpickled (the main process): a message dropped unopened
    #: (e.g. prefetched when an iterator is shut down) frees its slot
    _received: bool = field(default=False, repr=False, compare=False)
    _opened: bool = field(default=False, repr=False, compare=False)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._received = True
        _register(self)

    def __del__(self) -> None:
        if self._received and not self._opened:
            _release(self)

    def pin_memory(self, device: Any = None) -> Message:
        """Called by DataLoader's pin-memory thread: copy into pinned memory, free the slot."""
        return self.copy_out(pin=True)

    def copy_out(self, pin: bool = False) -> Message:
        """A message holding its own copy of the batches (page-locked with ``pin``); the
        slot is free again at once."""
        src = _resolve_buffer(self)
        copy = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin)
        copy.copy_(src[: self.nbytes])
        self._opened = True
        _release(self)
        return Message(self.key, -1, self.blocks, self.n_batches, self.nbytes, pinned=copy)


class SlotWriter:
    """Worker side: allocates batches in reusable shared slots (an ``Allocator``)."""

    def __init__(self, token: int, n_slots: int) -> None:
        self.key = (token, os.getpid())
        self.control = _shared(n_slots)
        self._control_sent = False
        self.buffers: list[torch.Tensor | None] = [None] * n_slots
        self._state = self.control.numpy()
        self._current: tuple[int, tuple, int, int, torch.Tensor | None] | None = None

    def __call__(self, specs: list[dict[str, tuple[tuple[int, ...], np.dtype]]]
                 ) -> list[dict[str, np.ndarray]]:
        blocks, total = _layout(specs)
        free = np.flatnonzero(self._state == FREE)
        new = None
        if len(free):
            slot = int(free[0])
            buf = self.buffers[slot]
            if buf is None or buf.numel() < total:
                buf = new = self.buffers[slot] = _shared(total)
            self._state[slot] = BUSY
        else:  # every slot is still held by the consumer: a one-off buffer
            slot, buf = -1, None
            buf = new = _shared(total)
        self._current = (slot, blocks, len(specs), total, new)
        return _views(buf.numpy(), blocks, len(specs))

    def message(self) -> Message:
        slot, blocks, n_batches, total, new = self._current
        control = None
        if not self._control_sent:
            control, self._control_sent = self.control, True
        return Message(self.key, slot, blocks, n_batches, total, new, control)


# main process: the slot buffers and tables of every live worker, by Message.key
_workers: dict[tuple[int, int], dict[str, Any]] = {}


def _register(msg: Message) -> None:
    """Keep the slot table and new slot buffers a message brought (main process)."""
    entry = _workers.setdefault(msg.key, {"control": None, "slots": {}})
    if msg.control is not None:
        entry["control"] = msg.control.numpy()
    if msg.buffer is not None and msg.slot >= 0:
        entry["slots"][msg.slot] = msg.buffer


def _resolve_buffer(msg: Message) -> torch.Tensor:
    if msg.pinned is not None:
        return msg.pinned
    if msg.slot < 0:
        return msg.buffer
    return _workers[msg.key]["slots"][msg.slot]


def _release(msg: Message) -> None:
    if msg.slot >= 0:
        entry = _workers.get(msg.key)
        if entry is not None and entry["control"] is not None:
            entry["control"][msg.slot] = FREE


def open_message(msg: Message, device: torch.device | None = None
                 ) -> tuple[list[dict[str, torch.Tensor]], dict[str, np.ndarray]]:
    """The tensors of each batch but the last, and the last batch's fields as numpy copies
    (the writer's own bookkeeping, read on the host).

    On the CPU the tensors are views of the slot, which is freed once none of them is
    referenced any more. With ``device``, the whole message is copied in one transfer
    (``non_blocking``: asynchronous from pinned memory) and the slot freed at once.
    """
    src = _resolve_buffer(msg)
    msg._opened = True
    last = msg.n_batches - 1
    raw = src.numpy()
    host = {name: raw[off : off + n].view(dtype).reshape(shape).copy()
            for ids, name, dtype, shape, off, n in msg.blocks if ids == (last,)}
    if device is not None:
        src = src[: msg.nbytes].to(device, non_blocking=True)
        _release(msg)  # a pageable source is consumed before ``to`` returns
    elif msg.slot >= 0 and msg.pinned is None:
        lease = raw[: msg.nbytes]  # one new object per message, kept alive by the views
        weakref.finalize(lease, _release, msg)
        src = torch.frombuffer(lease, dtype=torch.uint8) if msg.nbytes else src[:0]
    batches: list[dict[str, torch.Tensor]] = [{} for _ in range(last)]
    for ids, name, dtype, shape, off, n in msg.blocks:
        if ids[-1] == last:
            ids = ids[:-1]
        if ids:
            block = src[off : off + n * len(ids)].view(_torch_dtype(dtype))
            for i, t in zip(ids, block.view(len(ids), *shape).unbind(0)):
                batches[i][name] = t
    return batches, host


def forget_worker(token: int) -> None:
    """Drop the main process's references to the slots of a loader's workers."""
    for key in [k for k in _workers if k[0] == token]:
        del _workers[key]


_TORCH_DTYPES: dict[str, torch.dtype] = {}


def _torch_dtype(dtype: str) -> torch.dtype:
    t = _TORCH_DTYPES.get(dtype)
    if t is None:
        t = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype
    return t
