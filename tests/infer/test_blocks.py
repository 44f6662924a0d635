"""Whole-scene tiled prediction (no lake writing): tiled equals whole-scene, halo checks, training preprocessing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cubelake.infer import (
    InferError,
    ModelError,
    ModelSpec,
    Preprocessing,
    load_model,
    measure_receptive_field,
    save_model,
)
from cubelake.infer.blocks import PredictSettings, PredictStats, predict_blocks
from cubelake.infer.runner import WindowReader
from cubelake.infer.tiling import plan_tiles

from .conftest import SEG_RF, Pixel3D


def _assemble(model: Any, src: Any, settings: PredictSettings) -> tuple[np.ndarray, np.ndarray, PredictStats]:
    g = src.grid
    k = model.spec.classes
    probs = np.full((k, g.height, g.width), -1.0, np.float32)
    cls = np.full((g.height, g.width), 254, np.uint8)
    stats = PredictStats()
    seen = []
    for b in predict_blocks(model, src, settings, stats=stats):
        seen.append((b.cy, b.cx))
        y, x = b.cy * g.chunk_y, b.cx * g.chunk_x
        h, w = b.classes.shape
        assert b.probs.shape == (k, h, w)
        probs[:, y:y + h, x:x + w] = b.probs
        cls[y:y + h, x:x + w] = b.classes
    assert seen == [(cy, cx) for cy in range(g.n_rows) for cx in range(g.n_cols)]  # every chunk once, row-major
    return probs, cls, stats


def _patches(norm: np.ndarray, p: int) -> np.ndarray:
    """Every pixel's p x p neighbourhood of the whole scene, zero (the fill) beyond its edges."""
    r = p // 2
    padded = np.pad(norm, ((0, 0), (r, r), (r, r)))
    views = np.lib.stride_tricks.sliding_window_view(padded, (p, p), axis=(1, 2))
    c, h, w = norm.shape
    return np.ascontiguousarray(np.moveaxis(views.reshape(c, h * w, p, p), 0, 1))


def test_a_pixel_model_tiled_equals_the_whole_scene(enmap_scene: dict[str, Any], models: dict[str, Path]) -> None:
    """3-D CNN on 5 x 5 patches of a real EnMAP tile: 16 one-chunk tiles give the map one whole-scene tile gives,
    bit for bit, and the whole-image reference computed here with numpy + the model (to float rounding)."""
    model = load_model(models["pixel3d"])
    src = enmap_scene["src"]
    tiled, tiled_cls, st = _assemble(model, src, PredictSettings(batch=64))
    whole, whole_cls, st_whole = _assemble(model, src, PredictSettings(tile_chunks=4, batch=1024))
    assert (st.tiles, st_whole.tiles) == (16, 1)
    assert np.array_equal(tiled, whole)
    assert np.array_equal(tiled_cls, whole_cls)
    assert st.chunks_decoded == 16
    assert st.redecodes == 0  # each chunk fetched and decoded once though windows reach into neighbours
    norm = enmap_scene["norm"]
    with torch.inference_mode():
        ref = torch.softmax(model.module(torch.from_numpy(_patches(norm, 5))[:, None]), 1).numpy()
    ref = ref.T.reshape(5, *norm.shape[1:])
    np.testing.assert_allclose(tiled, ref, atol=1e-6)
    assert np.array_equal(tiled_cls, ref.argmax(0))
    np.testing.assert_allclose(tiled.sum(0), 1.0, atol=1e-5)


def test_a_spectral_model_classifies_each_spectrum(enmap_scene: dict[str, Any], models: dict[str, Path]) -> None:
    model = load_model(models["spectral1d"])
    probs, cls, st = _assemble(model, enmap_scene["src"], PredictSettings(batch=100))
    norm = enmap_scene["norm"]
    spectra = norm.reshape(norm.shape[0], -1).T[:, None]  # (pixels, 1, bands)
    with torch.inference_mode():
        ref = torch.softmax(model.module(torch.from_numpy(np.ascontiguousarray(spectra))), 1).numpy().T
    np.testing.assert_allclose(probs, ref.reshape(4, *norm.shape[1:]), atol=1e-6)
    assert np.array_equal(cls, ref.argmax(0).reshape(norm.shape[1:]))
    assert st.halo == 0


