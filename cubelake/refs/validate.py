"""Checks on a reference set as it is loaded: a reference set is untrusted input.

Every entry is checked before a byte is read: keys well-formed and naming a chunk of a declared
array, targets strings without control characters, byte ranges integers (offset >= 0, length
> 0 and at most :data:`MAX_CHUNK_BYTES`, within the target's recorded size), ``.zarray``
metadata sane and bounded (one decoded chunk at most :data:`MAX_CHUNK_BYTES`, so nothing can
run out of memory), JSON documents bounded in size and nesting. Each problem is a
:class:`RefsError` naming the file and the key, and saying what was expected.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cubelake.errors import RefsError

from .model import TARGETS_ATTR, Target

__all__ = [
    "MAX_CHUNK_BYTES",
    "MAX_DEPTH",
    "MAX_DOC_BYTES",
    "ArraySpec",
    "check_chunk_key",
    "check_key",
    "check_metadata",
    "check_range",
    "check_url",
    "parse_targets",
    "read_json",
]

MAX_DOC_BYTES = 512 * 2**20  # one JSON document; a larger reference set belongs in Parquet
MAX_DEPTH = 32  # nesting of a JSON metadata document (Zarr metadata needs 4 or 5)
MAX_CHUNK_BYTES = 2**30  # one decoded chunk, one stored byte range, one 1-D (coordinate) array
MAX_NDIM = 32
MAX_EXTENT = 2**48  # one dimension of an array
MAX_OFFSET = 2**62  # so that offset + length cannot overflow a signed 64-bit integer
MAX_KEY_CHARS = 1024
MAX_URL_CHARS = 4096
META_NAMES = (".zarray", ".zattrs", ".zgroup")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_BAD_SEGMENT = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")  # an empty, "." or ".." segment
_DTYPE_KINDS = "biufcSUmM"


def _err(path: str | Path, key: str, what: str) -> RefsError:
    return RefsError(f"{path}: key {key!r}: {what}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)


def check_key(key: Any, path: str | Path) -> str:
    """``key`` if it is a well-formed Zarr key: ``/``-separated names, no empty, ``.`` or ``..`` segment."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS or _CONTROL.search(key) \
            or _BAD_SEGMENT.search(key):
        raise RefsError(f"{path}: key {key!r} is not a well-formed Zarr key (names separated by '/', no empty, "
                        f"'.' or '..' segment, no control character, at most {MAX_KEY_CHARS} characters)")
    return key


def check_url(url: Any, path: str | Path, key: str) -> str:
    """``url`` if it is a usable target: a non-empty string without NUL or other control characters."""
    if not isinstance(url, str) or not url:
        raise _err(path, key, f"target {url!r} is not a non-empty string (a path or URL)")
    if len(url) > MAX_URL_CHARS:
        raise _err(path, key, f"target is {len(url)} characters long, more than {MAX_URL_CHARS}")
    if _CONTROL.search(url):
        raise _err(path, key, f"target {url!r} contains a control character (NUL, newline ...); refused")
    return url


def check_range(offset: Any, length: Any, path: str | Path, key: str) -> tuple[int, int]:
    """``(offset, length)`` as ints if ``offset`` is an integer >= 0 and ``length`` one in 1..MAX_CHUNK_BYTES."""
    if not _is_int(offset) or not 0 <= offset <= MAX_OFFSET:
        raise _err(path, key, f"byte offset {offset!r} is not an integer from 0 to {MAX_OFFSET}")
    if not _is_int(length) or length <= 0:
        raise _err(path, key, f"byte length {length!r} is not an integer > 0")
    if length > MAX_CHUNK_BYTES:
        raise _err(path, key, f"byte length {length} is more than the {MAX_CHUNK_BYTES} bytes one chunk may have")
    return int(offset), int(length)


def read_json(raw: bytes | str, path: str | Path, key: str) -> Any:
    """Parsed JSON, refusing invalid JSON, deep nesting and non-standard values other than NaN/Infinity."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise _err(path, key, f"JSON nested too deeply (more than {MAX_DEPTH} levels are refused)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _err(path, key, f"not valid JSON ({exc})") from None
    _check_depth(value, path, key)
    return value


def _check_depth(value: Any, path: str | Path, key: str) -> None:
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _err(path, key, f"JSON nested too deeply (more than {MAX_DEPTH} levels are refused)")
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """What a key needs from an array's ``.zarray``: its path, shape, chunk shape and key separator."""

    path: str  # "" for an array at the root
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    sep: str
    grid: tuple[int, ...] = ()  # chunks along each dimension (filled in from shape and chunks)

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid", tuple(-(-s // c) for s, c in zip(self.shape, self.chunks, strict=True)))

    @property
    def n_chunks(self) -> int:
        return math.prod(self.grid)

    def key(self, index: int) -> str:
        """The key of the chunk with C-order linear ``index`` (as fsspec's Parquet records number them)."""
        parts: list[int] = []
        for g in reversed(self.grid):
            index, i = divmod(index, g)
            parts.append(i)
        name = self.sep.join(str(i) for i in reversed(parts)) or "0"
        return f"{self.path}/{name}" if self.path else name


