"""A reference set in memory: Zarr v2 metadata plus chunk keys mapped to byte ranges of targets.

This is kerchunk's reference model (a key maps to inline bytes or to ``[url, offset, length]``),
with one addition kept inside the Zarr metadata itself so that it travels with every format:
the root attribute ``cubelake:targets`` lists each referenced file's URL, size, mtime and
content fingerprint (local files) or ETag (S3), which readers compare before trusting a byte
range (see :mod:`cubelake.refs.store`). A local URL may be relative: it is then relative to the
folder of the reference file, so a lake keeps working after ``mv`` or ``cp -r``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["REFS_VERSION", "TARGETS_ATTR", "RefSet", "Target"]

REFS_VERSION = 1
TARGETS_ATTR = "cubelake:targets"


@dataclass(frozen=True, slots=True)
class Target:
    """A referenced file as it was when the references were made."""

    url: str
    size: int
    mtime_ns: int | None = None  # local files: a fast path only (a copy gets a new mtime)
    etag: str | None = None  # object stores
    fingerprint: str | None = None  # local files: see cubelake.refs.fingerprint (absent in old sets)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"url": self.url, "size": self.size}
        if self.mtime_ns is not None:
            d["mtime_ns"] = self.mtime_ns
        if self.etag is not None:
            d["etag"] = self.etag
        if self.fingerprint is not None:
            d["fingerprint"] = self.fingerprint
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Target:
        """A target from its recorded form (validated by :func:`cubelake.refs.validate.parse_targets`)."""
        return cls(str(d["url"]), int(d["size"]), d.get("mtime_ns"), d.get("etag"), d.get("fingerprint"))

    @property
    def content_key(self) -> str:
        """What identifies the content, not where or when it was copied: size and fingerprint/ETag (else mtime)."""
        return f"{self.size}:{self.fingerprint or self.etag or self.mtime_ns}"


@dataclass(slots=True)
class RefSet:
    """Metadata/inline keys, chunk references (key -> target index, offset, length), and the targets."""

    meta: dict[str, bytes] = field(default_factory=dict)
    chunks: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)

    def json_meta(self, key: str) -> dict[str, Any]:
        return dict(json.loads(self.meta[key]))

    def set_json(self, key: str, value: dict[str, Any]) -> None:
        self.meta[key] = json.dumps(value, allow_nan=True, sort_keys=True).encode()

    def consolidate(self) -> None:
        """Record the targets in the root attributes and (re)write ``.zmetadata`` from the metadata keys."""
        attrs = self.json_meta(".zattrs") if ".zattrs" in self.meta else {}
        attrs[TARGETS_ATTR] = [t.to_dict() for t in self.targets]
        attrs["cubelake:refs_version"] = REFS_VERSION
        self.set_json(".zattrs", attrs)
        metadata = {k: json.loads(v) for k, v in self.meta.items()
                    if k.rsplit("/", 1)[-1] in (".zarray", ".zattrs", ".zgroup")}
        self.set_json(".zmetadata", {"metadata": metadata, "zarr_consolidated_format": 1})

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)
