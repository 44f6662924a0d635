"""The STAC 1.1 Item of one prediction: where and when (its scene's), what (the files), how (model and settings).

The item lives at ``predictions/<name>/item.json`` (:data:`cubelake.derived.PREDICTIONS`): its
assets point into the version it publishes (``./v/<version>/...``), its links lead to the lake's
root catalog, the predictions collection and the scene it was predicted from (``derived_from``,
as a datacube's item does). Extensions, each checked offline against its official schema:

* ``mlm`` (Machine Learning Model, v1.5.2) records the model: ``mlm:name``, ``mlm:architecture``,
  ``mlm:tasks``, ``mlm:framework``, ``mlm:input`` / ``mlm:output`` (shape, dimension order, data
  type, classes) and the model file as an asset with the ``mlm:model`` role and its
  ``mlm:artifact_type`` (the schema requires one such asset in any item that declares mlm);
* ``processing`` (v1.2.0): ``processing:level`` ``L4`` (the extension's level for "model output or
  results from analyses of lower level data"), ``processing:datetime``, ``processing:software``,
  ``processing:lineage`` (the model, scene and settings in words);
* ``projection``, ``raster`` and ``file`` where the fields occur (the grid, the COGs' resolution,
  sizes and checksums).

cubelake's own fields: ``cubelake:model_sha256``, ``cubelake:inputs_hash`` (what makes a rerun a
no-op: model file, scene version and settings), ``cubelake:settings``, ``cubelake:version`` (the
published version), ``cubelake:class_counts`` (pixels per class) and ``cubelake:nodata_pixels``.

:func:`prediction_item_from_spec` is pure; :func:`prediction_item` reads the scene's item from the
lake and checks the result against the schemas before anything is published.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from cubelake.catalog.items import used_extensions
from cubelake.catalog.schema import STAC_VERSION

from .errors import InferError
from .product import Asset

__all__ = ["CB_CLASS_COUNTS", "CB_INPUTS_HASH", "CB_MODEL_SHA256", "CB_SETTINGS", "CB_VERSION", "COLLECTION",
           "EXT_MLM", "EXT_PROCESSING", "PROCESSING_LEVEL", "ModelRecord", "PredictionItemSpec",
           "check_prediction_item", "prediction_item", "prediction_item_from_spec"]

EXT_MLM = "https://stac-extensions.github.io/mlm/v1.5.2/schema.json"
EXT_PROCESSING = "https://stac-extensions.github.io/processing/v1.2.0/schema.json"
COLLECTION = "cubelake-predictions"
#: The processing extension's level for "model output or results from analyses of lower level data
#: (variables not directly measured by the instruments, but derived from these measurements)": a class
#: map and class probabilities are thematic information a model derived from L1/L2 reflectance.
PROCESSING_LEVEL = "L4"
CB_VERSION = "cubelake:version"  # the version folder v/<version>/ the item publishes (cubelake.derived)
CB_INPUTS_HASH = "cubelake:inputs_hash"
CB_MODEL_SHA256 = "cubelake:model_sha256"
CB_SETTINGS = "cubelake:settings"
CB_CLASS_COUNTS = "cubelake:class_counts"
ITEM_FILE = "item.json"
MODEL_MEDIA_TYPE = "application/octet-stream; framework=pytorch"  # what mlm's README suggests for PyTorch files
_ARTIFACT_TYPES = {"torchscript": "torch.jit.save", "export": "torch.export.save"}  # mlm best practices' names
_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "other", "float32": "float32", "float16": "float16"}
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
_MLM_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_.\-\s]+[a-zA-Z0-9]$")
_MAX_ITEM = 64 * 1024 * 1024
# input axes: N, C for 1-D spectra; the 3-D CNN convention N, C, D, H, W with the spectrum as depth D
_DIM_ORDER = {"BC": ["batch", "channel"], "B1C": ["batch", "channel", "depth"],
              "BCHW": ["batch", "channel", "height", "width"],
              "B1CHW": ["batch", "channel", "depth", "height", "width"]}


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """What the item says about the model: its spec's fields, file (``href``, SHA-256, size) and format."""

    name: str
    architecture: str
    kind: str  # "pixel" | "dense"
    layout: str  # "BC" | "B1C" | "BCHW" | "B1CHW"
    bands: int
    classes: int
    patch: int
    output: str  # "logits" | "probabilities"
    sha256: str
    href: str  # where the model file is (an absolute URL or path: it is not part of the product)
    artifact_type: str  # mlm's name for how it was saved: torch.jit.save, torch.export.save
    size: int | None = None
    total_parameters: int | None = None
    receptive_field: int | None = None
    preprocessing: dict[str, Any] | None = None

    @classmethod
    def from_loaded(cls, model: Any, *, href: str | None = None, architecture: str | None = None) -> ModelRecord:
        """The record of a :class:`~cubelake.infer.model.LoadedModel` (``href``: default its file as a ``file://``
        URL, or its path when that is relative)."""
        spec, path = model.spec, Path(model.path)
        pre = spec.preprocessing.to_dict() if spec.preprocessing is not None else None
        size = path.stat().st_size if path.is_file() else None
        return cls(spec.name, architecture or _architecture(model), spec.kind, spec.layout, spec.bands, spec.classes,
                   spec.patch, spec.output, model.sha256, href or path.resolve().as_uri(),
                   _ARTIFACT_TYPES.get(model.format, str(model.format)), size, _parameters(model.module),
                   spec.receptive_field, pre)

    @property
    def mlm_name(self) -> str:
        """The name as ``mlm:name`` allows it (a letter first, at least three characters)."""
        return self.name if _MLM_NAME.match(self.name) else f"model-{self.name}"


