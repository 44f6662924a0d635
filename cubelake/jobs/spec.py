"""The job manifest: a typed, versioned YAML file that says what a scheduled run does.

Loading checks everything a run would trip on later (unknown fields, a cron expression that
does not parse, an input path that does not exist, a size that is not a size) and raises
:class:`~cubelake.errors.ConfigError` naming the file and the field, so a bad manifest fails
before any cluster is started or any scene is touched.

Relative paths in a manifest resolve against the manifest's own folder; ``${VAR}`` and
``${VAR:-default}`` in paths and the lake are taken from the environment (one manifest serves
several machines). A manifest is the operator's file and may name any folder; inputs it
points at (scene files, STAC catalogs) are untrusted and confined (see :mod:`.inputs`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cubelake.errors import ConfigError
from cubelake.record import AUX_NAME_RE, AUX_RESERVED_NAMES
from cubelake.storage import is_url
from cubelake.yamlsafe import YamlLimits, load_yaml

__all__ = ["MANIFEST_VERSION", "AuxEntry", "Filters", "IngestStep", "InputSpec", "Manifest", "Resources",
           "load_manifest", "parse_size"]

MANIFEST_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_PRODUCTS = ("cog", "zarr", "refs")


def parse_size(value: Any) -> int:
    """Bytes from an int or a text like ``500MB``, ``4GiB`` (binary units either way)."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes or a text like 4GiB, not true/false")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative ({value})")
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size; use bytes or a unit, e.g. 4GiB, 500MB")
    unit = (m.group(2) or "B").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}[unit])


