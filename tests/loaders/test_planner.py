"""The capacity planner measured end to end: a product on a real S3-protocol server behind an emulated
200 Mbit/s link with 40 ms to first byte (cubelake.linkemu), probed and planned by the loader."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from cubelake.linkemu import LinkEmulator, LinkSpec
from cubelake.loaders import (
    CubeDataset,
    LoaderMetrics,
    PlanSpec,
    Sampling,
    plan_capacity,
    predict,
    probe_link,
)
from cubelake.loaders.planner import workload_from_metrics
from cubelake.storage import S3Options

from ..conftest import S3Server, no_traceback, run_cli


@pytest.fixture
def shaped_cog(synth_lake: dict[str, Any], s3_server: S3Server, s3_bucket: str) -> Any:
    cog = synth_lake["scenes"][1] / "scene_b.tif"
    s3_server.client().upload_file(str(cog), s3_bucket, "products/scene_b.tif")
    with LinkEmulator(s3_server.endpoint, link=LinkSpec.preset("200mbps", ttfb_ms=40)) as emu:
        opts = S3Options.coerce({**s3_server.options, "endpoint_url": emu.endpoint})
        yield f"s3://{s3_bucket}/products/scene_b.tif", opts, emu


def test_the_probe_measures_the_emulated_link(shaped_cog: Any) -> None:
    url, opts, _ = shaped_cog
    link = probe_link(url, opts)
    assert 0.035 <= link.ttfb_s <= 0.080  # 40 ms imposed (+ moto's own few ms)
    assert 150e6 <= link.bandwidth_bps <= 230e6  # 200 Mbit/s imposed


def test_plan_capacity_measures_the_workload_and_names_the_binding_constraint(shaped_cog: Any) -> None:
    url, opts, emu = shaped_cog
    ds = CubeDataset([url], storage_options=opts, prefer=("cog",), sampling=Sampling(size=32, stride=32, labels="none"),
                     plan=PlanSpec(batch_size=8))
    pred, work, link = plan_capacity(ds, compute_s=0.001, batches=4)
    m = ds.metrics()
    # bytes per sample over the whole epoch, not over the first batches (which also fetch chunks for later ones)
    full = CubeDataset([url], storage_options=opts, prefer=("cog",), sampling=Sampling(size=32, stride=32,
                       labels="none"), plan=PlanSpec(batch_size=8))
    assert sum(len(b["scene"]) for b in full) == full.n_samples()
    epoch = full.metrics()
    assert work.bytes_per_sample == pytest.approx(epoch.bytes_fetched / epoch.samples, rel=0.10)
    assert work.request_bytes == pytest.approx(m.bytes_fetched / m.requests)
    assert work.epoch_batches == -(-full.n_samples() // 8)
    assert 0 < work.first_batch_bytes <= epoch.bytes_fetched  # the first round's chunks, not the epoch's
    assert pred.fill_s > link.ttfb_s
    assert pred.epoch_s >= pred.fill_s
    assert work.batch_size == 8
    assert emu.stats.requests >= m.requests  # every request went through the emulated link
    assert m.latency_ms(0.5) >= 40  # the link's 40 ms to first byte is in every request's latency
    assert 0 < m.throughput_bps <= 230e6
    assert m.inflight_peak >= 1
    assert "request latency p50" in m.report()
    # a 1 ms model on a 200 Mbit/s link with 40 ms to first byte cannot be fed: the link or its latency binds
    assert pred.binding in ("bandwidth", "latency")
    assert pred.stall_fraction > 0.5
    assert pred.required_bps == pytest.approx(8 * work.batch_bytes / 0.001)
    assert not pred.bandwidth_ok
    assert pred.recommended_concurrency >= 1
    assert str(round(link.ttfb_s * 1000)) in pred.explanation or pred.binding == "bandwidth"
    slow_model = predict(link, dataclasses.replace(work, compute_s=60.0), concurrency=ds.reader_config.threads)
    assert (slow_model.binding, slow_model.stall_fraction) == ("compute", 0.0)


def test_a_run_that_fetched_nothing_cannot_be_planned() -> None:
    with pytest.raises(Exception, match="fetched nothing from storage"):
        workload_from_metrics(LoaderMetrics(samples=10, batches=1), compute_s=0.1, decode_threads=2)


def test_cli_plans_a_lake_on_a_given_link(synth_lake: dict[str, Any]) -> None:
    res = run_cli("loader", "plan", "--lake", str(synth_lake["lake"]), "--compute-ms", "50", "--link", "200mbps",
                  "--ttfb-ms", "40", "--batches", "4", "--batch-size", "8", "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(no_traceback(res))
    p, w = doc["prediction"], doc["workload"]
    assert doc["link"] == {"bandwidth_bps": 200e6, "ttfb_s": 0.04}
    assert not doc["probed"]
    assert w["batch_size"] == 8
    assert p["load_s"] == pytest.approx(max(p["fetch_s"], p["decode_s"]))
    assert p["samples_per_s"] == pytest.approx(8 / max(0.05, p["load_s"]))
    assert p["binding"] in ("compute", "latency", "bandwidth", "decode")
    text = run_cli("loader", "plan", str(synth_lake["scenes"][0]), "--compute-ms", "50", "--link", "1gbps",
                   "--batches", "2", "--batch-size", "8")
    assert text.returncode == 0, text.stderr
    assert "link (given): 1,000 Mbit/s, 40.0 ms to first byte" in text.stdout
    assert "recommended: ReaderConfig(threads=" in text.stdout
    assert "batches): " in text.stdout
    assert "the first batch waiting" in text.stdout


def test_cli_probes_the_link_of_an_s3_product(shaped_cog: Any) -> None:
    url, _, emu = shaped_cog
    res = run_cli("loader", "plan", url, "--compute-ms", "5", "--prefer", "cog", "--batches", "2", "--batch-size", "8",
                  "--format", "json", env={"AWS_ENDPOINT_URL": emu.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                                           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                                           "AWS_ALLOW_HTTP": "true"})
    assert res.returncode == 0, res.stderr
    doc = json.loads(no_traceback(res))
    assert doc["probed"]
    assert 150e6 <= doc["link"]["bandwidth_bps"] <= 230e6
    assert 0.035 <= doc["link"]["ttfb_s"] <= 0.080


def test_cli_errors_name_what_is_wrong(tmp_path: Path) -> None:
    bad_link = run_cli("loader", "plan", str(tmp_path), "--compute-ms", "5", "--link", "7parsecs")
    assert bad_link.returncode == 2
    assert "'7parsecs': not a link preset or rate" in " ".join(no_traceback(bad_link).split())
    missing = run_cli("loader", "plan", str(tmp_path / "nope"), "--compute-ms", "5", "--link", "1gbps")
    assert missing.returncode == 1
    assert str(tmp_path / "nope") in " ".join(no_traceback(missing).split())
    nothing = run_cli("loader", "plan", "--compute-ms", "5")
    assert nothing.returncode == 2
    assert "name products" in " ".join(no_traceback(nothing).split())
