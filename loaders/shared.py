"""Batches from DataLoader workers to the training process through reused shared memory.

PyTorch hands a tensor from a worker process to the training process by moving it into a fresh
shared-memory segment (``shm_open``, ``ftruncate``, ``mmap``, copy) and sending its file descriptor.
On the benchmark VM that took about 40 ms for a 32 MiB batch, twice what cutting the batch takes,
nearly all of it page faults on the new segment. Here a worker cuts each batch straight into one of
a few shared-memory tensors it keeps.

Even a segment that already exists costs, per tensor and per batch, a connection to the worker's
descriptor-sharing thread to pass its file descriptor, and a new mapping in the training process: a
batch held 4-5 tensors, and the training process spent ~2 ms of CPU per batch receiving them (a
profile of a 2-worker epoch, 3072 x 3072 x 96 px). So each buffer is passed once: the training
process keeps it mapped (``_RECEIVED``) and marks it in a small shared array (``mapped``) the worker
reads; from then on a batch names its worker's pool and slot, and the small tensors (windows,
weights, labels up to :data:`INLINE_BYTES`) travel inside the pickle as NumPy arrays.

A buffer is reused only once the training process has dropped every tensor that views it. The
batch travels as a :class:`Delivery` (a ``dict``); unpickled in the training process it becomes a
plain ``dict`` again whose image is a new tensor over the mapped buffer, and puts a finalizer on that
tensor's storage (PyTorch keeps one Python object per storage while any tensor or view uses it, so
the finalizer runs when the last view is gone). The finalizer clears the buffer's ticket in a small
shared array the worker reads before it takes a buffer. Whatever goes wrong — a ``collate_fn`` that
rebuilds the dict, a batch never unpickled, a consumer that keeps every batch — the ticket stays set
and the worker takes another buffer, up to :data:`SLOTS`, then falls back to PyTorch's own copy:
slower, never unsafe.
"""

from __future__ import annotations

import itertools
import math
import os
import secrets
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cubelake.lake import pid_alive

__all__ = ["INLINE_BYTES", "SLOTS", "Delivery", "Lease", "SharedBatches", "worker_pool"]

#: shared-memory batch buffers per worker process (DataLoader's prefetch_factor batches are queued per worker,
#: one more is being cut and the training loop holds one or two)
SLOTS = 8
#: tensors of a batch up to this size travel inside the pickle, not as a shared-memory segment each
INLINE_BYTES = 4 * 1024 * 1024
#: workers' pools the training process keeps mapped (those of workers that have exited go first)
MAX_POOLS = 64


@dataclass
class Lease:
    """A buffer taken for one batch: its tensor, a numpy view of it, and its slot, ticket and generation."""

    tensor: torch.Tensor
    array: np.ndarray
    slot: int
    ticket: int
    pool: SharedBatches
    gen: int = 0

    def give_back(self) -> None:
        """The batch did not go out in this buffer (it was copied): the worker may take it again."""
        _release(self.pool.tickets, self.slot, self.ticket)


def _release(tickets: torch.Tensor, slot: int, ticket: int) -> None:
    # only the lease's own ticket is cleared: a late finalizer never frees a buffer taken again since
    if int(tickets[slot]) == ticket:
        tickets[slot] = 0


