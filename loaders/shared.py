"""Batches from DataLoader workers to the training process through reused shared memory.

PyTorch hands a tensor from a worker process to the training process by moving it into a fresh
shared-memory segment (``shm_open``, ``ftruncate``, ``mmap``, copy) and sending its file descriptor.
On the benchmark VM that took about 40 ms for a 32 MiB batch, twice what cutting the batch takes,
nearly all of it page faults on the new segment. Here a worker cuts each batch straight into one of
a few shared-memory tensors it keeps: PyTorch then only sends the descriptor of a segment that
already exists, and the training process maps it.

A buffer is reused only once the training process has dropped every tensor that views it. The
batch travels as a :class:`Delivery` (a ``dict``); unpickled in the training process it becomes a
plain ``dict`` again and puts a finalizer on the buffer's storage (PyTorch keeps one Python object
per storage while any tensor or view uses it, so the finalizer runs when the last view is gone).
The finalizer clears the buffer's ticket in a small shared array the worker reads before it takes a
buffer. Whatever goes wrong — a ``collate_fn`` that rebuilds the dict, a batch never unpickled, a
consumer that keeps every batch — the ticket stays set and the worker takes another buffer, up to
:data:`SLOTS`, then falls back to PyTorch's own copy: slower, never unsafe.
"""

from __future__ import annotations

import itertools
import os
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["SLOTS", "Delivery", "Lease", "SharedBatches", "worker_pool"]

#: shared-memory batch buffers per worker process (DataLoader's prefetch_factor batches are queued per worker,
#: one more is being cut and the training loop holds one or two)
SLOTS = 8


@dataclass
class Lease:
    """A buffer taken for one batch: its tensor, a numpy view of it, and its slot and ticket."""

    tensor: torch.Tensor
    array: np.ndarray
    slot: int
    ticket: int
    pool: SharedBatches

    def give_back(self) -> None:
        """The batch did not go out in this buffer (it was copied): the worker may take it again."""
        _release(self.pool.tickets, self.slot, self.ticket)


def _release(tickets: torch.Tensor, slot: int, ticket: int) -> None:
    # only the lease's own ticket is cleared: a late finalizer never frees a buffer taken again since
    if int(tickets[slot]) == ticket:
        tickets[slot] = 0


class SharedBatches:
    """One worker process's shared-memory batch buffers and their tickets (0 = free)."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.pid = os.getpid()
        self.tickets = torch.zeros(slots, dtype=torch.int64).share_memory_()
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._count = itertools.count(1)

    def take(self, shape: tuple[int, ...]) -> Lease | None:
        """A free buffer of ``shape`` (float32), or ``None`` when every buffer is still out."""
        for slot, buf in enumerate(self._buffers):
            if int(self.tickets[slot]) != 0:
                continue
            if buf is None or tuple(buf.shape) != shape:
                buf = torch.empty(shape, dtype=torch.float32).share_memory_()
                self._buffers[slot] = buf
            ticket = next(self._count)
            self.tickets[slot] = ticket
            return Lease(buf, buf.numpy(), slot, ticket, self)
        return None


_POOL: SharedBatches | None = None


def worker_pool() -> SharedBatches:
    """This process's pool (a forked worker makes its own: the parent's buffers are the parent's)."""
    global _POOL
    if _POOL is None or _POOL.pid != os.getpid():
        _POOL = SharedBatches()
    return _POOL


class Delivery(dict[str, Any]):
    """A batch cut into a shared buffer, on its way to the training process; a plain ``dict`` there."""

    __slots__ = ("lease",)

    def __init__(self, batch: dict[str, Any], lease: Lease) -> None:
        super().__init__(batch)
        self.lease = lease

    def __copy__(self) -> Delivery:  # DataLoader's default_convert copies the batch in the worker
        return Delivery(self, self.lease)

    def __reduce__(self) -> tuple[Any, ...]:
        lease = self.lease
        return _arrive, (dict(self), lease.pool.tickets, lease.slot, lease.ticket)


def _arrive(batch: dict[str, Any], tickets: torch.Tensor, slot: int, ticket: int) -> dict[str, Any]:
    """Unpickling a :class:`Delivery`: the buffer goes back to its worker when its storage is freed here."""
    weakref.finalize(batch["image"].untyped_storage(), _release, tickets, slot, ticket)
    return batch
