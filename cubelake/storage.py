"""The one storage seam: every byte cubelake reads or writes on a lake, a source or a target.

A :class:`Store` is a root URL (a local folder, ``memory://name``, ``s3://bucket/prefix``,
``gs://``, ``az://``) plus keys below it, served by obstore (Rust; releases the GIL, pools
connections, retries with backoff, multipart uploads). The operations are the object-store
ones every backend shares: ``get``, ranged ``get_ranges``, ``head`` (size, ETag, mtime),
``put`` (unconditional, create-only ``If-None-Match: *``, or replace-only ``If-Match: <etag>``),
``list``, ``delete`` and ``copy``. Errors come back as :class:`StorageError` subclasses that name
the URL and say what to do (missing bucket, rejected credentials, permission denied, an
unreachable endpoint), never as obstore's debug dumps.

S3 configuration follows the ecosystem's conventions (:class:`S3Options`): ``AWS_ENDPOINT_URL``
(or ``AWS_ENDPOINT_URL_S3``), ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ALLOW_HTTP=true`` for plain-http endpoints, and
explicit ``storage_options`` (s3fs-style keys are accepted too) that win over the environment.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime as dt
import json
import logging
import math
import os
import posixpath
import re
import shutil
import stat
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from .errors import CubelakeError

__all__ = [
    "CommitConflict",
    "ForkedClientError",
    "NotTextError",
    "ObjectInfo",
    "ObjectNotFound",
    "S3Options",
    "StorageError",
    "Store",
    "check_fork_safe",
    "gdal_vsi_path",
    "is_throttle",
    "is_url",
    "join_url",
    "object_at",
    "open_store",
    "parent_url",
    "read_json_info",
    "split_url",
    "url_of_gdal_path",
]

log = logging.getLogger(__name__)

_MULTIPART_CHUNK = 8 * 1024 * 1024  # a put of a file streams in parts of this size (bounded memory)
_REMOTE = ("s3", "gs", "gcs", "az", "azure", "abfs", "memory", "http", "https")


class StorageError(CubelakeError, OSError):
    """An object store refused or failed an operation; the message names the URL and the fix.

    ``transient``: the store may succeed if asked again (a timeout, a 5xx, a dropped connection),
    as opposed to a refusal that will not change (no such object, bad credentials, no permission).
    """

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class ObjectNotFound(StorageError, FileNotFoundError):
    """No object at that key."""


class NotTextError(StorageError):
    """An object read as text is too large for one, or is not UTF-8; ``info`` is what ``head`` said of it."""

    def __init__(self, message: str, info: ObjectInfo) -> None:
        super().__init__(message)
        self.info = info


class ForkedClientError(StorageError, RuntimeError):
    """obstore used in a process forked after its parent started obstore's runtime (it would hang)."""


class CommitConflict(StorageError):
    """A conditional put lost: the object exists (create) or changed since it was read (replace)."""


# -- URLs -----------------------------------------------------------------


