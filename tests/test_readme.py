"""Every example in README.md runs as written.

The blocks are taken from README.md when the tests run, in document order, and run from a folder
laid out like the repository after ``make demo``: ``repo/`` holding ``./lake`` (made by the
README's own ``make demo``, pointed at it with ``LAKE=``) next to ``shared/`` (the real scenes).
Shell blocks run line by line with bash, Python blocks with the interpreter, the transcript's
command in a fresh folder with its output compared line by line, the profile YAML through
``load_profile``. Only the lake's folder tree is not code.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pystac
import pytest

from cubelake.ingest import load_profile
from tests import s3auth, zygote
from tests.conftest import REAL, ROOT

README = ROOT / "README.md"
ENMAP = ("enmap_potsdam_tile_128_0", "enmap_potsdam_tile_128_32", "enmap_potsdam_tile_96_0", "enmap_potsdam_tile_96_32")


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # of the opening fence
    section: str

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.lang or 'text'}-{re.sub(r'[^a-z0-9]+', '-', self.section.lower()).strip('-')}"


def readme_blocks() -> list[Block]:
    out: list[Block] = []
    section, lang, start, body = "", None, 0, []
    for n, line in enumerate(README.read_text().splitlines(), start=1):
        if lang is None and line.startswith("#"):
            section = line.lstrip("#").strip()
        elif line.startswith("```") and lang is None:
            lang, start, body = line[3:].strip(), n, []
        elif line.startswith("```"):
            out.append(Block(lang, "\n".join(body) + "\n", start, section))
            lang = None
        elif lang is not None:
            body.append(line)
    return out


BLOCKS = readme_blocks()


#: blocks of these sections run against an S3-protocol server, with the variables their comment names set
S3_SECTIONS = ("Lakes on object storage (S3)", "Emulating a link")
EXTRA_ENV: dict[str, str] = {}


def env() -> dict[str, str]:
    """The environment a README line runs in: the venv's commands first; ``cubelake`` is ``tests/bin/cubelake``,
    which runs the same command forked from a warm process (a second or two saved on each of ~60 lines;
    ``CUBELAKE_TEST_COLD_CLI=1`` runs the installed ``cubelake`` instead)."""
    path = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    e = {**os.environ, **EXTRA_ENV}
    if not zygote.cold():
        path.insert(0, str(ROOT / "tests" / "bin"))
        e["CUBELAKE_TEST_ZYGOTE"] = zygote.socket_path()
    e["PATH"] = os.pathsep.join(path)
    e.pop("CUBELAKE_LAKE", None)
    return e


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -c code`` (forked from the warm process unless ``CUBELAKE_TEST_COLD_CLI=1``)."""
    argv = [sys.executable, "-c", code]
    if zygote.cold():
        return subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True, timeout=600)
    rc, out, err = zygote.run([], env(), str(cwd), 600, code=code)
    return subprocess.CompletedProcess(argv, rc, out.decode(errors="backslashreplace"),
                                       err.decode(errors="backslashreplace"))


def sh(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env(), capture_output=True, text=True, timeout=600)


@pytest.fixture
def s3_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """``AWS_ENDPOINT_URL`` and keys of the test server, holding the bucket ``my-bucket`` the section uses."""
    server = request.getfixturevalue("s3_server")
    client = server.client()
    if "my-bucket" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket="my-bucket")
    EXTRA_ENV.update(AWS_ENDPOINT_URL=server.endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                     AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true",
                     CUBELAKE_CACHE=str(tmp_path_factory.mktemp("readme-cache")))
    try:
        yield
    finally:
        EXTRA_ENV.clear()


