"""The ``roofwatch`` command: run the agent, the demo fleet, and the one-shot tools.

Exit status: 0 success, 1 runtime failure (no GPU backend, port in use, trace not writable),
2 bad configuration or usage. Errors meant for a person are printed without a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from agent import __version__
from agent.app.config import DEFAULT_PORT, ConfigError, Settings, load_settings
from agent.app.signals import wait_in_main_thread

log = logging.getLogger("roofwatch")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
DEMO_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
BACKENDS = ("auto", "nvml", "amd", "virtual", "nvml-virtual", "amd-virtual")
DEMO_BACKENDS = ("virtual", "nvml-virtual", "amd-virtual")


class CliError(Exception):
    """A failure to report in one line and exit with ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


# -- argument parsing -----------------------------------------------------------------------


def _settings_flags(parser: argparse.ArgumentParser, *, backend: bool = True, listen: bool = True) -> None:
    """Flags that map onto :class:`Settings` fields; unset flags stay ``None`` so env/file win."""
    group = parser.add_argument_group("settings (flags override ROOFWATCH_* variables, which override --config)")
    group.add_argument("--config", metavar="FILE", help="YAML settings file (default: $ROOFWATCH_CONFIG)")
    if backend:
        group.add_argument("--backend", choices=list(BACKENDS), help="telemetry source (default auto)")
    if listen:
        group.add_argument("--listen", metavar="HOST:PORT", help=f"HTTP listen address (default :{DEFAULT_PORT})")
        group.add_argument("--web-config-file", metavar="FILE",
                           help="exporter-toolkit web config: TLS and basic auth for the HTTP port (docs/security.md)")
    group.add_argument("--interval", dest="interval_s", type=float, metavar="SECONDS", help="collection interval (default 1)")
    group.add_argument("--node-name", metavar="NAME", help="node label value (default: host name)")
    group.add_argument("--expected-gpus", type=int, metavar="N", help="GPUs this node should have")
    group.add_argument("--scenario", metavar="NAME|FILE", help="virtual backend scenario (default demo)")
    group.add_argument("--virtual-node", metavar="NAME", help="which scenario node to play (virtual backend)")
    group.add_argument("--dtype", choices=["fp8", "bf16", "fp16", "tf32", "fp32", "fp64"],
                       help="precision behind the peak FLOP/s when the workload does not say (default bf16, flagged as assumed)")
    group.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    group.add_argument("--log-format", choices=["logfmt", "json"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="roofwatch",
        description="GPU telemetry agent: roofline verdicts, MFU and raw counters for Prometheus.",
    )
    parser.add_argument("--version", action="version", version=f"roofwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="run the agent on this node's GPUs", description="Run the agent: collect in the background, serve /metrics.")
    _settings_flags(run)
    run.add_argument("--record", metavar="FILE", help="also append every sample to this trace (.jsonl or .jsonl.gz)")
    run.add_argument("--driver-wait", dest="driver_wait_s", type=float, metavar="SECONDS",
                     help="wait this long for a GPU driver that does not answer yet, serving /healthz meanwhile "
                          "(default 0: exit at once)")

    demo = sub.add_parser("demo", help="run the agent on a simulated 8-GPU node", description="Run the agent on the virtual GPU fleet and print its URL.")
    _settings_flags(demo, backend=False)
    demo.add_argument("--backend", choices=DEMO_BACKENDS, default="virtual",
                      help="virtual: the simulator directly; nvml-virtual: the real NVML backend over a fake "
                           "driver playing the same simulation; amd-virtual: the real AMD backend (amdsmi) over a "
                           "fake libamd_smi, on the 8 x MI300X scenario unless --scenario says otherwise "
                           "(default virtual)")
    demo.add_argument("--record", metavar="FILE", help="also append every sample to this trace")

    snap = sub.add_parser("snapshot", help="print one snapshot of this node's GPUs", description="Collect briefly and print what the agent sees.")
    _settings_flags(snap, listen=False)
    snap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    snap.add_argument("--url", metavar="URL", help="read the snapshot from a running agent instead (e.g. http://node:9477)")

    rec = sub.add_parser("record", help="record a trace", description="Record samples to a trace file (../shared/trace-format.md).")
    _settings_flags(rec, listen=False)
    rec.add_argument("--out", required=True, metavar="FILE", help="trace file to write (.jsonl, or .jsonl.gz to compress)")
    rec.add_argument("--duration", type=float, default=60.0, metavar="SECONDS", help="how long to record (default 60)")
    rec.add_argument(
        "--simulate", action="store_true",
        help="write the virtual engine's samples in virtual time, labelled with the true class, without waiting",
    )

    cls = sub.add_parser(
        "classify", help="classify the GPUs of a recorded trace",
        description="Replay traces through the classifier and print one verdict per GPU per window as JSON Lines "
                    "(../shared/trace-format.md). With --evaluate, score the verdicts against the trace's labels.",
    )
    cls.add_argument("traces", nargs="+", metavar="TRACE", help="trace file(s): .jsonl or .jsonl.gz, - for stdin")
    cls.add_argument("--evaluate", action="store_true", help="print per-class precision, recall and the confusion matrix")
    cls.add_argument("--json", action="store_true", help="print the evaluation as one JSON line instead of a table")
    cls.add_argument("-q", "--quiet", action="store_true", help="do not print the verdict lines (with --evaluate)")
    cls.add_argument("--config", metavar="FILE", help="YAML settings file whose classifier: section sets the thresholds")
    cls.add_argument("--dtype", choices=["fp8", "bf16", "fp16", "tf32", "fp32", "fp64"],
                     help="precision behind the peak FLOP/s when the trace does not say (default bf16, flagged as assumed)")

    doctor = sub.add_parser(
        "doctor", help="check what this node can measure and how to fix what is missing",
        description="Check the driver, libraries, device access, persistence mode, GPM and every capability the "
                    "agent reads; for each missing piece, say which metrics and classes it costs and how to fix it. "
                    "Exit status: 0 fully usable, 3 usable with pieces missing, 1 no GPU can be read.",
    )
    doctor.add_argument("--config", metavar="FILE", help="YAML settings file (default: $ROOFWATCH_CONFIG)")
    doctor.add_argument("--backend", choices=list(BACKENDS), help="which source to check (default auto)")
    doctor.add_argument("--scenario", metavar="NAME|FILE", help="scenario for the virtual backends")
    doctor.add_argument("--virtual-node", metavar="NAME", help="scenario node for the virtual backends")
    doctor.add_argument("--json", action="store_true", help="print the findings as JSON")

    top = sub.add_parser(
        "top", help="live terminal view of a node's GPUs: class, MFU, SM/tensor/DRAM",
        description="Show what each GPU is doing and how much of its peak it uses, refreshed in place, from a "
                    "running agent's /metrics (this node's agent unless URL says otherwise). Keys: q quits, "
                    "s changes the sort order.",
    )
    top.add_argument("url", nargs="?", metavar="URL",
                     help="agent base URL or any roofwatch /metrics URL (default http://127.0.0.1:%d)" % DEFAULT_PORT)
    top.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="refresh period (default 2)")
    top.add_argument("--sort", choices=["gpu", "mfu", "class", "power"], default="gpu",
                     help="initial sort order; mfu puts the least efficient GPUs first (default gpu)")
    top.add_argument("--once", action="store_true", help="print one frame and exit (no keys, no full screen)")

    report = sub.add_parser(
        "report", help="render a recorded trace as one self-contained HTML page",
        description="Replay a trace through the classifier and write a post-mortem page: verdict timeline per GPU, "
                    "roofline scatter and MFU over time, in one HTML file with no external assets.",
    )
    report.add_argument("traces", nargs="+", metavar="TRACE", help="trace file(s): .jsonl or .jsonl.gz, - for stdin")
    report.add_argument("--out", required=True, metavar="FILE", help="HTML file to write")
    report.add_argument("--title", metavar="TEXT", help="page title (default: the trace's node and time span)")
    report.add_argument("--config", metavar="FILE", help="YAML settings file whose classifier: section sets the thresholds")
    report.add_argument("--dtype", choices=["fp8", "bf16", "fp16", "tf32", "fp32", "fp64"],
                        help="precision behind the peak FLOP/s when the trace does not say (default bf16, flagged as assumed)")

    specs = sub.add_parser("specs", help="print the GPU peak-spec catalogue", description="Print dense peak FLOP/s, bandwidth and ridge points per GPU model.")
    specs.add_argument("--json", action="store_true", help="print JSON (SI units)")
    return parser


def _settings_from(args: argparse.Namespace, **forced: Any) -> Settings:
    import os

    names = set(Settings.model_fields)
    overrides = {k: v for k, v in vars(args).items() if k in names}
    overrides.update(forced)
    config = getattr(args, "config", None) or os.environ.get("ROOFWATCH_CONFIG")
    try:
        return load_settings(config, **overrides)
    except ConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


# -- commands -------------------------------------------------------------------------------


def _open(settings: Settings, reports=None):
    from agent.backends.base import BackendUnavailable
    from agent.backends.registry import open_backend

    try:
        return open_backend(settings, reports)
    except BackendUnavailable as exc:
        raise CliError(str(exc)) from None


def _open_collector(settings: Settings, reports=None):
    """The backend opened and its GPUs discovered; BackendUnavailable when the driver does not answer."""
    from agent.backends.base import BackendUnavailable
    from agent.backends.registry import open_backend

    backend = open_backend(settings, reports)
    try:
        return _make_collector(settings, backend)
    except CliError as exc:
        raise BackendUnavailable(str(exc)) from None


def _make_collector(settings: Settings, backend):
    from agent.backends.base import BackendUnavailable
    from agent.collector import Backoff, Collector

    analyzer = None
    if settings.classify:
        from agent.classifier.live import LiveClassifier

        # The configured dtype counts as "said"; only the built-in default is flagged as assumed.
        analyzer = LiveClassifier(settings.classifier, dtype=settings.dtype if "dtype" in settings.model_fields_set else None)
    # A virtual agent plays one scenario node; naming it after that node (not this host) keeps
    # several demo agents on one machine apart, as real nodes would be.
    node = settings.node_name
    if "node_name" not in settings.model_fields_set and getattr(backend, "name", "") in DEMO_BACKENDS:
        node = getattr(backend, "node", node)
    try:
        collector = Collector(
            backend,
            node=node,
            interval_s=settings.interval_s,
            sample_timeout_s=settings.sample_timeout_s,
            history_len=settings.history_len,
            expected_devices=settings.expected_gpus,
            backoff=Backoff(initial_s=settings.interval_s),
            analyzer=analyzer,
        )
    except BackendUnavailable as exc:
        backend.close()
        raise CliError(str(exc)) from None
    warm = getattr(backend, "warm_samples", None)
    if analyzer is not None and warm is not None:  # the virtual demo: verdicts from the first scrape
        analyzer.prime(warm(time.time(), analyzer.thresholds.long_window_s / 2, settings.interval_s),
                       {d.gpu: d.spec for d in collector.devices})
    return collector


def _serve(read_settings: Callable[[], Settings], record: str | None, *, announce: bool) -> int:
    """Run the agent until SIGTERM/SIGINT; SIGHUP re-reads the configuration (agent.app.reload).
    ``read_settings`` reads file, environment and flags, now and on every reload. With
    ``driver_wait_s``, a missing GPU driver is waited for while the HTTP port already answers
    (agent.app.driver_wait)."""
    from agent.app.driver_wait import WAITABLE_BACKENDS, DriverWait
    from agent.app.logs import configure_logging
    from agent.app.reload import Reloader
    from agent.backends.base import BackendUnavailable
    from exporters.http import AgentHTTPServer

    settings = read_settings()
    configure_logging(settings.log_level, settings.log_format)
    web = _web_config(settings)
    store = _report_store(settings)
    driver_wait: DriverWait | None = None
    try:
        collector = _open_collector(settings, store)
    except BackendUnavailable as exc:
        if settings.driver_wait_s <= 0 or settings.backend not in WAITABLE_BACKENDS:
            raise CliError(str(exc)) from None
        collector = None
        driver_wait = DriverWait(
            attempt=lambda: _open_collector(settings, store), node=settings.node_name, backend=settings.backend,
            wait_s=settings.driver_wait_s, interval_s=settings.interval_s, expected_devices=settings.expected_gpus or 0,
        )
        driver_wait.failed(exc)
    source: list[Any] = [collector if collector is not None else driver_wait]  # what scrapes read, swapped once
    recorder = _attach_recorder(collector, record, settings) if record and collector is not None else None
    try:
        server = AgentHTTPServer(
            settings.listen_address,
            lambda: source[0].snapshot,
            stale_after_s=settings.effective_stale_after_s,
            max_processes_per_gpu=settings.max_processes_per_gpu,
            gpu_labels=settings.gpu_labels,
            reports=store if settings.report_http else None,
            web=web,
        )
    except OSError as exc:
        if collector is not None:
            collector.stop()
        raise CliError(f"cannot listen on {settings.listen}: {exc.strerror or exc}") from None
    report_socket = None
    if store is not None and settings.report_socket:
        from agent.context.workload.report_socket import ReportSocketServer

        try:
            report_socket = ReportSocketServer(settings.report_socket, store, mode=settings.report_socket_mode)
            report_socket.start()
        except OSError as exc:
            server.server_close()
            if collector is not None:
                collector.stop()
            raise CliError(f"report_socket: cannot listen on {settings.report_socket}: {exc.strerror or exc}") from None

    wake = threading.Event()
    pending = {"stop": False, "reload": False}

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            pending["reload"] = True
        else:
            log.info("stopping", extra={"signal": signal.Signals(signum).name})
            pending["stop"] = True
        wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    reloader = Reloader(settings, read_settings, server)

    _freeze_startup_heap()
    if collector is not None:
        collector.start()
    server_thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="roofwatch-http", daemon=True)
    server_thread.start()
    log.info(
        "serving",
        extra={"url": server.url, "backend": collector.backend.name if collector else settings.backend,
               "gpus": len(collector.devices) if collector else 0, "interval_s": settings.interval_s},
    )
    if announce:
        print(f"roofwatch {__version__}: {len(collector.devices)} GPUs ({collector.backend.name} backend) on {server.url}", flush=True)
        print(f"  metrics: {server.url}metrics   health: {server.url}healthz   stop: Ctrl-C", flush=True)
    failure = None
    while True:  # the signal handler only raises flags; the work happens here, off the handler
        if driver_wait is not None and collector is None and driver_wait.expired:
            failure = driver_wait.give_up_message()
            break
        woken = wait_in_main_thread(wake, driver_wait.next_delay_s() if collector is None else None)
        if woken:
            wake.clear()
            if pending["stop"]:
                break
            if pending["reload"]:
                pending["reload"] = False
                reloader.reload()
        elif collector is None:
            collector = driver_wait.try_once()
            if collector is not None:
                recorder = _attach_recorder(collector, record, settings) if record else None
                collector.start()
                source[0] = collector
                log.info("collecting", extra={"backend": collector.backend.name, "gpus": len(collector.devices)})
    server.shutdown()
    if not server.drain(timeout_s=5.0):
        log.warning("stopping with requests still being answered after 5 s")
    server.server_close()
    if report_socket is not None:
        report_socket.close()
    if collector is not None:
        collector.stop(timeout=1.0)
    if recorder is not None:
        recorder.close()
    if failure is not None:
        raise CliError(failure)
    return EXIT_OK