class SharedBatches:
    """One worker process's shared-memory batch buffers, their tickets (0 = free) and, per slot, the generation
    of its buffer the training process has mapped (0 = none)."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.pid = os.getpid()
        self.token = (self.pid, secrets.randbits(63))
        self.tickets = torch.zeros(slots, dtype=torch.int64).share_memory_()
        self.mapped = torch.zeros(slots, dtype=torch.int64).share_memory_()
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._gens = [0] * slots
        self._count = itertools.count(1)

    def take(self, shape: tuple[int, ...]) -> Lease | None:
        """A free buffer of ``shape`` (float32), or ``None`` when every buffer is still out."""
        for slot, buf in enumerate(self._buffers):
            if int(self.tickets[slot]) != 0:
                continue
            if buf is None or tuple(buf.shape) != shape:
                buf = _shared_empty(shape)
                self._buffers[slot] = buf
                self._gens[slot] += 1
            ticket = next(self._count)
            self.tickets[slot] = ticket
            return Lease(buf, buf.numpy(), slot, ticket, self, self._gens[slot])
        return None


def _shared_empty(shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 tensor of ``shape`` in new shared memory (contents undefined).

    Not ``torch.empty(shape).share_memory_()``: that copies the new private tensor into the segment, reading
    32 MiB of untouched pages for a 32 MiB batch (a page fault each) and writing them again, twice the faults
    and a copy per buffer; ``UntypedStorage._new_shared`` makes the segment the same way (same sharing
    strategy) without the copy.
    """
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * 4)
    return torch.empty(0, dtype=torch.float32).set_(storage).view(shape)


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
        lease, pool = self.lease, self.lease.pool
        rest = {k: v for k, v in self.items() if k != "image"}
        inline = [k for k, v in rest.items() if isinstance(v, torch.Tensor) and v.nbytes <= INLINE_BYTES
                  and v.device.type == "cpu" and not v.requires_grad]
        for k in inline:
            rest[k] = rest[k].numpy()
        # the buffer itself only until the training process says it has it mapped (then it is named)
        first = None if int(pool.mapped[lease.slot]) == lease.gen else (pool.tickets, pool.mapped, lease.tensor)
        return _arrive, (rest, inline, pool.token, lease.slot, lease.ticket, lease.gen, first)


class _Received:
    """The training process's side of one worker's pool: its arrays and the buffers it has mapped."""

    def __init__(self, tickets: torch.Tensor, mapped: torch.Tensor) -> None:
        self.tickets, self.mapped = tickets, mapped
        self.buffers: dict[int, tuple[int, np.ndarray]] = {}  # slot -> (generation, the buffer as numpy)


_RECEIVED: OrderedDict[tuple[int, int], _Received] = OrderedDict()
_LOCK = threading.Lock()


def _register(token: tuple[int, int], first: tuple[torch.Tensor, torch.Tensor, torch.Tensor], slot: int,
              gen: int) -> _Received:
    tickets, mapped, tensor = first
    with _LOCK:
        pool = _RECEIVED.get(token)
        if pool is None:
            _forget_exited()
            pool = _RECEIVED[token] = _Received(tickets, mapped)
        pool.buffers[slot] = (gen, tensor.numpy())
        mapped[slot] = gen  # after the buffer is kept: the worker may name it from now on
        return pool


def _forget_exited() -> None:
    """Unmap the pools of worker processes that have exited (and, past :data:`MAX_POOLS`, the oldest; their
    workers are told so and send their buffers again)."""
    for token in [t for t in _RECEIVED if not pid_alive(t[0])]:
        del _RECEIVED[token]
    while len(_RECEIVED) >= MAX_POOLS:
        _, old = _RECEIVED.popitem(last=False)
        old.mapped.zero_()


def _arrive(rest: dict[str, Any], inline: list[str], token: tuple[int, int], slot: int, ticket: int, gen: int,
            first: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None) -> dict[str, Any]:
    """Unpickling a :class:`Delivery`: the image is a new tensor over the worker's mapped buffer, and the buffer
    goes back to its worker when that tensor's storage is freed here."""
    if first is not None:
        pool = _register(token, first, slot, gen)
    else:
        with _LOCK:
            known = _RECEIVED.get(token)
        if known is None:
            raise RuntimeError(f"a batch from DataLoader worker process {token[0]} names a shared buffer this process "
                               f"has unmapped (more than {MAX_POOLS} workers' pools were alive at once); use fewer "
                               "DataLoaders or workers at a time")
        pool = known
    held_gen, array = pool.buffers[slot]
    if held_gen != gen:
        raise RuntimeError(f"worker batch buffer {slot} of pool {token} is generation {held_gen}, expected {gen}")
    # a tensor of its own storage over the same memory: its lifetime is this batch's, not the mapping's
    image = torch.frombuffer(array, dtype=torch.float32).view(array.shape)
    weakref.finalize(image.untyped_storage(), _release, pool.tickets, slot, ticket)
    batch = {k: (torch.from_numpy(v) if k in inline else v) for k, v in rest.items()}
    return {"image": image, **batch}
