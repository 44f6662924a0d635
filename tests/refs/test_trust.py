"""Reference sets are untrusted input: allowed roots, and stale targets caught before wrong bytes are served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cubelake.errors import RefsError, StaleReferenceError, UntrustedTargetError
from cubelake.lake import Lake
from cubelake.refs import AllowedRoots, build_refs, open_array, open_dataset, write_refs
from tests.conftest import hsi_cube


def _tiled(geotiff, name: str = "t.tif", bands: int = 3):
    data = hsi_cube(bands, 128, 192)
    return geotiff(name, data, tiled=True, blockxsize=64, blockysize=64, compress="zstd", predictor=2), data


def _evil(tmp_path: Path, target: str, name: str = "evil.json") -> Path:
    good = json.loads((tmp_path / "good.json").read_text())
    refs = good["refs"]
    for k, v in refs.items():
        if isinstance(v, list):
            refs[k] = [target, *v[1:]]
    good.pop("templates", None)
    p = tmp_path / name
    p.write_text(json.dumps(good))
    return p


@pytest.mark.parametrize("target", ["/etc/passwd", "file:///etc/passwd", "s3://other-bucket/x.tif",
                                    "http://example.com/x.tif", "../../../../../../../../etc/passwd",
                                    "SRC/../../../etc/passwd"])
def test_targets_outside_the_allowed_roots_are_refused(tmp_path: Path, geotiff, target: str) -> None:
    src, _ = _tiled(geotiff)
    write_refs(build_refs(str(src)), tmp_path / "good.json")
    evil = _evil(tmp_path, target.replace("SRC", str(tmp_path)))
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots") as info:
        open_array(evil)
    assert "segments" not in str(info.value)


def test_symlink_out_of_a_root_is_refused(tmp_path: Path, geotiff) -> None:
    src, _ = _tiled(geotiff)
    write_refs(build_refs(str(src)), tmp_path / "good.json")
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots"):
        open_array(_evil(tmp_path, str(tmp_path / "link" / "passwd")))


def test_explicitly_allowed_root_is_trusted(tmp_path: Path, geotiff) -> None:
    elsewhere = tmp_path / "archive"
    elsewhere.mkdir()
    src, data = _tiled(geotiff)
    moved = elsewhere / "t.tif"
    os.replace(src, moved)
    refs_dir = tmp_path / "refs"
    refs_dir.mkdir()
    write_refs(build_refs(str(moved)), refs_dir / "r.json")
    with pytest.raises(UntrustedTargetError, match="archive"):
        open_array(refs_dir / "r.json")
    np.testing.assert_array_equal(open_array(refs_dir / "r.json", allowed_roots=[str(elsewhere)])[:], data)


def test_a_lake_named_by_the_caller_lends_its_allowed_roots(tmp_path: Path, geotiff) -> None:
    lake = Lake(tmp_path / "lake")
    src, data = _tiled(geotiff)
    refs = lake.root / "cube.json"
    write_refs(build_refs(str(src)), refs)
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots"):
        open_array(refs, lake=lake)  # the source folder is not a root of this lake
    assert lake.allow_root(str(tmp_path)) is True
    assert lake.allow_root(str(tmp_path)) is False
    np.testing.assert_array_equal(open_array(refs, lake=lake)[:], data)
    np.testing.assert_array_equal(open_array(refs, lake=str(lake.root))[:], data)
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots"):
        open_array(refs)  # the lake.json beside the set counts only when the caller names the lake


def test_cli_check_reports_untrusted_and_allows_with_flag(tmp_path: Path, geotiff) -> None:
    src, _ = _tiled(geotiff)
    sub = tmp_path / "r"
    sub.mkdir()
    write_refs(build_refs(str(src)), sub / "r.json")
    cmd = [sys.executable, "-m", "cubelake.cli", "refs", "check", str(sub / "r.json")]
    bad = subprocess.run(cmd, capture_output=True, text=True)
    assert bad.returncode == 1
    assert "outside the allowed roots" in bad.stderr
    assert str(src) in bad.stderr
    ok = subprocess.run([*cmd, "--allow-root", str(tmp_path)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "unchanged and allowed" in ok.stdout


def test_allowed_roots_match_whole_path_segments() -> None:
    roots = AllowedRoots(["/data/lake", "s3://bucket/prefix"])
    roots.check("/data/lake/x.tif")
    roots.check("s3://bucket/prefix/a/b.tif")
    for bad in ("/data/lake2/x.tif", "s3://bucket/prefix2/x.tif", "s3://bucket2/prefix/x.tif", "/data/lake/../x.tif"):
        with pytest.raises(UntrustedTargetError, match="outside the allowed roots"):
            roots.check(bad)
    with pytest.raises(UntrustedTargetError, match="relative path"):
        roots.check("lake/x.tif")


@pytest.mark.parametrize("key", ["other/../prefix/x.tif", "prefix/../secret.tif", "prefix/./x.tif", "./prefix/x.tif",
                                 "/prefix/x.tif", "prefix//x.tif", "prefix/a/..", "prefix/x.tif/"])
def test_object_keys_are_checked_as_written(key: str) -> None:
    """An object store reads ``other/../prefix/x.tif`` as that literal key, outside ``prefix/``: normalising
    it would let it through, so dot and empty segments are refused by their own check."""
    roots = AllowedRoots(["s3://bucket/prefix"])
    with pytest.raises(UntrustedTargetError, match=r"'\.', '\.\.' or empty segments") as info:
        roots.check(f"s3://bucket/{key}")
    assert f"s3://bucket/{key}" in str(info.value)
    roots.check("s3://bucket/prefix/a..b/x.tif")  # dots inside a segment are a plain name


def test_modified_target_raises_stale_instead_of_wrong_values(tmp_path: Path, geotiff) -> None:
    src, data = _tiled(geotiff)
    write_refs(build_refs(str(src)), tmp_path / "r.json")
    arr = open_array(tmp_path / "r.json")
    np.testing.assert_array_equal(arr[:], data)
    # rewrite the file with other values and the same size: only the mtime tells
    raw = bytearray(src.read_bytes())
    st = src.stat()
    raw[-100:] = bytes(100)
    src.write_bytes(bytes(raw))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(StaleReferenceError, match="changed since its references were made"):
        arr[:]  # an already-open array notices too
    with pytest.raises(StaleReferenceError, match=str(src)):
        open_dataset(tmp_path / "r.json")


def test_truncated_or_missing_target_is_stale(tmp_path: Path, geotiff) -> None:
    src, _ = _tiled(geotiff)
    write_refs(build_refs(str(src)), tmp_path / "r.json")
    with open(src, "r+b") as f:
        f.truncate(src.stat().st_size // 2)
    with pytest.raises(StaleReferenceError, match="size"):
        open_array(tmp_path / "r.json")
    src.unlink()
    with pytest.raises(StaleReferenceError, match="missing"):
        open_array(tmp_path / "r.json")


@pytest.mark.parametrize(("content", "match"), [
    ("not json", "not a kerchunk JSON"),
    ('{"version": 1, "refs": {"data/0.0.0": [1, 2]}}', "malformed reference"),
    ('{"version": 1, "refs": {"data/0.0.0": ["{{u}}", 0, 5]}}', "undefined template"),
])
def test_malformed_reference_files_get_clear_errors(tmp_path: Path, content: str, match: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(RefsError, match=match):
        open_array(p)


def _plant_lake(folder: Path) -> None:
    """A lake marker that arrives with the untrusted set and would allow everything, if trusted."""
    (folder / "lake.json").write_text(json.dumps({"format": "cubelake-lake", "version": 1, "allowed_roots": ["/"]}))


@pytest.mark.parametrize("where", ["beside", "parent"])
def test_a_lake_json_shipped_with_the_set_grants_nothing(tmp_path: Path, geotiff, where: str) -> None:
    src, _ = _tiled(geotiff)
    write_refs(build_refs(str(src)), tmp_path / "good.json")
    parcel = tmp_path / "download" / "parcel"
    parcel.mkdir(parents=True)
    _plant_lake(parcel if where == "beside" else parcel.parent)
    evil = _evil(tmp_path, "/etc/passwd")
    evil = evil.replace(parcel / "evil.json")
    for opener in (open_dataset, open_array):
        with pytest.raises(UntrustedTargetError, match="outside the allowed roots") as info:
            opener(evil)
        assert str(evil) in str(info.value)
        assert "/etc/passwd" in str(info.value)
    run = subprocess.run([sys.executable, "-m", "cubelake.cli", "refs", "check", str(evil)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "Traceback" not in run.stdout + run.stderr
    assert str(evil) in run.stderr
    assert "'/etc/passwd' is outside the allowed roots" in run.stderr
    assert "--allow-root /etc" in run.stderr  # the exact flag, should the user really trust it
    assert "root:x:0:0" not in run.stdout + run.stderr  # no byte of /etc/passwd was served


def test_cli_check_trusts_the_lake_it_is_given(tmp_path: Path, geotiff) -> None:
    lake = Lake(tmp_path / "lake")
    src, _ = _tiled(geotiff)
    refs = write_refs(build_refs(str(src)), lake.root / "r.json")
    lake.allow_root(str(src.parent))
    cmd = [sys.executable, "-m", "cubelake.cli", "refs", "check", str(refs)]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert "outside the allowed roots" in bad.stderr
    ok = subprocess.run([*cmd, "--lake", str(lake.root)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "unchanged and allowed" in ok.stdout
    not_a_lake = subprocess.run([*cmd, "--lake", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert not_a_lake.returncode == 2
    assert "no cubelake lake here" in not_a_lake.stderr
    assert "Traceback" not in not_a_lake.stderr


def test_a_root_is_resolved_like_the_targets_it_allows(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    roots = AllowedRoots([str(tmp_path / "link"), "s3://bucket/prefix", "az://box/p"])
    assert roots.roots == [str(real), "s3://bucket/prefix", "az://box/p"]  # the real path; object roots keep their scheme
    roots.check(str(real / "x.tif"))  # the real path of a target under the linked root
    roots.check(str(tmp_path / "link" / "x.tif"))


@pytest.mark.parametrize(("target", "hint"), [("s3://bucket/other/x.tif", "--allow-root s3://bucket/other"),
                                              ("/data/elsewhere/x.tif", "--allow-root /data/elsewhere"),
                                              ("az://box/a/b/x.tif", "--allow-root az://box/a/b")])
def test_a_refused_target_names_the_root_that_would_allow_it(target: str, hint: str) -> None:
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots") as info:
        AllowedRoots(["s3://bucket/prefix"]).check(target)
    assert f"{hint} (cubelake refs check)" in str(info.value)
    assert "outside the allowed roots (s3://bucket/prefix);" in str(info.value)
    with pytest.raises(UntrustedTargetError, match=r"outside the allowed roots \(\(none\)\)"):
        AllowedRoots([]).check(target)


@pytest.mark.parametrize("scheme", ["az", "gs", "file", "http"])
def test_the_same_bucket_and_key_on_another_store_is_refused(scheme: str) -> None:
    roots = AllowedRoots(["s3://bucket/prefix"])
    roots.check("s3://bucket/prefix/x.tif")
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots"):
        roots.check(f"{scheme}://bucket/prefix/x.tif")


def test_relative_targets_resolve_beside_their_reference_file() -> None:
    from cubelake.refs.security import resolve_url

    assert resolve_url("tiles/x.tif", "/lake/refs") == "/lake/refs/tiles/x.tif"
    assert resolve_url("../x.tif", "s3://bucket/refs") == "s3://bucket/x.tif"
    for unchanged in ("/abs/x.tif", "s3://bucket/x.tif", "file:///abs/x.tif", "az://box/x.tif"):
        assert resolve_url(unchanged, "/lake/refs") == unchanged