def _architecture(model: Any) -> str:
    """The scripted module's class name (TorchScript keeps it), else a description of the spec."""
    name = getattr(model.module, "original_name", None)
    if isinstance(name, str) and name and name not in ("Module", "GraphModule"):
        return name
    spec = model.spec
    return f"{'per-pixel' if spec.kind == 'pixel' else 'dense'} classifier ({spec.layout} input)"


def _parameters(module: Any) -> int | None:
    try:
        return int(sum(p.numel() for p in module.parameters()))
    except (AttributeError, RuntimeError, TypeError):  # a module without parameters() (some exported programs)
        return None


@dataclass(frozen=True, slots=True)
class PredictionItemSpec:
    """Everything the item says. ``scene_item``: the source scene's item (geometry, bbox, time come from it);
    ``assets``: the product files (:meth:`~cubelake.infer.product.PredictionWriter.finish`);
    ``settings``: what shaped the values (halo, blend, tile, dtype, outputs), JSON types."""

    name: str
    version: str
    scene_item: Mapping[str, Any]
    model: ModelRecord
    assets: tuple[Asset, ...]
    settings: Mapping[str, Any]
    inputs_hash: str
    class_counts: tuple[int, ...]
    class_names: tuple[str, ...] = ()
    nodata_pixels: int | None = None
    created: datetime = field(default_factory=lambda: datetime.now(UTC))
    software: Mapping[str, str] = field(default_factory=dict)

    @property
    def scene_id(self) -> str:
        return str(self.scene_item.get("id"))


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _software() -> dict[str, str]:
    import torch

    from cubelake import __version__

    return {"cubelake": __version__, "torch": str(torch.__version__)}


def _preprocessing_text(pre: Mapping[str, Any] | None) -> str:
    if not pre:
        return "the scene's bands as stored (decoded to physical values)"
    parts = []
    ranges = pre.get("wavelength_ranges_nm")
    if ranges:
        parts.append("the bands centred in " + ", ".join(f"{lo:g}-{hi:g} nm" for lo, hi in ranges))
    else:
        parts.append("all the scene's bands")
    parts.append({"scene": "standardised with the scene's own statistics",
                  "fixed": "standardised with the training statistics",
                  "none": "in physical values"}.get(str(pre.get("normalize", "scene")), "normalised"))
    if pre.get("projection"):
        parts.append(f"projected onto {len(pre['projection'])} components (PCA)")
    return ", ".join(parts)


def _mlm_input(m: ModelRecord, data_type: str) -> dict[str, Any]:
    p = m.patch if m.kind == "pixel" else -1  # a dense model takes tiles of any size
    shape = {"BC": [-1, m.bands], "B1C": [-1, 1, m.bands], "BCHW": [-1, m.bands, p, p],
             "B1CHW": [-1, 1, m.bands, p, p]}[m.layout]
    what = "spectrum of each pixel" if m.layout in ("BC", "B1C") else \
        (f"{m.patch} x {m.patch} patch centred on each pixel" if m.kind == "pixel" else "tile of the scene")
    return {"name": "spectrum" if m.layout in ("BC", "B1C") else ("patch" if m.kind == "pixel" else "tile"),
            "bands": [],  # the channels are the preprocessed ones (selected, normalised, projected), not STAC bands
            "input": {"shape": shape, "dim_order": _DIM_ORDER[m.layout], "data_type": data_type},
            "description": f"the {what}: {_preprocessing_text(m.preprocessing)}"}


