"""Commands about this node's GPUs: ``snapshot``, ``record``, ``doctor``, ``selftest`` and ``top``."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from pathlib import Path
from typing import Callable

from agent.app.assemble import attach_recorder, make_collector, open_backend_or_fail
from agent.app.cli_base import BACKENDS, EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CliError, add_settings_flags, settings_from
from agent.app.config import DEFAULT_PORT
from agent.app.signals import SignalRequests


def register(sub: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add this group's subcommands to ``sub``; returns their handlers by name."""
    snap = sub.add_parser("snapshot", help="print one snapshot of this node's GPUs", description="Collect briefly and print what the agent sees.")
    add_settings_flags(snap, listen=False)
    snap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    snap.add_argument("--url", metavar="URL", help="read the snapshot from a running agent instead (e.g. http://node:9477)")

    rec = sub.add_parser("record", help="record a trace", description="Record samples to a trace file (format: docs/trace-format.md).")
    add_settings_flags(rec, listen=False)
    rec.add_argument("--out", required=True, metavar="FILE", help="trace file to write (.jsonl, or .jsonl.gz to compress)")
    rec.add_argument("--duration", type=float, default=60.0, metavar="SECONDS", help="how long to record (default 60)")
    rec.add_argument(
        "--simulate", action="store_true",
        help="write the virtual engine's samples in virtual time, labelled with the true class, without waiting",
    )

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

    selftest = sub.add_parser(
        "selftest", help="run calibrated workloads on one GPU and check roofwatch's counters, verdicts and MFU",
        description="Play short calibrated phases on one GPU (idle, bf16 and fp8 GEMM, device-to-device copy, tiny "
                    "kernels, a loader-starved loop, a wait on another stream) with PyTorch or CuPy, sample the GPU "
                    "through the agent's own backend meanwhile, and check each phase's counters, verdict and "
                    "counter MFU against what the phase should show (docs/nvidia.md). Writes a labelled trace per "
                    "phase and summary.json. Exit status: 0 every expectation holds, 3 some do not, 1 cannot run "
                    "(no GPU, or neither torch nor cupy), 2 usage error.",
    )
    selftest.add_argument("--gpu", type=int, default=0, metavar="N", help="NVML index of the GPU to test (default 0)")
    selftest.add_argument("--phase-seconds", type=float, default=12.0, metavar="SECONDS",
                          help="steady time per phase, 2 to 60 (default 12; 45 for hardware fixtures)")
    selftest.add_argument("--phases", metavar="LIST", help="comma-separated phases to run (default all)")
    selftest.add_argument("--interval", dest="sample_interval_s", type=float, default=0.25, metavar="SECONDS",
                          help="sampling interval (default 0.25; GPM needs 0.1 or more)")
    selftest.add_argument("--out", metavar="DIR", help="new or empty directory for the traces and summary.json "
                                                       "(default: roofwatch-selftest-HOST-TIME)")
    selftest.add_argument("--backend", choices=["auto", "nvml", "nvml-virtual"],
                          help="nvml (auto means the same) on a GPU node; nvml-virtual: the NVML code over a fake "
                               "driver whose simulated GPU plays each phase (the virtual runner)")
    selftest.add_argument("--runner", choices=["auto", "torch", "cupy"], default="auto",
                          help="library that runs the phases on a real GPU (default: torch, then cupy)")
    selftest.add_argument("--real-time", action="store_true",
                          help="nvml-virtual: play the phases in wall-clock time, sampling from a thread as on a GPU")
    selftest.add_argument("--scenario", metavar="NAME|FILE", help="nvml-virtual: the scenario whose node is simulated")
    selftest.add_argument("--virtual-node", metavar="NAME", help="nvml-virtual: which node of the scenario")
    selftest.add_argument("--config", metavar="FILE", help="YAML settings file (classifier thresholds, node name)")

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
    return {"snapshot": cmd_snapshot, "record": cmd_record, "doctor": cmd_doctor, "selftest": cmd_selftest,
            "top": cmd_top}


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
    settings = settings_from(args)
    collector = make_collector(settings, open_backend_or_fail(settings))
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


RECORD_WITHOUT_GPU = ("To record without a GPU: `roofwatch record --simulate` (a virtual fleet scenario, written as fast "
                      "as it is computed) or `roofwatch record --backend nvml-virtual` (the NVML backend over the fake "
                      "driver, in real time).")


def _wait_showing_progress(requests: SignalRequests, duration_s: float, count: Callable[[], int], out: str) -> None:
    """Wait out the recording (or a stop signal); on a terminal, one line overwritten each second says how far
    it is, so a minute of silence does not read as a hang. Nothing is written to a pipe or a file."""
    import sys
    import time

    tty = sys.stderr.isatty()
    started = time.monotonic()
    while (left := duration_s - (time.monotonic() - started)) > 0:
        if requests.wait(min(1.0, left), ("stop",)):
            break
        if tty:
            print(f"\rrecording to {out}: {time.monotonic() - started:.0f} of {duration_s:g} s, {count()} samples",
                  end="", file=sys.stderr, flush=True)
    if tty:
        print(file=sys.stderr)


