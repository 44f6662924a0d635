"""Reference sets on disk: kerchunk's JSON (version 1) and fsspec/kerchunk's Parquet format.

JSON suits small sets; above ``PARQUET_THRESHOLD`` chunks the Parquet format (one folder,
``.zmetadata`` plus per-variable record files, read lazily) is used, written through fsspec's
:class:`LazyReferenceMapper` (what ``kerchunk.df.refs_to_dataframe`` drives) with pyarrow.
Both are written to a temporary name and renamed into place, so a reader never sees half a set.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cubelake.errors import RefsError

from .model import TARGETS_ATTR, RefSet, Target

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


def write_refs(refs: RefSet, path: str | Path, fmt: RefsFormat = "auto", *, record_size: int = 100_000) -> Path:
    """Write ``refs`` to ``path`` (a ``.json`` file, or a Parquet folder), atomically; returns the path."""
    path = Path(path)
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
    """An opened reference set: metadata keys in memory, chunk references looked up on demand."""

    path: str
    format: Literal["json", "parquet"]
    meta: dict[str, bytes]
    targets: list[Target]
    _lookup: Mapping[str, Any]
    _urls: dict[str, None]  # every distinct target URL named by a chunk reference

    def get(self, key: str) -> bytes | tuple[str, int, int] | None:
        """Inline bytes, or ``(url, offset, length)``, or ``None`` when the key is absent."""
        if key in self.meta:
            return self.meta[key]
        try:
            v = self._lookup[key]
        except (KeyError, IndexError, ValueError):
            return None
        return _parse_value(v, self.path, key)

    def iter_keys(self) -> Iterator[str]:
        yield from self.meta
        if self.format == "json":
            yield from (k for k in self._lookup if k not in self.meta)
        else:
            yield from (k for k in self._lookup if not k.rsplit("/", 1)[-1].startswith("."))

    @property
    def urls(self) -> list[str]:
        return list(self._urls)


def _parse_value(v: Any, path: str, key: str) -> bytes | tuple[str, int, int]:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return base64.b64decode(v[7:]) if v.startswith("base64:") else v.encode()
    if isinstance(v, list | tuple) and len(v) == 3 and isinstance(v[0], str):
        return v[0], int(v[1]), int(v[2])
    if isinstance(v, list | tuple) and len(v) == 1 and isinstance(v[0], str):
        raise RefsError(f"{path}: key {key!r} references a whole file ({v[0]!r}); cubelake needs byte ranges")
    raise RefsError(f"{path}: key {key!r} has a malformed reference {v!r}; expected inline data or [url, offset, length]")


def _targets(meta: dict[str, bytes]) -> list[Target]:
    try:
        attrs = json.loads(meta.get(".zattrs", b"{}"))
        return [Target.from_dict(d) for d in attrs.get(TARGETS_ATTR, [])]
    except (ValueError, KeyError, TypeError) as exc:
        raise RefsError(f"malformed {TARGETS_ATTR} attribute: {exc}") from exc


def load_refs(path: str | Path) -> LoadedRefs:
    """Open a JSON reference file or a Parquet reference folder (told apart by ``.zmetadata``)."""
    p = Path(path)
    if p.is_dir():
        return _load_parquet(p)
    if not p.exists():
        raise RefsError(f"{p}: no such reference file or folder")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RefsError(f"{p}: not a kerchunk JSON reference file ({exc})") from exc
    if not isinstance(doc, dict):
        raise RefsError(f"{p}: not a kerchunk JSON reference file (top level is not an object)")
    if doc.get("version", 0) not in (0, 1) or "gen" in doc:
        raise RefsError(f"{p}: kerchunk reference version {doc.get('version')!r} with 'gen' is not supported")
    refs = doc.get("refs", doc) if "version" in doc else doc
    templates = {str(k): str(v) for k, v in (doc.get("templates") or {}).items()}
    meta: dict[str, bytes] = {}
    chunks: dict[str, Any] = {}
    urls: dict[str, None] = {}
    for key, v in refs.items():
        if isinstance(v, list) and v and isinstance(v[0], str):
            url = _TEMPLATE.sub(lambda m: templates.get(m.group(1), m.group(0)), v[0]) if "{{" in v[0] else v[0]
            if "{{" in url:
                raise RefsError(f"{p}: key {key!r} uses an undefined template in {v[0]!r}")
            chunks[key] = [url, *v[1:]]
            urls[url] = None
        else:
            meta[key] = _parse_value(v, str(p), key)  # type: ignore[assignment]
    return LoadedRefs(str(p), "json", meta, _targets(meta), chunks, urls)


def _load_parquet(folder: Path) -> LoadedRefs:
    import fsspec
    import pyarrow.parquet as pq
    from fsspec.implementations.reference import LazyReferenceMapper

    zmeta = folder / ".zmetadata"
    if not zmeta.exists():
        raise RefsError(f"{folder}: a Parquet reference folder needs .zmetadata; this folder has none")
    try:
        lazy = LazyReferenceMapper(str(folder), fs=fsspec.filesystem("file"), engine="pyarrow")
        doc = json.loads(zmeta.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise RefsError(f"{folder}: unreadable Parquet references ({exc})") from exc
    zmeta_doc = {k: v for k, v in doc.get("metadata", {}).items() if k.rsplit("/", 1)[-1] in (".zarray", ".zattrs", ".zgroup")}
    meta = {k: json.dumps(v).encode() for k, v in zmeta_doc.items()}
    meta[".zmetadata"] = json.dumps({"metadata": zmeta_doc, "zarr_consolidated_format": 1}).encode()
    urls: dict[str, None] = {}
    for f in sorted(folder.rglob("refs.*.parq")):
        col = pq.read_table(f, columns=["path"]).column("path")
        for u in col.unique().to_pylist():
            if u:
                urls[str(u)] = None
    return LoadedRefs(str(folder), "parquet", meta, _targets(meta), lazy, urls)
