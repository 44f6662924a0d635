"""``cubelake link emulate``: an emulated network link in front of an S3 endpoint, until Ctrl-C."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

from cubelake.errors import ConfigError, LinkEmulatorError

from ._render import QUIET, VERBOSE, configure_output, err_console, out_console, show
from .ingest import OutputFormat

if TYPE_CHECKING:  # the library is imported by the command bodies: ``--help`` stays quick
    from cubelake.linkemu import FaultSpec, LinkSpec, LinkStats

link_app = typer.Typer(help="Emulated network links: bandwidth, latency and S3 faults in front of an endpoint.",
                       no_args_is_help=True)


def _link(preset: str, ttfb_ms: float | None, jitter_ms: float, cap_uploads: bool) -> LinkSpec:
    from cubelake.linkemu import LinkSpec, parse_rate_mbps

    try:
        parse_rate_mbps(preset)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--preset") from None
    try:
        return LinkSpec.preset(preset, ttfb_ms=ttfb_ms, jitter_ms=jitter_ms, cap_uploads=cap_uploads)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--ttfb-ms / --jitter-ms") from None


def _faults(rate: float, kinds: str, methods: str, retry_after_s: int, stall_s: float) -> FaultSpec:
    from cubelake.linkemu import FaultSpec

    scope = {"get": "GET", "all": "all"}.get(methods.strip().lower())
    if scope is None:
        raise typer.BadParameter(f"{methods!r}: use get (faults on reads only) or all", param_hint="--fault-methods")
    try:
        return FaultSpec(rate=rate, kinds=kinds, methods=scope, retry_after_s=retry_after_s,  # type: ignore[arg-type]
                         stall_s=stall_s)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--fault-rate / --faults") from None


def _size(n: int) -> str:
    """Bytes in B, KB, MB or GB (powers of 1000)."""
    value = float(n)
    for unit in ("B", "KB", "MB"):
        if value < 1000:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def _summary(stats: LinkStats) -> str:
    faults = ", ".join(f"{k} x{n}" for k, n in stats.faults.items() if n) or "none"
    return (f"stopped: {stats.requests} request(s), {_size(stats.bytes_sent)} sent, {_size(stats.bytes_received)} "
            f"received; faults injected: {faults}; upstream errors: {stats.upstream_errors}")


def _emit(fmt: OutputFormat, doc: dict[str, Any], text: str) -> None:
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(doc, ensure_ascii=True) + "\n")
    else:
        for line in text.splitlines():
            out_console().print(show(line))
    sys.stdout.flush()


@contextmanager
def _stop_signals() -> Iterator[threading.Event]:
    """An event set by Ctrl-C (SIGINT) or SIGTERM, however many arrive, until the block ends.

    A handler, not ``KeyboardInterrupt``: coreutils ``timeout -s INT`` signals the child and then its whole
    process group, so a second SIGINT can land while the emulator shuts down — raised there, it killed the
    command (exit 130) before its summary.
    """
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@link_app.command("emulate")
def emulate_cmd(
    upstream: str = typer.Option(..., "--upstream", help="The S3 endpoint to sit in front of: http://host:port."),
    preset: str = typer.Option("none", "--preset",
                               help="1gbps, 500mbps, 200mbps (40 ms TTFB unless --ttfb-ms), none, or a rate like 300mbps."),
    ttfb_ms: float | None = typer.Option(None, "--ttfb-ms", help="Time to first byte of every response, ms."),
    jitter_ms: float = typer.Option(0.0, "--jitter-ms", help="TTFB varies by up to ± this, seeded, ms."),
    cap_uploads: bool = typer.Option(False, "--cap-uploads", help="Cap request bodies (uploads) at the rate too."),
    fault_rate: float = typer.Option(0.0, "--fault-rate", help="Fraction of requests that fail (0.05 = 5%)."),
    faults: str = typer.Option("503,500", "--faults",
                               help="Fault kinds, weight after a colon: 503,500,reset,truncate,stall (e.g. 503:3,reset)."),
    fault_methods: str = typer.Option("get", "--fault-methods", help="get (reads only) or all."),
    retry_after_s: int = typer.Option(1, "--retry-after-s", help="Retry-After of an injected 503, s."),
    stall_s: float = typer.Option(600.0, "--stall-s", help="How long a stalled body stops, s."),
    seed: int = typer.Option(0, "--seed", help="Fixes jitter and faults: the n-th request fares the same every run."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(0, "--port", help="Port to listen on (0: a free one)."),
    fmt: OutputFormat = typer.Option(OutputFormat.text, "--format", help="text or json (one JSON line at start and stop)."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Serve an emulated link until Ctrl-C; point S3 clients at the endpoint it prints (AWS_ENDPOINT_URL)."""
    from cubelake.linkemu import LinkEmulator

    configure_output(verbose, quiet)
    link = _link(preset, ttfb_ms, jitter_ms, cap_uploads)
    fault_spec = _faults(fault_rate, faults, fault_methods, retry_after_s, stall_s)
    try:
        emu = LinkEmulator(upstream, link=link, faults=fault_spec, seed=seed, host=host, port=port)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--upstream / --port") from None
    with _stop_signals() as stop:  # a Ctrl-C during the start ends the run as soon as it is up
        try:
            emu.start()
        except LinkEmulatorError as exc:
            raise typer.BadParameter(str(exc), param_hint="--host / --port") from None
        try:
            try:
                emu.check_upstream()
            except LinkEmulatorError as exc:
                err_console().print(f"[yellow]warning[/yellow]: {show(exc)}")
            described = f"{link.describe()}; {fault_spec.describe()}; seed {seed}"
            _emit(fmt, {"event": "started", "endpoint": emu.endpoint, "upstream": upstream, "link": described},
                  f"link emulator on {emu.endpoint} -> {upstream}\n  {described}\n"
                  f"  export AWS_ENDPOINT_URL={emu.endpoint} AWS_ALLOW_HTTP=true\nCtrl-C stops it.")
            while not stop.wait(0.5):
                pass
        finally:
            emu.close()
    stats = emu.stats
    _emit(fmt, {"event": "stopped", "stats": stats.to_dict()}, _summary(stats))
