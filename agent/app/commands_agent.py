"""``roofwatch run`` and ``roofwatch demo``: the agent itself, collecting in the background and serving HTTP
until SIGTERM/SIGINT, reloading on SIGHUP, and waiting for a late GPU driver when told to."""

from __future__ import annotations

import argparse
import errno
import logging
import signal
import threading
from typing import Any, Callable

from agent import __version__
from agent.app.assemble import attach_recorder, open_collector, open_otlp, status_page
from agent.app.cli_base import (
    DEMO_BACKENDS,
    DEMO_LISTEN,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    add_settings_flags,
    settings_from,
)
from agent.app.config import ConfigError, Settings
from agent.app.signals import SignalRequests

log = logging.getLogger("roofwatch")


def register(sub: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add this group's subcommands to ``sub``; returns their handlers by name."""
    run = sub.add_parser("run", help="run the agent on this node's GPUs", description="Run the agent: collect in the background, serve /metrics.")
    add_settings_flags(run)
    run.add_argument("--record", metavar="FILE", help="also append every sample to this trace (.jsonl or .jsonl.gz)")
    run.add_argument("--driver-wait", dest="driver_wait_s", type=float, metavar="SECONDS",
                     help="wait this long for a GPU driver that does not answer yet, serving /healthz meanwhile "
                          "(default 0: exit at once)")
    add_dcgm_exporter_flag(run)
    run.add_argument("--amd-exporter-url", metavar="URL",
                     help="an AMD Device Metrics Exporter /metrics URL: with --backend amd-exporter the only source")
    run.add_argument("--amd-exporter-profiler-window-us", dest="amd_exporter_profiler_window_us", type=float,
                     metavar="US", help="the exporter's profiler sampling window (default 1000; docs/amd.md)")

    demo = sub.add_parser("demo", help="run the agent on a simulated 8-GPU node", description="Run the agent on the virtual GPU fleet and print its URL.")
    add_settings_flags(demo, backend=False)
    demo.add_argument("--backend", choices=(*DEMO_BACKENDS, "dcgm-exporter"), default="virtual",
                      help="virtual: the simulator directly; nvml-virtual: the real NVML backend over a fake "
                           "driver playing the same simulation; amd-virtual: the real AMD backend (amdsmi) over a "
                           "fake libamd_smi, on the 8 x MI300X scenario unless --scenario says otherwise "
                           "(default virtual); dcgm-exporter: a running dcgm-exporter at --dcgm-exporter-url")
    demo.add_argument("--record", metavar="FILE", help="also append every sample to this trace")
    add_dcgm_exporter_flag(demo)
    for parser in (run, demo):
        parser.add_argument("--otlp-endpoint", metavar="URL",
                            help="also push every metric over OTLP to this collector (http/protobuf: "
                                 "http://HOST:4318; OTEL_EXPORTER_OTLP_* honoured; docs/otlp.md)")
    return {"run": cmd_run, "demo": cmd_demo}


def add_dcgm_exporter_flag(parser: argparse.ArgumentParser) -> None:
    """``--dcgm-exporter-url``: the node's dcgm-exporter, joined to NVML or read alone (docs/nvidia.md)."""
    parser.add_argument("--dcgm-exporter-url", metavar="URL",
                        help="a dcgm-exporter /metrics URL: fills the profiling counters NVML lacks before Hopper, "
                             "or with --backend dcgm-exporter is the only source")


def serve(read_settings: Callable[[], Settings], record: str | None, *, announce: bool) -> int:
    """Run the agent until SIGTERM/SIGINT; SIGHUP re-reads the configuration (agent.app.reload).
    ``read_settings`` reads file, environment and flags, now and on every reload. With
    ``driver_wait_s``, a missing GPU driver is waited for while the HTTP port already answers
    (agent.app.driver_wait); an exporter that serves the GPUs (``--backend dcgm-exporter``, ``amd-exporter``)
    is always waited for, on a thread of its own, while the port answers (agent.app.source_wait)."""
    from agent.app.driver_wait import WAITABLE_BACKENDS, DriverWait
    from agent.app.logs import configure_logging
    from agent.app.reload import Reloader
    from agent.app.source_wait import SOURCE_BACKENDS
    from agent.backends.base import BackendUnavailable
    from exporters.http import AgentHTTPServer

    settings = read_settings()
    configure_logging(settings.log_level, settings.log_format)
    web = web_config(settings)
    store = report_store(settings)
    requests = SignalRequests()  # handlers only raise a request; the work happens below, off the handler
    driver_wait: DriverWait | None = None
    source_wait = None
    collector = None
    if settings.backend in SOURCE_BACKENDS:
        source_wait = waiting_source(settings, store, lambda: requests.raise_request("source"))
    else:
        try:
            collector = open_collector(settings, store)
        except BackendUnavailable as exc:
            if settings.driver_wait_s <= 0 or settings.backend not in WAITABLE_BACKENDS:
                raise CliError(str(exc)) from None
            driver_wait = DriverWait(
                attempt=lambda: open_collector(settings, store), node=settings.node_name, backend=settings.backend,
                wait_s=settings.driver_wait_s, interval_s=settings.interval_s,
                expected_devices=settings.expected_gpus or 0,
            )
            driver_wait.failed(exc)
    waiting = source_wait or driver_wait
    source: list[Any] = [collector if collector is not None else waiting]  # what scrapes read, swapped once
    try:
        otlp = open_otlp(settings, lambda: source[0].snapshot)  # the same snapshot /metrics serves
    except CliError:
        if collector is not None:
            collector.stop()
        raise
    recorder = attach_recorder(collector, record, settings) if record and collector is not None else None
    try:
        server = AgentHTTPServer(
            settings.listen_address,
            lambda: source[0].snapshot,
            stale_after_s=settings.effective_stale_after_s,
            max_processes_per_gpu=settings.max_processes_per_gpu,
            gpu_labels=settings.gpu_labels,
            optional_metrics=settings.optional_metrics,
            reports=store if settings.report_http else None,
            web=web,
            limits=listener_limits(settings),
            page=status_page(),
        )
    except OSError as exc:
        if collector is not None:
            collector.stop()
        raise CliError(_listen_error(settings.listen, exc)) from None
    if otlp is not None:
        server.exposition.extra_families = otlp.scrape_families  # roofwatch_otlp_* beside the snapshot's
    report_socket = None
    if store is not None and settings.report_socket:
        from exporters.http.report_socket import ReportSocketServer

        try:
            report_socket = ReportSocketServer(settings.report_socket, store, mode=settings.report_socket_mode)
            report_socket.start()
        except OSError as exc:
            server.server_close()
            if collector is not None:
                collector.stop()
            raise CliError(f"report_socket: cannot listen on {settings.report_socket}: {exc.strerror or exc}") from None

    requests.install({signal.SIGTERM: "stop", signal.SIGINT: "stop", signal.SIGHUP: "reload"})
    reloader = Reloader(settings, read_settings, server)

    freeze_startup_heap()
    if collector is not None:
        collector.start()
    server_thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="roofwatch-http", daemon=True)
    server_thread.start()
    if source_wait is not None:
        source_wait.start()  # after the port answers: a neighbour that never answers holds only its own thread
    if otlp is not None:
        otlp.start()
    log.info(
        "serving",
        extra={"url": server.url, "backend": collector.backend.name if collector else settings.backend,
               "gpus": len(collector.devices) if collector else 0, "interval_s": settings.interval_s},
    )
    if announce:
        gpus = f"{len(collector.devices)} GPUs ({collector.backend.name} backend)" if collector else \
            f"waiting for {waiting.wait.what if source_wait else 'the GPU driver'}"
        print(f"roofwatch {__version__}: {gpus} on {server.url}", flush=True)
        print(f"  metrics: {server.url}metrics   health: {server.url}healthz   stop: Ctrl-C", flush=True)
    failure = None
    while True:
        if driver_wait is not None and collector is None and driver_wait.expired:
            failure = driver_wait.give_up_message()
            break
        delay = driver_wait.next_delay_s() if driver_wait is not None and collector is None else None
        if requests.wait(delay, ("stop", "reload", "source")):
            if requests.pending("stop"):
                log.info("stopping", extra={"signal": requests.signal_name("stop")})
                break
            if requests.take("reload"):
                reloader.reload()
            if requests.take("source") and source_wait is not None and collector is None:
                if source_wait.fatal is not None:
                    failure = source_wait.fatal
                    break
                collector = source_wait.take()
                if collector is not None:
                    recorder = start_collecting(collector, source, record, settings)
        elif driver_wait is not None and collector is None:
            collector = driver_wait.try_once()
            if collector is not None:
                recorder = start_collecting(collector, source, record, settings)
    if source_wait is not None:
        source_wait.stop()
    server.shutdown()
    if not server.drain(timeout_s=5.0):
        log.warning("stopping with requests still being answered after 5 s")
    server.server_close()
    if report_socket is not None:
        report_socket.close()
    if otlp is not None:
        otlp.stop(timeout=1.0)
    if collector is not None:
        collector.stop(timeout=1.0)
    if recorder is not None:
        recorder.close()
    requests.close()
    if failure is not None:
        raise CliError(failure)
    return EXIT_OK


