"""``cubelake predict``: whole-scene tiled prediction of lake scenes with a TorchScript / torch.export model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cubelake.errors import CatalogQueryError, CubelakeError

from ._render import QUIET, VERBOSE, configure_output, fail, out_console, print_json, show
from .cube import LAKE, TextOrJson, _open, _query


def _settings(halo: int | None, blend: str, tile_chunks: int, batch: int, tile_batch: int, device: str, dtype: str,
              outputs: str, prob_dtype: str, strict_halo: bool, preprocessing: Path | None) -> Any:
    from cubelake.infer.blocks import PredictSettings

    pre = None
    if preprocessing is not None:
        pre = _preprocessing(preprocessing)
    return PredictSettings(halo=halo, blend=blend, tile_chunks=tile_chunks, batch=batch,  # type: ignore[arg-type]
                           tile_batch=tile_batch, device=device, dtype=dtype,  # type: ignore[arg-type]
                           outputs=tuple(o.strip() for o in outputs.split(",") if o.strip()),
                           prob_dtype=prob_dtype, strict_halo=strict_halo, preprocessing=pre)  # type: ignore[arg-type]


_MAX_JSON = 64 * 1024 * 1024  # a 4096 x 4096 projection matrix as JSON is about this size


def _preprocessing(path: Path) -> Any:
    """The ``--preprocessing`` file (untrusted: bounded in size and nesting, every field checked)."""
    import json

    from cubelake.infer.spec import Preprocessing

    try:
        if path.stat().st_size > _MAX_JSON:
            raise typer.BadParameter(f"{path}: larger than {_MAX_JSON // 2**20} MiB; a preprocessing file holds a few "
                                     "vectors and a projection matrix", param_hint="--preprocessing")
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise typer.BadParameter(f"{path}: {exc.strerror or exc}", param_hint="--preprocessing") from None
    except (ValueError, RecursionError) as exc:
        raise fail(CubelakeError(f"{path}: not valid JSON ({type(exc).__name__}: {str(exc)[:200]})"), 2) from None
    try:
        return Preprocessing.from_dict(doc, str(path))
    except CubelakeError as exc:
        raise fail(exc, 2) from None


def _model(path: Path, spec: Path | None) -> Any:
    from cubelake.infer import ModelSpec, load_model

    given = None
    if spec is not None:
        try:
            given = ModelSpec.from_json(spec.read_bytes(), str(spec))
        except OSError as exc:
            raise typer.BadParameter(f"{spec}: {exc.strerror or exc}", param_hint="--spec") from None
        except CubelakeError as exc:
            raise fail(exc, 2) from None
    try:
        return load_model(path, given)
    except CubelakeError as exc:  # one line naming the file (a usage error: the model given is not one)
        raise fail(exc, 2) from None


def _line(res: Any) -> str:
    st = res.stats
    if res.status == "failed":
        return f"{show(res.scene_id)}: [red]failed[/red]: {show(res.message)}"
    if res.status == "up to date":
        return f"{show(res.scene_id)}: up to date ({show(res.item_url)})"
    rate = st.pixels / st.wall_s if st.wall_s else 0.0
    return (f"{show(res.scene_id)}: predicted {st.pixels} pixels in {st.tiles} tiles, {st.wall_s:.2f} s "
            f"({rate:,.0f} pixels/s), halo {st.halo} px, {st.chunks_decoded} chunks decoded"
            f"{f' ({st.redecodes} again)' if st.redecodes else ''} -> {show(res.item_url)}")


def predict_cmd(
    model: Path = typer.Option(..., "--model", "-m", help="TorchScript or torch.export model (its spec inside, or --spec)."),
    scene: list[str] = typer.Option([], "--scene", "-s", help="Scene id; repeatable. With search options, both must hold."),
    lake: str = LAKE,
    bbox: str | None = typer.Option(None, "--bbox", help="Scenes meeting west,south,east,north (degrees)."),
    intersects: str | None = typer.Option(None, "--intersects", help="Scenes meeting this GeoJSON (text or file)."),
    datetime: str | None = typer.Option(None, "--datetime", "-t", help="Scenes acquired in START/END ('..' open)."),
    collection: list[str] = typer.Option([], "--collection", "-c", help="Scenes of this collection; repeatable."),
    filters: list[str] = typer.Option([], "--filter", "-f", help="PROPERTY OP VALUE, as in catalog search; repeatable."),
    spec: Path | None = typer.Option(None, "--spec", help="The model's spec as JSON (when the file has none, or to override)."),
    preprocessing: Path | None = typer.Option(None, "--preprocessing", help="Band selection / normalisation / PCA as JSON (overrides the model's)."),
    halo: int | None = typer.Option(None, "--halo", help="Context pixels around each tile (default: the model's receptive field)."),
    blend: str = typer.Option("center", "--blend", help="center (crop to the tile), mean or cosine."),
    tile_chunks: int = typer.Option(1, "--tile-chunks", help="Chunks per tile side."),
    batch: int = typer.Option(1024, "--batch", help="Patches per forward pass (per-pixel models)."),
    tile_batch: int = typer.Option(4, "--tile-batch", help="Tiles per forward pass (dense models)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda (cuda:N)."),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32, fp16 or bf16."),
    outputs: str = typer.Option("classes,probabilities", "--outputs", help="classes and/or probabilities (comma-separated)."),
    prob_dtype: str = typer.Option("float32", "--prob-dtype", help="float32 or float16 probabilities."),
    strict_halo: bool = typer.Option(False, "--strict-halo", help="Refuse a halo below the receptive field (default: warn)."),
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text or json."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Predict whole scenes tile by tile and publish each map (COG + Zarr + STAC item) in the lake.

    Tiles are the product's chunks plus a halo; each chunk is read and decoded once. Run again with the
    same model, scene and settings, a scene is "up to date". Exit 1 if a scene failed (the others go on).
    """
    configure_output(verbose, quiet)
    from cubelake.infer.errors import InferError
    from cubelake.infer.predict import predict_scenes

    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise typer.BadParameter("CUDA is not available on this machine; use --device cpu", param_hint="--device")
    try:
        settings = _settings(halo, blend, tile_chunks, batch, tile_batch, device, dtype, outputs, prob_dtype,
                             strict_halo, preprocessing)
    except InferError as exc:
        raise fail(exc, 2) from None
    lm = _model(model, spec)
    lk = _open(lake)
    try:
        results = predict_scenes(lk, scene, lm, settings, query=_query(bbox, intersects, datetime, collection, filters))
    except (InferError, CatalogQueryError) as exc:
        raise fail(exc, 2) from None
    except CubelakeError as exc:
        raise fail(exc, 1) from None
    if fmt is TextOrJson.json:
        print_json({"results": [r.to_dict() for r in results]})
    else:
        for r in results:
            out_console().print(_line(r))
            for w in r.stats.warnings:
                out_console().print(f"  [yellow]warning[/yellow]: {show(w)}")
    if any(r.status == "failed" for r in results):
        raise typer.Exit(1)
