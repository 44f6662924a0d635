"""Loading and saving the models cubelake runs: TorchScript or ``torch.export`` programs, with their spec inside.

A model file is untrusted input. Only the two self-describing formats are accepted (a pickled
``nn.Module`` from ``torch.save`` could run any code when loaded, so it is refused); the spec
travels in the archive's extra file ``cubelake.json`` and is checked field by field
(:mod:`.spec`), its size bounded. The model's hash (SHA-256 of the file) names it in products and
makes predictions idempotent.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from .errors import ModelError
from .spec import ModelSpec

__all__ = ["SPEC_FILE", "LoadedModel", "load_model", "measure_receptive_field", "model_format", "model_hash", "save_model"]

log = logging.getLogger(__name__)

SPEC_FILE = "cubelake.json"
_MAX_SPEC = 64 * 1024 * 1024  # a PCA matrix of 4096 x 4096 numbers as JSON is about 80 MB: bound below that
Format = Literal["torchscript", "export"]


@contextlib.contextmanager
def _torchscript_quietly() -> Iterator[None]:
    """TorchScript is deprecated in torch 2.x but is still what many trained models ship as; its warning
    is for model authors, not for the users running them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.", category=DeprecationWarning)
        yield


def model_hash(path: Path) -> str:
    """SHA-256 of the model file (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * 1024 * 1024):
            h.update(block)
    return h.hexdigest()


def model_format(path: Path) -> Format:
    """Which of the two archive formats ``path`` is; :class:`ModelError` for anything else."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            spec = [i for i in z.infolist() if i.filename.endswith(f"/extra/{SPEC_FILE}")]
    except FileNotFoundError:
        raise ModelError(f"{path}: no such model file") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelError(f"{path}: not a TorchScript or torch.export archive ({exc}); save the model with "
                         "cubelake.infer.save_model (or torch.jit.save / torch.export.save)") from None
    if spec and spec[0].file_size > _MAX_SPEC:
        raise ModelError(f"{path}: its {SPEC_FILE} is {spec[0].file_size} bytes (at most {_MAX_SPEC})")
    if any(n.endswith("/archive_format") for n in names):
        return "export"
    if any(n.endswith("/data.pkl") for n in names) and any("/code/" in n for n in names):
        return "torchscript"
    raise ModelError(f"{path}: a zip archive but neither TorchScript nor torch.export (a pickled module from "
                     "torch.save is refused: loading it could run any code); save it with cubelake.infer.save_model")


