"""Offline validation of STAC objects against the official JSON schemas (``jsonschema`` + ``referencing``).

The core STAC 1.1.0 and GeoJSON schemas are the ones pystac ships; the extension schemas are
official copies bundled in ``cubelake/catalog/schemas`` (their source is named in the README
there). An object is checked against its core schema and against every URL in its
``stac_extensions``; an extension whose schema is not available offline is itself a problem,
so nothing is declared that cannot be checked. Nothing is fetched from the network.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema_specifications
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable

from .schema import STAC_VERSION

__all__ = ["SCHEMA_DIR", "stac_registry", "validate_stac"]

#: The extension schemas bundled with cubelake (official copies).
SCHEMA_DIR = Path(str(files("cubelake.catalog") / "schemas"))

_CORE = f"https://schemas.stacspec.org/v{STAC_VERSION}"
_CORE_FOR_TYPE = {
    "Feature": f"{_CORE}/item-spec/json-schema/item.json",
    "Collection": f"{_CORE}/collection-spec/json-schema/collection.json",
    "Catalog": f"{_CORE}/catalog-spec/json-schema/catalog.json",
}
_MAX_MESSAGE = 300


def _core_resources() -> Iterable[tuple[str, dict[str, Any]]]:
    """pystac's copies of the core STAC and GeoJSON schemas, under the URLs other schemas use for them."""
    import pystac.validation.jsonschemas as bundled

    root = Path(str(files(bundled)))
    for path in sorted((root / "stac-spec" / f"v{STAC_VERSION}").glob("*.json")):
        spec = {"catalog.json": "catalog-spec", "collection.json": "collection-spec"}.get(path.name, "item-spec")
        yield f"{_CORE}/{spec}/json-schema/{path.name}", json.loads(path.read_text())
    for path in sorted((root / "geojson").glob("*.json")):
        yield f"https://geojson.org/schema/{path.name}", json.loads(path.read_text())


def _dir_resources(folder: Path) -> Iterable[tuple[str, dict[str, Any]]]:
    """Every ``*.json`` schema under ``folder``, under its ``$id`` (without a trailing ``#``)."""
    for path in sorted(folder.rglob("*.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and isinstance(doc.get("$id"), str):
            yield doc["$id"].rstrip("#"), doc


@functools.cache
def _registry(extra_dirs: tuple[Path, ...]) -> Registry:
    pairs = [*_core_resources(), *_dir_resources(SCHEMA_DIR)]
    for folder in extra_dirs:  # later folders replace earlier copies of the same $id
        pairs += list(_dir_resources(folder))
    resources = [(uri, Resource.from_contents(doc)) for uri, doc in pairs]
    registry: Registry = Registry().with_resources(resources)
    return registry.combine(jsonschema_specifications.REGISTRY)


def stac_registry(extra_dirs: Sequence[str | Path] = ()) -> Registry:
    """The schemas to validate with: core STAC (pystac's), bundled extensions, then ``extra_dirs``' ``*.json``."""
    return _registry(tuple(Path(d).resolve() for d in extra_dirs))


def _known(registry: Registry, uri: str) -> bool:
    try:
        registry.resolver().lookup(uri)
    except Unresolvable:
        return False
    return True


def _describe(error: jsonschema.ValidationError) -> str:
    """The error's message with a long instance shown by its type, plus the closest alternative's reason."""
    text = repr(error.instance)
    message = error.message.replace(text, f"the {type(error.instance).__name__}") if len(text) > 80 else error.message
    if error.context:
        best = jsonschema.exceptions.best_match(error.context)
        if best is not None:
            message += f" (closest: {best.json_path}: {_describe(best)})"
    return message if len(message) <= _MAX_MESSAGE else message[:_MAX_MESSAGE] + "..."


def validate_stac(obj: Mapping[str, Any], registry: Registry | None = None) -> list[str]:
    """Every way ``obj`` (an Item, Collection or Catalog dict) breaks the official schemas; empty when valid.

    Each problem reads ``<JSON path>: <what is wrong> (<schema URL>)``.
    """
    registry = registry if registry is not None else stac_registry()
    kind = obj.get("type")
    if kind not in _CORE_FOR_TYPE:
        return [f"$.type: {kind!r} is not a STAC object type (expected Feature, Collection or Catalog)"]
    exts = obj.get("stac_extensions", [])
    urls = [_CORE_FOR_TYPE[str(kind)]] + [u for u in exts if isinstance(u, str)] if isinstance(exts, list) else []
    problems = [] if urls else ["$.stac_extensions: not a list of schema URLs"]
    for url in urls or [_CORE_FOR_TYPE[str(kind)]]:
        if not _known(registry, url):
            problems.append(f"$.stac_extensions: {url} has no schema available offline; declare only extensions "
                            "whose official schema cubelake bundles (or pass its folder)")
            continue
        validator = jsonschema.Draft7Validator({"$ref": url}, registry=registry)
        try:
            errors = sorted(validator.iter_errors(obj), key=lambda e: (list(e.absolute_path), e.message))
        except Unresolvable as exc:
            problems.append(f"$: {url} refers to a schema not available offline ({exc})")
            continue
        problems += [f"{e.json_path}: {_describe(e)} ({url})" for e in errors]
    return problems
