"""The batch sweep: elasticity, plateau and OOM search against known answers; real CPU sweeps of a small
3-D CNN (timing curve, JSON + PNG report, a memory cap enforced in fresh processes); the CLI; CUDA checks."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from cubelake.infer import (
    ModelSpec,
    SweepSettings,
    SweepSettingsError,
    elasticities,
    find_plateau,
    fit_memory,
    oom_search,
    parse_batches,
    run_sweep,
    run_trial,
    save_model,
    write_report,
)
from cubelake.infer.model import load_model
from tests.conftest import no_traceback, run_cli

PNG = b"\x89PNG\r\n\x1a\n"


# -- pure: elasticity, plateau, OOM search, memory model ----------------------------------------------

@pytest.mark.parametrize("a", [0.0, 0.3, 1.0])
def test_elasticity_of_a_power_law_is_its_exponent(a: float) -> None:
    batches = [64, 96, 128, 256, 1024]
    es = elasticities(batches, [5.0 * b ** -a for b in batches])
    assert es == pytest.approx([-a] * 4, abs=1e-12)


@pytest.mark.parametrize(("c", "k"), [(0.01, 1.0), (0.5, 20.0), (2.0, 7.0)])
def test_plateau_starts_at_the_analytic_knee(c: float, k: float) -> None:
    """ms/sample = c + k/B has point elasticity -k/(cB + k): |e| < 0.05 exactly when B > 19k/c. An arc
    step (B, B+1) averages the point elasticity over it, so the first step under 0.05 starts within one
    batch of the knee."""
    knee = 19 * k / c
    batches = list(range(1, int(3 * knee) + 2))
    p = find_plateau(batches, [c + k / b for b in batches], 0.05)
    assert p is not None
    assert knee - 1 < p.start < knee + 1
    assert p.end == batches[-1]
    assert p.best == batches[-1]  # still decreasing, however slowly


def test_plateau_on_the_seed_grid() -> None:
    """On 64..1024 a knee placed at 256 (k/c = 256/19): the step 128 -> 256 lies wholly before it (|e| > 0.05),
    every later step wholly after (|e| < 0.05); so the plateau is exactly 256..1024."""
    c, k = 1.0, 256 / 19
    grid = list(parse_batches("64,128,...,1024"))
    assert grid == [64, 128, 256, 512, 1024]
    es = elasticities(grid, [c + k / b for b in grid])
    assert abs(es[1]) > 0.05
    assert all(abs(e) < 0.05 for e in es[2:])
    p = find_plateau(grid, [c + k / b for b in grid])
    assert p is not None
    assert (p.start, p.end) == (256, 1024)


def test_no_plateau_when_the_last_step_is_steep_and_a_late_rise_still_counts() -> None:
    grid = [64, 128, 256, 512]
    assert find_plateau(grid, [1.0 / math.sqrt(b) for b in grid]) is None  # e = -0.5 throughout
    flat_then_up = [2.0, 1.0, 1.01, 1.02]  # slight rise on the plateau (cache effects in the seed)
    p = find_plateau(grid, flat_then_up)
    assert p is not None
    assert (p.start, p.best) == (128, 128)
    assert find_plateau([64], [1.0]) is None


@pytest.mark.parametrize("cap", [300, 1500, 5000, 20000, 40000])
def test_oom_search_finds_an_injected_cap_within_5_percent_in_15_trials(cap: int) -> None:
    s = oom_search(lambda b: b <= cap, start=1024)
    assert s.converged
    assert len(s.trials) <= 15
    assert s.max_fit is not None
    assert s.first_oom is not None
    assert s.max_fit <= cap < s.first_oom
    assert s.first_oom - s.max_fit <= 0.05 * s.max_fit
    assert s.trials[0][0] == 1024
    fits = [b for b, ok in s.trials if ok]
    assert max(fits) == s.max_fit
    assert min(b for b, ok in s.trials if not ok) == s.first_oom


@pytest.mark.parametrize(("limit_mib", "m0_mib", "per_sample_kib"), [(24 * 1024, 1500, 2560), (8 * 1024, 300, 700)])
def test_oom_search_against_an_allocator_limit(limit_mib: int, m0_mib: int, per_sample_kib: int) -> None:
    """An allocator that refuses once M_param + M_ctx + B * A_per_sample passes its limit (the seed's model)."""
    def fits(b: int) -> bool:
        return m0_mib * 2**20 + b * per_sample_kib * 1024 <= limit_mib * 2**20

    wall = (limit_mib * 1024 - m0_mib * 1024) // per_sample_kib
    s = oom_search(fits, start=1024)
    assert s.converged
    assert len(s.trials) <= 15
    assert s.max_fit is not None
    assert 0.95 * wall <= s.max_fit <= wall < (s.first_oom or 0)


def test_oom_search_shrinks_from_a_start_that_fails_and_reports_an_exhausted_budget() -> None:
    s = oom_search(lambda b: b <= 100, start=1024)
    assert s.trials[:3] == ((1024, False), (682, False), (454, False))
    assert s.converged
    assert s.max_fit is not None
    assert s.max_fit <= 100 < (s.first_oom or 0) <= 105
    short = oom_search(lambda b: b <= 40000, start=1024, max_trials=5)
    assert not short.converged
    assert len(short.trials) == 5
    assert short.first_oom is None
    nothing = oom_search(lambda b: False, start=8)
    assert nothing.max_fit is None
    assert nothing.first_oom == 1
    assert nothing.converged


def test_memory_fit_recovers_a_linear_model() -> None:
    m0, a = 1.5 * 2**30, 2.5 * 2**20  # the seed's example: 1.5 GB context, 2.5 MB per sample
    batches = [64, 128, 256, 384, 512, 768, 1024]
    m = fit_memory(batches, [m0 + a * b for b in batches])
    assert m is not None
    assert m.m0_bytes == pytest.approx(m0, rel=1e-9)
    assert m.per_sample_bytes == pytest.approx(a, rel=1e-9)
    assert m.r2 == pytest.approx(1.0)
    cap = 24 * 2**30
    assert m.max_batch(cap) == math.floor((cap - m0) / a)
    noisy = fit_memory(batches, [m0 + a * b + (-1) ** i * 4 * 2**20 for i, b in enumerate(batches)])
    assert noisy is not None
    assert noisy.per_sample_bytes == pytest.approx(a, rel=0.01)
    assert 0.99 < noisy.r2 < 1.0
    assert fit_memory([64, 64], [1.0, 2.0]) is None


def test_batch_lists() -> None:
    assert parse_batches("256, 64,128") == (64, 128, 256)
    assert parse_batches("64,96,...,1024") == (64, 96, 144, 216, 324, 486, 729, 1024)
    for bad, words in [("64,x", "'x' is not a whole number"), ("0,64", "0 is out of range"), ("", "give batch sizes"),
                       ("64,...,1024", "FIRST,SECOND,...,LAST"), ("128,64,...,1024", "FIRST < SECOND < LAST")]:
        with pytest.raises(SweepSettingsError, match="--batches") as exc:
            parse_batches(bad)
        assert words in str(exc.value)


# -- real sweeps on the CPU ------------------------------------------------------------------------------

class Wide3D(torch.nn.Module):
    """A small 3-D CNN over (1, bands, p, p) patches whose activations (8 x bands x p x p per sample) dominate
    its memory, so that a memory cap bites at a few hundred samples."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv3d(1, 8, 3, padding=1)
        self.c2 = torch.nn.Conv3d(8, 8, 1)
        self.fc = torch.nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(x.mean(dim=(2, 3, 4)))


class Flat(torch.nn.Module):
    """Takes exactly 1 x 16 x 5 x 5 per sample (a flattening classifier): other patch sizes fail."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = ModelSpec(name="wide3d", kind="pixel", layout="B1CHW", bands=32, classes=5, patch=7)
    return save_model(Wide3D(), tmp_path_factory.mktemp("sweep") / "wide3d.pt", spec)


@pytest.fixture(scope="module")
def flat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = ModelSpec(name="flat", kind="pixel", layout="B1CHW", bands=16, classes=3, patch=5)
    return save_model(Flat(), tmp_path_factory.mktemp("sweep") / "flat.pt", spec)


@pytest.mark.integration
def test_cpu_sweep_writes_a_consistent_json_and_a_png(cnn: Path, tmp_path: Path) -> None:
    settings = SweepSettings(batches=(8, 16, 32, 64), warmup=1, iters=3)
    report = run_sweep(cnn, settings)
    json_path, png_path = write_report(report, tmp_path / "out")
    assert png_path is not None
    png = png_path.read_bytes()
    assert png.startswith(PNG)
    assert len(png) > 10_000
    d = json.loads(json_path.read_text())
    assert d["format"] == "cubelake.sweep/1"
    assert d["settings"]["batches"] == [8, 16, 32, 64]
    assert d["environment"]["torch"] == torch.__version__
    assert d["environment"]["device"] == "cpu"
    assert d["environment"]["device_name"]
    assert d["model"]["sha256"] == load_model(cnn).sha256
    assert d["model"]["input_shape"] == [1, 32, 7, 7]
    assert [t["batch"] for t in d["trials"]] == [8, 16, 32, 64]
    for t in d["trials"]:
        assert t["ok"]
        assert t["phase"] == "sweep"
        assert len(t["times_ms"]) == 3
        assert t["ms_per_batch"] == pytest.approx(sorted(t["times_ms"])[1])  # the median
        assert t["ms_per_sample"] == pytest.approx(t["ms_per_batch"] / t["batch"])
        assert t["samples_per_s"] == pytest.approx(1000 * t["batch"] / t["ms_per_batch"])
        assert t["peak_bytes"] > 0
    mps = [t["ms_per_sample"] for t in d["trials"]]
    assert [e["elasticity"] for e in d["elasticities"]] == pytest.approx(list(elasticities([8, 16, 32, 64], mps)))
    assert [(e["from"], e["to"]) for e in d["elasticities"]] == [(8, 16), (16, 32), (32, 64)]
    plateau = find_plateau([8, 16, 32, 64], mps)
    assert d["plateau"] == (plateau.to_dict() if plateau else None)
    assert d["oom_search"] is None
    mm = d["memory_model"]
    assert mm["fitted"]
    assert mm["per_sample_bytes"] > 8 * 32 * 7 * 7 * 4  # at least one activation of 8 channels per sample
    assert mm["predicted_max_batch"] is None  # no cap on the CPU without --memory-cap


@pytest.mark.integration
def test_cpu_memory_cap_oom_search_in_fresh_processes(cnn: Path, tmp_path: Path) -> None:
    """A real cap (RLIMIT_DATA in each trial's fresh process): the search brackets the wall to 5 %; run again,
    the largest batch that fitted fits and 1.05 x it fails; the memory model predicts the wall roughly."""
    cap = 32 * 2**20
    settings = SweepSettings(batches=(32, 64), warmup=0, iters=1, memory_cap=cap, find_oom=True)
    report = run_sweep(cnn, settings)
    o = report.oom
    assert o is not None
    assert o.converged
    assert len(o.trials) <= 15
    assert o.max_fit is not None
    assert o.first_oom is not None
    assert o.first_oom - o.max_fit <= 0.05 * o.max_fit
    assert all(t.fresh_process for t in report.trials)
    assert all(t.extra["rlimit_data_bytes"] > cap for t in report.trials if "rlimit_data_bytes" in t.extra)
    failed = [t for t in report.trials if not t.ok]
    assert failed
    assert all(t.oom for t in failed)
    assert all("can't allocate memory" in (t.error or "") for t in failed)
    model = load_model(cnn)
    again = SweepSettings(batches=(1,), warmup=0, iters=1, memory_cap=cap)
    assert run_trial(model, o.max_fit, again, phase="oom").ok
    over = run_trial(model, math.ceil(1.05 * o.max_fit), again, phase="oom")
    assert over.oom
    assert report.memory is not None
    assert report.memory.r2 > 0.95
    assert report.predicted_max_batch is not None
    assert abs(report.prediction_error or 1.0) < 0.25
    json_path, png_path = write_report(report, tmp_path)
    d = json.loads(json_path.read_text())
    assert [(t["batch"], t["fits"]) for t in d["oom_search"]["trials"]] == list(o.trials)
    assert d["memory_model"]["measured_max_batch"] == o.max_fit
    assert d["memory_model"]["cap_bytes"] == cap
    assert png_path is not None
    assert png_path.read_bytes().startswith(PNG)


def test_a_find_oom_on_cpu_needs_a_cap_and_a_failing_model_is_an_error(cnn: Path, flat: Path) -> None:
    with pytest.raises(SweepSettingsError, match="--memory-cap"):
        run_sweep(cnn, SweepSettings(batches=(8,), find_oom=True))
    from cubelake.infer import ModelError

    with pytest.raises(ModelError, match=r"flat\.pt: the model fails on one sample \(1, 1, 16, 7, 7\)"):
        run_sweep(flat, SweepSettings(batches=(8,), patch=7, warmup=0, iters=1))
    with pytest.raises(SweepSettingsError, match="dtype 'fp8'"):
        SweepSettings(dtype="fp8")  # type: ignore[arg-type]


@pytest.mark.integration
def test_a_fresh_trial_past_its_timeout_is_killed_with_its_server(cnn: Path) -> None:
    from cubelake.infer import InferError
    from cubelake.infer._fresh import _SERVERS

    model = load_model(cnn)
    quick = SweepSettings(batches=(1,), warmup=0, iters=1, fresh_process=True)
    assert run_trial(model, 8, quick).ok
    server = _SERVERS["plain"].proc
    assert server is not None
    slow = SweepSettings(batches=(1,), warmup=0, iters=100_000, fresh_process=True, timeout_s=1.0)
    with pytest.raises(InferError, match=r"the trial at batch 64 did not finish within 1 s \(killed\)"):
        run_trial(model, 64, slow)
    assert _SERVERS["plain"].proc is None
    assert server.returncode == -9
    deadline = time.monotonic() + 10
    while _running_in_group(server.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL was sent to the whole group; the kernel tears the trial down
    assert _running_in_group(server.pid) == []  # the trial it was running went with it
    again = run_trial(model, 8, quick)  # a new server answers the next trial
    assert again.ok
    assert again.fresh_process


def _running_in_group(pgid: int) -> list[int]:
    """Processes of process group ``pgid`` that still run (zombies waiting for init do not count)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, ...
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(d.name))
    return found


# -- the CLI -------------------------------------------------------------------------------------------

def test_cli_sweep_end_to_end(cnn: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    res = run_cli("sweep", "--model", str(cnn), "--batches", "8,16,...,64", "--warmup", "2", "--iters", "3",
                  "--out", str(out))
    text = no_traceback(res)
    assert res.returncode == 0, text
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"wide3d ({cnn}): input [1, 32, 7, 7] per sample, fp32 on ")
    header = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["batch", "ms/batch"])
    assert lines[header].split() == ["batch", "ms/batch", "ms/sample", "samples/s", "elasticity", "peak", "memory"]
    rows = [ln.split() for ln in lines[header + 2:header + 6]]
    d = json.loads((out / "sweep.json").read_text())
    assert [r[0] for r in rows] == ["8", "16", "32", "64"]
    assert rows[0][4] == "-"  # no step into the first batch size
    for r, t in zip(rows, d["trials"], strict=True):
        assert float(r[1]) == pytest.approx(t["ms_per_batch"], abs=5e-4)
        assert float(r[2]) == pytest.approx(t["ms_per_sample"], abs=5e-6)
    assert [float(r[4]) for r in rows[1:]] == pytest.approx([e["elasticity"] for e in d["elasticities"]], abs=5e-4)
    assert any(ln.startswith("plateau: ") for ln in lines)
    assert "OOM search: not run (--find-oom; on CPU with --memory-cap)" in lines
    assert any(ln.startswith("memory model: M = ") and ln.endswith("give --memory-cap to predict the largest batch")
               for ln in lines)
    assert lines[-1] == f"report: {out / 'sweep.json'}, {out / 'sweep.png'}"
    assert (out / "sweep.png").read_bytes().startswith(PNG)


@pytest.mark.integration
def test_cli_find_oom_under_a_cpu_cap(cnn: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cubelake.cli import app

    out = tmp_path / "oom"
    res = CliRunner().invoke(app, ["sweep", "--model", str(cnn), "--batches", "32,64", "--warmup", "0", "--iters", "1",
                                   "--memory-cap", "32MiB", "--find-oom", "--out", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads((out / "sweep.json").read_text())
    o, mm = d["oom_search"], d["memory_model"]
    lines = res.output.splitlines()
    head = next(ln for ln in lines if ln.startswith("OOM search"))
    assert head.startswith(f"OOM search (x1.5 then bisection): largest batch that fits {o['max_fit']}, first that "
                           f"fails {o['first_oom']} (gap {o['gap']:.1%}, {len(o['trials'])} trials, converged)")
    steps = " ".join(f"{t['batch']}:{'ok' if t['fits'] else 'OOM'}" for t in o["trials"])
    assert f"  trials: {steps}" in lines
    assert steps.startswith("64:ok 96:")  # from the largest batch of the sweep, x1.5
    mem = next(ln for ln in lines if ln.startswith("memory model: "))
    assert mem.endswith(f"under 32.0 MiB it predicts a largest batch of {mm['predicted_max_batch']}, measured "
                        f"{o['max_fit']} ({mm['prediction_error']:+.1%})")


@pytest.mark.parametrize(("args", "code", "words"), [
    (["--model", "{missing}"], 2, ["--model", "no such file"]),
    (["--model", "{text}"], 2, ["not a TorchScript or torch.export archive"]),
    (["--model", "{cnn}", "--batches", "64,abc"], 2, ["--batches '64,abc'", "'abc' is not a whole number"]),
    (["--model", "{cnn}", "--device", "cuda:99"], 2, ["--device cuda:99"]),
    (["--model", "{cnn}", "--memory-cap", "lots"], 2, ["--memory-cap", "not a size"]),
    (["--model", "{cnn}", "--find-oom"], 2, ["--find-oom on CPU needs --memory-cap"]),
    (["--model", "{flat}", "--patch", "7", "--batches", "8", "--iters", "1", "--warmup", "0"], 1,
     ["the model fails on one sample", "check --patch/--bands"]),
])
def test_cli_bad_input_is_one_clear_line(cnn: Path, flat: Path, tmp_path: Path, args: list[str], code: int,
                                          words: list[str]) -> None:
    from typer.testing import CliRunner

    from cubelake.cli import app

    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    paths = {"missing": str(tmp_path / "nope.pt"), "text": str(text), "cnn": str(cnn), "flat": str(flat)}
    res = CliRunner().invoke(app, ["sweep", *[a.format(**paths) for a in args], "--out", str(tmp_path / "o")])
    assert isinstance(res.exception, SystemExit), res.exception  # an exit, not an exception's traceback
    assert res.exit_code == code, res.output
    for w in words:
        assert w in res.output, res.output
    assert "Traceback" not in res.output
    assert [ln for ln in res.output.splitlines() if ln.strip()][-1].startswith("error: ")
    assert not (tmp_path / "o" / "sweep.json").exists()


# -- CUDA (run by bench/gpu_checks.py on a machine with a GPU) -------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
def test_cuda_sweep_times_with_events(tmp_path: Path) -> None:
    spec = ModelSpec(name="wide3d", kind="pixel", layout="B1CHW", bands=200, classes=5, patch=15)
    path = save_model(Wide3D(), tmp_path / "wide3d.pt", spec)
    report = run_sweep(path, SweepSettings(batches=(64, 128, 256), device="cuda", warmup=3, iters=10))
    assert report.environment["device_name"] == torch.cuda.get_device_name()
    assert report.environment["device_memory_bytes"] == torch.cuda.get_device_properties("cuda").total_memory
    param_bytes = sum(p.numel() * 4 for p in Wide3D().parameters())
    for t in report.trials:
        assert t.ok
        assert len(t.times_ms) == 10
        assert all(x > 0 for x in t.times_ms)
        # the input alone is batch x 1 x 200 x 15 x 15 floats, on the device during the trial
        assert t.peak_bytes is not None
        assert t.peak_bytes >= t.batch * 200 * 15 * 15 * 4 + param_bytes
        assert t.reserved_bytes is not None
        assert t.reserved_bytes >= t.peak_bytes
    assert report.memory is not None
    assert report.memory.per_sample_bytes > 200 * 15 * 15 * 4
    json_path, png = write_report(report, tmp_path)
    assert json.loads(json_path.read_text())["environment"]["cuda"] == torch.version.cuda
    assert png is not None


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("fresh", [False, True])
def test_cuda_find_oom_under_a_memory_fraction(tmp_path: Path, fresh: bool) -> None:
    """A 2 GiB cap (set_per_process_memory_fraction): the caching allocator refuses past it; the search
    brackets the wall to 5 % and the memory model's prediction lands near it."""
    spec = ModelSpec(name="wide3d", kind="pixel", layout="B1CHW", bands=200, classes=5, patch=15)
    path = save_model(Wide3D(), tmp_path / "wide3d.pt", spec)
    cap = 2 * 2**30
    report = run_sweep(path, SweepSettings(batches=(64, 128), device="cuda", warmup=1, iters=2, memory_cap=cap,
                                           find_oom=True, fresh_process=fresh))
    o = report.oom
    assert o is not None
    assert o.converged
    assert len(o.trials) <= 15
    assert o.max_fit is not None
    assert o.first_oom is not None
    assert o.first_oom - o.max_fit <= 0.05 * o.max_fit
    assert all(t.oom for t in report.trials if not t.ok)
    ok = [t for t in report.trials if t.ok]
    assert all(t.reserved_bytes is not None and t.reserved_bytes <= cap for t in ok)
    assert report.memory_cap_bytes == cap
    assert report.predicted_max_batch is not None
    assert abs(report.prediction_error or 1.0) < 0.5
    if not fresh:
        assert torch.cuda.memory_allocated() < 64 * 2**20  # the OOM trials left nothing behind