def parse_seconds(value: Any) -> float:
    """Seconds from a number or a text like ``30s``, ``6h``, ``2d``."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a duration; use e.g. 30s, 15m, 6h, 2d")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


Size = Annotated[int, BeforeValidator(parse_size)]
Seconds = Annotated[float, BeforeValidator(parse_seconds)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AuxEntry(_Strict):
    """An aux raster warped onto every scene's grid (``cubelake ingest --aux``; :class:`cubelake.ingest.AuxSpec`).

    ``path``: a raster file, a folder of rasters or a glob pattern, relative to the manifest's folder.
    ``resampling``: unset = ``nearest`` for categorical, ``bilinear`` for continuous layers.
    ``max_time_delta``: seconds (or ``3d``, ``12h``) between scene and aux acquisition accepted; unset: any.
    """

    name: str
    path: str
    resampling: Literal["nearest", "bilinear", "cubic"] | None = None
    kind: Literal["continuous", "categorical"] = "continuous"
    max_time_delta: Seconds | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not AUX_NAME_RE.fullmatch(v):
            raise ValueError(f"{v!r}: an aux name is 1-32 characters of a-z, 0-9 and _ (stored as aux_<name>)")
        if v in AUX_RESERVED_NAMES:
            raise ValueError(f"{v!r} is reserved (the cube's own arrays); choose another name")
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("empty path; give a raster file, a folder of rasters or a glob pattern")
        return v

    @model_validator(mode="after")
    def _nearest_for_classes(self) -> AuxEntry:
        if self.kind == "categorical" and self.resampling not in (None, "nearest"):
            raise ValueError(f"aux '{self.name}': a categorical layer is resampled with nearest (interpolating "
                             f"class values invents classes), not {self.resampling}; drop resampling or use nearest")
        return self


def _unset(value: Any) -> bool:
    return value is None


class IngestSettings(_Strict):
    """What ingest builds; every field may also be set on one input to override the job's value."""

    profile: str | None = None
    products: tuple[str, ...] | None = None
    chunk: int | None = None
    shard: int | None = None
    labels: str | None = None
    refs_format: Literal["auto", "json", "parquet"] | None = None
    variable: str | None = None
    axes: Literal["yxb", "xyb", "byx", "bxy", "bp", "pb"] | None = None
    force: bool | None = None
    #: left out of the dump while unset, so jobs without aux layers keep their ledger's settings hashes
    aux: tuple[AuxEntry, ...] | None = Field(default=None, exclude_if=_unset)

    @field_validator("aux")
    @classmethod
    def _aux(cls, v: tuple[AuxEntry, ...] | None) -> tuple[AuxEntry, ...] | None:
        names = [a.name for a in v or ()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"aux name(s) {', '.join(twice)} given more than once; each layer needs its own name")
        return v

    @field_validator("products")
    @classmethod
    def _products(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return v
        bad = [p for p in v if p not in _PRODUCTS]
        if bad or not v:
            raise ValueError(f"unknown product(s) {bad or list(v)}; choose from {', '.join(_PRODUCTS)}")
        return tuple(dict.fromkeys(v))

    @field_validator("chunk")
    @classmethod
    def _chunk(cls, v: int | None) -> int | None:
        if v is not None and (v <= 0 or v % 16):
            raise ValueError(f"chunk must be a positive multiple of 16 pixels (TIFF tile rule), got {v}")
        return v

    @field_validator("shard")
    @classmethod
    def _shard(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"shard is a positive number of chunks per shard side, got {v}")
        return v


class IngestStep(IngestSettings):
    """The ingest step: defaults ``profile: auto``, ``products: [cog, zarr]``."""

    max_scene_bytes: Size | None = None


class InputSpec(_Strict):
    """One input: a local file/folder/glob, an ``s3://`` object or prefix, or a STAC catalog file."""

    path: str | None = None
    stac: str | None = None
    #: ``stac`` only: object-store prefixes its items' assets may name (a catalog cannot widen its own trust;
    #: local assets must lie in the catalog's folder)
    allow_roots: tuple[str, ...] = ()
    ingest: IngestSettings = Field(default_factory=IngestSettings)

    @model_validator(mode="after")
    def _one_source(self) -> InputSpec:
        if (self.path is None) == (self.stac is None):
            raise ValueError("give exactly one of 'path' (file, folder, glob, s3:// URL) or 'stac' (an "
                             "ItemCollection or catalog.json)")
        return self

    @property
    def where(self) -> str:
        return str(self.path if self.path is not None else self.stac)


class Filters(_Strict):
    """Which discovered scenes the job takes (by their primary file)."""

    pattern: str | None = None  # a glob on the file name, e.g. "ENMAP*.TIF"
    newer_than_last_success: bool = False
    min_size: Size | None = None
    max_size: Size | None = None


class StackStep(_Strict):
    """Group the job's scenes by grid and stack each group's references into one virtual cube."""

    dim: Literal["time", "scene"] = "time"
    format: Literal["auto", "json", "parquet"] = "auto"
    min_scenes: int = Field(default=2, ge=1)


class ExportStep(_Strict):
    """Write a stac-geoparquet snapshot of the whole catalog (a path in the lake, or any path/URL)."""

    path: str = "exports/catalog.parquet"


class GcStep(_Strict):
    grace: Seconds = 6 * 3600.0


class Steps(_Strict):
    ingest: IngestStep = Field(default_factory=IngestStep)
    stack: StackStep | None = None
    export: ExportStep | None = None
    gc: GcStep | None = None


class Resources(_Strict):
    """How the job uses the cluster: workers (LocalCluster), memory per task, retries, time limits."""

    workers: int = Field(default=max(1, (os.cpu_count() or 1)), ge=1, le=1024)
    threads_per_task: int = Field(default=1, ge=1, le=256)  # the ingest's own read/compress threads
    memory_per_task: Size = 4 * 1024**3
    retries: int = Field(default=2, ge=0, le=20)
    lease_ttl: Seconds = 60.0


def _check_cron(expr: str) -> str:
    from croniter import croniter

    if not croniter.is_valid(expr):
        raise ValueError(f"{expr!r} is not a cron expression; use five fields 'minute hour day month weekday', "
                         "e.g. '0 2 * * *' for 02:00 every night")
    return expr


class Manifest(_Strict):
    """A job: what to ingest, the steps, the lake, the resources and when it is due."""

    version: int
    name: str
    lake: str
    inputs: list[InputSpec] = Field(min_length=1, max_length=10_000)
    filters: Filters = Field(default_factory=Filters)
    steps: Steps = Field(default_factory=Steps)
    resources: Resources = Field(default_factory=Resources)
    schedule: Annotated[str, BeforeValidator(_check_cron)] | None = None
    source: str = Field(default="", exclude=True)  # the file it was loaded from (not part of the job)

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != MANIFEST_VERSION:
            raise ValueError(f"manifest version {v} is not supported; this cubelake reads version {MANIFEST_VERSION}"
                             + (" (upgrade cubelake)" if v > MANIFEST_VERSION else ""))
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r}: a job name is 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                             "or digit (it names the job's folder in the lake)")
        return v

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"path": e} if isinstance(e, str) else e for e in v]
        return v

    def settings_for(self, spec: InputSpec) -> IngestStep:
        """The ingest settings of one input: the job's, with the input's overrides (an input's ``aux`` list
        replaces the job's; ``aux: []`` means none)."""
        over = {k: v for k in type(spec.ingest).model_fields if (v := getattr(spec.ingest, k)) is not None}
        return self.steps.ingest.model_copy(update=over)

    def fingerprint(self) -> str:
        """A hash of the whole job (what ``jobs status`` shows to tell manifest versions apart)."""
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def expand(text: str, where: str) -> str:
    """``${VAR}`` / ``${VAR:-default}`` from the environment; an unset variable without default is an error."""
    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value is None or (value == "" and m.group(2) is not None):
            if m.group(2) is None:
                raise ConfigError(f"{where}: environment variable {m.group(1)} is not set; set it or write "
                                  f"${{{m.group(1)}:-default}}")
            return m.group(2)
        return value

    return _ENV.sub(sub, text)


