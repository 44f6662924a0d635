"""Byte access for the loader: ranged reads of local files and ``s3://`` objects, a disk cache, coalescing.

One interface (:class:`ByteStore`) with two backends: local files are read with ``os.pread`` on
cached descriptors (no event loop, releases the GIL), S3 objects with obstore (Rust, releases the
GIL, connection pooling). :func:`coalesce` is the pure planning of which byte ranges to merge into
one request.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cubelake.refs.security import split_url as refs_split_url
from cubelake.refs.store import S3Options, s3_config

__all__ = ["ByteStore", "DiskCache", "LocalBytes", "Range", "S3Bytes", "coalesce", "open_bytes", "split_url"]

log = logging.getLogger(__name__)


class ByteStore(Protocol):
    def get_ranges(self, path: str, starts: Sequence[int], ends: Sequence[int]) -> list[memoryview | bytes]: ...
    def get(self, path: str) -> bytes: ...
    def list(self, prefix: str) -> list[str]: ...


class LocalBytes:
    """Local files, read with ``os.pread`` (paths are absolute file paths)."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            with self._lock:
                fd = self._fds.get(path)
                if fd is None:
                    fd = os.open(path, os.O_RDONLY)
                    self._fds[path] = fd
        return fd

    def get_ranges(self, path: str, starts: Sequence[int], ends: Sequence[int]) -> list[memoryview | bytes]:
        fd = self._fd(path)
        out: list[memoryview | bytes] = []
        for s, e in zip(starts, ends, strict=True):
            data = os.pread(fd, e - s, s)
            if len(data) != e - s:
                raise OSError(f"{path}: short read, {len(data)} of {e - s} bytes at offset {s} (file truncated?)")
            out.append(data)
        return out

    def get(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def list(self, prefix: str) -> list[str]:
        root = Path(prefix)
        if not root.is_dir():
            return []
        return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __getstate__(self) -> dict[str, Any]:  # descriptors do not cross into DataLoader workers
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


class S3Bytes:
    """One bucket through obstore; ``path`` is the object key."""

    def __init__(self, bucket: str, options: S3Options | None = None) -> None:
        self.bucket = bucket
        self.options = dict(options or {})
        self._store: Any = None

    @property
    def store(self) -> Any:
        if self._store is None:
            from obstore.store import S3Store

            check_fork_safe(f"s3://{self.bucket}")

            cfg, client = s3_config(self.options)
            self._store = S3Store(self.bucket, config=cfg, client_options=client)  # type: ignore[arg-type]
        return self._store

    def get_ranges(self, path: str, starts: Sequence[int], ends: Sequence[int]) -> list[memoryview | bytes]:
        import obstore

        return [memoryview(b) for b in obstore.get_ranges(self.store, path, starts=list(starts), ends=list(ends))]

    def get(self, path: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.store, path).bytes())

    def list(self, prefix: str) -> list[str]:
        import obstore

        p = prefix.rstrip("/") + "/"
        return [o["path"][len(p):] for batch in obstore.list(self.store, prefix=p) for o in batch]

    def __getstate__(self) -> dict[str, Any]:  # a client does not cross into DataLoader workers
        return {"bucket": self.bucket, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.bucket, self.options, self._store = state["bucket"], state["options"], None


_OBSTORE_PID: list[int] = []  # the process whose obstore runtime has started


def check_fork_safe(what: str) -> None:
    """Refuse to use obstore in a process forked after its parent started obstore's runtime.

    obstore's Rust runtime does not survive ``fork()``: requests in a forked DataLoader worker
    hang forever. Spawned workers start clean.
    """
    pid = os.getpid()
    if _OBSTORE_PID and _OBSTORE_PID[0] != pid:
        raise RuntimeError(f"{what}: this process was forked after its parent read from S3 (obstore's runtime does not "
                           "survive fork); create the DataLoader with multiprocessing_context='spawn' (or 'forkserver')")
    if not _OBSTORE_PID:
        _OBSTORE_PID.append(pid)


def split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, bucket, key)`` of ``s3://bucket/key``; ``("file", "", absolute path)`` for local paths."""
    scheme, where = refs_split_url(url)
    if scheme == "s3":
        bucket, _, key = where.partition("/")
        return "s3", bucket, key
    if scheme != "file":
        raise ValueError(f"{url}: unsupported URL scheme; use a local path or s3://bucket/key")
    return "file", "", str(Path(where).resolve())


_LOCAL = LocalBytes()
_S3: dict[tuple[str, str], S3Bytes] = {}
_S3_LOCK = threading.Lock()
# an obstore client's runtime does not survive fork(): DataLoader workers make their own
os.register_at_fork(after_in_child=_S3.clear)


def open_bytes(url: str, options: S3Options | None = None) -> tuple[ByteStore, str]:
    """The byte store serving ``url`` (one per bucket and options, reused) and the path to give it."""
    scheme, bucket, key = split_url(url)
    if scheme == "file":
        return _LOCAL, key
    ident = (bucket, repr(sorted((options or {}).items())))
    with _S3_LOCK:
        store = _S3.get(ident)
        if store is None:
            store = _S3[ident] = S3Bytes(bucket, options)
    return store, key


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