def _web_config(settings: Settings):
    """TLS and basic auth, checked before any GPU is opened: a bad file is a usage error naming the field."""
    from exporters.web_config import WebConfigError, web_config_or_none

    try:
        return web_config_or_none(settings.web_config_file)
    except WebConfigError as exc:
        raise CliError(f"web_config_file: {exc}", EXIT_USAGE) from None


def _freeze_startup_heap() -> None:
    """Move everything alive after start-up (modules, the spec catalogue, the primed classifier)
    out of the collector's reach. Those objects live as long as the agent, yet every full
    collection walked them: a 20 ms pause on about one render in forty (docs/performance.md)."""
    import gc

    gc.collect()
    gc.freeze()


def _report_store(settings: Settings):
    """Where workload reports land (None when both transports are off); a bad token file stops the start."""
    if not settings.reports_enabled or settings.backend in DEMO_BACKENDS:
        return None  # the simulated fleet reports for its own jobs
    from agent.context.workload.report_store import ReportStore

    try:
        token = settings.read_report_token()
    except ConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    return ReportStore(ttl_s=settings.report_ttl_s, token=token, rate_per_s=settings.report_rate_per_s)


def _attach_recorder(collector, path: str, settings: Settings):
    from agent.trace import TraceWriteError
    from agent.trace.recorder import SnapshotRecorder

    try:
        recorder = SnapshotRecorder(path, node=collector.node)
    except (OSError, TraceWriteError) as exc:
        raise CliError(f"cannot write trace {path}: {exc}") from None
    collector.add_listener(recorder)
    return recorder


