"""Checks of one fsspec Parquet record file (``<var>/refs.<n>.parq``), vectorised with pyarrow.

Row ``i`` of file ``n`` is chunk ``n * record_size + i`` of the variable, in C order (fsspec's
``LazyReferenceMapper`` numbering); a row with a ``path`` is a byte-range reference.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from cubelake.errors import RefsError

from .validate import MAX_CHUNK_BYTES, MAX_OFFSET, ArraySpec, check_range

__all__ = ["check_record_file"]

_NAME = re.compile(r"refs\.([0-9]{1,12})\.parq")


def _table(folder: Path, f: Path, record_size: int) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rel = f.relative_to(folder)
    try:
        pf = pq.ParquetFile(f)
        if pf.metadata.num_rows > record_size:
            raise RefsError(f"{folder}: {rel} has {pf.metadata.num_rows} rows, more than the record size {record_size}")
        names = set(pf.schema_arrow.names)
        if not {"path", "offset", "size"} <= names:
            raise RefsError(f"{folder}: {rel} lacks the path/offset/size columns of fsspec's Parquet references")
        t = pf.read(columns=["path", "offset", "size"])
    except (pa.ArrowException, OSError) as exc:
        raise RefsError(f"{folder}: {rel} is not a readable Parquet file ({exc})") from None
    for col in ("offset", "size"):
        typ = t.schema.field(col).type
        if not (pa.types.is_integer(typ) or pa.types.is_null(typ)):
            raise RefsError(f"{folder}: {rel}: column {col!r} holds {typ}, not integers; byte offsets and "
                            "lengths must be integers")
    typ = t.schema.field("path").type
    if pa.types.is_dictionary(typ):  # fsspec writes the paths dictionary-encoded
        t = t.set_column(t.schema.get_field_index("path"), "path", t["path"].cast(typ.value_type))
        typ = typ.value_type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_null(typ)):
        raise RefsError(f"{folder}: {rel}: column 'path' holds {typ}, not strings")
    return t


def check_record_file(folder: Path, f: Path, arrays: dict[str, ArraySpec],
                      record_size: int) -> list[tuple[str, int, str]]:
    """``(url, furthest byte, key of that row)`` per target of the file's references; raises on a bad row."""
    import pyarrow.compute as pc

    rel = f.relative_to(folder)
    var = rel.parent.as_posix()
    spec = arrays.get("" if var == "." else var)
    m = _NAME.fullmatch(f.name)
    if spec is None or m is None:
        raise RefsError(f"{folder}: {rel} holds references for {var!r}, which has no .zarray in .zmetadata")
    first = int(m.group(1)) * record_size
    t = _table(folder, f, record_size)
    rows = np.flatnonzero(pc.is_valid(t["path"]).to_numpy(zero_copy_only=False))
    if rows.size == 0:
        return []
    if first + int(rows[-1]) >= spec.n_chunks:
        raise RefsError(f"{folder}: {rel}: row {int(rows[-1])} is chunk {first + int(rows[-1])}, outside the "
                        f"{spec.n_chunks} chunks of {spec.path or 'the root array'}")
    paths = t["path"].take(rows)
    off = t["offset"].take(rows).to_numpy(zero_copy_only=False)
    n = t["size"].take(rows).to_numpy(zero_copy_only=False)
    if off.dtype.kind not in "iu" or n.dtype.kind not in "iu":  # nulls made them float/object
        bad = int(np.flatnonzero(t["offset"].take(rows).is_null().to_numpy(zero_copy_only=False)
                                 | t["size"].take(rows).is_null().to_numpy(zero_copy_only=False))[0])
        check_range(None, None, folder, spec.key(first + int(rows[bad])))
    bad_rows = np.flatnonzero((off < 0) | (off > MAX_OFFSET) | (n <= 0) | (n > MAX_CHUNK_BYTES))
    if bad_rows.size:  # compared before any cast, so a huge unsigned value is not read as negative
        i = int(bad_rows[0])
        check_range(int(off[i]), int(n[i]), folder, spec.key(first + int(rows[i])))
    ends = off.astype(np.int64) + n.astype(np.int64)
    codes = pc.dictionary_encode(paths).combine_chunks()
    idx = codes.indices.to_numpy(zero_copy_only=False)
    names = codes.dictionary.to_pylist()
    order = np.lexsort((ends, idx))  # by target, then by end: the last of each target's run is its furthest
    last = order[np.flatnonzero(np.r_[idx[order][1:] != idx[order][:-1], True])]
    return [(str(names[idx[k]]), int(ends[k]), spec.key(first + int(rows[k]))) for k in last.tolist()]
