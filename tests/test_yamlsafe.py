"""Untrusted YAML (profiles, later manifests) is bounded before it is built: alias bombs, deep nesting, size."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cubelake.errors import ConfigError, ProfileError
from cubelake.ingest import load_profile
from cubelake.yamlsafe import YamlLimits, load_yaml
from tests.conftest import no_traceback, run_cli


def _bomb(levels: int = 9, key: str = "stac:\n  properties:\n    x: ") -> str:
    """A billion-laughs document nested below the top level: 10 x 10 x ... aliases."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "name: bomb\nanchors:\n" + "\n".join("  " + ln for ln in lines) + f"\n{key}*a{levels - 1}\n"


@pytest.mark.serial  # a time bound: run alone
def test_alias_bomb_below_the_top_level_is_refused_quickly(tmp_path: Path) -> None:
    p = tmp_path / "bomb.yaml"
    p.write_text(_bomb())
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb.yaml: YAML expands to more than 20000 values"):
        load_yaml(p)
    assert time.perf_counter() - t0 < 2.0  # measured from parser events: nothing was expanded


def test_long_string_repeated_by_aliases_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("s: &s " + "x" * 100_000 + "\nl: [" + ", ".join(["*s"] * 100) + "]\n")
    with pytest.raises(ConfigError, match="characters"):
        load_yaml(p)


def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    p = tmp_path / "deep.yaml"
    p.write_text("a: " + "[" * 10_000 + "]" * 10_000 + "\n")
    with pytest.raises(ConfigError, match="nested more than 24 levels deep"):
        load_yaml(p)


def test_size_limit_and_malformed_yaml(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "b" * 2_000_000 + "\n")
    with pytest.raises(ConfigError, match="over the 1048576-byte limit"):
        load_yaml(big)
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_yaml(bad)


def test_ordinary_documents_with_aliases_load_unchanged() -> None:
    doc = load_yaml("t.yaml", text="base: &b {x: 1, y: [1, 2]}\nother: *b\nn: 3\n")
    assert doc == {"base": {"x": 1, "y": [1, 2]}, "other": {"x": 1, "y": [1, 2]}, "n": 3}
    with pytest.raises(ConfigError):
        load_yaml("t.yaml", text="[" * 5 + "]" * 5, limits=YamlLimits(max_depth=4))


def test_profiles_go_through_the_bounded_loader(tmp_path: Path) -> None:
    p = tmp_path / "bomb.yaml"
    p.write_text(_bomb())
    with pytest.raises(ProfileError, match="alias bomb"):
        load_profile(p)
    res = run_cli("ingest", "--lake", str(tmp_path / "lake"), "--profile", str(p), str(tmp_path), timeout=60)
    assert res.returncode == 2
    no_traceback(res)
    assert "alias bomb" in res.stderr
    assert not (tmp_path / "lake" / "scenes").exists() or not any((tmp_path / "lake" / "scenes").iterdir())


@pytest.mark.parametrize("side", ["../../etc/passwd", "/etc/passwd", "sub/../../x.csv"])
def test_profile_sidecar_stays_in_the_profile_folder(tmp_path: Path, side: str) -> None:
    p = tmp_path / "prof" / "p.yaml"
    p.parent.mkdir()
    p.write_text(f"name: p\nspectral: {{sidecar: '{side}'}}\n")
    with pytest.raises(ProfileError, match="is not a path inside the profile's folder"):
        load_profile(p)


def test_profile_sidecar_next_to_the_profile_is_read(tmp_path: Path) -> None:
    (tmp_path / "wl.csv").write_text("wavelength_nm,fwhm_nm\n500,10\n510,10\n")
    (tmp_path / "p.yaml").write_text("name: p\nspectral: {sidecar: wl.csv}\n")
    prof = load_profile(tmp_path / "p.yaml")
    assert prof.spectral.wavelengths_nm == [500.0, 510.0]
    (tmp_path / "bad.csv").write_text("wavelength_nm\n500\nfive\n")
    (tmp_path / "q.yaml").write_text("name: q\nspectral: {sidecar: bad.csv}\n")
    with pytest.raises(ProfileError, match=r"bad\.csv: non-numeric"):
        load_profile(tmp_path / "q.yaml")