def _mlm_output(m: ModelRecord, data_type: str, names: Sequence[str], named: bool) -> dict[str, Any]:
    pixel = m.kind == "pixel"
    return {"name": m.output, "tasks": ["classification"] if pixel else ["semantic-segmentation"],
            "result": {"shape": [-1, m.classes] if pixel else [-1, m.classes, -1, -1],
                       "dim_order": ["batch", "class"] if pixel else ["batch", "class", "height", "width"],
                       "data_type": data_type},
            "description": f"{m.output} per class{' of the centre pixel' if pixel else ' per pixel'}; the product's "
                          "probabilities are their softmax" + ("" if m.output == "logits" else " (as given)"),
            "classification:classes": [{"value": i, "name": n, "description": n if named else f"class {i}"}
                                       for i, n in enumerate(names)]}


def _mlm_fields(spec: PredictionItemSpec, names: Sequence[str]) -> dict[str, Any]:
    m = spec.model
    data_type = _DTYPES.get(str(spec.settings.get("dtype", "fp32")), "other")
    software = spec.software or _software()
    # a per-pixel model classifies one patch (classification); its map is a pixel-wise classification, which
    # mlm's README asks to call semantic-segmentation
    out: dict[str, Any] = {
        "mlm:name": m.mlm_name, "mlm:architecture": m.architecture,
        "mlm:tasks": ["classification", "semantic-segmentation"] if m.kind == "pixel" else ["semantic-segmentation"],
        "mlm:framework": "PyTorch"}  # the schema's predefined spelling
    torch_version = software.get("torch", "")
    if _SEMVER.match(torch_version):
        out["mlm:framework_version"] = torch_version
    if m.total_parameters is not None:
        out["mlm:total_parameters"] = m.total_parameters
    out["mlm:input"] = [_mlm_input(m, data_type)]
    out["mlm:output"] = [_mlm_output(m, data_type, names, bool(spec.class_names))]
    return out


def _lineage(spec: PredictionItemSpec) -> str:
    m, s = spec.model, spec.settings
    tiling = ", ".join(f"{k} {s[k]}" for k in ("halo", "blend", "tile_chunks", "dtype") if k in s)
    return (f"Model {m.name} ({m.architecture}; {m.artifact_type}, sha256 {m.sha256}) applied to scene "
            f"{spec.scene_id} in tiles aligned to its chunks ({tiling}); classes = argmax of the class "
            "probabilities (softmax of the model's logits); nodata where the scene has none.")


def _processing_fields(spec: PredictionItemSpec) -> dict[str, Any]:
    return {"processing:level": PROCESSING_LEVEL, "processing:datetime": _iso(spec.created),
            "processing:software": dict(spec.software or _software()), "processing:lineage": _lineage(spec)}


def _model_asset(m: ModelRecord) -> dict[str, Any]:
    asset: dict[str, Any] = {"href": m.href, "type": MODEL_MEDIA_TYPE, "roles": ["mlm:model", "model"],
                             "title": f"the model {m.name} (not part of the product: where it was read from)",
                             "mlm:artifact_type": m.artifact_type, "file:checksum": "1220" + m.sha256}
    if m.size is not None:
        asset["file:size"] = m.size
    return asset


def _scene_fields(scene: Mapping[str, Any]) -> dict[str, Any]:
    props = scene.get("properties") or {}
    out = {k: props[k] for k in ("datetime", "start_datetime", "end_datetime") if k in props}
    out.setdefault("datetime", None)
    if isinstance(props.get("gsd"), int | float):
        out["gsd"] = props["gsd"]
    return out


def _assets(spec: PredictionItemSpec) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The product assets (inside the version) and the model's; projection fields shared by all of them are
    moved up to the item's properties."""
    assets = {a.key: a.to_stac(spec.version) for a in spec.assets}
    common: dict[str, Any] = {}
    if assets:
        first = next(iter(assets.values()))
        for k in [k for k in first if k.startswith("proj:")]:
            if all(a.get(k) == first[k] for a in assets.values()):
                common[k] = first[k]
                for a in assets.values():
                    a.pop(k)
    assets["model"] = _model_asset(spec.model)
    return assets, common


