"""A read-only Zarr store over a reference set, which checks what it reads.

fsspec's ``ReferenceFileSystem`` serves the same references but cannot tell when a target has
changed: it returns whatever bytes now sit at the recorded offsets, which decode to garbage or,
worse, to plausible wrong values. This store compares each target's size and content
fingerprint (local; the recorded mtime, when it still matches, spares reading the fingerprint)
or ETag (S3, sent as ``If-Match`` with every range request) to what the reference set recorded
and raises :class:`StaleReferenceError` instead. It also checks every target against the
allowed roots before anything is read.

Every byte comes through :mod:`cubelake.storage` (local ``os.pread`` on cached descriptors, S3 via obstore).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import AsyncIterator, Iterable

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.buffer.core import default_buffer_prototype

from cubelake.errors import RefsError, StaleReferenceError
from cubelake.storage import (
    CommitConflict,
    ObjectNotFound,
    S3Options,
    StorageError,
    object_at,
)
from cubelake.storage import Store as ObjectStore

from .fingerprint import file_fingerprint
from .formats import LoadedRefs
from .model import Target
from .security import AllowedRoots, split_url

__all__ = ["RefsStore", "S3Options"]

log = logging.getLogger(__name__)



def _stale(url: str, what: str) -> StaleReferenceError:
    return StaleReferenceError(
        f"{url} changed since its references were made ({what}); the byte ranges no longer point at the tiles. "
        "Re-create the references (re-ingest the scene, or `cubelake refs build`)")


class _LocalReader:
    def __init__(self) -> None:
        self._root = ObjectStore("/")
        self._checked: dict[str, tuple[int, int, int, int]] = {}  # path -> (dev, ino, size, mtime) found unchanged

    def check(self, path: str, t: Target | None, end: int = 0) -> os.stat_result:
        """The file's stat after checking it is a regular file, unchanged against ``t`` and ``end`` bytes long at least."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise StaleReferenceError(f"{path}: referenced file is missing; re-create the references") from None
        except OSError as exc:
            raise RefsError(f"{path}: referenced file cannot be read ({exc.strerror or exc})") from None
        if not stat.S_ISREG(st.st_mode):
            raise RefsError(f"{path}: referenced target is not a regular file (a folder, FIFO or device); refused")
        seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self._checked.get(path) == seen:
            return st
        if t is not None:
            self._compare(path, st, t)
        elif st.st_size < end:
            raise _stale(path, f"{st.st_size} bytes, but references reach byte {end}")
        self._checked[path] = seen
        return st

    @staticmethod
    def _compare(path: str, st: os.stat_result, t: Target) -> None:
        if st.st_size != t.size:
            raise _stale(path, f"size {st.st_size} bytes, recorded {t.size}")
        if t.mtime_ns is not None and st.st_mtime_ns == t.mtime_ns:
            return  # fast path: untouched since the references were made
        if t.fingerprint is not None:
            # a copied or moved lake has new mtimes: the content decides
            try:
                now = file_fingerprint(path)
            except OSError as exc:
                raise RefsError(f"{path}: referenced file cannot be read ({exc.strerror or exc})") from None
            if now != t.fingerprint:
                raise _stale(path, "its content differs from the recorded fingerprint")
        elif t.mtime_ns is not None:  # an older reference set: the mtime is all it recorded
            raise _stale(path, "modification time differs from the recorded one, and no content fingerprint "
                               "was recorded to tell a copy from a change")

    def read(self, path: str, offset: int, length: int, t: Target | None) -> bytes:
        self.check(path, t, offset + length)
        try:
            return bytes(self._root.get_ranges(path.lstrip("/"), [offset], [offset + length])[0])
        except StorageError as exc:
            if "short read" in str(exc):
                raise _stale(path, f"fewer than {length} bytes at offset {offset}") from None
            raise RefsError(f"{path}: cannot read bytes {offset}..{offset + length} ({exc})") from None

    def close(self) -> None:
        self._root.close()


class _S3Reader:
    """Targets in S3 buckets, through the storage seam (one client per bucket and options)."""

    def __init__(self, options: S3Options | None) -> None:
        self._options = S3Options.coerce(options)

    def _split(self, url: str) -> tuple[ObjectStore, str]:
        return object_at(url, self._options)

    async def check(self, url: str, t: Target | None, end: int = 0) -> None:
        store, key = self._split(url)
        try:
            head = await store.head_async(key)
        except ObjectNotFound:
            raise StaleReferenceError(f"{url}: referenced object is missing; re-create the references") from None
        except StorageError as exc:
            raise RefsError(str(exc)) from None
        if t is not None:
            if head.size != t.size:
                raise _stale(url, f"size {head.size} bytes, recorded {t.size}")
            if t.etag is not None and head.etag != t.etag:
                raise _stale(url, f"ETag {head.etag}, recorded {t.etag}")
        elif head.size < end:
            raise _stale(url, f"{head.size} bytes, but references reach byte {end}")

    async def read(self, url: str, offset: int, length: int, t: Target | None) -> bytes:
        store, key = self._split(url)
        try:
            got = await store.get_ranges_async(key, [offset], [offset + length],
                                               if_match=t.etag if t is not None else None)
        except CommitConflict:
            raise _stale(url, "its ETag no longer matches") from None
        except ObjectNotFound:
            raise StaleReferenceError(f"{url}: referenced object is missing; re-create the references") from None
        except StorageError as exc:
            if "short read" in str(exc):
                raise _stale(url, f"fewer than {length} bytes at offset {offset}") from None
            raise RefsError(str(exc)) from None
        return bytes(got[0])


