"""Scene identity: ids, content hashes of the source files, and the config hash.

Re-ingesting is skipped when both hashes equal the published scene's. File hashes are reused
from the published record while a file's size and mtime are unchanged (as git and rsync do),
so an unchanged scene costs a ``stat`` per file, not a re-read. Files are hashed with BLAKE3:
cryptographic, listed in multihash (STAC ``file:checksum``), and 2.2x faster than SHA-256 here
(3.5 vs 1.6 GB/s on one core), which matters because ingest hashes every source byte.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cubelake.hashing import file_blake3
from cubelake.lake import AnyLake, safe_scene_id
from cubelake.record import SceneRecord, SourceFile
from cubelake.storage import object_at, url_of_gdal_path

from .sources import SceneInput, SceneKind
from .sources.envi import DATA_EXTENSIONS

__all__ = ["FORMAT_VERSION", "FileFingerprint", "base_name", "config_hash", "content_hash", "fingerprint_files",
           "scene_id_for"]

#: Bumped when products change shape for the same inputs and config (forces re-ingest).
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class FileFingerprint:
    path: str
    size: int
    mtime_ns: int
    blake3: str | None
    etag: str | None = None  # an object-store source: its ETag identifies the content (hashing it means reading it all)

    def to_dict(self) -> dict[str, Any]:
        out = {"path": self.path, "size": self.size, "mtime_ns": self.mtime_ns, "blake3": self.blake3}
        return out | ({"etag": self.etag} if self.etag is not None else {})


def fingerprint_files(files: list[str], previous: SceneRecord | None = None) -> list[FileFingerprint]:
    """Size, mtime and BLAKE3 of each file; hashes reused from ``previous`` when size+mtime match."""
    known: dict[str, SourceFile] = {}
    if previous is not None:
        known = {f.path: f for f in previous.source.files}
    out = []
    for f in files:
        url = url_of_gdal_path(f)
        if url is not None:
            out.append(_remote_fingerprint(url))
            continue
        p = Path(f).resolve()
        st = p.stat()
        old = known.get(str(p))
        if old is not None and old.size == st.st_size and old.mtime_ns == st.st_mtime_ns and old.blake3 is not None:
            digest = old.blake3
        else:
            digest = file_blake3(p)
        out.append(FileFingerprint(str(p), st.st_size, st.st_mtime_ns, digest))
    return out


def _remote_fingerprint(url: str) -> FileFingerprint:
    store, key = object_at(url)
    head = store.head(key)
    return FileFingerprint(url, head.size, 0, None, head.etag or f"size-{head.size}")


def content_hash(prints: list[FileFingerprint]) -> str:
    """One hash for the scene's bytes, independent of where the files are (objects: their ETag and size)."""
    h = hashlib.sha256()
    for fp in prints:
        h.update((fp.blake3 or f"etag:{fp.etag}:{fp.size}").encode())
    return h.hexdigest()


def config_hash(settings: dict[str, Any]) -> str:
    payload = {"format_version": FORMAT_VERSION, **settings}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def base_name(inp: SceneInput, tags: dict[str, str] | None = None) -> str:
    """The name a scene's id starts from (before any suffix that tells two sources of one name apart)."""
    if inp.kind is SceneKind.LANDSAT:
        if tags and tags.get("LANDSAT_SCENE_ID"):
            return tags["LANDSAT_SCENE_ID"]
        name = inp.path.name
        for suffix in ("_MTL.txt", "_MTL.json", "_MTL.TXT", "_MTL.JSON"):
            name = name.removesuffix(suffix)
        return name
    if inp.kind is SceneKind.ENVI:
        stem = inp.path.name.removesuffix(".hdr").removesuffix(".HDR")
        for ext in DATA_EXTENSIONS:
            if ext and stem.lower().endswith(ext):
                stem = stem[: -len(ext)]
        return stem
    if inp.kind is SceneKind.DLR:  # the delivery's name: <name>-METADATA.XML
        return inp.path.name[: -len("-METADATA.XML")]
    return inp.path.stem


def scene_id_for(lake: AnyLake, inp: SceneInput, tags: dict[str, str] | None = None) -> str:
    """A safe, stable id; another source already owning the name gets a path-hash suffix."""
    base = safe_scene_id(base_name(inp, tags))
    source = inp.url or (str(inp.path.resolve()) if inp.path.exists() else os.path.abspath(inp.path))
    for cand in (base, f"{base}-{hashlib.sha1(os.fsencode(source)).hexdigest()[:8]}"):
        rec = lake.scene_record(cand)
        if rec is None:
            rejected = lake.rejected_record(cand) or {}
            src = rejected.get("source")
            owner = src.get("path") if isinstance(src, dict) else None
            if owner not in (None, source):
                continue
            return cand
        if rec.source.path == source:
            return cand
    return f"{base}-{hashlib.sha1(os.fsencode(source)).hexdigest()[:8]}"