def _dense_reference(model: Any, norm: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return torch.softmax(model.module(torch.from_numpy(norm[None])), 1)[0].numpy()


def test_a_dense_model_with_a_halo_at_least_its_receptive_field(enmap_scene: dict[str, Any],
                                                                models: dict[str, Path]) -> None:
    """The receptive field is measured (the spec does not declare it): 4 px; with that halo, 8-px tiles give
    the whole-image segmentation within 1e-5; the blends that average overlaps differ but stay close."""
    model = load_model(models["seg"])
    assert model.format == "export"
    assert measure_receptive_field(model) == SEG_RF
    ref = _dense_reference(model, enmap_scene["norm"])
    probs, cls, st = _assemble(model, enmap_scene["src"], PredictSettings())
    assert st.halo == SEG_RF
    assert st.warnings == []
    np.testing.assert_allclose(probs, ref, atol=1e-5)
    assert np.array_equal(cls, ref.argmax(0))
    wide, _, _ = _assemble(model, enmap_scene["src"], PredictSettings(halo=2 * SEG_RF, blend="cosine"))
    assert np.abs(wide - ref).max() < 0.05
    assert np.abs(wide - ref).max() > 1e-5  # it does blend outputs computed with less context


def test_a_halo_below_the_receptive_field_is_warned_about(enmap_scene: dict[str, Any], models: dict[str, Path],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    model = load_model(models["seg"])
    ref = _dense_reference(model, enmap_scene["norm"])
    with caplog.at_level(logging.WARNING):
        probs, _, st = _assemble(model, enmap_scene["src"], PredictSettings(halo=1))
    assert st.warnings
    assert "halo 1 px is below the model's receptive field (4 px measured)" in st.warnings[0]
    assert "--halo 4" in caplog.text
    assert np.abs(probs - ref).max() > 1e-3  # the seams it warned about are there
    with pytest.raises(InferError, match="receptive field"):
        _assemble(model, enmap_scene["src"], PredictSettings(halo=1, strict_halo=True))
    pixel = load_model(models["pixel3d"])
    with pytest.raises(InferError, match="patch's radius 2"):
        _assemble(pixel, enmap_scene["src"], PredictSettings(halo=1))


def test_windows_are_preprocessed_as_the_training_loader_cuts_them(enmap_scene: dict[str, Any]) -> None:
    """Preprocessing.from_dataset: a global-normalised, PCA-projected CubeDataset's batches equal the windows the
    predictor reads for the same places (band selection, statistics and projection saved with the model)."""
    from cubelake.loaders import CubeDataset, PlanSpec, Sampling, Spectral

    lake = enmap_scene["lake"]
    ds = CubeDataset([Path(lake) / "scenes" / "enmap_potsdam_tile_96_0"], sampling=Sampling(size=8, stride=8),
                     spectral=Spectral(wavelength_ranges_nm=[(450.0, 1300.0)], normalize="global"),
                     plan=PlanSpec(batch_size=16))
    proj = ds.fit_projection(6)
    pre = Preprocessing.from_dataset(ds, proj)
    assert pre.normalize == "fixed"
    assert pre.out_bands == 6
    pre = Preprocessing.from_dict(pre.to_dict())  # what travels inside the model file
    ds.spectral = Spectral(wavelength_ranges_nm=[(450.0, 1300.0)], normalize="global", projection=proj)
    src = enmap_scene["src"]
    g = src.grid
    wr = WindowReader(src, pre, plan_tiles(g.height, g.width, g.chunk_y, g.chunk_x, 0))
    try:
        n = 0
        for batch in ds:
            for img, (r, c, h, w) in zip(batch["image"].numpy(), batch["window"].numpy(), strict=True):
                x, _ = wr.read((int(r), int(r + h), int(c), int(c + w)))
                np.testing.assert_allclose(x, img, rtol=1e-4, atol=1e-4)
                n += 1
        assert n == 16
    finally:
        wr.close()


@pytest.mark.filterwarnings("ignore:.*torch.jit:DeprecationWarning")
def test_model_files_are_checked(tmp_path: Path, enmap_scene: dict[str, Any]) -> None:
    bad = tmp_path / "notes.pt"
    bad.write_text("not a model")
    with pytest.raises(ModelError, match=r"not a TorchScript or torch\.export archive"):
        load_model(bad)
    pickled = tmp_path / "pickled.pt"
    torch.save(Pixel3D(), pickled)
    with pytest.raises(ModelError, match=r"pickled module from torch\.save is refused"):
        load_model(pickled)
    bare = tmp_path / "bare.pt"
    torch.jit.save(torch.jit.script(Pixel3D()), str(bare))
    with pytest.raises(ModelError, match=r"no cubelake\.json inside"):
        load_model(bare)
    spec = ModelSpec(name="p", kind="pixel", layout="B1CHW", bands=3, classes=5, patch=5)
    assert load_model(bare, spec).spec == spec
    with pytest.raises(ModelError, match="odd size"):
        ModelSpec(name="p", kind="pixel", layout="BCHW", bands=3, classes=2, patch=4)
    with pytest.raises(ModelError, match="unknown field"):
        ModelSpec.from_json('{"name": "p", "kind": "pixel", "layout": "BC", "bands": 3, "classes": 2, "evil": 1}')
    with pytest.raises(ModelError, match="bands"):
        ModelSpec.from_json('{"name": "p", "kind": "pixel", "layout": "BC", "bands": 1e9, "classes": 2}')
    wrong = save_model(Pixel3D().eval(), tmp_path / "wrong.pt", ModelSpec(
        name="wrong", kind="pixel", layout="B1CHW", bands=10, classes=5, patch=5))
    with pytest.raises(InferError, match=r"gives 206 bands, the model wrong\.pt takes 10"):
        list(predict_blocks(load_model(wrong), enmap_scene["src"], PredictSettings()))


@pytest.fixture(scope="module")
def seg_fp32(enmap_scene: dict[str, Any], models: dict[str, Path]) -> np.ndarray:
    """The segmentation model's fp32 probabilities over the scene (computed once for the module)."""
    ref, _, _ = _assemble(load_model(models["seg"]), enmap_scene["src"], PredictSettings())
    return ref


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_reduced_precision_on_cpu(enmap_scene: dict[str, Any], models: dict[str, Path], seg_fp32: np.ndarray,
                                  dtype: str) -> None:
    """fp16/bf16 compute: the model is cast, inputs follow; probabilities stay close to fp32's."""
    ref = seg_fp32
    model = load_model(models["seg"])
    low, _, _ = _assemble(model, enmap_scene["src"], PredictSettings(dtype=dtype))  # type: ignore[arg-type]
    assert model.dtype == (torch.bfloat16 if dtype == "bf16" else torch.float16)
    err = np.abs(low - ref).max()
    assert 0 < err < 1e-2


class TinyUNet(torch.nn.Module):
    """Two poolings and two upsamplings: input sides must be multiples of 4."""

    def __init__(self, bands: int, classes: int = 3) -> None:
        super().__init__()
        self.down = torch.nn.Conv2d(bands, 8, 3, padding=1)
        self.mid = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.out = torch.nn.Conv2d(16, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.down(x))
        b = torch.nn.functional.max_pool2d(a, 2)
        b = torch.nn.functional.max_pool2d(torch.relu(self.mid(b)), 2)
        up = torch.nn.functional.interpolate(b, scale_factor=4.0, mode="nearest")
        return self.out(torch.cat([a, up], dim=1))


def test_a_model_needing_sizes_divisible_by_n_declares_pad_to(enmap_scene: dict[str, Any], tmp_path: Path) -> None:
    """Edge windows (e.g. 12 x 16 px) are padded with the fill to the next multiple and the output cropped."""
    bands = int(enmap_scene["phys"].shape[0])
    spec = dict(name="unet", kind="dense", layout="BCHW", bands=bands, classes=3, patch=0, receptive_field=6,
                preprocessing=enmap_scene["pre"])
    bare = load_model(save_model(TinyUNet(bands).eval(), tmp_path / "unet.pt", ModelSpec(**spec)))  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="declares pad_to"):
        _assemble(bare, enmap_scene["src"], PredictSettings())
    model = load_model(save_model(TinyUNet(bands).eval(), tmp_path / "unet4.pt", ModelSpec(**spec, pad_to=4)))  # type: ignore[arg-type]
    probs, cls, st = _assemble(model, enmap_scene["src"], PredictSettings(halo=8))
    assert st.tiles == 16
    np.testing.assert_allclose(probs.sum(0), 1.0, atol=1e-5)
    assert (cls < 3).all()
    # the whole scene (32 x 32, already a multiple of 4) in one tile: the same map where windows align with the
    # poolings (halo 8 keeps every window's origin on the 4-pixel grid)
    whole, _, _ = _assemble(load_model(tmp_path / "unet4.pt"), enmap_scene["src"], PredictSettings(tile_chunks=4))
    np.testing.assert_allclose(probs, whole, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_receptive_field_of_a_reduced_precision_model_is_measured_in_float32(
        models: dict[str, Path], dtype: torch.dtype) -> None:
    """The same radius as fp32's, measured without fp16 convolutions on the CPU (15 s for a 257 px tile), and the
    model is left as it was: its dtype and its rounded weights, bit for bit."""
    model = load_model(models["seg"]).to("cpu", dtype)
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    calls: list[torch.dtype] = []
    hook = model.module.register_forward_pre_hook(lambda _m, args: calls.append(args[0].dtype))
    try:
        assert measure_receptive_field(model) == SEG_RF
    finally:
        hook.remove()
    assert calls
    assert set(calls) == {torch.float32}
    assert model.dtype == dtype
    after = model.module.state_dict()
    assert all(after[k].dtype == dtype and torch.equal(after[k], v) for k, v in before.items())
