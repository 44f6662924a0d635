"""``cubelake loader plan``: will training stall on this link, and what should change?"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import typer

from cubelake.errors import ConfigError, CubelakeError

from ._render import QUIET, VERBOSE, configure_output, fail, out_console, show
from .ingest import OutputFormat

loader_app = typer.Typer(help="The PyTorch loader: capacity planning for training from a lake or object storage.",
                         no_args_is_help=True)


def _link(link: str | None, ttfb_ms: float) -> Any:
    """The link given on the command line, or ``None`` (probe the store)."""
    if link is None:
        return None
    from cubelake.linkemu import parse_rate_mbps
    from cubelake.loaders import Link

    try:
        mbps = parse_rate_mbps(link)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--link") from None
    if mbps is None:
        raise typer.BadParameter(f"{link!r}: give the link's rate, e.g. 500mbps or 1gbps", param_hint="--link")
    try:
        return Link(bandwidth_bps=mbps * 1e6, ttfb_s=ttfb_ms / 1000)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--ttfb-ms") from None


def _dataset(products: list[str], lake: str | None, window: int, stride: int, batch_size: int, threads: int,
             prefer: str) -> Any:
    from cubelake.loaders import CubeDataset, PlanSpec, ReaderConfig, Sampling

    if not products:
        if lake is None:
            raise typer.BadParameter("name products (scene folders, product URLs) or a --lake to plan over all "
                                     "its scenes", param_hint="PRODUCTS")
        from cubelake.catalog import LakeCatalog, Query

        with LakeCatalog(lake) as cat:
            products = cat.search(Query(), scenes_only=True)
    return CubeDataset(products, lake=lake, sampling=Sampling(size=window, stride=stride, labels="none"),
                       plan=PlanSpec(batch_size=batch_size), reader=ReaderConfig(threads=threads),
                       prefer=tuple(p.strip() for p in prefer.split(",") if p.strip()))


def _report(pred: Any, work: Any, link: Any, probed: bool) -> str:
    mib = 2**20
    how = "probed" if probed else "given"
    return "\n".join([
        f"link ({how}): {link.bandwidth_bps / 1e6:,.0f} Mbit/s, {link.ttfb_s * 1000:.1f} ms to first byte",
        f"workload (measured): {work.bytes_per_sample / 1024:,.1f} KiB fetched per sample, batch {work.batch_size}, "
        f"{work.request_bytes / mib:,.2f} MiB per request, decoding {work.decode_bytes_per_s / mib:,.0f} MiB/s",
        f"per batch: fetch {pred.fetch_s * 1000:,.1f} ms, decode {pred.decode_s * 1000:,.1f} ms, load T_d "
        f"{pred.load_s * 1000:,.1f} ms, compute T_c {pred.compute_s * 1000:,.1f} ms "
        f"({pred.concurrency} request(s) in flight: {pred.fetch_bytes_per_s * 8 / 1e6:,.0f} Mbit/s)",
        f"predicted: {pred.samples_per_s:,.1f} samples/s, utilisation {pred.utilisation:.0%}, "
        f"stall {pred.stall_fraction:.0%}; B/8 >= D*k/T_c: {'yes' if pred.bandwidth_ok else 'no'} "
        f"(needs {pred.required_bps / 1e6:,.0f} Mbit/s)",
        f"epoch ({work.epoch_batches} batches): {pred.epoch_s:,.1f} s, {pred.epoch_samples_per_s:,.1f} samples/s, "
        f"stall {pred.epoch_stall_fraction:.0%}, the first batch waiting {pred.fill_s * 1000:,.0f} ms for its chunks",
        f"binding: {pred.explanation}",
        f"recommended: ReaderConfig(threads={pred.recommended_concurrency}, cache_bytes={pred.recommended_cache_bytes}), "
        f"prefetch_batches={pred.recommended_prefetch}",
    ])


@loader_app.command("plan")
def plan_cmd(
    products: list[str] = typer.Argument(None, help="Scene folders or product URLs (default: every scene of --lake)."),
    lake: str | None = typer.Option(None, "--lake", help="The lake (folder or s3:// URL) the products belong to."),
    compute_ms: float = typer.Option(..., "--compute-ms", help="The model's time per batch (T_c), ms."),
    link: str | None = typer.Option(None, "--link", help="The link's rate, e.g. 500mbps (default: probe the store)."),
    ttfb_ms: float = typer.Option(40.0, "--ttfb-ms", help="With --link: time to first byte, ms."),
    window: int = typer.Option(32, "--window", help="Sample window, pixels."),
    stride: int = typer.Option(32, "--stride", help="Sliding-window stride, pixels."),
    batch_size: int = typer.Option(64, "--batch-size", help="Samples per batch (k)."),
    threads: int = typer.Option(2, "--threads", help="Requests in flight / decode threads (ReaderConfig.threads)."),
    batches: int = typer.Option(16, "--batches", help="Batches served to measure the workload."),
    prefer: str = typer.Option("zarr,refs,cog", "--prefer", help="Product kinds in order of preference."),
    fmt: OutputFormat = typer.Option(OutputFormat.text, "--format", help="text or json."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Measure a few batches, probe (or take) the link, and predict samples/s and stall, with what to change."""
    configure_output(verbose, quiet)
    if compute_ms <= 0 or batches < 1 or batch_size < 1 or threads < 1:
        raise typer.BadParameter("--compute-ms, --batches, --batch-size and --threads must be positive")
    given = _link(link, ttfb_ms)
    from cubelake.loaders import plan_capacity

    try:
        ds = _dataset(list(products or []), lake, window, stride, batch_size, threads, prefer)
        pred, work, used = plan_capacity(ds, compute_s=compute_ms / 1000, link=given, batches=batches)
    except (CubelakeError, OSError) as exc:
        raise fail(exc if isinstance(exc, CubelakeError) else CubelakeError(str(exc))) from None
    if fmt is OutputFormat.json:
        doc = {"prediction": pred.to_dict(), "workload": dataclasses.asdict(work), "link": dataclasses.asdict(used),
               "probed": given is None}
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    for line in _report(pred, work, used, given is None).splitlines():
        out_console().print(show(line))