def clean(res: subprocess.CompletedProcess[str], what: str) -> str:
    out = res.stdout + res.stderr
    assert "Traceback" not in out, (what, out)
    return out


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``repo/lake`` made by ``make demo`` (the README's first command), ``shared/`` beside ``repo``."""
    work = tmp_path_factory.mktemp("readme")
    (work / "shared").symlink_to(REAL.parents[1], target_is_directory=True)
    root = work / "repo"
    root.mkdir()
    warm = [] if zygote.cold() else [f"CUBELAKE={ROOT / 'tests' / 'bin' / 'cubelake'}"]
    res = subprocess.run(["make", "-C", str(ROOT), "demo", f"LAKE={root / 'lake'}", *warm], env=env(),
                         capture_output=True, text=True, timeout=1200)
    out = clean(res, "make demo")
    assert res.returncode == 0, out
    assert "ERROR" not in out  # no third-party log line leaks into the demo
    assert "== exit code 1 (1 = some inputs were rejected, as the bad inputs must be)" in out
    assert re.search(r"^4 item\(s\)$", res.stdout, re.M), res.stdout  # the Potsdam summer search
    assert re.search(r"^ok: .*\.refs\.json", res.stdout, re.M), res.stdout  # the refs check
    res = subprocess.run(["make", "-C", str(ROOT), "samples", f"SAMPLES={root / 'samples'}"], env=env(),
                         capture_output=True, text=True, timeout=600)  # the README's `make samples`
    assert res.returncode == 0, clean(res, "make samples")
    return root


# -- what each shell line must do beyond exiting 0 (keyed by a unique part of the line) ---------------

def _enmap_table(out: str) -> None:
    assert {row.split()[0] for row in out.splitlines() if row.startswith("enmap_")} == set(ENMAP)


def _item_collection(out: str) -> None:
    items = list(pystac.ItemCollection.from_dict(json.loads(out)))
    assert items
    assert all(it.id.startswith("enmap_") for it in items)  # the Potsdam scenes: EnMAP tiles and land cover
    assert all(Path(a.href).is_file() or Path(a.href).is_dir() for it in items for a in it.assets.values()
               if a.href.startswith("/"))  # absolute hrefs that resolve from anywhere


CHECKS: dict[str, Callable[[str], None]] = {
    "--bbox 12.9,52.3,13.2,52.5 --datetime 2022-06/2022-08": _enmap_table,
    "--geohash u336": _item_collection,
    "covers_wavelength(450, 1300) AND S_INTERSECTS": _enmap_table,  # CQL2 text on the command line
    "--intersects field.geojson": lambda out: _check("enmap_potsdam_tile_96_0" in out, out),
    "catalog validate": lambda out: _check(", 0 invalid" in out, out),
    "loader plan lake/scenes/enmap_potsdam_tile_96_0": lambda out: _check(
        "link (given): 200 Mbit/s, 40.0 ms to first byte" in out and "binding: " in out
        and "recommended: ReaderConfig(threads=" in out, out),
    "refs check lake/scenes/scene_band1": lambda out: _check(out.startswith("ok: "), out),
    "refs check pair.json": lambda out: _check(out.startswith("ok: "), out),
    "refs build": lambda out: _check("--allow-root /" in out, out),  # says what check will need
    "cubelake validate ../shared/data/real/bad_inputs": lambda out: _check("rejected" in out, out),
    "lake --lake s3://my-bucket/lake": lambda out: _check(out.startswith("lake s3://my-bucket/lake: 5 scene(s)"), out),
    "catalog export --lake s3://my-bucket/lake": lambda out: _check(out.startswith("5 item(s) -> s3://my-bucket/"), out),
    "offline --bbox": lambda out: _check("copied enmap_potsdam_tile_96_0" in out, out),
    "jobs status manifests/nightly.yaml": lambda out: _check("succeeded" in out and "skipped   enmap_potsdam_tile_96_0"
                                                             in out, out),
    "jobs list --lake lake --format json": lambda out: _check(
        {j["job"] for j in json.loads(out)["jobs"]} == {"demo", "nightly-potsdam"}, out),
    "jobs run --due manifests/": lambda out: _check("not due manifests/nightly.yaml" in out, out),
    "predict --lake lake --model hsi3d.pt": lambda out: _check(
        out.count("predicted 1024 pixels") == 4 and "chunks decoded" in out, out),
    "--collection cubelake-predictions": lambda out: _check("4 item(s)" in out and "__hsi3d" in out, out),
    "ingest samples/EMIT_L2A_RFL": lambda out: _check("ingested: cog + zarr (46 of 48 bands, 55x51, float32)" in out,
                                                      out),
    "ingest samples/PRS_L2D": lambda out: _check("ingested: cog + zarr (18 of 23 bands, 20x24, float32)" in out, out),
    "ingest samples/ENMAP01": lambda out: _check("ingested: cog + zarr (10 of 12 bands, 20x24, int16)" in out, out),
    "ingest samples/DESIS": lambda out: _check("ingested: cog + zarr (12 of 12 bands, 20x24, float32)" in out, out),
    "ingest samples/research_cube.nc": lambda out: _check("ingested: cog + zarr (10 of 10 bands, 12x15, float32)" in out,
                                                          out),
    "cubelake lake --lake products": lambda out: _check(out.startswith("lake products: 5 scene(s)") and all(
        f"[{p}]" in out for p in ("emit-l2a", "prisma-l2d", "enmap-l2a", "desis-l2a", "generic")), out),
    "sweep --model hsi3d.pt": lambda out: _check("OOM search (x1.5 then bisection): largest batch that fits" in out
                                                 and "memory model: M = " in out, out),
}
#: what a Python block must print, keyed by a unique part of its code
PY_OUTPUT: dict[str, list[str]] = {
    "refs.combine_refs(": ["EPSG:32633", "{'scene': 2, 'band': 1, 'y': 549, 'x': 549}"],
    'lake="s3://my-bucket/lake"': ["4 True"],
    "odc.stac.load(items": [str(sorted(ENMAP)), "{'y': 64, 'x': 64, 'time': 1} int16 -32768.0"],
    "LinkEmulator(os.environ": ["True 2 {'503': 0, '500': 1, 'reset': 0, 'truncate': 0, 'stall': 0}"],
}
EXIT_CODES = {"cubelake validate ../shared/data/real/bad_inputs": 1}  # its inputs are bad: exit 1 says so


def _check(ok: bool, out: str) -> None:
    assert ok, out


#: servers a README line starts in the background (``... &``): stopped with SIGINT when the module ends
BACKGROUND: list[subprocess.Popen[str]] = []


@pytest.fixture(scope="module", autouse=True)
def _stop_background() -> Iterator[None]:
    yield
    for proc in BACKGROUND:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"{proc.args!r} did not stop on SIGINT") from None
        assert "Traceback" not in (err or ""), err
    BACKGROUND.clear()