@dataclass
class LoadedModel:
    """A loaded model in eval mode, its spec, file, format and hash; call it on a batch."""

    module: Any
    spec: ModelSpec
    path: Path
    format: Format
    sha256: str
    device: str = "cpu"
    dtype: torch.dtype = torch.float32

    def to(self, device: str = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
        """Moved to ``device`` and cast to ``dtype`` (in place; returns itself)."""
        try:
            self.module = self.module.to(device=device, dtype=dtype)
        except (RuntimeError, AssertionError) as exc:
            raise ModelError(f"{self.path}: cannot move the model to {device} as {dtype}: {exc}") from None
        self.device, self.dtype = device, dtype
        return self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            out = self.module(x)
        if isinstance(out, tuple | list):
            out = out[0]
        if not isinstance(out, torch.Tensor):
            raise ModelError(f"{self.path}: the model returned {type(out).__name__}, not a tensor")
        return out


def _read_spec(path: Path, fmt: Format) -> tuple[Any, str | None]:
    extra: dict[str, Any] = {SPEC_FILE: ""}
    try:
        if fmt == "torchscript":
            with _torchscript_quietly():
                module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
        else:
            with open(path, "rb") as f:  # a file object: torch.export wants a .pt2 name otherwise
                module = torch.export.load(f, extra_files=extra).module()
    except Exception as exc:  # torch raises many kinds for a damaged archive
        raise ModelError(f"{path}: the {fmt} archive does not load ({type(exc).__name__}: {exc})") from None
    text = extra.get(SPEC_FILE)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return module, text or None


def load_model(path: str | Path, spec: ModelSpec | None = None) -> LoadedModel:
    """Load a TorchScript or ``torch.export`` model; its spec from the file unless ``spec`` is given."""
    p = Path(path)
    fmt = model_format(p)
    module, text = _read_spec(p, fmt)
    if spec is None:
        if text is None:
            raise ModelError(f"{p}: no {SPEC_FILE} inside (what the model takes: kind, layout, bands, classes, "
                             "patch, preprocessing); save it with cubelake.infer.save_model or give the spec "
                             "(--spec FILE.json)")
        spec = ModelSpec.from_json(text, f"{p}:{SPEC_FILE}")
    if fmt == "torchscript":
        module.eval()
    return LoadedModel(module=module, spec=spec, path=p, format=fmt, sha256=model_hash(p))


def _dynamic_shapes(spec: ModelSpec, example: torch.Tensor) -> Any:
    batch = torch.export.Dim("batch", min=1, max=1 << 24)
    dims: dict[int, Any] = {0: batch}
    if spec.kind == "dense":
        h, w = example.ndim - 2, example.ndim - 1
        dims[h] = torch.export.Dim("height", min=2, max=1 << 15)
        dims[w] = torch.export.Dim("width", min=2, max=1 << 15)
    return (dims,)


def save_model(module: torch.nn.Module, path: str | Path, spec: ModelSpec, *,
               format: Format = "torchscript") -> Path:
    """Save ``module`` (in eval mode) with ``spec`` inside: TorchScript (``torch.jit.script``) or a
    ``torch.export`` program whose batch (and, for dense models, height and width) are dynamic."""
    p = Path(path)
    module = module.eval()
    text = spec.to_json()
    if format == "torchscript":
        with _torchscript_quietly():
            torch.jit.save(torch.jit.script(module), str(p), _extra_files={SPEC_FILE: text})
    elif format == "export":
        example = spec.example(2, size=16)
        program = torch.export.export(module, (example,), dynamic_shapes=_dynamic_shapes(spec, example))
        with open(p, "wb") as f:
            torch.export.save(program, f, extra_files={SPEC_FILE: text})
    else:
        raise ModelError(f"model format {format!r}: 'torchscript' or 'export'")
    return p


def _reach(model: LoadedModel, limit: int, seed: int) -> int:
    """The radius of the output change a one-pixel change at the centre of a ``2*limit+1`` tile makes."""
    size = 2 * limit + 1
    x = model.spec.example(1, size=size, seed=seed, dtype=model.dtype, device=model.device)
    y0 = model(x).float()
    x2 = x.clone()
    x2[..., limit, limit] += 3.0
    reach = ((model(x2).float() - y0).abs().reshape(-1, size, size).amax(dim=0) > 0).cpu()
    if not bool(reach.any()):
        return 0
    rows = torch.nonzero(reach.any(dim=1)).flatten()
    cols = torch.nonzero(reach.any(dim=0)).flatten()
    return int(max(limit - int(rows.min()), int(rows.max()) - limit, limit - int(cols.min()), int(cols.max()) - limit))


def measure_receptive_field(model: LoadedModel, *, limit: int = 64, max_limit: int = 512, seed: int = 0) -> int:
    """The radius (pixels) over which one input pixel changes a dense model's output, measured.

    A random tile of ``2*limit+1`` pixels a side is run twice, the second time with its centre pixel
    changed in every band; the output differs exactly where the centre pixel is in the receptive
    field (as far as the tile reaches). The tile is doubled until two sizes agree on a radius below
    half the smaller one (a dilated kernel's sparse reach shows only once the tile covers its taps),
    up to ``max_limit``; a field not settled by then is reported as the largest radius seen, with a
    warning to declare ``receptive_field`` in the spec. Models whose reach skips more than ``limit``
    pixels at once (dilations over 64 px) must declare it.
    """
    if model.spec.kind == "pixel":
        return model.spec.patch // 2
    if model.dtype != torch.float32:
        # measured in float32: the reach is the architecture's, a small far change can round away in fp16/bf16,
        # and CPUs have no fast fp16 convolutions (a 257 px tile took 15 s). Casting the rounded weights up and
        # back down is exact.
        device, dtype = model.device, model.dtype
        model.to(device, torch.float32)
        try:
            return measure_receptive_field(model, limit=limit, max_limit=max_limit, seed=seed)
        finally:
            model.to(device, dtype)
    prev = -1
    while True:
        r = _reach(model, limit, seed)
        if r == prev and 2 * r < limit:
            return r
        if limit >= max_limit:
            log.warning("%s: the receptive field did not settle within %d px (at least %d px measured); declare "
                        "receptive_field in the model's spec", model.path, max_limit, max(r, prev))
            return max(r, prev)
        prev, limit = r, min(2 * limit, max_limit)


def with_spec(model: LoadedModel, **changes: Any) -> LoadedModel:
    """``model`` with spec fields replaced."""
    return replace(model, spec=replace(model.spec, **changes))