def _check_dtype(dt: Any, path: str | Path, key: str) -> np.dtype[Any]:
    try:
        dtype = np.dtype(dt) if isinstance(dt, str) else None
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in _DTYPE_KINDS or dtype.itemsize == 0:
        raise _err(path, key, f"dtype {dt!r} is not a numeric, string or datetime NumPy type string (e.g. '<i2')")
    return dtype


def _check_codec(config: Any, path: str | Path, key: str) -> None:
    import numcodecs

    import cubelake.refs  # noqa: F401  (registers cubelake_tiff and imagecodecs' codecs)

    if not isinstance(config, dict) or not isinstance(config.get("id"), str):
        raise _err(path, key, f"codec {config!r} is not an object with an 'id'")
    try:
        numcodecs.get_codec(dict(config))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # unknown id, or bad parameters
        raise _err(path, key, f"codec {config['id']!r} cannot be used ({type(exc).__name__}: {exc})") from None


def _check_fill(fill: Any, dtype: np.dtype[Any], path: str | Path, key: str) -> None:
    if fill is None or dtype.kind not in "biuf":
        return
    ok: bool
    if dtype.kind == "f":
        ok = (_is_int(fill) or isinstance(fill, float)) or fill in ("NaN", "Infinity", "-Infinity")
    elif dtype.kind == "b":
        ok = isinstance(fill, bool) or fill in (0, 1)
    else:
        info = np.iinfo(dtype)
        ok = (_is_int(fill) or (isinstance(fill, float) and fill.is_integer())) and info.min <= fill <= info.max
    if not ok:
        raise _err(path, key, f"fill_value {fill!r} is not a value of dtype {dtype.str}")


def check_zarray(doc: Any, path: str | Path, key: str) -> ArraySpec:
    """The :class:`ArraySpec` of a Zarr v2 ``.zarray`` document, refusing anything unsound or unbounded."""
    if not isinstance(doc, dict) or doc.get("zarr_format") != 2:
        raise _err(path, key, "not Zarr v2 array metadata (an object with zarr_format 2)")
    shape, chunks = doc.get("shape"), doc.get("chunks")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(_is_int(s) and 0 <= s <= MAX_EXTENT for s in shape):
        raise _err(path, key, f"shape {shape!r} is not a list of at most {MAX_NDIM} integers from 0 to {MAX_EXTENT}")
    if not isinstance(chunks, list) or len(chunks) != len(shape) \
            or not all(_is_int(c) and 1 <= c <= MAX_EXTENT for c in chunks):
        raise _err(path, key, f"chunks {chunks!r} is not a list of {len(shape)} integers >= 1 (one per dimension)")
    dtype = _check_dtype(doc.get("dtype"), path, key)
    nbytes = math.prod(chunks) * dtype.itemsize
    if nbytes > MAX_CHUNK_BYTES:
        raise _err(path, key, f"one chunk {tuple(chunks)} of {dtype.str} decodes to {nbytes} bytes, more than the "
                              f"{MAX_CHUNK_BYTES} allowed")
    if len(shape) == 1 and shape[0] * dtype.itemsize > MAX_CHUNK_BYTES:
        raise _err(path, key, f"a 1-D array of {shape[0] * dtype.itemsize} bytes (coordinates are read whole); "
                              f"at most {MAX_CHUNK_BYTES} are allowed")
    if doc.get("order", "C") not in ("C", "F"):
        raise _err(path, key, f"order {doc.get('order')!r} is not 'C' or 'F'")
    sep = doc.get("dimension_separator", ".")
    if sep not in (".", "/"):
        raise _err(path, key, f"dimension_separator {sep!r} is not '.' or '/'")
    if doc.get("compressor") is not None:
        _check_codec(doc["compressor"], path, key)
    filters = doc.get("filters")
    if filters is not None and not isinstance(filters, list):
        raise _err(path, key, f"filters {filters!r} is not a list of codecs or null")
    for f in filters or []:
        _check_codec(f, path, key)
    _check_fill(doc.get("fill_value"), dtype, path, key)
    prefix = key[: -len(".zarray")].rstrip("/")
    return ArraySpec(prefix, tuple(int(s) for s in shape), tuple(int(c) for c in chunks), sep)