def prediction_item_from_spec(spec: PredictionItemSpec) -> dict[str, Any]:
    """The prediction's STAC 1.1 Item, with relative hrefs (it sits in ``predictions/<name>/``). No I/O."""
    names = spec.class_names or tuple(f"class_{i}" for i in range(spec.model.classes))
    assets, proj = _assets(spec)
    props: dict[str, Any] = {**_scene_fields(spec.scene_item), "created": _iso(spec.created),
                             "updated": _iso(spec.created), **proj, **_mlm_fields(spec, names),
                             **_processing_fields(spec),
                             CB_MODEL_SHA256: spec.model.sha256, CB_INPUTS_HASH: spec.inputs_hash,
                             CB_SETTINGS: dict(spec.settings), CB_VERSION: spec.version,
                             "cubelake:scene": spec.scene_id, "cubelake:classes": spec.model.classes,
                             CB_CLASS_COUNTS: [int(v) for v in spec.class_counts]}
    if spec.nodata_pixels is not None:
        props["cubelake:nodata_pixels"] = int(spec.nodata_pixels)
    scene = spec.scene_item
    coll = f"../../collections/{COLLECTION}/collection.json"
    item: dict[str, Any] = {
        "type": "Feature", "stac_version": STAC_VERSION, "stac_extensions": [], "id": spec.name,
        "collection": COLLECTION, "geometry": scene.get("geometry"),
        **({"bbox": list(scene["bbox"])} if scene.get("bbox") is not None else {}),
        "properties": props,
        "links": [
            {"rel": "root", "href": "../../catalog.json", "type": "application/json"},
            {"rel": "parent", "href": coll, "type": "application/json"},
            {"rel": "collection", "href": coll, "type": "application/json"},
            {"rel": "derived_from", "href": f"../../scenes/{spec.scene_id}/{ITEM_FILE}",
             "type": "application/geo+json", "title": f"scene {spec.scene_id}"},
        ],
        "assets": assets,
    }
    item["stac_extensions"] = [*used_extensions(item), EXT_MLM, EXT_PROCESSING]
    return dict(json.loads(json.dumps(item, allow_nan=False)))  # plain JSON types


def check_prediction_item(item: Mapping[str, Any]) -> None:
    """Raise :class:`InferError` listing how the item breaks the official schemas (core and every extension)."""
    from cubelake.catalog.validate import validate_stac

    problems = validate_stac(item)
    if problems:
        raise InferError(f"prediction {item.get('id')}: its STAC item breaks the official schemas, nothing was "
                         f"published (please report this as a cubelake bug): {'; '.join(problems[:5])}")


def _scene_item(lake: Any, scene_id: str) -> dict[str, Any]:
    from cubelake.storage import read_json_info

    item, _ = read_json_info(lake.store, f"scenes/{scene_id}/{ITEM_FILE}", _MAX_ITEM)
    if item is None:
        raise InferError(f"{lake.store.url_of(f'scenes/{scene_id}/{ITEM_FILE}')}: no such scene item; the "
                         f"prediction needs its scene published in {lake.url} (cubelake ingest)")
    return item


def prediction_item(*, lake: Any, name: str, scene_id: str, model: Any, settings: Mapping[str, Any],
                    assets: Sequence[Asset], version: str, inputs_hash: str, class_counts: Sequence[int] | np.ndarray,
                    stats: Any | None = None, class_names: Sequence[str] | None = None,
                    created: datetime | None = None, model_href: str | None = None) -> dict[str, Any]:
    """The checked item of a prediction of ``scene_id`` (its item read from ``lake``) by ``model`` (a
    :class:`~cubelake.infer.model.LoadedModel` or a :class:`ModelRecord`); raises :class:`InferError` if the
    scene has no item or the result breaks a schema. ``stats``: the run's statistics (``nodata_pixels``)."""
    record = model if isinstance(model, ModelRecord) else ModelRecord.from_loaded(model, href=model_href)
    nodata = getattr(stats, "nodata_pixels", None) if stats is not None else None
    counts = tuple(int(v) for v in class_counts)
    if len(counts) != record.classes or any(v < 0 or not math.isfinite(v) for v in counts):
        raise InferError(f"prediction {name}: class_counts must be {record.classes} counts >= 0, got {len(counts)}")
    spec = PredictionItemSpec(name, version, _scene_item(lake, scene_id), record, tuple(assets), dict(settings),
                              inputs_hash, counts, tuple(class_names or ()), nodata,
                              created or datetime.now(UTC))
    item = prediction_item_from_spec(spec)
    check_prediction_item(item)
    return item
