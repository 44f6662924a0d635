"""The loader's side of byte access: which ranges to merge into one request, and a disk cache.

Every byte itself comes through :mod:`cubelake.storage` (local ``os.pread``, S3 through obstore).
:func:`coalesce` is the pure planning of which byte ranges to merge into one request;
:class:`DiskCache` keeps compressed chunk bytes on local disk across epochs and processes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DiskCache", "Range", "coalesce"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Range:
    """``[start, end)`` of one file, and who asked for it."""

    start: int
    end: int
    tag: Any = None


def coalesce(ranges: Sequence[Range], max_gap: int = 0, max_size: int = 64 * 1024 * 1024) -> list[tuple[int, int, list[Range]]]:
    """Merge ranges (of one file) lying at most ``max_gap`` bytes apart into requests of at most ``max_size``.

    Returns ``(start, end, members)`` sorted by start. Overlapping ranges are merged too. The
    bytes read beyond the members are at most ``max_gap`` per merge: the read amplification a
    gap costs is the price of one request fewer.
    """
    out: list[tuple[int, int, list[Range]]] = []
    for r in sorted(ranges, key=lambda r: (r.start, r.end)):
        if r.end < r.start:
            raise ValueError(f"range end {r.end} before start {r.start}")
        if out and r.start - out[-1][1] <= max_gap and max(out[-1][1], r.end) - out[-1][0] <= max_size:
            s, e, members = out[-1]
            out[-1] = (s, max(e, r.end), [*members, r])
        else:
            out.append((r.start, r.end, [r]))
    return out


class DiskCache:
    """Compressed chunk bytes on local disk, shared by processes and epochs.

    Keys name the source bytes exactly (URL, offset, length and the source's version tag), so a
    changed source never hits a stale entry. Entries are written to a temporary name and renamed,
    so concurrent workers never see half a file. When the folder grows past ``max_bytes`` the
    least recently written entries are removed.
    """

    def __init__(self, root: str | Path, max_bytes: int = 50 * 1024**3) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._written = 0

    @staticmethod
    def key(url: str, offset: int, length: int | None, version: str) -> str:
        return hashlib.blake2b(f"{url}\0{offset}\0{length}\0{version}".encode(), digest_size=20).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes | memoryview) -> None:
        p = self._path(key)
        p.parent.mkdir(exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, p)
        self._written += len(data)
        if self._written > self.max_bytes // 20:
            self._written = 0
            self.trim()

    def trim(self) -> None:
        files = [(p.stat().st_mtime, p.stat().st_size, p) for p in self.root.rglob("*") if p.is_file()]
        total = sum(s for _, s, _ in files)
        for _, s, p in sorted(files, key=lambda t: t[0]):
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= s
        log.debug("disk cache %s trimmed to %d bytes", self.root, total)