def check_metadata(meta: dict[str, bytes], path: str | Path,
                   consolidated: dict[str, Any] | None = None) -> tuple[dict[str, bytes], dict[str, ArraySpec]]:
    """Validated metadata keys and a ``.zmetadata`` rebuilt from them, plus each array's :class:`ArraySpec`.

    ``.zmetadata`` is what zarr reads when a set is opened consolidated; rebuilding it from the
    checked keys (they win over its own copies) leaves no second, unchecked description.
    """
    docs: dict[str, Any] = {}
    if consolidated is None and ".zmetadata" in meta:
        consolidated = read_json(meta[".zmetadata"], path, ".zmetadata")
    if consolidated is not None:
        inner = consolidated.get("metadata", {}) if isinstance(consolidated, dict) else None
        if not isinstance(inner, dict):
            raise _err(path, ".zmetadata", "not consolidated Zarr metadata (an object with a 'metadata' object)")
        for k, v in inner.items():
            if check_key(k, path).rsplit("/", 1)[-1] in META_NAMES:
                _check_depth(v, path, k)
                docs[k] = v
    for k, v in meta.items():
        if k.rsplit("/", 1)[-1] in META_NAMES:
            docs[k] = read_json(v, path, k)
    arrays: dict[str, ArraySpec] = {}
    for k, d in docs.items():
        name = k.rsplit("/", 1)[-1]
        if not isinstance(d, dict):
            raise _err(path, k, "Zarr metadata must be a JSON object")
        if name == ".zarray":
            spec = check_zarray(d, path, k)
            arrays[spec.path] = spec
        elif name == ".zgroup" and d.get("zarr_format") != 2:
            raise _err(path, k, "not a Zarr v2 group (zarr_format must be 2)")
    out = {k: v for k, v in meta.items() if k != ".zmetadata"}
    for k, d in docs.items():
        out.setdefault(k, json.dumps(d, allow_nan=True).encode())
    out[".zmetadata"] = json.dumps({"metadata": docs, "zarr_consolidated_format": 1}, allow_nan=True).encode()
    return out, arrays


def check_chunk_key(key: str, arrays: dict[str, ArraySpec], path: str | Path) -> None:
    """Refuse a byte-range key that is not a chunk of a declared array, inside its chunk grid."""
    prefix, _, rest = key.rpartition("/")
    spec = arrays.get(prefix)
    if spec is None or spec.sep == "/":
        spec = None
        for p, a in arrays.items():
            if a.sep == "/" and (not p or key.startswith(p + "/")):
                spec, rest = a, key[len(p) + 1:] if p else key
                break
    if spec is None:
        raise _err(path, key, "names no chunk of an array declared in the set (no .zarray for it)")
    parts = rest.split(spec.sep)
    ndim = len(spec.shape)
    if len(parts) != max(ndim, 1) or not rest.isascii() or not all(x.isdigit() for x in parts):
        raise _err(path, key, f"is not a chunk key of {spec.path or 'the root array'} ({max(ndim, 1)} "
                              f"integer(s) separated by {spec.sep!r})")
    index = tuple(int(x) for x in parts)
    if ndim and any(i >= g for i, g in zip(index, spec.grid, strict=True)):
        raise _err(path, key, f"chunk {index} is outside the array's chunk grid {spec.grid}")
    if not ndim and index != (0,):
        raise _err(path, key, "a 0-dimensional array has only chunk 0")


def parse_targets(meta: dict[str, bytes], path: str | Path) -> list[Target]:
    """The targets recorded in the root ``.zattrs`` (``cubelake:targets``), each field checked."""
    attrs = json.loads(meta[".zattrs"]) if ".zattrs" in meta else {}
    raw = attrs.get(TARGETS_ATTR, [])
    if not isinstance(raw, list):
        raise _err(path, ".zattrs", f"{TARGETS_ATTR} is not a list")
    out = []
    for i, d in enumerate(raw):
        where = f".zattrs {TARGETS_ATTR}[{i}]"
        if not isinstance(d, dict):
            raise _err(path, where, "not an object with url and size")
        url = check_url(d.get("url"), path, where)
        if not _is_int(d.get("size")) or d["size"] < 0:
            raise _err(path, where, f"size {d.get('size')!r} is not an integer >= 0")
        if d.get("mtime_ns") is not None and not _is_int(d["mtime_ns"]):
            raise _err(path, where, f"mtime_ns {d['mtime_ns']!r} is not an integer")
        for name in ("etag", "fingerprint"):
            v = d.get(name)
            if v is not None and (not isinstance(v, str) or len(v) > 256 or _CONTROL.search(v)):
                raise _err(path, where, f"{name} {v!r} is not a short string")
        out.append(Target(url, int(d["size"]), d.get("mtime_ns"), d.get("etag"), d.get("fingerprint")))
    return out
