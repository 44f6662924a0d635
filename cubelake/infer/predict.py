"""Whole-scene prediction into the lake: each scene's map written, described and published as a product.

``predict_scene(lake, scene_id, model)`` runs :func:`.blocks.predict_blocks` over the scene's
preferred product (Zarr, refs or COG: the chunk-aware reader reads them alike), streams the
finished chunks into a staged Zarr store and COGs (:mod:`.product`), describes them with a STAC
item linked to the scene's item (:mod:`.item`) and publishes both with the lake's protocol for
derived products (:mod:`cubelake.derived`): atomic (readers see the old map or the new one),
and idempotent: the item records the hash of the model file, the scene's product version and the
settings that shape the values; the same three again find the published map "up to date" and
nothing runs. The item is then indexed in the lake's catalog, so predictions are found by
``cubelake catalog search`` like scenes.

Layout: ``predictions/<scene>__<model>/item.json`` and ``.../v/<version>/`` (the product files).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cubelake.errors import CubelakeError
from cubelake.lake import AnyLake, Lake, open_lake, safe_scene_id
from cubelake.loaders.reader import ReaderConfig
from cubelake.loaders.sources import open_source
from cubelake.object_lake import new_version

from .blocks import PredictSettings, PredictStats, predict_blocks, resolve_halo
from .errors import InferError
from .model import LoadedModel, load_model, with_spec

__all__ = ["PredictResult", "inputs_hash", "predict_name", "predict_scene", "predict_scenes", "scene_identity"]

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]


@dataclass
class PredictResult:
    scene_id: str
    name: str
    status: Literal["predicted", "up to date", "failed"]
    item_url: str | None = None
    message: str = ""
    stats: PredictStats = field(default_factory=PredictStats)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stats"] = dataclasses.asdict(self.stats)
        return d


def predict_name(scene_id: str, model_name: str) -> str:
    """The product's name (folder and STAC item id): ``<scene>__<model>``."""
    name = f"{scene_id}__{model_name}"
    if safe_scene_id(name) != name:
        raise InferError(f"{name!r} is not a safe product name; rename the model (letters, digits, '.', '_', '-')")
    return name


def inputs_hash(model: LoadedModel, scene: dict[str, Any], settings: dict[str, Any]) -> str:
    """What a published prediction is the function of: the model file and the spec it ran with (given or
    its own), the scene's product (:func:`scene_identity`) and the settings that shape the values (with the
    preprocessing actually applied)."""
    doc = {"model_sha256": model.sha256, "spec": model.spec.to_dict(), "scene": scene, "settings": settings}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def scene_identity(lake: AnyLake, scene_id: str, src: Any) -> dict[str, Any]:
    """The scene's product as a prediction depends on it: what was ingested (content), how (config), which
    product and grid was read, and the product's own version."""
    record = lake.scene_record(scene_id)
    g = src.grid
    return {"content_hash": getattr(record, "content_hash", None), "config_hash": getattr(record, "config_hash", None),
            "product": src.kind, "grid": [g.height, g.width, g.chunk_y, g.chunk_x], "version": src.version}


def _scene_source(lake: AnyLake, scene_id: str) -> Any:
    if lake.scene_record(scene_id) is None:
        raise InferError(f"no scene {scene_id!r} in {lake.url}; list them with 'cubelake catalog search --lake {lake.url}'")
    where = lake.scene_dir(scene_id) if isinstance(lake, Lake) else lake.store.url_of(f"scenes/{scene_id}")
    src = open_source(where, storage_options=None if lake.is_local else lake.store.options)
    if src.grid.chunk_y != src.grid.chunk_x:
        raise InferError(f"{src.url}: its chunks are {src.grid.chunk_y}x{src.grid.chunk_x} px; predictions are "
                         "written on square chunks (re-ingest the scene with --chunk N)")
    return src


