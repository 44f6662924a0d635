"""Reference sets on disk: kerchunk's JSON (version 1) and fsspec/kerchunk's Parquet format.

JSON suits small sets; above ``PARQUET_THRESHOLD`` chunks the Parquet format (one folder,
``.zmetadata`` plus per-variable record files, read lazily) is used, written through fsspec's
:class:`LazyReferenceMapper` (what ``kerchunk.df.refs_to_dataframe`` drives) with pyarrow.
Both are written to a temporary name and renamed into place, so a reader never sees half a set.
Local targets under the output's folder are written relative to it (a moved or copied folder
keeps working); loading resolves them against the reference file's folder, and checks every
entry (:mod:`cubelake.refs.validate`) before anything is read.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cubelake.errors import RefsError
from cubelake.storage import ObjectNotFound, StorageError, is_url, object_at, parent_url

from .model import RefSet, Target
from .security import resolve_url, split_url
from .validate import (
    MAX_DOC_BYTES,
    ArraySpec,
    check_chunk_key,
    check_key,
    check_metadata,
    check_range,
    check_url,
    parse_targets,
)

__all__ = ["PARQUET_THRESHOLD", "LoadedRefs", "load_refs", "write_refs"]

PARQUET_THRESHOLD = 100_000
RefsFormat = Literal["auto", "json", "parquet"]
_TEMPLATE = re.compile(r"\{\{(\w+)\}\}")


def _inline(value: bytes) -> str:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode()
    return text if not text.startswith("base64:") else "base64:" + base64.b64encode(value).decode()


def _to_json(refs: RefSet) -> dict[str, Any]:
    templates = {f"t{i}": t.url for i, t in enumerate(refs.targets)}
    out: dict[str, Any] = {k: _inline(v) for k, v in refs.meta.items()}
    for key, (ti, off, n) in refs.chunks.items():
        out[key] = [f"{{{{t{ti}}}}}", off, n]
    return {"version": 1, "templates": templates, "refs": out}


def relative_targets(refs: RefSet, folder: str | Path) -> RefSet:
    """``refs`` with each local target that lies under ``folder`` named relative to it (others unchanged)."""
    base = os.path.realpath(folder)
    targets = []
    for t in refs.targets:
        scheme, where = split_url(t.url)
        if scheme == "file" and os.path.isabs(where):
            real = os.path.realpath(where)
            if real.startswith(base.rstrip(os.sep) + os.sep):
                t = dataclasses.replace(t, url=Path(os.path.relpath(real, base)).as_posix())
        targets.append(t)
    if targets == refs.targets:
        return refs
    out = RefSet(dict(refs.meta), refs.chunks, targets)
    out.consolidate()
    return out


def write_refs(refs: RefSet, path: str | Path, fmt: RefsFormat = "auto", *, record_size: int = 100_000,
               relative: bool = True) -> Path:
    """Write ``refs`` to ``path`` (a ``.json`` file, or a Parquet folder), atomically; returns the path.

    ``relative``: local targets under ``path``'s folder are written relative to it, so the folder
    can be moved or copied with them.
    """
    path = Path(path)
    if relative:
        refs = relative_targets(refs, path.parent)
    if fmt == "auto":
        fmt = "parquet" if refs.n_chunks >= PARQUET_THRESHOLD else "json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        if fmt == "json":
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(_to_json(refs), f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
        else:
            _write_parquet(refs, tmp, record_size)
        if path.is_dir() and fmt == "parquet":
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
    return path


def _write_parquet(refs: RefSet, folder: Path, record_size: int) -> None:
    import fsspec
    from fsspec.implementations.reference import LazyReferenceMapper

    fs = fsspec.filesystem("file")
    folder.mkdir(parents=True)
    out = LazyReferenceMapper.create(root=str(folder), fs=fs, record_size=record_size, engine="pyarrow")
    urls = [t.url for t in refs.targets]
    for key in sorted(refs.meta):
        if key != ".zmetadata":  # the mapper writes its own, with the record size
            out[key] = refs.meta[key]
    for key in sorted(refs.chunks):
        ti, off, n = refs.chunks[key]
        out[key] = [urls[ti], off, n]
    out.flush()


@dataclass
class LoadedRefs:
    """An opened, checked reference set: metadata keys in memory, chunk references looked up on demand.

    Target URLs are as resolved against :attr:`base` (the reference file's folder): a relative
    local target becomes an absolute path.
    """

    path: str
    format: Literal["json", "parquet"]
    meta: dict[str, bytes]
    targets: list[Target]
    _lookup: Mapping[str, Any]
    _urls: dict[str, str]  # every distinct target URL named by a chunk reference -> the URL resolved
    base: str = ""  # the folder relative targets are resolved against (the reference file's)
    max_end: dict[str, int] = dataclasses.field(default_factory=dict)  # resolved URL -> furthest byte referenced
    range_error: str | None = None  # the first byte range past its target's recorded size, if any

    def check_ranges(self) -> None:
        """Raise :class:`RefsError` for a byte range past its target's recorded size.

        Kept apart from loading so that an opener can first refuse targets it does not trust:
        "outside the allowed roots" is the answer a set pointing at /etc/passwd deserves.
        """
        if self.range_error is not None:
            raise RefsError(self.range_error)

    def get(self, key: str) -> bytes | tuple[str, int, int] | None:
        """Inline bytes, or ``(url, offset, length)``, or ``None`` when the key is absent."""
        if key in self.meta:
            return self.meta[key]
        try:
            v = self._lookup[key]
        except (KeyError, IndexError, ValueError, FileNotFoundError):
            return None
        if isinstance(v, tuple):
            return v  # a JSON set: checked and resolved on loading
        parsed = _parse_value(v, self.path, key)
        if isinstance(parsed, bytes):
            return parsed
        url, off, n = parsed
        if url not in self._urls:  # every URL of a Parquet set was checked on loading
            raise RefsError(f"{self.path}: key {key!r} names target {url!r}, which was not among those checked")
        return self._urls[url], off, n

    def iter_keys(self) -> Iterator[str]:
        yield from self.meta
        if self.format == "json":
            yield from (k for k in self._lookup if k not in self.meta)
        else:
            yield from (k for k in self._lookup if not k.rsplit("/", 1)[-1].startswith("."))

    @property
    def urls(self) -> list[str]:
        """Every distinct target of a chunk reference, resolved."""
        return list(dict.fromkeys(self._urls.values()))


def _parse_value(v: Any, path: str, key: str) -> bytes | tuple[str, int, int]:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        if not v.startswith("base64:"):
            return v.encode()
        try:
            return base64.b64decode(v[7:], validate=True)
        except (binascii.Error, ValueError):
            raise RefsError(f"{path}: key {key!r}: inline data marked base64: is not valid base64") from None
    if isinstance(v, list | tuple) and len(v) == 3 and isinstance(v[0], str):
        url = check_url(v[0], path, key)
        off, n = check_range(v[1], v[2], path, key)
        return url, off, n
    if isinstance(v, list | tuple) and len(v) == 1 and isinstance(v[0], str):
        raise RefsError(f"{path}: key {key!r} references a whole file ({v[0]!r}); cubelake needs byte ranges")
    raise RefsError(f"{path}: key {key!r} has a malformed reference {str(v)[:200]!r}; expected inline data or "
                    "[url, offset, length]")


def _read_json_file(p: Path) -> Any:
    """A JSON document from a regular file of at most ``MAX_DOC_BYTES`` (a FIFO would block a reader)."""
    if not p.is_file():
        raise RefsError(f"{p}: not a regular file; give a kerchunk JSON file or a Parquet reference folder")
    with open(p, "rb") as f:
        raw = f.read(MAX_DOC_BYTES + 1)
    if len(raw) > MAX_DOC_BYTES:
        raise RefsError(f"{p}: more than {MAX_DOC_BYTES} bytes; write a set this large as Parquet "
                        "(--refs-format parquet)")
    return _parse_json(raw, p)


def _parse_json(raw: bytes, where: Any) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise RefsError(f"{where}: not a kerchunk JSON reference file (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RefsError(f"{where}: not a kerchunk JSON reference file ({exc})") from None


def _ends(chunks: Iterable[tuple[str, tuple[str, int, int]]], targets: list[Target],
          path: str | Path) -> tuple[dict[str, int], str | None]:
    """The furthest byte referenced in each target, and the first range past a target's recorded size."""
    sizes = {t.url: t.size for t in targets}
    ends: dict[str, int] = {}
    problem = None
    for key, (url, off, n) in chunks:
        end = off + n
        if problem is None and end > sizes.get(url, end):
            problem = f"{path}: key {key!r}: bytes {off}..{end} lie past the end of {url} ({sizes[url]} bytes recorded)"
        if end > ends.get(url, 0):
            ends[url] = end
    return ends, problem


def _resolved_targets(targets: list[Target], base: str) -> list[Target]:
    return [dataclasses.replace(t, url=resolve_url(t.url, base)) for t in targets]


def load_refs(path: str | Path, storage_options: Any = None) -> LoadedRefs:
    """Open and check a JSON reference file or a Parquet reference folder (told apart by ``.zmetadata``).

    ``path`` may be an object-store URL of a JSON set (``s3://.../x.refs.json``); its relative
    targets resolve against its own folder there.
    """
    if is_url(str(path)):
        return _load_remote_json(str(path), storage_options)
    p = Path(path)
    if p.is_dir():
        return _load_parquet(p)
    if not p.exists():
        raise RefsError(f"{p}: no such reference file or folder")
    return _load_json_doc(_read_json_file(p), p, str(p.resolve().parent))


def _load_remote_json(url: str, storage_options: Any) -> LoadedRefs:
    store, key = object_at(url, storage_options)
    if not key.lower().endswith(".json"):
        raise RefsError(f"{url}: only JSON reference sets can be read from an object store; download a Parquet "
                        "set first, or write it as JSON")
    try:
        if store.head(key).size > MAX_DOC_BYTES:
            raise RefsError(f"{url}: more than {MAX_DOC_BYTES} bytes; not a reference set cubelake reads")
        raw = store.get(key)
    except ObjectNotFound:
        raise RefsError(f"{url}: no such reference file") from None
    except StorageError as exc:
        raise RefsError(str(exc)) from None
    return _load_json_doc(_parse_json(raw, url), url, parent_url(url))


def _load_json_doc(doc: Any, p: Any, base: str) -> LoadedRefs:
    """A parsed kerchunk JSON document, checked; ``p`` names it in errors, ``base`` resolves relative targets."""
    if not isinstance(doc, dict):
        raise RefsError(f"{p}: not a kerchunk JSON reference file (top level is not an object)")
    if doc.get("version", 0) not in (0, 1) or "gen" in doc:
        raise RefsError(f"{p}: kerchunk reference version {doc.get('version')!r} with 'gen' is not supported")
    refs = doc.get("refs", doc) if "version" in doc else doc
    templates = doc.get("templates") or {}
    if not isinstance(refs, dict) or not isinstance(templates, dict):
        raise RefsError(f"{p}: not a kerchunk JSON reference file ('refs' and 'templates' must be objects)")
    templates = {str(k): check_url(v, p, f"templates/{k}") for k, v in templates.items()}
    meta: dict[str, bytes] = {}
    raw: dict[str, tuple[str, int, int]] = {}
    for key, v in refs.items():
        if key in ("version", "templates") and refs is doc:
            continue
        check_key(key, p)
        if isinstance(v, list) and len(v) == 3 and isinstance(v[0], str) and "{{" in v[0]:
            url = _TEMPLATE.sub(lambda m: templates.get(m.group(1), m.group(0)), v[0])
            if "{{" in url:
                raise RefsError(f"{p}: key {key!r} uses an undefined template in {v[0]!r}")
            v = [url, *v[1:]]
        parsed = _parse_value(v, str(p), key)
        if isinstance(parsed, bytes):
            meta[key] = parsed
        else:
            raw[key] = parsed
    meta, arrays = check_metadata(meta, p)
    for key in raw:
        check_chunk_key(key, arrays, p)
    targets = _resolved_targets(parse_targets(meta, p), base)
    urls = {u: resolve_url(u, base) for u in dict.fromkeys(v[0] for v in raw.values())}
    chunks = {k: (urls[u], off, n) for k, (u, off, n) in raw.items()}
    ends, problem = _ends(chunks.items(), targets, p)
    return LoadedRefs(str(p), "json", meta, targets, chunks, urls, base, ends, problem)


def _load_parquet(folder: Path) -> LoadedRefs:
    import fsspec
    from fsspec.implementations.reference import LazyReferenceMapper

    zmeta = folder / ".zmetadata"
    if not zmeta.exists():
        raise RefsError(f"{folder}: a Parquet reference folder needs .zmetadata; this folder has none")
    doc = _read_json_file(zmeta)
    record_size = doc.get("record_size") if isinstance(doc, dict) else None
    if not isinstance(record_size, int) or isinstance(record_size, bool) or record_size < 1:
        raise RefsError(f"{zmeta}: record_size {record_size!r} is not an integer >= 1; not an fsspec Parquet "
                        "reference folder")
    meta, arrays = check_metadata({}, folder, consolidated=doc)
    try:
        lazy = LazyReferenceMapper(str(folder), fs=fsspec.filesystem("file"), engine="pyarrow")
    except (ValueError, OSError, KeyError, TypeError) as exc:
        raise RefsError(f"{folder}: unreadable Parquet references ({exc})") from exc
    base = str(folder.resolve().parent)
    targets = _resolved_targets(parse_targets(meta, folder), base)
    urls, ends, problem = _check_parquet(folder, arrays, record_size, targets, base)
    return LoadedRefs(str(folder), "parquet", meta, targets, lazy, urls, base, ends, problem)


def _check_parquet(folder: Path, arrays: dict[str, ArraySpec], record_size: int, targets: list[Target],
                   base: str) -> tuple[dict[str, str], dict[str, int], str | None]:
    """Check every record file's references, vectorised; the URLs (raw -> resolved) and furthest byte per target."""
    from ._parquet import check_record_file

    urls: dict[str, str] = {}
    ends: dict[str, int] = {}
    problem = None
    sizes = {t.url: t.size for t in targets}
    for f in sorted(folder.rglob("refs.*.parq")):
        for raw_url, end, key_of_max in check_record_file(folder, f, arrays, record_size):
            if raw_url not in urls:
                urls[raw_url] = resolve_url(check_url(raw_url, folder, key_of_max), base)
            url = urls[raw_url]
            if problem is None and end > sizes.get(url, end):
                problem = (f"{folder}: key {key_of_max!r}: bytes up to {end} lie past the end of {url} "
                           f"({sizes[url]} bytes recorded)")
            ends[url] = max(ends.get(url, 0), end)
    return urls, ends, problem