def waiting_source(settings: Settings, store, notify: Callable[[], None]):
    """The wait for the exporter that serves this agent's GPUs (agent.app.source_wait), not started."""
    from agent.app.source_wait import SourceWait
    from agent.model.redact import safe_url

    url = settings.dcgm_exporter_url if settings.backend == "dcgm-exporter" else settings.amd_exporter_url
    interval = (settings.dcgm_exporter_interval_s if settings.backend == "dcgm-exporter"
                else settings.amd_exporter_interval_s)
    return SourceWait(lambda: open_collector(settings, store), what=f"{settings.backend} at {safe_url(url or '')}",
                      source=settings.backend, node=settings.node_name, interval_s=settings.interval_s,
                      retry_max_s=interval, expected_devices=settings.expected_gpus or 0, notify=notify)


def start_collecting(collector, source: list[Any], record: str | None, settings: Settings):
    """A collector opened after a wait: its recorder attached (returned, or None), started, and made what
    scrapes read."""
    recorder = attach_recorder(collector, record, settings) if record else None
    collector.start()
    source[0] = collector
    log.info("collecting", extra={"backend": collector.backend.name, "gpus": len(collector.devices)})
    return recorder


def listener_limits(settings: Settings):
    """The HTTP port's bounds against slow and hostile clients (exporters.http.limits), from the settings."""
    from exporters.http.limits import ListenerLimits

    return ListenerLimits(header_timeout_s=settings.http_header_timeout_s, idle_timeout_s=settings.http_idle_timeout_s,
                          max_connections=settings.http_max_connections,
                          max_connections_per_client=settings.http_max_connections_per_client,
                          max_in_flight=settings.http_max_in_flight)