def predict_scene(lake: AnyLake | str | Path, scene_id: str, model: LoadedModel | str | Path,
                  settings: PredictSettings | None = None, *, reader: ReaderConfig | None = None) -> PredictResult:
    """Predict one scene of ``lake`` with ``model`` and publish the map (see the module docstring)."""
    from cubelake import derived
    from cubelake.derived import PREDICTIONS

    settings = settings or PredictSettings()
    lk = open_lake(lake, create=False)
    lm = model if isinstance(model, LoadedModel) else load_model(model)
    name = predict_name(scene_id, lm.spec.name)
    src = _scene_source(lk, scene_id)
    stats = PredictStats()
    with derived.product_lock(lk, PREDICTIONS, name):
        published, etag = derived.read_item(lk, PREDICTIONS, name)
        halo = stats.halo = resolve_halo(lm, settings, stats)
        ran = with_spec(lm, preprocessing=settings.effective_preprocessing(lm.spec))  # as recorded in the item
        ident = settings.identity(halo, lm.spec.kind)
        digest = inputs_hash(ran, scene_identity(lk, scene_id, src), ident)
        if published is not None and derived.is_complete(lk, PREDICTIONS, name, published) and \
                (published.get("properties") or {}).get("cubelake:inputs_hash") == digest:
            log.info("%s: prediction %s is up to date", lk.url, name)
            return PredictResult(scene_id, name, "up to date", _item_url(lk, name), stats=stats)
        with derived.product_staging(lk, PREDICTIONS, name) as staged:
            item = _write(lk, name, scene_id, src, ran, settings, staged, stats, digest, ident, halo, reader)
            derived.publish(lk, PREDICTIONS, name, staged, item, etag)
    _index(lk, name)
    return PredictResult(scene_id, name, "predicted", _item_url(lk, name), stats=stats)


def _write(lk: AnyLake, name: str, scene_id: str, src: Any, lm: LoadedModel, settings: PredictSettings,
           staged: Path, stats: PredictStats, digest: str, ident: dict[str, Any], halo: int,
           reader: ReaderConfig | None) -> dict[str, Any]:
    from .item import prediction_item
    from .product import PredictionWriter

    g = src.grid
    version = new_version()
    cog = g.chunk_y % 16 == 0
    if not cog:
        msg = (f"the scene's chunks are {g.chunk_y}x{g.chunk_x} px, and COG tiles (the chunks) must be "
               "multiples of 16 px: the prediction is written as Zarr only")
        log.warning("%s: %s", name, msg)
        stats.warnings.append(msg)
    writer = PredictionWriter(staged, name, height=g.height, width=g.width, chunk=g.chunk_y, crs_wkt=src.crs_wkt,
                              transform=src.transform, classes=lm.spec.classes, outputs=settings.outputs,
                              prob_dtype=settings.prob_dtype, cog=cog)
    try:
        for b in predict_blocks(lm, src, settings, halo=halo, reader=reader, stats=stats):
            writer.write(b.cy, b.cx, b.classes, b.probs)
        assets = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return prediction_item(lake=lk, name=name, scene_id=scene_id, model=lm, settings=ident, assets=assets,
                           version=version, inputs_hash=digest, class_counts=writer.class_counts, stats=stats)


def _item_url(lk: AnyLake, name: str) -> str:
    from cubelake.derived import ITEM_FILE, PREDICTIONS

    return lk.store.url_of(PREDICTIONS.key(name, ITEM_FILE))


def _index(lk: AnyLake, name: str) -> None:
    """Index the published item in the lake's catalog (a failure leaves the product published: reindex adds it)."""
    from cubelake.catalog import LakeCatalog
    from cubelake.derived import ITEM_FILE, PREDICTIONS

    try:
        with LakeCatalog(lk) as cat:
            cat.publish_derived(PREDICTIONS.key(name, ITEM_FILE))
    except CubelakeError as exc:
        log.warning("%s: prediction %s is published but not yet in the catalog index (%s); 'cubelake catalog "
                    "reindex' adds it", lk.url, name, exc)


def predict_scenes(lake: AnyLake | str | Path, scene_ids: Sequence[str], model: LoadedModel | str | Path,
                   settings: PredictSettings | None = None, *, query: Any | None = None,
                   progress: Progress | None = None) -> list[PredictResult]:
    """:func:`predict_scene` for each chosen scene; one scene's failure is its result, the others go on."""
    from cubelake.catalog.select import select_scene_ids

    lk = open_lake(lake, create=False)
    lm = model if isinstance(model, LoadedModel) else load_model(model)
    ids = select_scene_ids(lk, scene_ids, query)
    out = []
    for n, sid in enumerate(ids, 1):
        t0 = time.perf_counter()
        try:
            res = predict_scene(lk, sid, lm, settings)
        except CubelakeError as exc:
            log.error("%s: scene %s: %s", lk.url, sid, exc)
            res = PredictResult(sid, f"{sid}__{lm.spec.name}", "failed", message=str(exc))
        res.stats.wall_s = res.stats.wall_s or time.perf_counter() - t0
        out.append(res)
        if progress:
            progress(sid, n, len(ids))
    return out