def start_background(line: str, cwd: Path) -> None:
    """``command ... &``: started, and waited for until the URL it prints answers (a server)."""
    import httpx

    proc = subprocess.Popen(["bash", "-c", f"exec {line.split('#')[0].strip().removesuffix('&')}"], cwd=cwd,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    BACKGROUND.append(proc)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    m = re.search(r"(http://127\.0\.0\.1:\d+/)", first)
    assert m, (line, first, proc.poll())
    for _ in range(300):
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(m.group(1) + "conformance", timeout=5).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"{line}: {m.group(1)} never answered")


def run_shell_block(block: Block, cwd: Path) -> None:
    for line in (ln for ln in block.text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")):
        if line.split("#")[0].rstrip().endswith("&"):
            start_background(line, cwd)
            continue
        res = sh(line, cwd)
        out = clean(res, line)
        want = next((rc for key, rc in EXIT_CODES.items() if key in line), 0)
        assert res.returncode == want, (line, out)
        for key, check in CHECKS.items():
            if key in line:
                check(res.stdout)


def run_transcript(block: Block, fresh: Path) -> None:
    """``$ command`` and its output: the command runs in a fresh folder; each shown line must appear, in
    order (``...`` inside a line stands for any text, a line of ``...`` for any lines; times may differ)."""
    first, *shown = block.text.splitlines()
    assert first.startswith("$ ")
    res = sh(first[2:], fresh)
    clean(res, first)
    actual = res.stdout.splitlines()
    i = 0
    for want in shown:
        if want.strip() == "...":
            continue
        rx = re.escape(want).replace(r"\.\.\.", ".*")
        rx = re.sub(r"\\\(\d+\\\.\d\\ s\\\)", r"\\(\\d+\\.\\d s\\)", rx)
        while i < len(actual) and not re.fullmatch(rx, actual[i]):
            i += 1
        assert i < len(actual), (f"README shows {want!r}; not in the output (in order)", res.stdout)
        i += 1


def load_profile_block(block: Block, where: Path) -> None:
    folder = where / "profile"
    folder.mkdir(exist_ok=True)
    (folder / "my-sensor.yaml").write_text(block.text)
    # the sidecar the example names: one wavelength per band of the 200 its match rule expects
    (folder / "wavelengths.csv").write_text("wavelength_nm,fwhm_nm\n" + "".join(
        f"{400 + 10.5 * i:.1f},10.0\n" for i in range(200)))
    prof = load_profile(folder / "my-sensor.yaml")
    assert prof.name == "my-sensor"
    assert prof.spectral.wavelengths_nm is not None
    assert len(prof.spectral.wavelengths_nm) == 200
    assert prof.encoding.dtype == "int16"


def manifest_block(block: Block, repo: Path) -> None:
    """The manifest example, saved where the README says; the shell block after it runs it."""
    from cubelake.jobs import load_manifest

    path = repo / "manifests" / "nightly.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(block.text)
    m = load_manifest(path)
    assert m.name == "nightly-potsdam"
    assert m.lake == str(repo / "lake")
    assert m.settings_for(m.inputs[0]).products == ("cog",)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=[pytest.mark.s3] if b.section in S3_SECTIONS else [])
                                   for b in BLOCKS])
