"""Every entry of a reference set is checked on loading: bad ones are a RefsError naming the file and the key.

Each kind of bad entry is tried through Python (``open_array``) and through ``cubelake refs check``
in another process (exit code 1, the file and the key named, no traceback). One process runs the
CLI's ``main`` over every bad set in turn, as ``python -m cubelake.cli refs check SET`` would (a
start per set would cost ~2 s each).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cubelake.errors import RefsError
from cubelake.refs import build_refs, open_array, write_refs
from cubelake.refs import formats as refs_formats
from tests.conftest import hsi_cube, write_geotiff

Doc = dict[str, Any]
CHUNK = "data/0.0.0"


def _good(tmp_path: Path, geotiff=None) -> tuple[Path, np.ndarray]:
    data = hsi_cube(2, 128, 128)
    profile = dict(tiled=True, blockxsize=64, blockysize=64, compress="deflate")
    src = geotiff("t.tif", data, **profile) if geotiff else write_geotiff(tmp_path / "t.tif", data, **profile)
    return write_refs(build_refs(str(src)), tmp_path / "good.json", "json"), data


_DRIVER = """
import contextlib, io, json, sys, traceback
from cubelake.cli import main
results = {}
for path in sys.argv[1:]:
    out, err, rc = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.argv = ["cubelake", "refs", "check", path]
        try:
            main()
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            traceback.print_exc()
            rc = -1
    results[path] = [rc, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


def _cli_check_all(paths: list[Path]) -> dict[str, tuple[int, str, str]]:
    """``cubelake refs check`` of each set, run by the CLI's main in one other process."""
    run = subprocess.run([sys.executable, "-c", _DRIVER, *map(str, paths)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    return {k: (v[0], v[1], v[2]) for k, v in json.loads(run.stdout).items()}


def _set_ref(i: int, value: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        doc["refs"][CHUNK][i] = value
    return mutate


def _zarray(**changes: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        za = json.loads(doc["refs"]["data/.zarray"])
        za.update(changes)
        doc["refs"]["data/.zarray"] = json.dumps(za)
    return mutate


def _add_key(key: str, value: Any = None) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        doc["refs"][key] = value if value is not None else list(doc["refs"][CHUNK])
    return mutate


def _target_field(**changes: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        attrs = json.loads(doc["refs"][".zattrs"])
        attrs["cubelake:targets"][0].update(changes)
        doc["refs"][".zattrs"] = json.dumps(attrs)
    return mutate


def _deep_attrs(doc: Doc) -> None:
    doc["refs"]["data/.zattrs"] = "[" * 200 + "]" * 200


def _template(doc: Doc) -> None:
    doc["templates"]["t0"] = 5


def _nul_target(doc: Doc) -> None:
    doc["refs"][CHUNK][0] = "/tmp/x\u0000.tif"


def _newline_target(doc: Doc) -> None:
    doc["refs"][CHUNK][0] = "t.tif\nok: forged line"


def _past_end(doc: Doc) -> None:
    size = json.loads(doc["refs"][".zattrs"])["cubelake:targets"][0]["size"]
    doc["refs"][CHUNK][1:] = [size - 10, 100]


BAD: list[tuple[str, Callable[[Doc], None], str, str]] = [
    # (case, mutation, key named in the message, what the message says)
    ("negative offset", _set_ref(1, -1), CHUNK, "byte offset -1 is not an integer"),
    ("float offset", _set_ref(1, 1.5), CHUNK, "byte offset 1.5 is not an integer"),
    ("string offset", _set_ref(1, "428"), CHUNK, "byte offset '428' is not an integer"),
    ("bool offset", _set_ref(1, True), CHUNK, "byte offset True is not an integer"),
    ("huge offset", _set_ref(1, 2**63), CHUNK, "is not an integer from 0 to"),
    ("length 2**40", _set_ref(2, 2**40), CHUNK, "byte length 1099511627776 is more than"),
    ("zero length", _set_ref(2, 0), CHUNK, "byte length 0 is not an integer > 0"),
    ("float length", _set_ref(2, 10.0), CHUNK, "byte length 10.0 is not an integer"),
    ("range past the recorded size", _past_end, CHUNK, "lie past the end of"),
    ("NUL in target", _nul_target, CHUNK, "contains a control character"),
    ("newline in target", _newline_target, CHUNK, "contains a control character"),
    ("target not a string", _set_ref(0, 7), CHUNK, "malformed reference"),
    ("template not a string", _template, "templates/t0", "is not a non-empty string"),
    ("two-element reference", _add_key("data/1.0.0", ["t.tif", 5]), "data/1.0.0", "malformed reference"),
    ("'..' in a key", _add_key("data/../x/0.0.0"), "data/../x/0.0.0", "not a well-formed Zarr key"),
    ("empty segment in a key", _add_key("data//0.0.0"), "data//0.0.0", "not a well-formed Zarr key"),
    ("NUL in a key", _add_key("data/0.0.0\u0000"), "data/0.0.0\x00", "not a well-formed Zarr key"),
    ("chunk outside the grid", _add_key("data/0.9.0"), "data/0.9.0", "outside the array's chunk grid"),
    ("not a chunk index", _add_key("data/0.a.0"), "data/0.a.0", "is not a chunk key of data"),
    ("key of no array", _add_key("other/0.0.0"), "other/0.0.0", "no .zarray for it"),
    ("negative shape", _zarray(shape=[2, -128, 128]), "data/.zarray", "shape [2, -128, 128] is not a list"),
    ("zero chunk", _zarray(chunks=[2, 0, 64]), "data/.zarray", "chunks [2, 0, 64] is not a list"),
    ("float chunk", _zarray(chunks=[2, 64.0, 64]), "data/.zarray", "is not a list of 3 integers"),
    ("object dtype", _zarray(dtype="|O"), "data/.zarray", "dtype '|O' is not"),
    ("nonsense dtype", _zarray(dtype="<q9"), "data/.zarray", "dtype '<q9' is not"),
    ("chunk over 1 GiB", _zarray(chunks=[2, 65536, 65536], shape=[2, 65536, 65536]), "data/.zarray",
     "decodes to 17179869184 bytes"),
    ("unknown codec", _zarray(compressor={"id": "no-such-codec"}), "data/.zarray", "codec 'no-such-codec' cannot"),
    ("filters not a list", _zarray(filters="zlib"), "data/.zarray", "filters 'zlib' is not a list"),
    ("fill value of another type", _zarray(fill_value="abc"), "data/.zarray", "fill_value 'abc' is not a value"),
    ("zarr_format 3", _zarray(zarr_format=3), "data/.zarray", "not Zarr v2 array metadata"),
    ("deeply nested attributes", _deep_attrs, "data/.zattrs", "nested too deeply"),
    ("target size a string", _target_field(size="big"), ".zattrs cubelake:targets[0]", "size 'big' is not an integer"),
    ("bad base64", _add_key("x/0", "base64:!!!"), "x/0", "not valid base64"),
]


def _write_bad(folder: Path, good: Path, mutate: Callable[[Doc], None]) -> Path:
    doc = json.loads(good.read_text())
    mutate(doc)
    bad = folder / "bad.json"
    bad.write_text(json.dumps(doc))
    return bad


def _cli_check(refs: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cubelake.cli", "refs", "check", str(refs), *extra],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def bad_sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One bad JSON set per case of BAD (beside one good set and its target) and one bad Parquet set per case."""
    root = tmp_path_factory.mktemp("bad_refs")
    good, _ = _good(root)
    out: dict[str, Path] = {}
    for i, (case, mutate, _, _) in enumerate(BAD):
        folder = root / f"json{i}"
        folder.mkdir()
        shutil.copy(root / "t.tif", folder / "t.tif")
        out[f"json:{case}"] = _write_bad(folder, good, mutate)
    for i, (case, mutate_pq, _) in enumerate(PARQUET_BAD):
        folder = root / f"parquet{i}"
        folder.mkdir()
        shutil.copy(root / "t.tif", folder / "t.tif")
        refs = write_refs(build_refs(str(folder / "t.tif")), folder / "t.refs", "parquet")
        assert open_array(refs).shape == (2, 128, 128)
        mutate_pq(refs / "data" / "refs.0.parq")
        out[f"parquet:{case}"] = refs
    return out


@pytest.fixture(scope="module")
def cli_results(bad_sets: dict[str, Path]) -> dict[str, tuple[int, str, str]]:
    return _cli_check_all(list(bad_sets.values()))


def _assert_cli_refused(result: tuple[int, str, str], refs: Path, match: str) -> None:
    rc, out, err = result
    assert rc == 1, (refs, out, err)
    assert "Traceback" not in out + err
    assert "ok:" not in out
    assert str(refs) in err
    assert match in err.replace("\n", "")


@pytest.mark.parametrize(("case", "mutate", "key", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_entry_is_refused_naming_the_file_and_key(bad_sets, cli_results, case: str,
                                                      mutate: Callable[[Doc], None], key: str, match: str) -> None:
    bad = bad_sets[f"json:{case}"]
    with pytest.raises(RefsError) as info:
        open_array(bad)
    msg = str(info.value)
    assert str(bad) in msg
    assert repr(key) in msg or key in msg
    assert match in msg
    _assert_cli_refused(cli_results[str(bad)], bad, match)


def test_one_bad_entry_through_python_m_cubelake_cli(bad_sets) -> None:
    """The same check as a user runs it, in a process of its own, for one case of each format."""
    for name, match in (("json:NUL in target", "contains a control character"),
                        ("parquet:length 2**40", "byte length 1099511627776 is more than")):
        run = _cli_check(bad_sets[name])
        _assert_cli_refused((run.returncode, run.stdout, run.stderr), bad_sets[name], match)


def test_the_untouched_set_opens(tmp_path: Path, geotiff) -> None:
    good, data = _good(tmp_path, geotiff)
    np.testing.assert_array_equal(open_array(good)[:], data)
    run = _cli_check(good)
    assert run.returncode == 0, run.stderr
    assert "unchanged and allowed" in run.stdout


def test_nesting_beyond_the_json_parser_and_oversized_documents(tmp_path: Path, monkeypatch) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"version": 1, "refs": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(RefsError, match="nested too deeply"):
        open_array(deep)
    run = _cli_check(deep)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert "nested too deeply" in run.stderr
    big = tmp_path / "big.json"
    big.write_text('{"version": 1, "refs": {".zgroup": "' + " " * 5000 + '{}"}}')
    monkeypatch.setattr(refs_formats, "MAX_DOC_BYTES", 4096)  # the real bound is 512 MiB
    with pytest.raises(RefsError, match="more than 4096 bytes; write a set this large as Parquet"):
        open_array(big)


def test_a_target_that_is_not_a_regular_file_is_refused(tmp_path: Path, geotiff) -> None:
    import os

    good, _ = _good(tmp_path, geotiff)
    doc = json.loads(good.read_text())
    os.mkfifo(tmp_path / "fifo.tif")
    attrs = json.loads(doc["refs"][".zattrs"])
    attrs["cubelake:targets"] = []
    doc["refs"][".zattrs"] = json.dumps(attrs)
    doc["templates"]["t0"] = "fifo.tif"
    bad = tmp_path / "fifo.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(RefsError, match="not a regular file"):
        open_array(bad)
    run = _cli_check(bad)
    assert run.returncode == 1
    assert "not a regular file" in run.stderr
    assert "Traceback" not in run.stderr


def test_unrecorded_target_shorter_than_its_references_is_refused(tmp_path: Path, geotiff) -> None:
    good, _ = _good(tmp_path, geotiff)
    doc = json.loads(good.read_text())
    attrs = json.loads(doc["refs"][".zattrs"])
    attrs.pop("cubelake:targets")  # as kerchunk writes them: no sizes recorded
    doc["refs"][".zattrs"] = json.dumps(attrs)
    (tmp_path / "short.tif").write_bytes((tmp_path / "t.tif").read_bytes()[:1000])
    doc["templates"]["t0"] = "short.tif"
    bad = tmp_path / "short.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(RefsError, match=r"short\.tif.*bytes, but references reach byte"):
        open_array(bad)


# -- Parquet ------------------------------------------------------------------------------------------


def _rewrite(f: Path, column: str, values: pa.Array | list[Any]) -> None:
    t = pq.read_table(f)
    t = t.set_column(t.schema.get_field_index(column), column, pa.array(values) if isinstance(values, list) else values)
    pq.write_table(t, f)


def _column(f: Path, column: str, row: int, value: Any, typ: pa.DataType | None = None) -> None:
    values = pq.read_table(f).column(column).to_pylist()
    values[row] = value
    _rewrite(f, column, pa.array(values, type=typ))


PARQUET_BAD: list[tuple[str, Callable[[Path], None], str]] = [
    ("negative offset", lambda f: _column(f, "offset", 1, -5), "byte offset -5 is not an integer"),
    ("length 2**40", lambda f: _column(f, "size", 2, 2**40), "byte length 1099511627776 is more than"),
    ("zero length", lambda f: _column(f, "size", 0, 0), "byte length 0 is not an integer > 0"),
    ("float offsets", lambda f: _rewrite(f, "offset", [float(v) for v in pq.read_table(f).column("offset").to_pylist()]),
     "column 'offset' holds double, not integers"),
    ("NUL in a target", lambda f: _column(f, "path", 3, "t\u0000.tif"), "contains a control character"),
    ("past the recorded size", lambda f: _column(f, "offset", 1, 10**6), "lie past the end of"),
    ("missing offset", lambda f: _column(f, "offset", 2, None, pa.int64()), "byte offset None is not an integer"),
    ("row beyond the chunk grid", lambda f: _column(f, "path", 500, "t.tif"), "outside the 4 chunks of data"),
]


@pytest.mark.parametrize(("case", "mutate", "match"), PARQUET_BAD, ids=[b[0] for b in PARQUET_BAD])
def test_bad_parquet_rows_are_refused_naming_the_key(bad_sets, cli_results, case: str,
                                                     mutate: Callable[[Path], None], match: str) -> None:
    folder = bad_sets[f"parquet:{case}"]
    with pytest.raises(RefsError) as info:
        open_array(folder)
    msg = str(info.value)
    assert str(folder) in msg
    assert match in msg
    if "row beyond" not in case and "float" not in case:
        assert "key 'data/0." in msg
    _assert_cli_refused(cli_results[str(folder)], folder, match)


@pytest.mark.parametrize(("attr", "value"), [("GeoTransform", "1 2 three 4 5 6"), ("crs_wkt", "PROJCS[nonsense")])
def test_combine_reports_an_unreadable_grid_description(tmp_path: Path, geotiff, attr: str, value: str) -> None:
    good, _ = _good(tmp_path, geotiff)
    doc = json.loads(good.read_text())
    sr = json.loads(doc["refs"]["spatial_ref/.zattrs"])
    sr[attr] = value
    doc["refs"]["spatial_ref/.zattrs"] = json.dumps(sr)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    from cubelake.refs import combine_refs

    with pytest.raises(RefsError, match="grid description") as info:
        combine_refs([good, bad], dim="scene")
    assert str(bad) in str(info.value)
    run = subprocess.run([sys.executable, "-m", "cubelake.cli", "refs", "combine", str(good), str(bad), "--dim", "scene",
                          "-o", str(tmp_path / "cube.json")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "grid description" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "cube.json").exists()
