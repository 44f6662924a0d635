"""Which chunks the reader loads, prefetches and lets go around each batch of one epoch's plan."""

from __future__ import annotations

import numpy as np

from .plan import EpochPlan, NextUse
from .reader import ChunkKey, ChunkReader


class ChunkFeed:
    """Walks a plan batch by batch: before a batch it requests the chunks the batch needs, then prefetches
    further ones as the budget allows; after it, it tells the reader when each chunk is next needed and
    releases the chunks no later sample needs. ``n_sources``/``n_aux``: aux layer ``k`` of scene ``s`` is
    source ``n_sources + s * n_aux + k``, loaded with its scene's chunk."""

    def __init__(self, plan: EpochPlan, batch_size: int, start: int, chunk_nbytes: int, n_sources: int,
                 n_aux: int) -> None:
        self.plan, self.bs = plan, batch_size
        self.chunks: list[ChunkKey] = [(int(s), int(c)) for s, c in plan.chunks]
        self._n_sources, self._n_aux = n_sources, n_aux
        self._by_last = np.argsort(plan.last_use, kind="stable")
        self._next_req = self._need_end = self._next_rel = 0
        # chunks only the skipped samples needed are never loaded
        while self._next_req < len(self.chunks) and plan.last_use[self._next_req] < start:
            self._next_req += 1
        while self._next_rel < len(self._by_last) and plan.last_use[self._by_last[self._next_rel]] < start:
            self._next_rel += 1
        # prefetch takes chunks in first-use order, so until a prefetched chunk's first use every chunk a batch in
        # between holds is pinned now or was prefetched before it: what is pinned never exceeds what is pinned now
        # plus what is prefetched, and keeping that within the budget is enough for no chunk to be evicted before
        # its use (the chunks one call takes count before the reader sees them)
        self._chunk_bytes = chunk_nbytes * (1 + n_aux)
        self._next_use = NextUse(plan)

    def with_aux(self, keys: list[ChunkKey]) -> list[ChunkKey]:
        """``keys`` and the same chunks of their scenes' aux layers."""
        na, n = self._n_aux, self._n_sources
        return keys if not na else keys + [(n + s * na + k, c) for s, c in keys for k in range(na)]

    def _request(self, reader: ChunkReader, ks: list[int], due: list[int]) -> None:
        reader.request(self.with_aux([self.chunks[k] for k in ks]), due + [d for d in due for _ in range(self._n_aux)])

    def before(self, lo: int, hi: int, reader: ChunkReader, depth: int) -> None:
        """Request batch ``[lo, hi)``'s chunks, then up to ``depth`` more ahead of it."""
        plan, n = self.plan, len(self.chunks)
        # chunks are in first-use order: those before need_end serve this batch
        while self._need_end < n and plan.first_use[self._need_end] < hi:
            self._need_end += 1
        needed = [k for k in range(self._next_req, self._need_end) if plan.last_use[k] >= lo]
        self._request(reader, needed, [int(plan.first_use[k]) for k in needed])
        self._next_req = max(self._next_req, self._need_end)
        ahead: list[int] = []
        while (self._next_req < n and self._next_req - self._need_end < depth
               and reader.has_room(self.chunks[self._next_req], len(ahead) * self._chunk_bytes)):
            ahead.append(self._next_req)
            self._next_req += 1
        self._request(reader, ahead, [int(plan.first_use[k]) for k in ahead])

    def after(self, lo: int, hi: int, reader: ChunkReader) -> None:
        """Batch ``[lo, hi)`` is cut: each chunk it used is next needed where the plan says; release the done."""
        plan = self.plan
        used = np.unique(plan.indices[plan.indptr[lo]:plan.indptr[hi]])
        due = self._next_use.after(used, hi).tolist()
        reader.set_due(self.with_aux([self.chunks[k] for k in used]), due + [d for d in due for _ in range(self._n_aux)])
        by_last = self._by_last
        while self._next_rel < len(by_last) and plan.last_use[by_last[self._next_rel]] < hi:
            for key in self.with_aux([self.chunks[by_last[self._next_rel]]]):
                reader.release(key)
            self._next_rel += 1