def resolve_path(text: str, base: Path) -> str:
    """A manifest path: URLs as they are, local paths against the manifest's folder."""
    if is_url(text):
        return text
    p = Path(text).expanduser()
    return os.path.normpath(p if p.is_absolute() else (base / p))


def _problem(exc: ValidationError) -> str:
    lines = []
    for e in exc.errors():
        loc = _field_name(e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (a typo? see manifests/README.md for the fields)"
        lines.append(f"{loc}: {msg}")
    return "; ".join(lines)


def _field_name(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_manifest(path: str | Path, *, check_inputs: bool = True) -> Manifest:
    """Read and check a manifest; raises :class:`ConfigError` naming the file and each wrong field.

    ``check_inputs``: also require every literal local input path to exist (globs may match nothing).
    """
    where = str(path)
    doc = load_yaml(path, limits=YamlLimits(max_bytes=256 * 1024, max_nodes=50_000))
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: a manifest is a YAML mapping (version, name, lake, inputs, ...), got "
                          f"{type(doc).__name__}")
    try:
        manifest = Manifest.model_validate({**doc, "source": where})
    except ValidationError as exc:
        raise ConfigError(f"{where}: invalid manifest: {_problem(exc)}") from None
    base = Path(path).resolve().parent
    lake = resolve_path(expand(manifest.lake, f"{where}: lake"), base)
    ingest = _resolved_settings(manifest.steps.ingest, f"{where}: steps.ingest", base, check_inputs)
    inputs = []
    for i, spec in enumerate(manifest.inputs):
        field = f"{where}: inputs[{i}]"
        upd: dict[str, Any] = {"ingest": _resolved_settings(spec.ingest, f"{field}.ingest", base, check_inputs)}
        if spec.path is not None:
            upd["path"] = resolve_path(expand(spec.path, field), base)
        if spec.stac is not None:
            upd["stac"] = resolve_path(expand(spec.stac, field), base)
        spec = spec.model_copy(update=upd)
        if check_inputs:
            _check_exists(spec, field)
        inputs.append(spec)
    steps = manifest.steps.model_copy(update={"ingest": ingest})
    return manifest.model_copy(update={"lake": lake, "inputs": inputs, "steps": steps})


_Settings = TypeVar("_Settings", bound=IngestSettings)


def _resolved_settings(settings: _Settings, field: str, base: Path, check: bool) -> _Settings:
    """Ingest settings with ``labels`` and each aux ``path`` resolved against the manifest's folder ``base``."""
    upd: dict[str, Any] = {}
    if settings.labels is not None:
        upd["labels"] = resolve_path(expand(settings.labels, f"{field}.labels"), base)
    if settings.aux:
        upd["aux"] = tuple(_resolved_aux(a, f"{field}.aux[{i}]", base, check) for i, a in enumerate(settings.aux))
    return settings.model_copy(update=upd) if upd else settings


def _resolved_aux(entry: AuxEntry, field: str, base: Path, check: bool) -> AuxEntry:
    """An aux entry whose path is local and absolute; ``check``: a path without glob characters must exist."""
    path = resolve_path(expand(entry.path, f"{field}.path"), base)
    if is_url(path):
        raise ConfigError(f"{field}.path: {path}: aux rasters are read from local files (a file, a folder or a "
                          "glob pattern); copy the raster to a local disk and name that path")
    if check and not any(c in path for c in "*?[") and not Path(path).exists():
        raise ConfigError(f"{field}.path: {path} does not exist; fix the path (relative paths start at the "
                          "manifest's folder) or remove the layer")
    return entry.model_copy(update={"path": path})


def _check_exists(spec: InputSpec, field: str) -> None:
    target = spec.where
    if is_url(target) or any(c in target for c in "*?["):
        return
    if not Path(target).exists():
        key = "stac" if spec.stac is not None else "path"
        raise ConfigError(f"{field}.{key}: {target} does not exist; fix the path (relative paths start at the "
                          "manifest's folder) or remove the input")
