"""The published index of an object-store lake as a base snapshot plus one cumulative change set.

Pure data and decisions, no I/O (:mod:`.remote` reads and writes the objects):

* :class:`IndexPointer` — ``catalog/index.json``: the generation, the immutable base snapshot
  (``key``, its size and item count), the change set published on top of it (if any) and the
  collections the index holds.
* :class:`ChangeSet` — every item upserted or deleted since the base, latest change per item,
  gzip-compressed JSON. It is *cumulative*: each writer publishes a new one holding the previous
  changes plus its own, so a reader needs the base and one change-set object, never a chain.
* :func:`should_fold` — when a writer folds the changes into a new base snapshot instead.

Why: republishing a whole SQLite snapshot per scene costs O(lake) per ingest (388 MB and 5.9 s
at 100k items, BENCHMARKS.md); a change set costs O(changes since the last fold), and folding
only when the changes are large amortises the snapshot's upload over hundreds of scenes.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["Change", "ChangeSet", "DamagedIndexError", "FoldPolicy", "IndexPointer", "should_fold"]

MAX_CHANGESET_BYTES = 256 * 1024 * 1024  # uncompressed; a change set is folded long before this
_PREFIX = "catalog/index/"


class DamagedIndexError(ValueError):
    """A pointer or change set that is not what cubelake writes (the message says what is wrong)."""


@dataclass(frozen=True, slots=True)
class FoldPolicy:
    """When the changes are folded into a new base snapshot.

    A base under ``always_below`` bytes is cheap to republish, so every change folds (the lake's
    static STAC tree then follows each ingest). Above it, changes accumulate until a change adds a
    new collection, the set reaches ``max_bytes`` compressed, or it holds :meth:`max_entries` items.
    A fold costs about ``f`` per base item, a change about ``c`` per item already in the set, so
    ``n`` changes per fold cost ``f·N/n + c·n/2`` per change, least at ``n = sqrt(2·f/c·N)``;
    with f ≈ 0.08 ms and c ≈ 0.4 ms on the S3 benchmark (BENCHMARKS.md) that is ``0.63·sqrt(N)``.
    """

    always_below: int = 32 * 1024 * 1024
    max_bytes: int = 4 * 1024 * 1024
    per_sqrt_item: float = 0.63
    entries_range: tuple[int, int] = (32, 1000)

    def max_entries(self, base_items: int) -> int:
        lo, hi = self.entries_range
        return max(lo, min(hi, int(self.per_sqrt_item * math.sqrt(max(base_items, 0)))))


def should_fold(policy: FoldPolicy, pointer: IndexPointer | None, changes: ChangeSet | None,
                new_collections: set[str]) -> bool:
    """Whether the next change should publish a new base snapshot rather than a change set."""
    if pointer is None or pointer.base_bytes < policy.always_below:
        return True
    if new_collections - set(pointer.collections):
        return True  # the root catalog must list a new collection at once
    if changes is None:
        return False
    return len(changes.entries) >= policy.max_entries(pointer.items) or changes.encoded_bytes >= policy.max_bytes


@dataclass(frozen=True, slots=True)
class IndexPointer:
    """``catalog/index.json``: what the published index is made of."""

    generation: int
    key: str | None  # the base snapshot (None: empty, every item is in the change set)
    items: int  # items in the base snapshot
    base_bytes: int = 0
    changes: str | None = None  # the cumulative change set on top of the base
    changes_entries: int = 0
    collections: tuple[str, ...] = ()

    @classmethod
    def parse(cls, doc: Any) -> IndexPointer:
        """The pointer in ``doc``; raises :class:`DamagedIndexError` for anything cubelake does not write."""
        if not isinstance(doc, dict) or doc.get("format") != "cubelake-index":
            raise DamagedIndexError("not a cubelake index pointer")
        key, changes = doc.get("key"), (doc.get("changes") or {}).get("key") if isinstance(doc.get("changes"), dict) \
            else None
        for k in (key, changes):
            if k is not None and not (isinstance(k, str) and k.startswith(_PREFIX) and ".." not in k):
                raise DamagedIndexError(f"names {k!r}, which is not an object under {_PREFIX}")
        if key is None and changes is None:
            raise DamagedIndexError("names neither a snapshot nor a change set")
        colls = doc.get("collections", [])
        try:
            return cls(int(doc["generation"]), key, int(doc.get("items", 0)), int(doc.get("base_bytes", 0)), changes,
                       int((doc.get("changes") or {}).get("entries", 0)),
                       tuple(str(c) for c in colls) if isinstance(colls, list) else ())
        except (KeyError, TypeError, ValueError) as exc:
            raise DamagedIndexError(f"a field is missing or not a number ({exc})") from None

    def to_json(self, written_at: str) -> str:
        changes = {"key": self.changes, "entries": self.changes_entries} if self.changes else None
        return json.dumps({"format": "cubelake-index", "version": 2, "generation": self.generation, "key": self.key,
                           "items": self.items, "base_bytes": self.base_bytes, "changes": changes,
                           "collections": list(self.collections), "written_at": written_at}) + "\n"


@dataclass(frozen=True, slots=True)
class Change:
    """The latest change of one item since the base: its item and href, or ``None`` for a deletion."""

    generation: int
    item: dict[str, Any] | None
    href: str | None = None


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """Every change since the base snapshot ``base``, one (the latest) per item id."""

    base: str | None
    entries: dict[str, Change] = field(default_factory=dict)
    encoded_bytes: int = 0  # the size of the object it was read from

    def with_change(self, item_id: str, change: Change) -> ChangeSet:
        return replace(self, entries={**self.entries, item_id: change})

    def collections(self) -> set[str]:
        return {str(c.item["collection"]) for c in self.entries.values() if c.item is not None}

    def encode(self) -> bytes:
        doc = {"format": "cubelake-index-changes", "base": self.base,
               "entries": [{"id": i, "generation": c.generation, "item": c.item, "href": c.href}
                           for i, c in sorted(self.entries.items())]}
        return gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=6, mtime=0)

    @classmethod
    def decode(cls, data: bytes) -> ChangeSet:
        """A change set from its object; raises :class:`DamagedIndexError` when it is not one."""
        try:  # bounded: a hostile object cannot expand into more memory than a real change set needs
            inflater = zlib.decompressobj(wbits=31)
            raw = inflater.decompress(data, MAX_CHANGESET_BYTES)
            if inflater.unconsumed_tail:
                raise DamagedIndexError(f"expands to more than {MAX_CHANGESET_BYTES} bytes")
            doc = json.loads(raw)
        except (zlib.error, ValueError, RecursionError) as exc:
            if isinstance(exc, DamagedIndexError):
                raise
            raise DamagedIndexError(f"not gzip-compressed JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != "cubelake-index-changes" \
                or not isinstance(doc.get("entries"), list):
            raise DamagedIndexError("not a cubelake index change set")
        return cls(doc.get("base"), dict(_entry(e) for e in doc["entries"]), len(data))


def _entry(e: Any) -> tuple[str, Change]:
    if not isinstance(e, dict) or not isinstance(e.get("id"), str) or not isinstance(e.get("generation"), int):
        raise DamagedIndexError("an entry has no id or generation")
    item, href = e.get("item"), e.get("href")
    if item is not None and not (isinstance(item, dict) and item.get("id") == e["id"]
                                 and isinstance(item.get("collection"), str)):
        raise DamagedIndexError(f"the entry of {e['id']!r} holds no STAC item with that id and a collection")
    if href is not None and not isinstance(href, str):
        raise DamagedIndexError(f"the entry of {e['id']!r} has an href that is not a string")
    return e["id"], Change(e["generation"], item, href)