def cmd_record(args: argparse.Namespace) -> int:
    from agent.trace import TraceWriteError

    if args.duration <= 0:
        raise CliError("--duration: must be greater than 0 seconds", EXIT_USAGE)
    if args.simulate:
        settings = settings_from(args, backend="virtual")
        from agent.virtual.recording import record_simulation

        try:
            count = record_simulation(settings.scenario, Path(args.out), node=settings.virtual_node,
                                      interval_s=settings.interval_s, duration_s=args.duration)
        except TraceWriteError as exc:
            raise CliError(str(exc)) from None
        print(f"wrote {count} samples to {args.out}")
        return EXIT_OK
    settings = settings_from(args)
    from agent.app.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    collector = make_collector(settings, open_backend_or_fail(settings, without_gpu=RECORD_WITHOUT_GPU))
    recorder = attach_recorder(collector, args.out, settings)
    requests = SignalRequests()
    requests.install({signal.SIGTERM: "stop", signal.SIGINT: "stop"})
    collector.start()
    _wait_showing_progress(requests, args.duration, lambda: recorder.count, args.out)
    collector.stop()
    requests.close()
    recorder.close()
    print(f"wrote {recorder.count} samples to {args.out}")
    return EXIT_OK if recorder.error is None else EXIT_FAILURE


def cmd_doctor(args: argparse.Namespace) -> int:
    from agent.diagnostics.doctor import run_doctor

    from agent.app.logs import configure_logging
    from agent.model.redact import hide

    settings = settings_from(args)
    configure_logging("error", settings.log_format)  # findings, not log lines: errors only, credentials hidden
    report = run_doctor(settings)
    print(hide(json.dumps(report.to_json(), indent=2) if args.json else report.text()))  # no credential it holds
    return report.exit_code


def cmd_selftest(args: argparse.Namespace) -> int:
    import socket
    import sys
    import time

    from agent.backends.options import BackendOptions
    from agent.diagnostics.selftest.phases import parse_phases
    from agent.diagnostics.selftest.selftest import Options, SelftestError, run_selftest

    logging.basicConfig(level=logging.ERROR)  # the report, not log lines
    settings = settings_from(args)
    virtual = settings.backend == "nvml-virtual"
    if settings.backend not in ("auto", "nvml", "nvml-virtual"):
        raise CliError(f"selftest runs on nvml (or auto) and nvml-virtual, not {settings.backend}", EXIT_USAGE)
    if not 2.0 <= args.phase_seconds <= 60.0:  # seven phases stay well under ten minutes
        raise CliError("--phase-seconds: between 2 and 60", EXIT_USAGE)
    if not 0.1 <= args.sample_interval_s <= args.phase_seconds / 4:
        raise CliError("--interval: at least 0.1 s (GPM's shortest span) and at most a quarter of a phase", EXIT_USAGE)
    if args.gpu < 0:
        raise CliError("--gpu: a GPU index, 0 or more", EXIT_USAGE)
    if virtual and args.runner != "auto":
        raise CliError(f"--runner {args.runner} needs a real GPU; nvml-virtual plays the phases itself", EXIT_USAGE)
    if not virtual and (args.real_time or args.scenario or args.virtual_node):
        raise CliError("--real-time, --scenario and --virtual-node go with --backend nvml-virtual", EXIT_USAGE)
    try:
        phases = parse_phases(args.phases)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    scenario = None
    if virtual and "scenario" in settings.model_fields_set:
        from agent.virtual.scenario import ScenarioError, resolve_scenario

        try:
            scenario = resolve_scenario(settings.scenario)
        except ScenarioError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
    out = Path(args.out or f"roofwatch-selftest-{socket.gethostname()}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CliError(f"--out {out}: exists and is not an empty directory; name a new one", EXIT_USAGE)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {out}: {exc.strerror or exc}") from None
    options = Options(gpu=args.gpu, phases=phases, phase_seconds=args.phase_seconds,
                      interval_s=args.sample_interval_s, backend=settings.backend, runner=args.runner,
                      real_time=args.real_time, thresholds=settings.classifier, settings=BackendOptions.of(settings),
                      scenario=scenario,
                      virtual_node=settings.virtual_node, progress=lambda line: print(line, file=sys.stderr, flush=True))
    try:
        summary = run_selftest(options)
    except SelftestError as exc:
        if created and not any(out.iterdir()):
            out.rmdir()  # made for this run, and nothing came of it
        raise CliError(str(exc), exc.code) from None
    from agent.trace import TraceWriteError

    print(summary.text())
    try:
        written = summary.write(out)
    except (OSError, TraceWriteError) as exc:
        raise CliError(f"cannot write the results to {out}: {exc}") from None
    print(f"wrote {len(written) - 2} trace(s), classifier.yaml and summary.json to {out}")
    return summary.exit_code


def cmd_top(args: argparse.Namespace) -> int:
    from agent.views.top import run_top

    return run_top(args)