def test_readme_block_runs_as_written(block: Block, repo: Path, request: pytest.FixtureRequest) -> None:
    if block.section in S3_SECTIONS:
        request.getfixturevalue("s3_env")
    if block.lang == "" and not block.text.startswith("$ "):
        assert block.text.lstrip().startswith("lake/"), "only the lake's folder tree is not code"
        return
    if block.lang == "" :
        fresh = repo.parent / "fresh"
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir()
        run_transcript(block, fresh)
    elif block.lang == "sh" and block.text.startswith("make demo"):
        assert [ln.split("#")[0].strip() for ln in block.text.splitlines()] == ["make demo", "make test"]
        # make demo made the fixture's lake; make test is what runs this test
    elif block.lang == "sh" and block.text.startswith("source .venv/bin/activate"):
        res = sh(block.text.strip() + " && command -v cubelake", ROOT)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == str(ROOT / ".venv" / "bin" / "cubelake")
    elif block.lang == "sh":
        run_shell_block(block, repo)
    elif block.lang == "python":
        res = run_python(block.text, repo)
        assert res.returncode == 0, res.stderr
        clean(res, block.id)
        for key, lines in PY_OUTPUT.items():
            if key in block.text:
                assert res.stdout.splitlines() == lines
    elif block.lang == "yaml" and block.section.startswith("Scheduled jobs"):
        manifest_block(block, repo)
    elif block.lang == "yaml":
        load_profile_block(block, repo.parent)
    elif block.lang == "json" and block.section == "Lakes on object storage (S3)":
        # the writer's policy: the actions the permission tests grant, each on its level of resource
        assert json.loads(block.text) == s3auth.lake_policy("my-bucket", "lake", s3auth.WRITER_ACTIONS)
    else:
        pytest.fail(f"README block at line {block.line} has a language ({block.lang!r}) this test cannot run")


def test_every_kind_of_block_is_covered() -> None:
    langs = {b.lang for b in BLOCKS}
    assert langs <= {"", "sh", "python", "yaml", "json"}
    assert sum(b.lang == "python" for b in BLOCKS) >= 6
    assert any(b.text.startswith("$ ") for b in BLOCKS)


def test_what_the_readme_says_outside_its_blocks(repo: Path) -> None:
    """Commands the prose quotes: combining the demo lake's scenes is refused, and the checks the command
    block runs with --lake / --allow-root fail without them, naming the flag to pass."""
    text = README.read_text()
    combine = "cubelake refs combine lake/scenes/*/*.refs.json -o cube.json"
    assert combine in text
    res = sh(combine, repo)
    assert res.returncode == 1
    assert "cannot be stacked" in clean(res, combine)
    assert not (repo / "cube.json").exists()
    res = sh("cubelake refs check lake/scenes/scene_band1/scene_band1.refs.json", repo)
    assert res.returncode == 1
    assert "--lake LAKE" in res.stderr
    res = sh("cubelake refs check pair.json", repo)
    assert res.returncode == 1
    assert f"--allow-root {REAL.resolve() / 'cog_rio_tiler'}" in res.stderr
    assert "s3://bucket/archive" in (repo / "lake" / "lake.json").read_text()