def web_config(settings: Settings):
    """TLS and basic auth, checked before any GPU is opened: a bad file is a usage error naming the field."""
    from exporters.web_config import WebConfigError, web_config_or_none

    try:
        return web_config_or_none(settings.web_config_file)
    except WebConfigError as exc:
        raise CliError(f"web_config_file: {exc}", EXIT_USAGE) from None


def freeze_startup_heap() -> None:
    """Move everything alive after start-up (modules, the spec catalogue, the primed classifier)
    out of the collector's reach. Those objects live as long as the agent, yet every full
    collection walked them: a 20 ms pause on about one render in forty (docs/performance.md)."""
    import gc

    gc.collect()
    gc.freeze()


def report_store(settings: Settings):
    """Where workload reports land (None when both transports are off); a bad token file stops the start."""
    if not settings.reports_enabled or settings.backend in DEMO_BACKENDS:
        return None  # the simulated fleet reports for its own jobs
    from agent.context.workload.report_store import ReportStore

    try:
        token = settings.read_report_token()
    except ConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    return ReportStore(ttl_s=settings.report_ttl_s, token=token, rate_per_s=settings.report_rate_per_s,
                       pids_visible=settings.backend != "dcgm-exporter")


def _listen_error(listen: str, exc: OSError) -> str:
    """Why the port cannot be opened, with what to change: the setting's flag, file key and variable."""
    why = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        why += " (another process listens there: pick a free port with --listen HOST:PORT, `listen:` in the settings " \
               "file or ROOFWATCH_LISTEN)"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why += " (ports below 1024 need privileges: use --listen HOST:PORT with a higher port)"
    elif exc.errno == errno.EADDRNOTAVAIL:
        why += " (no interface of this machine has that address: fix the host in --listen)"
    return f"cannot listen on {listen}: {why}"


def cmd_run(args: argparse.Namespace) -> int:
    return serve(lambda: settings_from(args), args.record, announce=False)


def cmd_demo(args: argparse.Namespace) -> int:
    forced: dict[str, Any] = {"backend": args.backend}

    def read() -> Settings:
        settings = settings_from(args, **forced)
        if args.listen is None and "listen" not in settings.model_fields_set:
            settings = settings_from(args, listen=DEMO_LISTEN, **forced)
        return settings

    return serve(read, args.record, announce=True)