def cmd_run(args: argparse.Namespace) -> int:
    return _serve(lambda: _settings_from(args), args.record, announce=False)


def cmd_demo(args: argparse.Namespace) -> int:
    forced: dict[str, Any] = {"backend": args.backend}

    def read() -> Settings:
        settings = _settings_from(args, **forced)
        if args.listen is None and "listen" not in settings.model_fields_set:
            settings = _settings_from(args, listen=DEMO_LISTEN, **forced)
        return settings

    return _serve(read, args.record, announce=True)


def cmd_snapshot(args: argparse.Namespace) -> int:
    from agent.views.snapshot_text import snapshot_table
    from exporters.snapshot_json import snapshot_to_dict

    if args.url:
        from agent.views.snapshot_text import SnapshotFetchError, fetch_snapshot_json

        try:
            data = fetch_snapshot_json(args.url)
        except SnapshotFetchError as exc:
            raise CliError(str(exc)) from None
        print(json.dumps(data, indent=2) if args.json else snapshot_table(data))
        return EXIT_OK
    settings = _settings_from(args)
    collector = _make_collector(settings, _open(settings))
    try:
        # Two cycles: rate and two-sample (GPM) metrics need a previous reading.
        collector.collect_once()
        threading.Event().wait(min(settings.interval_s, 1.0))
        snapshot = collector.collect_once()
    finally:
        collector.stop()
    data = snapshot_to_dict(snapshot)
    print(json.dumps(data, indent=2) if args.json else snapshot_table(data))
    return EXIT_OK