def split_url(url: str) -> tuple[str, str]:
    """``(scheme, rest)``: ``("file", path)`` for local paths, else e.g. ``("s3", "bucket/key")``."""
    if "://" not in url:
        return "file", url
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            return "file", "//" + parts.netloc + unquote(parts.path)  # a UNC-style host: never under a local root
        return "file", unquote(parts.path)
    return scheme, parts.netloc + parts.path


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether a location names an object store (``s3://``, ``memory://`` ...), not a local path."""
    s = str(location)
    return "://" in s and split_url(s)[0] != "file"


_GDAL_S3 = "/vsis3/"


def gdal_vsi_path(url: str) -> str:
    """GDAL's name for an ``s3://bucket/key`` object: ``/vsis3/bucket/key`` (read by range requests)."""
    scheme, where = split_url(url)
    if scheme != "s3":
        raise ValueError(f"{url}: only s3:// objects have a GDAL /vsis3/ name; give an s3:// URL")
    return _GDAL_S3 + where


def url_of_gdal_path(path: str | os.PathLike[str]) -> str | None:
    """The ``s3://`` URL of GDAL's ``/vsis3/bucket/key`` name; ``None`` for any other path (a local file)."""
    s = os.fspath(path)
    return "s3://" + s[len(_GDAL_S3):] if s.startswith(_GDAL_S3) else None


def join_url(root: str, *keys: str) -> str:
    """``root`` with keys appended by ``/`` (a local root stays a local path)."""
    out = str(root).rstrip("/")
    for k in keys:
        if k:
            out = f"{out}/{k.strip('/')}"
    return out


def check_key(key: str) -> str:
    """A key safe to join under a root: relative, no ``..`` or empty segments, no control characters."""
    k = key.strip("/")
    parts = k.split("/")
    if not k or any(p in ("", ".", "..") for p in parts) or any(ord(c) < 32 for c in k) or "\\" in k:
        raise StorageError(f"{key!r}: not a valid object key (relative, '/'-separated, no '..' or empty parts)")
    return k


# -- configuration ----------------------------------------------------------

_TRUE = ("1", "true", "yes", "on")
_ALIASES = {
    "endpoint_url": ("endpoint_url", "endpoint"), "region": ("region", "region_name"),
    "access_key_id": ("access_key_id", "aws_access_key_id", "key"),
    "secret_access_key": ("secret_access_key", "aws_secret_access_key", "secret"),
    "session_token": ("session_token", "aws_session_token", "token"), "anonymous": ("anonymous", "anon"),
}


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible store; unset fields fall back to the ``AWS_*`` environment."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    anonymous: bool = False
    allow_http: bool | None = None  # None: plain http only when the endpoint says http://
    max_retries: int = 3
    retry_timeout_s: float = 30.0  # a run never waits on an unreachable endpoint longer than this per request
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 300.0
    extra: Mapping[str, str] = field(default_factory=dict)  # further obstore S3 config keys, passed through

    @classmethod
    def coerce(cls, options: S3Options | Mapping[str, Any] | None) -> S3Options:
        """Options from an :class:`S3Options`, an s3fs-style mapping, or ``None`` (the environment only)."""
        if isinstance(options, S3Options):
            return options
        o = dict(options or {})
        kw: dict[str, Any] = {}
        client_kwargs = o.pop("client_kwargs", None) or {}
        if "endpoint_url" in client_kwargs:
            o.setdefault("endpoint_url", client_kwargs["endpoint_url"])
        for name, keys in _ALIASES.items():
            for k in keys:
                if k in o:
                    kw[name] = o.pop(k)
        names = {f.name for f in fields(cls)}
        for k in list(o):
            if k in names:
                kw[k] = o.pop(k)
        if o:
            kw["extra"] = {str(k): str(v) for k, v in o.items()}
        return cls(**kw)

    def resolved(self) -> S3Options:
        """These options with the environment filled in where a field is unset."""
        env = os.environ
        endpoint = self.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        allow_http = self.allow_http
        if allow_http is None:
            allow_http = env.get("AWS_ALLOW_HTTP", "").lower() in _TRUE or str(endpoint or "").startswith("http://")
        key = self.access_key_id or env.get("AWS_ACCESS_KEY_ID")
        secret = self.secret_access_key or env.get("AWS_SECRET_ACCESS_KEY")
        token = self.session_token or (env.get("AWS_SESSION_TOKEN") if not self.access_key_id else None)
        return replace(self, endpoint_url=endpoint, allow_http=allow_http, access_key_id=key, secret_access_key=secret,
                       session_token=token,
                       region=self.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1")

    def obstore_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of obstore's ``S3Store`` (config, client options, retry config)."""
        r = self.resolved()
        cfg: dict[str, Any] = {"region": r.region, **dict(r.extra)}
        if r.anonymous:
            cfg["skip_signature"] = True
        elif r.access_key_id and r.secret_access_key:
            cfg.update(access_key_id=r.access_key_id, secret_access_key=r.secret_access_key)
            if r.session_token:
                cfg["token"] = r.session_token
        if r.endpoint_url:
            cfg["endpoint"] = r.endpoint_url
            cfg.setdefault("virtual_hosted_style_request", False)
        client = {"allow_http": bool(r.allow_http), "connect_timeout": f"{r.connect_timeout_s:g}s",
                  "timeout": f"{r.request_timeout_s:g}s"}
        retry = {"max_retries": r.max_retries, "retry_timeout": dt.timedelta(seconds=r.retry_timeout_s)}
        return {"config": cfg, "client_options": client, "retry_config": retry}

    def fsspec_options(self) -> dict[str, Any]:
        """The same settings as s3fs ``storage_options`` (for kerchunk/fsspec readers)."""
        r = self.resolved()
        out: dict[str, Any] = {"anon": True} if r.anonymous else {}
        if r.access_key_id and not r.anonymous:
            out.update(key=r.access_key_id, secret=r.secret_access_key)
            if r.session_token:
                out["token"] = r.session_token
        if r.endpoint_url:
            out["endpoint_url"] = r.endpoint_url
        out["client_kwargs"] = {"region_name": r.region}
        return out

    def gdal_env(self) -> Any:
        """A ``rasterio.Env`` that lets GDAL read ``/vsis3/`` with these settings."""
        import rasterio
        from rasterio.session import AWSSession

        r = self.resolved()
        opts: dict[str, Any] = {"GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR", **_gdal_http(r)}
        kw: dict[str, Any] = {"region_name": r.region}
        if r.anonymous:
            kw["aws_unsigned"] = True
        elif r.access_key_id:
            kw.update(aws_access_key_id=r.access_key_id, aws_secret_access_key=r.secret_access_key,
                      aws_session_token=r.session_token)
        if r.endpoint_url:
            kw["endpoint_url"] = r.endpoint_url.split("://", 1)[-1]
            opts.update(AWS_HTTPS="NO" if r.endpoint_url.startswith("http://") else "YES", AWS_VIRTUAL_HOSTING="FALSE")
        return rasterio.Env(session=AWSSession(**kw), **opts)

    def ident(self) -> tuple[Any, ...]:
        """A hashable identity (clients are shared between equal options)."""
        r = self.resolved()
        return tuple(getattr(r, f.name) if f.name != "extra" else tuple(sorted(r.extra.items())) for f in fields(r))


def _gdal_http(r: S3Options) -> dict[str, str]:
    """The same timeouts and retries for GDAL's curl as obstore gets: without them a stalled response
    holds a ``/vsis3/`` open or read for as long as the server keeps the connection (seen: 120 s)."""
    return {"GDAL_HTTP_TIMEOUT": str(max(1, math.ceil(r.request_timeout_s))),
            "GDAL_HTTP_CONNECTTIMEOUT": str(max(1, math.ceil(r.connect_timeout_s))),
            "GDAL_HTTP_MAX_RETRY": str(r.max_retries), "GDAL_HTTP_RETRY_DELAY": "0.5"}


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``head``/``list``/``put`` tell about an object."""

    key: str
    size: int
    etag: str | None
    mtime: dt.datetime | None


# -- errors ---------------------------------------------------------------

_UNREACHABLE = ("the endpoint cannot be reached; check AWS_ENDPOINT_URL (or endpoint_url), the network, and "
                "AWS_ALLOW_HTTP=true for a plain-http endpoint")
_HINTS = (
    (("nosuchbucket",), "the bucket does not exist; create it or correct the URL"),
    (("invalidaccesskeyid", "signaturedoesnotmatch", "invalidtoken", "expiredtoken", "unauthenticated",
      "401 unauthorized"),
     "the credentials were rejected; set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) "
     "or pass storage_options"),
    (("accessdenied", "403 forbidden", "permission denied"), "permission denied"),
    (("error sending request", "connection refused", "dns error", "timed out", "tcp connect", "operation timed out"),
     _UNREACHABLE),
)


#: the IAM action AWS checks for each operation (the S3 API reference's "Permissions" of each request: HEAD and
#: ranged GETs of an object need s3:GetObject, ListObjectsV2 needs s3:ListBucket on the bucket); other S3 stores
#: (MinIO, Ceph, R2) use the same names
_S3_ACTIONS = {"read": "s3:GetObject", "stat": "s3:GetObject", "read ranges of": "s3:GetObject",
               "download": "s3:GetObject", "open": "s3:GetObject", "list": "s3:ListBucket on the bucket",
               "write": "s3:PutObject", "delete": "s3:DeleteObject", "copy": "s3:GetObject and s3:PutObject"}


def _permission_hint(url: str, what: str) -> str:
    """What to grant after a refused ``what``: the one IAM action it needs, and what readers and writers need."""
    if "://" not in url:
        return "permission denied; check the owner and mode of this path"
    if not url.startswith("s3://"):
        return "permission denied; grant these credentials access to this bucket and prefix"
    action = _S3_ACTIONS.get(what, "s3:GetObject, s3:PutObject, s3:ListBucket and s3:DeleteObject")
    return (f"permission denied; this needs {action} (a lake's readers need s3:GetObject and s3:ListBucket, "
            "its writers also s3:PutObject and s3:DeleteObject)")


def error_line(exc: BaseException) -> str:
    """The first line of an error's message, without obstore's debug dump (its type name if it has none)."""
    text = str(exc).split("\n\nDebug source:")[0].strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


#: how a store says it throttles: the status as obstore/reqwest word it ("status code: 503 Service Unavailable",
#: "(429 Too Many Requests)"), S3's error code (SlowDown, "Please reduce your request rate"), Azure's "Server Busy"
_THROTTLE = re.compile(r"\bstatus(?: code)?:? *(?:429|503)\b|\b(?:429 too many requests|503 service unavailable)\b"
                       r"|(?-i:\bSlow ?Down\b)|\btoo many requests\b|reduce your request rate|\bserver busy\b",
                       re.IGNORECASE)


def is_throttle(error: BaseException) -> bool:
    """Whether ``error`` (an obstore error, or our translation of one) says the store is throttling requests."""
    return bool(_THROTTLE.search(str(error)))


def translate(exc: BaseException, url: str, what: str) -> CubelakeError:
    """A cubelake error for an obstore/OS failure of ``what`` on ``url``."""
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    if isinstance(exc, CubelakeError):
        return exc
    text = str(exc).lower()
    if isinstance(exc, AlreadyExistsError):
        return CommitConflict(f"{url}: already exists ({what} with If-None-Match: * lost to another writer)")
    if isinstance(exc, PreconditionError):
        return CommitConflict(f"{url}: changed since it was read ({what} with If-Match lost to another writer)")
    for needles, hint in _HINTS:
        if any(n in text for n in needles):
            hint = _permission_hint(url, what) if hint == "permission denied" else hint
            return StorageError(f"{url}: cannot {what}: {hint}", transient=hint is _UNREACHABLE)
    if isinstance(exc, FileNotFoundError) or type(exc).__name__ == "NotFoundError":
        return ObjectNotFound(f"{url}: no such object")
    if isinstance(exc, PermissionError) or type(exc).__name__ == "PermissionDeniedError":
        return StorageError(f"{url}: cannot {what}: {_permission_hint(url, what)}")
    if isinstance(exc, NotImplementedError):
        return StorageError(f"{url}: cannot {what}: this store does not support it ({error_line(exc)})")
    return StorageError(f"{url}: cannot {what}: {error_line(exc)}", transient=is_transient(exc))


# obstore's errors that asking again will not change; every other obstore error (GenericError: a
# 5xx after its own retries, a body that timed out or was cut) is worth another attempt
_PERMANENT_OBSTORE = frozenset({"NotFoundError", "PermissionDeniedError", "UnauthenticatedError", "PreconditionError",
                                "AlreadyExistsError", "NotSupportedError", "InvalidPathError", "NotModifiedError",
                                "UnknownConfigurationKeyError", "NotImplementedError"})
# what GDAL (/vsis3/ through curl) and the OS say of a failure that may pass
_TRANSIENT_TEXT = ("timed out", "timeout", "connection reset", "reset by peer", "broken pipe", "transfer closed",
                   "http response code: 5", "http error code: 5", "status code: 5", "slowdown", "slow down",
                   "service unavailable", "internal error", "curl error", "end of file", "incomplete", "body error",
                   "error sending request")


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a store or transport failure that another attempt may not meet (a timeout, a
    5xx, a reset or cut body), rather than a refusal or a bad product that would fail the same way."""
    if isinstance(exc, StorageError):
        return exc.transient
    if isinstance(exc, CubelakeError | FileNotFoundError | PermissionError):
        return False
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    if type(exc).__module__.startswith("obstore"):
        return type(exc).__name__ not in _PERMANENT_OBSTORE
    if isinstance(exc, OSError | RuntimeError):  # rasterio's GDAL errors, zarr's wrapped store errors
        text = str(exc).lower()
        return any(t in text for t in _TRANSIENT_TEXT)
    return False


# -- clients ----------------------------------------------------------------

_OBSTORE_PID: list[int] = []  # the process whose obstore runtime has started
_CLIENTS: dict[tuple[Any, ...], Any] = {}
_MEMORY: dict[str, Any] = {}
_LOCK = threading.Lock()


def _reset_after_fork() -> None:
    _CLIENTS.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


def check_fork_safe(what: str) -> None:
    """Refuse to use obstore's network clients in a process forked after its parent started them.

    obstore's Rust runtime does not survive ``fork()``: requests in a forked DataLoader worker
    hang forever. Spawned workers start clean.
    """
    pid = os.getpid()
    if _OBSTORE_PID and _OBSTORE_PID[0] != pid:
        raise ForkedClientError(f"{what}: this process was forked after its parent read from an object store (obstore's "
                           "runtime does not survive fork); create the DataLoader with "
                           "multiprocessing_context='spawn' (or 'forkserver')")
    if not _OBSTORE_PID:
        _OBSTORE_PID.append(pid)


def _client(scheme: str, bucket: str, options: S3Options) -> Any:
    """One obstore client per bucket and options, shared by every :class:`Store` in the process."""
    from obstore.store import MemoryStore, S3Store, from_url

    ident = (scheme, bucket, options.ident() if scheme == "s3" else ())
    with _LOCK:
        client = _CLIENTS.get(ident)
        if client is not None:
            return client
        if scheme == "memory":
            client = _MEMORY.setdefault(bucket, MemoryStore())
        elif scheme == "s3":
            check_fork_safe(f"s3://{bucket}")
            client = S3Store(bucket, **options.obstore_kwargs())
        else:
            check_fork_safe(f"{scheme}://{bucket}")
            client = from_url(f"{scheme}://{bucket}")
        _CLIENTS[ident] = client
        return client


def _info(key: str, meta: Mapping[str, Any]) -> ObjectInfo:
    return ObjectInfo(key, int(meta["size"]), meta.get("e_tag"), meta.get("last_modified"))


def _local_info(key: str, st: os.stat_result) -> ObjectInfo:
    etag = f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'
    return ObjectInfo(key, st.st_size, etag, dt.datetime.fromtimestamp(st.st_mtime_ns / 1e9, dt.UTC))


class _Local:
    """A local folder as an object store, in plain Python.

    Not obstore's ``LocalStore``: obstore's runtime does not survive ``fork()`` (a forked
    DataLoader worker reading a local lake hung forever), and object_store's LocalFileSystem
    implements no ``If-Match`` put. Writes go to a temporary file, are fsynced and renamed
    (readers see the old object or the new, never a torn one); create-only puts use ``link``,
    which never replaces; ``If-Match`` compares and renames under a file lock.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def file(self, key: str) -> Path:
        return self.root / key if key else self.root

    def head(self, key: str) -> ObjectInfo:
        st = os.stat(self.file(key))
        if not stat.S_ISREG(st.st_mode):
            raise FileNotFoundError(f"{self.file(key)}: not a regular file")
        return _local_info(key, st)

    def get(self, key: str) -> bytes:
        return self.file(key).read_bytes()

    def fd(self, path: str) -> int:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device must never be opened (it could block forever)
            raise FileNotFoundError(f"{path}: not a regular file")
        with self._lock:
            fd, ino = self._fds.get(path, (-1, -1))
            if ino != st.st_ino:
                if fd >= 0:
                    os.close(fd)
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
                self._fds[path] = (fd, st.st_ino)
            return fd

    def get_ranges(self, key: str, starts: Sequence[int], ends: Sequence[int]) -> builtins.list[memoryview | bytes]:
        fd = self.fd(str(self.file(key)))
        return [os.pread(fd, e - s, s) for s, e in zip(starts, ends, strict=True)]

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        base = self.file(prefix)
        if not base.is_dir():
            return
        for folder, dirs, files in os.walk(base):
            dirs.sort()
            for name in sorted(files):
                if name.startswith(".") and name.endswith((".tmp", ".lock")):
                    continue  # our own temporary and lock files are not objects
                p = Path(folder, name)
                with contextlib.suppress(FileNotFoundError):
                    st = p.lstat()
                    if stat.S_ISREG(st.st_mode):
                        yield _local_info(p.relative_to(self.root).as_posix(), st)

    def list_dirs(self, prefix: str) -> tuple[builtins.list[str], builtins.list[ObjectInfo]]:
        base = self.file(prefix)
        if not base.is_dir():
            return [], []
        dirs, objs = [], []
        for e in sorted(os.scandir(base), key=lambda e: e.name):
            if e.is_dir(follow_symlinks=False):
                dirs.append(e.name)
            elif e.is_file(follow_symlinks=False) and not (e.name.startswith(".") and e.name.endswith((".tmp", ".lock"))):
                objs.append(_local_info(Path(e.path).relative_to(self.root).as_posix(), e.stat(follow_symlinks=False)))
        return dirs, objs

    def _write_tmp(self, target: Path, payload: bytes | Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        if isinstance(payload, Path):
            shutil.copyfile(payload, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        else:
            with open(tmp, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
        return tmp

    def put(self, key: str, payload: bytes | Path, create: bool, if_match: str | None) -> ObjectInfo:
        target = self.file(key)
        tmp = self._write_tmp(target, payload)
        try:
            if create:
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    raise CommitConflict(f"{target}: already exists (create-only put lost to another writer)") from None
            elif if_match is not None:
                self._replace_if(key, tmp, if_match)
            else:
                os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return self.head(key)

    def _replace_if(self, key: str, tmp: Path, if_match: str) -> None:
        import filelock

        target = self.file(key)
        with filelock.FileLock(target.with_name(f".{target.name}.lock")):
            try:
                current = self.head(key).etag
            except FileNotFoundError:
                current = None
            if current != if_match:
                raise CommitConflict(f"{target}: changed since it was read (ETag {current}, expected {if_match}); "
                                     "another writer replaced it")
            os.replace(tmp, target)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.file(key).unlink()

    def copy(self, src: str, dst: str) -> None:
        tmp = self._write_tmp(self.file(dst), self.file(src))
        os.replace(tmp, self.file(dst))

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._fds.values():
                os.close(fd)
            self._fds.clear()


class Store:
    """Objects below one root URL; keys are ``/``-separated and relative to the root.

    Object stores (S3, GCS, Azure, memory) are served by obstore; a local folder by :class:`_Local`
    (plain Python: see there why not obstore's LocalStore).
    """

    def __init__(self, url: str | os.PathLike[str], options: S3Options | Mapping[str, Any] | None = None) -> None:
        self.options = S3Options.coerce(options)
        scheme, where = split_url(str(url))
        self.scheme = "gs" if scheme == "gcs" else scheme
        self._local: _Local | None = None
        if self.scheme == "file":
            root = Path(where).expanduser().absolute()
            self.url, self.bucket, self._prefix = str(root), "", ""
            self._local = _Local(root)
        elif self.scheme in _REMOTE:
            bucket, _, prefix = where.partition("/")
            if not bucket:
                raise StorageError(f"{url}: no bucket in the URL; write {self.scheme}://BUCKET/PREFIX")
            self.bucket, self._prefix = bucket, prefix.strip("/")
            self.url = join_url(f"{self.scheme}://{bucket}", self._prefix)
        else:
            raise StorageError(f"{url}: unsupported URL scheme {scheme!r}; use a local path, s3://, gs://, az:// "
                               "or memory://")

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:  # clients and descriptors do not cross processes
        return {"url": self.url, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["options"])  # type: ignore[misc]

    @property
    def is_local(self) -> bool:
        return self._local is not None

    @property
    def client(self) -> Any:
        return _client(self.scheme, self.bucket, self.options)

    def child(self, sub: str) -> Store:
        """The store rooted at ``sub`` below this one (same client and options)."""
        return Store(self.url_of(sub), self.options)

    def path(self, key: str) -> str:
        """The full key inside the bucket."""
        k = check_key(key) if key else ""
        return "/".join(p for p in (self._prefix, k) if p)

    def url_of(self, key: str = "") -> str:
        return join_url(self.url, check_key(key)) if key else self.url

    def local_path(self, key: str = "") -> Path:
        """The file behind ``key`` of a local store."""
        if self._local is None:
            raise StorageError(f"{self.url}: not a local folder")
        return self._local.file(check_key(key) if key else "")

    def signed_url(self, key: str, expires_s: int = 3600) -> str:
        """A presigned ``https``/``http`` GET URL of ``key`` (object stores that sign: S3 and S3-compatible)."""
        import datetime as dt

        import obstore

        if self._local is not None or self.scheme != "s3":
            raise StorageError(f"{self.url_of(key)}: only s3:// objects have presigned URLs")
        with self._op(key, "sign"):
            return str(obstore.sign(self.client, "GET", self.path(key), dt.timedelta(seconds=expires_s)))

    @contextlib.contextmanager
    def _op(self, key: str, what: str) -> Iterator[None]:
        try:
            yield
        except CubelakeError:
            raise
        except Exception as exc:
            raise translate(exc, self.url_of(key) if key else self.url, what) from None

    def _key(self, key: str) -> str:
        return check_key(key) if key else ""

    # -- reads ---------------------------------------------------------------
    def get(self, key: str) -> bytes:
        import obstore

        with self._op(key, "read"):
            if self._local is not None:
                return self._local.get(self._key(key))
            return bytes(obstore.get(self.client, self.path(key)).bytes())

    def get_text(self, key: str, max_bytes: int = 64 * 1024 * 1024) -> str:
        """A small text object (a record, a pointer), refused (:class:`NotTextError`) when larger than ``max_bytes``."""
        return self.get_text_info(key, max_bytes)[0]

    def get_text_info(self, key: str, max_bytes: int = 64 * 1024 * 1024) -> tuple[str, ObjectInfo]:
        """:meth:`get_text` and what ``head`` said of the object (its ETag for a conditional replace)."""
        info = self.head(key)
        if info.size > max_bytes:
            raise NotTextError(f"{self.url_of(key)}: {info.size} bytes, more than the {max_bytes} a text object may "
                               "have here; is this the right object?", info)
        try:
            return self.get(key).decode("utf-8"), info
        except UnicodeDecodeError as exc:
            raise NotTextError(f"{self.url_of(key)}: not UTF-8 text ({exc.reason} at byte {exc.start})", info) from None

    def head(self, key: str) -> ObjectInfo:
        import obstore

        try:
            with self._op(key, "stat"):
                if self._local is not None:
                    return self._local.head(self._key(key))
                return _info(key, obstore.head(self.client, self.path(key)))
        except StorageError as exc:
            if "permission denied" not in str(exc) or self._local is not None:
                raise
            # a refused HEAD has no body to say why (bad key? no permission?): a one-byte GET does
            with self._op(key, "read"):
                obstore.get(self.client, self.path(key), options={"range": (0, 1)})
            raise

    async def head_async(self, key: str) -> ObjectInfo:
        import obstore

        if self._local is not None:
            return self.head(key)
        with self._op(key, "stat"):
            return _info(key, await obstore.head_async(self.client, self.path(key)))

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except ObjectNotFound:
            return False
        return True

    def get_ranges(self, key: str, starts: Sequence[int], ends: Sequence[int]) -> builtins.list[memoryview | bytes]:
        """Byte ranges ``[start, end)`` of one object (coalesced into few requests by obstore, remotely)."""
        import obstore

        with self._op(key, "read ranges of"):
            if self._local is not None:
                got: builtins.list[memoryview | bytes] = self._local.get_ranges(self._key(key), starts, ends)
            else:
                raw = obstore.get_ranges(self.client, self.path(key), starts=list(starts), ends=list(ends))
                got = [memoryview(b) for b in raw]
        return _checked(self.url_of(key), got, starts, ends)

    async def get_ranges_async(self, key: str, starts: Sequence[int], ends: Sequence[int],
                               if_match: str | None = None) -> builtins.list[memoryview | bytes]:
        """:meth:`get_ranges` for event loops; ``if_match``: fail with :class:`CommitConflict` if the ETag moved."""
        import obstore

        if self._local is not None:
            return self.get_ranges(key, starts, ends)
        out: builtins.list[memoryview | bytes] = []
        with self._op(key, "read ranges of"):
            if if_match is None:
                raw = await obstore.get_ranges_async(self.client, self.path(key), starts=list(starts), ends=list(ends))
                out = [memoryview(b) for b in raw]
            else:
                for s, e in zip(starts, ends, strict=True):
                    res = await obstore.get_async(self.client, self.path(key),
                                                  options={"range": (s, e), "if_match": if_match})
                    out.append(memoryview(await res.bytes_async()))
        return _checked(self.url_of(key), out, starts, ends)

    def download(self, key: str, dest: str | os.PathLike[str]) -> int:
        """Stream an object into a local file (written beside it, then renamed); its size."""
        import obstore

        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        n = 0
        with self._op(key, "download"):
            if self._local is not None:
                shutil.copyfile(self._local.file(self._key(key)), tmp)
                n = tmp.stat().st_size
            else:
                with open(tmp, "wb") as f:
                    for chunk in obstore.get(self.client, self.path(key)).stream(min_chunk_size=_MULTIPART_CHUNK):
                        f.write(chunk)
                        n += len(chunk)
        os.replace(tmp, dest)
        return n

    def open_reader(self, key: str, buffer_size: int = 1 << 20) -> Any:
        """A seekable binary file over an object that reads ranges on demand (bounded memory)."""
        import obstore

        with self._op(key, "open"):
            if self._local is not None:
                self._local.head(self._key(key))  # a regular file, not a FIFO
                return open(self._local.file(self._key(key)), "rb")
            return _BinaryReader(obstore.open_reader(self.client, self.path(key), buffer_size=buffer_size))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object below ``prefix`` (keys relative to the store's root), in pages."""
        import obstore

        if self._local is not None:
            with self._op(prefix, "list"):
                yield from self._local.list(self._key(prefix))
            return
        base = self.path(prefix)
        strip = len(self._prefix) + 1 if self._prefix else 0
        with self._op(prefix, "list"):
            for batch in obstore.list(self.client, prefix=base + "/" if base else None, chunk_size=1000):
                for meta in batch:
                    yield _info(meta["path"][strip:], meta)

    def list_dirs(self, prefix: str = "") -> tuple[builtins.list[str], builtins.list[ObjectInfo]]:
        """The "folders" and objects directly below ``prefix`` (one delimiter listing)."""
        import obstore

        with self._op(prefix, "list"):
            if self._local is not None:
                return self._local.list_dirs(self._key(prefix))
            base = self.path(prefix)
            res = obstore.list_with_delimiter(self.client, prefix=base or None)
        strip = len(self._prefix) + 1 if self._prefix else 0
        dirs = [p[strip:].rstrip("/").rsplit("/", 1)[-1] for p in res["common_prefixes"]]
        return sorted(dirs), [_info(m["path"][strip:], m) for m in res["objects"]]

    # -- writes ----------------------------------------------------------------
    def put(self, key: str, data: bytes | memoryview | str | os.PathLike[str], *, create: bool = False,
            if_match: str | None = None) -> ObjectInfo:
        """Write an object; ``create=True`` fails if it exists, ``if_match`` unless its ETag is still that.

        ``data`` may be bytes or a local file (streamed in multipart uploads of bounded size).
        A lost condition raises :class:`CommitConflict`.
        """
        import obstore

        if create and if_match is not None:
            raise ValueError("put: give create=True or if_match, not both")
        payload: Any = Path(data) if isinstance(data, str | os.PathLike) else bytes(data)
        with self._op(key, "write"):
            if self._local is not None:
                return self._local.put(self._key(key), payload, create, if_match)
            mode: Any = "create" if create else ({"e_tag": if_match} if if_match is not None else "overwrite")
            res = obstore.put(self.client, self.path(key), payload, mode=mode, chunk_size=_MULTIPART_CHUNK,
                              max_concurrency=4)
        size = payload.stat().st_size if isinstance(payload, Path) else len(payload)
        return ObjectInfo(key, size, res.get("e_tag"), None)

    def close(self) -> None:
        """Close cached file descriptors (local); clients of object stores are shared and stay."""
        if self._local is not None:
            self._local.close()

    def zarr_store(self, *, read_only: bool = True) -> Any:
        """A zarr-python 3 store over this root (zarr's LocalStore locally, its ObjectStore over obstore else)."""
        import zarr.storage

        if self.is_local:
            return zarr.storage.LocalStore(self.url, read_only=read_only)
        if self.scheme == "memory":
            raise StorageError(f"{self.url}: zarr over memory:// stores is not supported; use a local folder or s3://")
        from obstore.store import S3Store, from_url

        if self.scheme == "s3":
            check_fork_safe(self.url)
            client: Any = S3Store(self.bucket, prefix=self._prefix or None, **self.options.obstore_kwargs())
        else:
            client = from_url(self.url)
        return zarr.storage.ObjectStore(client, read_only=read_only)

    def delete(self, key: str) -> None:
        """Remove an object (missing is fine)."""
        import obstore

        with contextlib.suppress(ObjectNotFound), self._op(key, "delete"):
            if self._local is not None:
                self._local.delete(self._key(key))
            else:
                obstore.delete(self.client, self.path(key))

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object below ``prefix``; how many were removed."""
        import obstore

        keys = [o.key for o in self.list(prefix)]
        if self._local is not None:
            for k in keys:
                self.delete(k)
            _prune_empty(self._local.file(self._key(prefix)))
            return len(keys)
        for i in range(0, len(keys), 1000):
            with self._op(prefix, "delete"):
                obstore.delete(self.client, [self.path(k) for k in keys[i:i + 1000]])
        return len(keys)

    def copy(self, src: str, dst: str) -> None:
        """Server-side copy of one object within this store (replacing ``dst``; S3 has no copy-if-absent)."""
        import obstore

        with self._op(src, "copy"):
            if self._local is not None:
                self._local.copy(self._key(src), self._key(dst))
            else:
                obstore.copy(self.client, self.path(src), self.path(dst))


def _prune_empty(folder: Path) -> None:
    """Remove ``folder`` and the empty folders below it (local stores; object stores have none)."""
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


def _checked(url: str, parts: list[memoryview | bytes], starts: Sequence[int],
             ends: Sequence[int]) -> list[memoryview | bytes]:
    for data, s, e in zip(parts, starts, ends, strict=True):
        if len(data) != e - s:
            raise StorageError(f"{url}: short read, {len(data)} of {e - s} bytes at offset {s} (object truncated?)")
    return parts


class _BinaryReader:
    """obstore's buffered object reader as a binary file whose reads return ``bytes`` (tifffile needs them)."""

    def __init__(self, reader: Any) -> None:
        self._r = reader

    def __enter__(self) -> _BinaryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._r.seek(offset, whence))

    def tell(self) -> int:
        return int(self._r.tell())

    def read(self, size: int | None = -1) -> bytes:
        return bytes(self._r.read(size if size is not None and size >= 0 else None))

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._r.close()


def read_json_info(store: Store, key: str, max_bytes: int) -> tuple[dict[str, Any] | None, str | None]:
    """A small JSON object and the ETag it was read at: ``(None, None)`` when missing; a damaged or
    non-object one is logged and read as ``None`` (with its ETag, so a conditional write can replace it)."""
    try:
        text, info = store.get_text_info(key, max_bytes)
    except ObjectNotFound:
        return None, None
    except NotTextError as exc:
        log.warning("%s", exc)
        return None, exc.info.etag
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        log.warning("%s: unreadable JSON (%s)", store.url_of(key), exc)
        return None, info.etag
    return (data if isinstance(data, dict) else None), info.etag


def open_store(url: str | os.PathLike[str], options: S3Options | Mapping[str, Any] | None = None) -> Store:
    """The :class:`Store` rooted at ``url`` (a local path or an object-store URL)."""
    return Store(url, options)


def object_at(url: str, options: S3Options | Mapping[str, Any] | None = None) -> tuple[Store, str]:
    """The store rooted at the folder holding the object at ``url``, and the object's key in it."""
    scheme, where = split_url(url)
    if scheme == "file":
        path = Path(where).expanduser().absolute()
        return Store(path.parent, options), path.name
    folder, _, name = where.rpartition("/")
    if not folder or not name:
        raise StorageError(f"{url}: not an object URL; write {scheme}://BUCKET/KEY")
    return Store(f"{scheme}://{folder}", options), name


def parent_url(url: str) -> str:
    """The folder (prefix) holding ``url`` (a local one resolved)."""
    scheme, where = split_url(url)
    if scheme == "file":
        return str(Path(where).expanduser().resolve().parent)
    return f"{scheme}://{posixpath.dirname(where)}"
