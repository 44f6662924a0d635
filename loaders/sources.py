"""Opening a product for the loader: a lake scene folder, catalog hit or STAC item, ``.zarr`` store, refs or COG.

The kinds themselves live in :mod:`.products` (one module each, one interface, :class:`ChunkSource`);
this module finds which product a name means, opens it (asked again when the store fails in a way that
may pass) and attaches labels.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cubelake.errors import CubelakeError
from cubelake.products import aux_array_name, aux_cog_name, scene_product
from cubelake.storage import S3Options, error_line, is_transient, is_url, join_url, parent_url

from .products import ChunkSource, Piece, ProductError, open_cog, open_refs, open_zarr
from .products._base import _labels_tif, _scene_record

__all__ = ["ChunkSource", "Piece", "ProductError", "ProductLike", "open_aux", "open_source", "open_sources"]

log = logging.getLogger(__name__)

ProductLike = Any  # str | Path | catalog SearchHit | STAC item dict
PRODUCT_PREFERENCE = ("zarr", "refs", "cog")


def _scene_dir_source(folder: Path, prefer: Sequence[str], options: S3Options | None,
                      lake: str | Path | None = None) -> ChunkSource:
    record = _scene_record(folder)
    if record is None:
        raise ProductError(f"{folder}: no scene.json; give a lake scene folder, a .zarr store, refs or a COG")
    sid = record.scene_id
    products = record.products
    labels = folder / (record.labels.cog if record.labels is not None and record.labels.cog else f"{sid}.labels.tif")
    found = scene_product(folder, products, prefer)
    if found is not None:
        kind, p = found[0], str(found[1])
        if kind == "zarr":
            return open_zarr(p, sid, options, record)
        if kind == "refs":
            return open_refs(p, sid, options, record, [], labels_path=labels, lake=lake)
        return open_cog(p, sid, options, record, labels)
    raise ProductError(f"{folder}: scene {sid} has none of the products {list(prefer)} (it has {sorted(products)}); "
                       "re-ingest with --products " + ",".join(prefer))


def _object_scene_source(url: str, prefer: Sequence[str], options: S3Options | None,
                         lake: str | Path | None) -> ChunkSource:
    """A scene of an object-store lake, resolved through its commit object to its published version."""
    from cubelake.object_lake import ObjectLake

    root, sep, sid = url.rstrip("/").rpartition("/scenes/")
    if not sep or "/" in sid:
        raise ProductError(f"{url}: not a lake scene (expected <lake>/scenes/<id>), a .zarr store, refs or a COG")
    try:
        lk = ObjectLake(root, create=False, options=options)
        record, location = lk.scene_record(sid), lk.scene_location(sid)
    except CubelakeError as exc:
        raise ProductError(f"{url}: {exc}") from None
    if record is None or location is None:
        raise ProductError(f"{url}: scene {sid} is not published in the lake {root}")
    products = record.products
    for kind in prefer:
        info = products.get(kind)
        if not info:
            continue
        p = join_url(location, info.path)
        if kind == "zarr":
            return open_zarr(p, sid, options, record)
        if kind == "refs":
            return open_refs(p, sid, options, record, [], lake=lake or root)
        return open_cog(p, sid, options, record, None)
    raise ProductError(f"{url}: scene {sid} has none of the products {list(prefer)} (it has {sorted(products)})")


def open_source(product: ProductLike, *, prefer: Sequence[str] = PRODUCT_PREFERENCE, storage_options: S3Options | None = None,
                allowed_roots: Sequence[str] = (), labels: str | Path | None = None,
                lake: str | Path | None = None) -> ChunkSource:
    """A :class:`ChunkSource` for a lake scene folder, catalog hit or STAC item, ``.zarr`` store, refs or COG.

    ``prefer``: product kinds to try, in order, for scenes that have several. ``labels``: a
    label raster on the scene's grid (overrides the scene's own). ``lake``: the lake a catalog
    hit came from (hits name their item relative to it); reference sets of its scenes may also
    point into its allowed roots (a lake found on disk next to the product is not trusted).
    """
    args = {"product": product, "prefer": tuple(prefer), "storage_options": storage_options,
            "allowed_roots": tuple(allowed_roots), "labels": labels, "lake": lake}
    href = getattr(product, "href", None)
    if href is not None and not Path(href).is_absolute():
        if lake is None:
            raise ProductError(f"catalog hit {getattr(product, 'id', href)}: its item path {href} is relative to its lake; "
                               "pass lake=<the lake folder> too")
        product = join_url(str(lake), href) if is_url(str(lake)) else Path(lake) / href
    src = _open_retrying(product, lambda: _open_source(product, prefer, storage_options, allowed_roots, labels, lake))
    src.open_args = args
    return src


OPEN_ATTEMPTS = 4  # tries to open a product whose store fails in a way that may pass
_OPEN_BACKOFF_S = (0.2, 5.0)  # full-jitter backoff between them: base, cap


def _open_retrying(product: ProductLike, open_: Callable[[], ChunkSource]) -> ChunkSource:
    """``open_()``, asked again (full-jitter backoff, :data:`OPEN_ATTEMPTS` in all) when the store failed
    in a way that may pass. The metadata reads of an open go through zarr and GDAL, which give up on a
    body that times out or is cut (obstore's and GDAL's own retries, ``max_retries``, cover status codes,
    not those); a bad product or a refusal fails at once."""
    attempts = OPEN_ATTEMPTS
    for attempt in range(attempts):
        try:
            return open_()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if attempt + 1 == attempts:
                raise ProductError(f"{_name(product)}: could not be opened: the store failed {attempts} times, last: "
                                   f"{error_line(exc)}; check the endpoint, or raise storage_options max_retries or "
                                   "request_timeout_s for a slow link") from None
            base, cap = _OPEN_BACKOFF_S
            delay = random.uniform(0, min(cap, base * 2**attempt))
            log.warning("%s: opening failed (%s); attempt %d of %d in %.2f s", _name(product), error_line(exc),
                        attempt + 2, attempts, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _name(product: ProductLike) -> str:
    return str(getattr(product, "href", None) or (product.get("id") if isinstance(product, dict) else product))


def _open_source(product: ProductLike, prefer: Sequence[str], storage_options: S3Options | None,
                 allowed_roots: Sequence[str], labels: str | Path | None, lake: str | Path | None) -> ChunkSource:
    href = str(product) if isinstance(product, Path) and product.name == "item.json" else None
    if isinstance(product, dict) and product.get("type") == "Feature":
        links = [ln["href"] for ln in product.get("links", []) if ln.get("rel") == "self"]
        href = links[0] if links else None
        if href is None:
            raise ProductError(f"STAC item {product.get('id')}: no self link; open its scene folder instead")
    if href is None and isinstance(product, str) and is_url(product) and product.endswith("/item.json"):
        href = product
    if href is not None:
        product = parent_url(href) if is_url(href) else Path(href).parent
    s = str(product)
    name = s.rstrip("/").rsplit("/", 1)[-1]
    if is_url(s):
        stem = name.split(".")[0]
        if not name.lower().endswith((".zarr", ".json", ".parq", ".parquet", ".tif", ".tiff")):
            return _with_labels(_object_scene_source(s, prefer, storage_options, lake), labels)
    else:
        p = Path(s)
        if not p.exists():
            raise ProductError(f"{s}: no such product; give a lake scene folder, a .zarr store, refs or a COG")
        if p.is_dir() and (p / "scene.json").exists():
            src = _scene_dir_source(p, prefer, storage_options, lake)
            return _with_labels(src, labels)
        stem = name.split(".")[0]
        s = str(p.resolve())
    low = name.lower()
    if low.endswith(".zarr") or low.endswith(".zarr/"):
        src = open_zarr(s, stem, storage_options, None)
    elif low.endswith((".json", ".parq", ".parquet")):
        src = open_refs(s, stem, storage_options, None, allowed_roots, lake=lake)
    elif low.endswith((".tif", ".tiff")):
        src = open_cog(s, stem, storage_options, None, None)
    else:
        raise ProductError(f"{s}: unknown product type; expected a .zarr store, .refs.json/.refs.parq references, "
                           "a .tif COG or a lake scene folder")
    return _with_labels(src, labels)


def open_aux(src: ChunkSource, name: str) -> ChunkSource:
    """The aux layer ``name`` of ``src``'s scene (``cubelake ingest --aux``), a source on the same grid: the
    ``aux_<name>`` array of the scene's Zarr, or for refs and COGs the ``<id>.aux_<name>.tif`` beside them."""
    if src.kind == "zarr":
        aux = open_zarr(src.url, src.scene_id, src.storage_options, None, array=aux_array_name(name))
    else:
        url = join_url(parent_url(src.url), aux_cog_name(src.scene_id, name))
        if not is_url(url) and not Path(url).is_file():
            raise ProductError(f"{src.url}: scene {src.scene_id} has no aux layer {name!r} (no {Path(url).name} "
                               "beside it); ingest the scene with --aux, or ask for a layer it has")
        aux = open_cog(url, src.scene_id, src.storage_options, None, None)
    g, a = src.grid, aux.grid
    if (a.height, a.width, a.chunk_y, a.chunk_x) != (g.height, g.width, g.chunk_y, g.chunk_x):
        raise ProductError(f"{aux.url}: aux layer {name!r} is not on the scene's chunk grid ({a} vs {g}); "
                           "re-ingest the scene with --aux so the layer is written on its grid")
    aux.open_args = {"aux_of": src.open_args, "aux": name}
    return aux


def _reopen(args: dict[str, Any], stats: dict[str, np.ndarray] | None) -> ChunkSource:
    if "aux" in args:  # an aux layer: its scene's product, then the layer
        return open_aux(_reopen(args["aux_of"], None), args["aux"])
    src = open_source(**args)
    src.stats = stats
    return src


def _with_labels(src: ChunkSource, labels: str | Path | None) -> ChunkSource:
    if labels is not None:
        src.labels_loader = _labels_tif(Path(labels), (src.grid.height, src.grid.width))
    return src


def open_sources(products: Sequence[ProductLike] | Any, **kw: Any) -> list[ChunkSource]:
    """:func:`open_source` for each product (a list, or a catalog search result)."""
    return [open_source(p, **kw) for p in products]