def cmd_record(args: argparse.Namespace) -> int:
    from agent.trace import TraceWriteError

    if args.duration <= 0:
        raise CliError("--duration: must be greater than 0 seconds", EXIT_USAGE)
    if args.simulate:
        settings = _settings_from(args, backend="virtual")
        from agent.trace.recorder import record_simulation

        try:
            count = record_simulation(settings, Path(args.out), duration_s=args.duration)
        except TraceWriteError as exc:
            raise CliError(str(exc)) from None
        print(f"wrote {count} samples to {args.out}")
        return EXIT_OK
    settings = _settings_from(args)
    from agent.app.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    collector = _make_collector(settings, _open(settings))
    recorder = _attach_recorder(collector, args.out, settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    collector.start()
    wait_in_main_thread(stop, args.duration)
    collector.stop()
    recorder.close()
    print(f"wrote {recorder.count} samples to {args.out}")
    return EXIT_OK if recorder.error is None else EXIT_FAILURE


def _read_traces(paths: Sequence[str]) -> list:
    """Every sample of every trace; a bad line or file is a one-line error naming it."""
    from agent.trace import TraceFormatError, read_trace

    samples = []
    for path in paths:
        try:
            samples.extend(read_trace(path))
        except TraceFormatError as exc:
            raise CliError(str(exc)) from None
        except OSError as exc:
            raise CliError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    if not samples:
        raise CliError("no samples in " + ", ".join(paths))
    return samples


def _trace_classifier_settings(args: argparse.Namespace) -> tuple[Settings, str | None]:
    """Thresholds from --config; the dtype from --dtype, else the config's when it sets one."""
    settings = _settings_from(argparse.Namespace(config=args.config))
    return settings, args.dtype or (settings.dtype if "dtype" in settings.model_fields_set else None)


def cmd_classify(args: argparse.Namespace) -> int:
    from agent.classifier.engine import classify_samples
    from agent.classifier.evaluate import evaluate

    settings, dtype = _trace_classifier_settings(args)
    samples = _read_traces(args.traces)
    kept = []
    out = sys.stdout
    for verdict in classify_samples(samples, settings.classifier, dtype=dtype):
        if args.evaluate:
            kept.append(verdict)
        if not (args.quiet and args.evaluate):
            out.write(json.dumps(verdict.to_json(), separators=(",", ":")) + "\n")
    if args.evaluate:
        result = evaluate(kept)
        if result.scored == 0:
            raise CliError("nothing to evaluate: the trace has no labelled samples outside phase changes")
        if args.json:
            out.write(json.dumps({"evaluation": result.to_json()}) + "\n")
        else:
            out.write(result.table() + "\n")
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from agent.diagnostics.doctor import run_doctor

    logging.basicConfig(level=logging.ERROR)  # findings, not log lines
    report = run_doctor(_settings_from(args))
    print(json.dumps(report.to_json(), indent=2) if args.json else report.text())
    return report.exit_code


def cmd_top(args: argparse.Namespace) -> int:
    from agent.views.top import run_top

    return run_top(args)


def cmd_report(args: argparse.Namespace) -> int:
    from agent.classifier.engine import classify_samples
    from agent.views.report import build_report

    settings, dtype = _trace_classifier_settings(args)
    samples = _read_traces(args.traces)
    verdicts = list(classify_samples(samples, settings.classifier, dtype=dtype))
    html = build_report(samples, verdicts, title=args.title, sources=[Path(t).name for t in args.traces])
    out = Path(args.out)
    partial = out.with_name(f".{out.name}.partial")
    try:  # written whole or not at all: a reader never opens half a report
        partial.write_text(html, encoding="utf-8")
        partial.replace(out)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise CliError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(f"wrote {args.out}: {len(verdicts)} verdicts of {len({(s.node, s.gpu) for s in samples})} GPUs")
    return EXIT_OK


def cmd_specs(args: argparse.Namespace) -> int:
    from agent.views import specs_table

    if args.json:
        print(json.dumps(specs_table.specs_json(), indent=2))
    else:
        print(specs_table.specs_table())
    return EXIT_OK


COMMANDS = {
    "run": cmd_run,
    "demo": cmd_demo,
    "snapshot": cmd_snapshot,
    "record": cmd_record,
    "classify": cmd_classify,
    "specs": cmd_specs,
    "doctor": cmd_doctor,
    "top": cmd_top,
    "report": cmd_report,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        print(f"roofwatch {args.command}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `roofwatch classify TRACE | head`: the reader left, nothing is wrong
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
