"""Memory for decoded chunks, reused once nothing refers to it.

Why our own: a fresh buffer costs one page fault per 4 KiB page when first written (2.5-2.9 µs each on the
benchmark VM, ``bench/epoch_faults.py``): 768 faults for a 3 MiB chunk (128 x 128 px x 96 bands of uint16).
Evicted chunks' buffers are therefore decoded into again; the free list is deep enough for the bursts of
evictions a batch's releases cause (the reader kept 4 before: a first epoch took 90k faults, now 67k).

A buffer goes back to the free list when its chunk leaves the cache, and is handed out again only when nothing
else refers to it: every view NumPy makes of a buffer refers to the buffer's root array (see :func:`root`), so
a batch or a caller still reading an evicted chunk keeps its buffer out of reuse.

Buffers are carved from blocks of at least 16 MiB (whole 2 MiB pages), private anonymous mappings, so where the
system's transparent-huge-page policy is ``always`` the kernel can back them with huge pages. ``MADV_HUGEPAGE``
is not asked for: on the benchmark VM (a Firecracker guest), with a patch that did (ad hoc, not kept), huge
pages cut the faults of a first epoch from 67k to 9k but not its system time (0.26-1.01 s against
0.16-0.34 s), first-touch cost being the host's.
"""

from __future__ import annotations

import mmap
import sys
import threading

import numpy as np

__all__ = ["ChunkBuffers", "root"]

HUGE = 2 * 1024 * 1024
BLOCK = 16 * 1024 * 1024  # a block holds at least this much (or one chunk): whole huge pages, few mappings


def root(a: np.ndarray) -> np.ndarray:
    """The array at the bottom of ``a``'s chain of views (the one whose ``base`` is not an array)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class ChunkBuffers:
    """Byte buffers of one size or a few, for decoding chunks into; thread-safe.

    ``keep``: how many returned buffers to hold for reuse (more are dropped, and their block's memory is freed
    once all of the block's buffers are).
    """

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []
        self._carve: dict[int, list[np.ndarray]] = {}  # size -> not yet handed out, from the last block
        self.allocated = 0  # bytes of blocks mapped so far

    def take(self, nbytes: int) -> np.ndarray:
        """A C-contiguous ``uint8`` buffer of ``nbytes`` nobody else refers to (its contents are stale)."""
        with self._lock:
            for i in range(len(self._free)):  # not enumerate(): its result tuple would hold one more reference
                b = self._free[i]
                # 3 = the list, ``b``, getrefcount's argument: no chunk array or view of it is alive
                if b.nbytes == nbytes and sys.getrefcount(b) <= 3:
                    del self._free[i]
                    return b
            fresh = self._carve.get(nbytes)
            if not fresh:
                fresh = self._carve[nbytes] = self._block(nbytes)
                self.allocated += sum(b.nbytes for b in fresh)
            return fresh.pop()

    def give(self, chunk: np.ndarray) -> None:
        """``chunk`` (an array decoded into a buffer from :meth:`take`) left the cache: its buffer may be reused."""
        buf = root(chunk)
        if not isinstance(buf.base, memoryview):  # not one of ours (decoded into memory of its own)
            return
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)

    @staticmethod
    def _block(nbytes: int) -> list[np.ndarray]:
        count = max(1, BLOCK // nbytes)
        size = -(-count * nbytes // HUGE) * HUGE
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: shared memory gets no THP
        view = memoryview(m)
        # each buffer's root is its own array over its own slice: views of one chunk never pin another's buffer
        return [np.frombuffer(view[i * nbytes:(i + 1) * nbytes], np.uint8) for i in reversed(range(count))]