def _span(size: int, byte_range: ByteRequest | None) -> tuple[int, int]:
    """``[start, stop)`` of a zarr byte request within a value of ``size`` bytes."""
    if byte_range is None:
        return 0, size
    if isinstance(byte_range, RangeByteRequest):
        return byte_range.start, min(size, byte_range.end)
    if isinstance(byte_range, OffsetByteRequest):
        return byte_range.offset, size
    if isinstance(byte_range, SuffixByteRequest):
        return max(0, size - byte_range.suffix), size
    raise RefsError(f"unsupported byte range request {byte_range!r}")


class RefsStore(Store):
    """Read-only zarr store serving a reference set's keys, with target checks."""

    supports_writes = False
    supports_deletes = False
    supports_partial_writes = False
    supports_listing = True

    def __init__(self, refs: LoadedRefs, *, roots: AllowedRoots, storage_options: S3Options | None = None,
                 verify: bool = True) -> None:
        super().__init__(read_only=True)
        self.refs = refs
        self.roots = roots
        self._targets = {t.url: t for t in refs.targets}
        for url in {*refs.urls, *self._targets}:
            roots.check(url, refs_path=refs.path)
        schemes = {split_url(u)[0] for u in refs.urls}
        unsupported = schemes - {"file", "s3"}
        if unsupported:
            raise RefsError(f"{refs.path}: targets use {sorted(unsupported)}; cubelake reads local files and s3:// only")
        self._local = _LocalReader()
        self._s3 = _S3Reader(storage_options) if "s3" in schemes else None
        self._storage_options = storage_options
        if not self._targets and refs.urls:
            log.warning("%s records no target sizes/mtimes: changed targets cannot be detected", refs.path)
        # in this order, so each set is refused for its first problem: an untrusted target, then a target
        # that is not a file (a FIFO) or has changed, then a byte range past its target's recorded end
        if verify:
            self.verify_targets()
        refs.check_ranges()

    def verify_targets(self) -> None:
        """Check every target now (size, fingerprint/mtime or ETag; unrecorded ones against the furthest byte)."""
        from zarr.core.sync import sync

        for url in {*self._targets, *self.refs.urls}:
            scheme, where = split_url(url)
            t = self._targets.get(url)
            end = self.refs.max_end.get(url, 0)
            try:
                if scheme == "file":
                    self._local.check(where, t, end)
                elif self._s3 is not None:
                    sync(self._s3.check(url, t, end))
            except RefsError as exc:  # say which set it is about, too
                raise type(exc)(f"{self.refs.path}: {exc}") from exc

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RefsStore) and other.refs.path == self.refs.path

    def __repr__(self) -> str:
        return f"RefsStore({self.refs.path!r})"

    def with_read_only(self, read_only: bool = False) -> RefsStore:
        if not read_only:
            raise ValueError("a reference store is read-only")
        return self

    async def _fetch(self, url: str, offset: int, length: int) -> bytes:
        scheme, where = split_url(url)
        t = self._targets.get(url)
        if scheme == "file":
            return await asyncio.to_thread(self._local.read, where, offset, length, t)
        assert self._s3 is not None
        return await self._s3.read(url, offset, length, t)

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        prototype = prototype or default_buffer_prototype()
        v = self.refs.get(key)
        if v is None:
            return None
        if isinstance(v, bytes):
            start, stop = _span(len(v), byte_range)
            return prototype.buffer.from_bytes(v[start:stop])
        url, off, n = v
        start, stop = _span(n, byte_range)
        return prototype.buffer.from_bytes(await self._fetch(url, off + start, stop - start))

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        return self.refs.get(key) is not None

    async def set(self, key: str, value: Buffer) -> None:
        raise RefsError("a reference store is read-only")

    async def delete(self, key: str) -> None:
        raise RefsError("a reference store is read-only")

    async def list(self) -> AsyncIterator[str]:
        for k in self.refs.iter_keys():
            yield k

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for k in self.refs.iter_keys():
            if k.startswith(prefix):
                yield k

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        prefix = prefix.rstrip("/")
        seen: set[str] = set()
        for k in self.refs.meta:
            rest = k if not prefix else (k[len(prefix) + 1:] if k.startswith(prefix + "/") else None)
            if rest:
                head = rest.split("/")[0]
                if head not in seen:
                    seen.add(head)
                    yield head

    def close(self) -> None:
        self._local.close()
        super().close()
