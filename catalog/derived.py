"""Derived products in the catalog: built datacubes and predictions, indexed beside the scenes. No I/O.

A derived product publishes its STAC item at ``<root>/<name>/item.json`` (``root`` one of
:data:`cubelake.lake.DERIVED_ROOTS`); the catalog indexes it with that key as its href, so search, show and
export treat it like a scene's item. Its id must be its folder's name (as a scene's is), and it
must not take the id of another indexed item: ids are one namespace across the catalog. An item
without a ``collection`` is indexed in the collection named after its root (``datacubes``,
``predictions``); the item file itself is never rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cubelake.errors import CatalogError, CorruptItemError
from cubelake.lake import DERIVED_ROOTS, safe_scene_id

from .items import ITEM_FILE

__all__ = ["DERIVED_ROOTS", "DerivedKey", "derived_description", "derived_for_index", "is_derived_href",
           "parse_derived_key"]

_WHAT = {"datacubes": "datacubes built with 'cubelake cube build'",
         "predictions": "model predictions written with 'cubelake predict'"}


@dataclass(frozen=True, slots=True)
class DerivedKey:
    """Where a derived item lives: ``<root>/<name>/item.json``, relative to the lake."""

    root: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.root}/{self.name}/{ITEM_FILE}"


def parse_derived_key(key: object) -> DerivedKey:
    """A lake-relative derived item key, checked; :class:`CatalogError` naming the key and the expected form."""
    expected = (f"expected a key relative to the lake, <root>/<name>/{ITEM_FILE} with <root> one of "
                f"{', '.join(DERIVED_ROOTS)} and <name> made of letters, digits, '.', '_' and '-' "
                f"(e.g. predictions/my-map/{ITEM_FILE})")
    if not isinstance(key, str) or not key:
        raise CatalogError(f"derived item key {key!r}: not a key; {expected}")
    parts = key.split("/")
    why = None
    if key.startswith("/") or ":" in key:
        why = "an absolute path or URL"
    elif "\\" in key:
        why = "backslashes (the key's separator is '/')"
    elif parts[0] not in DERIVED_ROOTS:
        why = f"{parts[0]!r} is not a derived products' folder"
    elif len(parts) != 3 or parts[2] != ITEM_FILE:
        why = f"not three parts ending in {ITEM_FILE}"
    elif parts[1] in ("", ".", "..") or safe_scene_id(parts[1]) != parts[1]:
        why = f"{parts[1]!r} is not a safe name"
    if why is not None:
        raise CatalogError(f"derived item key {key!r}: {why}; {expected}")
    return DerivedKey(parts[0], parts[1])


def is_derived_href(href: str | None) -> bool:
    """Whether an index href is a derived item's (not a scene's)."""
    return bool(href) and str(href).split("/", 1)[0] in DERIVED_ROOTS


def derived_for_index(item: dict[str, Any], ref: DerivedKey, where: str) -> dict[str, Any]:
    """``item`` as the index takes it (its collection defaulted to its root); :class:`CorruptItemError`
    naming ``where`` (its file or URL) when its id is not its folder's name or its collection is unsafe."""
    if item.get("id") != ref.name:
        raise CorruptItemError(f"{where}: item id {item.get('id')!r} differs from its folder {ref.name!r}; "
                               f"write the item with id {ref.name!r} (or move it to {ref.root}/<its id>/)")
    collection = item.get("collection")
    if collection is None:
        return {**item, "collection": ref.root}
    if not isinstance(collection, str) or not collection or safe_scene_id(collection) != collection:
        raise CorruptItemError(f"{where}: collection {collection!r} is not a safe collection id (letters, "
                               f"digits, '.', '_', '-'); use e.g. {ref.root!r}")
    return item


def derived_description(hrefs: list[str]) -> str:
    """A collection description for derived items with these hrefs (for a collection of no scene profile)."""
    roots = sorted({h.split("/", 1)[0] for h in hrefs if is_derived_href(h)})
    what = "; ".join(_WHAT.get(r, r) for r in roots) or "derived products"
    return f"Derived products of the lake: {what}"
