"""Choosing scenes by id and/or catalog search: what ``cube build`` and ``predict`` start from."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from cubelake.errors import CatalogError, CatalogQueryError
from cubelake.lake import AnyLake

__all__ = ["select_scene_ids"]


def select_scene_ids(lake: AnyLake, ids: Sequence[str], query: Any | None) -> list[str]:
    """The ids of the chosen scenes: ``ids``, or the catalog's scene hits for ``query`` (among ``ids`` if
    given; derived items, such as datacubes and predictions, are never chosen).

    Raises :class:`CatalogQueryError` when nothing chooses a scene (a usage error) and
    :class:`CatalogError` naming the ids a search left out, or when it found no scene.
    """
    if query is None:
        if not ids:
            raise CatalogQueryError("no scenes chosen: give scene ids, or search options (--bbox, --datetime, "
                                    "--collection ...) that select them from the catalog")
        return sorted(set(ids))
    from .lake import LakeCatalog

    q = dataclasses.replace(query, ids=tuple(ids)) if ids else query
    with LakeCatalog(lake) as cat:
        found = sorted({h.id for h in cat.search(q, scenes_only=True)})
    missing = sorted(set(ids) - set(found))
    if missing:
        raise CatalogError(f"scene(s) {', '.join(missing)} are not in the catalog of {lake.url} or do not match the "
                           "search options; list them with 'cubelake catalog search'")
    if not found:
        raise CatalogError(f"no scene of {lake.url} matches the search options; try them with "
                           "'cubelake catalog search'")
    return found
