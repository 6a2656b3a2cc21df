"""Commands that need neither a GPU nor an agent: ``classify`` and ``report`` over recorded traces, and ``specs``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

from agent.app.cli_base import EXIT_OK, EXIT_USAGE, CliError, settings_from
from agent.app.config import Settings


def register(sub: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add this group's subcommands to ``sub``; returns their handlers by name."""
    cls = sub.add_parser(
        "classify", help="classify the GPUs of a recorded trace",
        description="Replay traces through the classifier and print one verdict per GPU per window as JSON Lines "
                    "(docs/trace-format.md). With --evaluate, score the verdicts against the trace's labels.",
    )
    cls.add_argument("traces", nargs="+", metavar="TRACE", help="trace file(s): .jsonl or .jsonl.gz, - for stdin")
    cls.add_argument("--evaluate", action="store_true", help="print per-class precision, recall and the confusion matrix")
    cls.add_argument("--json", action="store_true", help="print the evaluation as one JSON line instead of a table")
    cls.add_argument("-q", "--quiet", action="store_true", help="do not print the verdict lines (with --evaluate)")
    cls.add_argument("--config", metavar="FILE", help="YAML settings file whose classifier: section sets the thresholds")
    cls.add_argument("--dtype", choices=["fp8", "bf16", "fp16", "tf32", "fp32", "fp64"],
                     help="precision behind the peak FLOP/s when the trace does not say (default bf16, flagged as assumed)")
    cls.add_argument("--skip-bad-lines", action="store_true", help=SKIP_HELP)
    add_max_gpus_flag(cls)

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
    report.add_argument("--skip-bad-lines", action="store_true", help=SKIP_HELP)
    add_max_gpus_flag(report)

    _register_fleet_report(sub)

    specs = sub.add_parser("specs", help="print the GPU peak-spec catalogue", description="Print dense peak FLOP/s, bandwidth and ridge points per GPU model.")
    specs.add_argument("--json", action="store_true", help="print JSON (SI units)")
    return {"classify": cmd_classify, "report": cmd_report, "specs": cmd_specs, "fleet-report": cmd_fleet_report}


SKIP_HELP = ("skip lines that break the trace contract (and a cut-off gzip end) with one warning that counts them, "
             "instead of stopping at the first with exit status 2: for a long recording whose agent was killed")


def _max_gpus(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of GPUs, at least 1 (got {text[:40]!r})")
    return value


def add_max_gpus_flag(parser: argparse.ArgumentParser) -> None:
    from agent.trace.reader import DEFAULT_MAX_GPUS

    parser.add_argument("--max-gpus", type=_max_gpus, default=DEFAULT_MAX_GPUS, metavar="N",
                        help=f"refuse traces that name more than N distinct GPUs (node, gpu) in all (default "
                             f"{DEFAULT_MAX_GPUS}; each costs memory in every evaluation)")


def read_traces(paths: Sequence[str], *, skip_bad_lines: bool = False, command: str = "classify",
                max_gpus: int | None = None) -> list:
    """Every sample of every trace. A bad line stops with exit status 2 naming its file and line;
    with ``skip_bad_lines`` bad lines are skipped and one warning on stderr counts them. The traces
    together may name at most ``max_gpus`` distinct GPUs (default the reader's): the first sample of
    one more stops with exit status 2 naming its file and line and the flag, skipping or not. Values no GPU
    can produce (agent/model/bounds.py, the table the live collector applies) are dropped from their sample
    (unknown, not 0) and one warning counts them and names the first."""
    from agent.model.bounds import bound_sample
    from agent.trace import TraceFormatError, TraceReader
    from agent.trace.reader import DEFAULT_MAX_GPUS, TooManyGpus

    samples = []
    skipped = read = rejected = 0
    first: TraceFormatError | None = None
    first_rejected: str | None = None
    gpus: set[tuple[str, str]] = set()  # one limit for all the traces replayed together
    for path in paths:
        try:
            reader = TraceReader(path, strict=not skip_bad_lines, max_gpus=max_gpus or DEFAULT_MAX_GPUS, gpus=gpus)
            for sample in reader:
                sample, dropped = bound_sample(sample)
                samples.append(sample)
                if dropped:
                    rejected += len(dropped)
                    first_rejected = first_rejected or (f"{path}, GPU {sample.gpu[:40]!r} at ts {sample.ts:g}: "
                                                        f"{dropped[0].field} = {dropped[0].value:.6g}, outside "
                                                        f"{dropped[0].bound}")
        except TooManyGpus as exc:
            raise CliError(f"{exc} (--max-gpus N raises the limit)", EXIT_USAGE) from None
        except TraceFormatError as exc:
            hint = "" if skip_bad_lines else " (--skip-bad-lines skips such lines)"
            raise CliError(f"{exc}{hint}", EXIT_USAGE) from None
        except OSError as exc:
            raise CliError(f"cannot read trace {path}: {exc.strerror or exc}") from None
        skipped += reader.error_count
        read += reader.lines_read
        first = first or (reader.errors[0] if reader.errors else None)
    if rejected:  # dropped as the live agent drops them (agent/model/bounds.py); one line for them all
        print(f"roofwatch {command}: dropped {rejected} reading{'s' if rejected != 1 else ''} outside their physical "
              f"bounds (unknown, not 0); the first: {first_rejected}", file=sys.stderr)
    if skipped:
        print(f"roofwatch {command}: skipped {skipped} bad line{'s' if skipped != 1 else ''} of {read}; "
              f"the first: {first}", file=sys.stderr)
    if not samples:
        raise CliError("no samples in " + ", ".join(paths))
    return samples


def trace_classifier_settings(args: argparse.Namespace) -> tuple[Settings, str | None]:
    """Thresholds from --config; the dtype from --dtype, else the config's when it sets one."""
    settings = settings_from(argparse.Namespace(config=args.config))
    return settings, args.dtype or (settings.dtype if "dtype" in settings.model_fields_set else None)


def cmd_classify(args: argparse.Namespace) -> int:
    from agent.classifier.engine import classify_samples
    from agent.classifier.evaluate import evaluate

    settings, dtype = trace_classifier_settings(args)
    samples = read_traces(args.traces, skip_bad_lines=args.skip_bad_lines, command="classify", max_gpus=args.max_gpus)
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


def cmd_report(args: argparse.Namespace) -> int:
    from agent.app.output_files import OutputRefused, check_target, write_whole
    from agent.classifier.engine import classify_samples
    from agent.views.report import build_report

    try:
        check_target(Path(args.out))  # before the work: a refusal should not cost a replay
    except OutputRefused as exc:
        raise CliError(f"--out: {exc}", EXIT_USAGE) from None

    settings, dtype = trace_classifier_settings(args)
    samples = read_traces(args.traces, skip_bad_lines=args.skip_bad_lines, command="report", max_gpus=args.max_gpus)
    verdicts = list(classify_samples(samples, settings.classifier, dtype=dtype))
    html = build_report(samples, verdicts, title=args.title, sources=[Path(t).name for t in args.traces])
    try:  # written whole or not at all, through a temporary file nobody could have planted
        write_whole(args.out, html.encode("utf-8", "replace"))  # names are printable already (safe_text)
    except OutputRefused as exc:
        raise CliError(f"--out: {exc}", EXIT_USAGE) from None
    except OSError as exc:
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


def _register_fleet_report(sub: argparse._SubParsersAction) -> None:
    fleet = sub.add_parser(
        "fleet-report", help="the weekly efficiency review of a fleet, from Prometheus, as one HTML page",
        description="Query a Prometheus-compatible store (Prometheus, VictoriaMetrics, Thanos, Mimir) for the fleet's "
                    "GPU-hours by class, wasted GPU-hours and their cost, MFU distribution, worst jobs, straggler and "
                    "jitter incidents and energy, against the previous period; write one self-contained HTML page "
                    "(docs/fleet-report.md).")
    fleet.add_argument("--prometheus", required=True, action="append", metavar="URL",
                       help="the store's API root, e.g. http://prometheus:9090; once per cluster store to merge "
                            "their answers (one --deadline for all; a store that fails is listed on the page)")
    fleet.add_argument("--range", default="7d", metavar="DURATION", help="period to review (default 7d; 10m to 400d)")
    fleet.add_argument("--end", metavar="TIME", help="end of the period: unix seconds or RFC 3339 (default now)")
    fleet.add_argument("--cluster", metavar="C", help="only series whose cluster label is C")
    fleet.add_argument("--out", default="fleet.html", metavar="FILE", help="HTML file to write (default fleet.html)")
    fleet.add_argument("--json", metavar="FILE", help="also write the computed numbers as JSON")
    fleet.add_argument("--source", choices=["roofwatch", "aggregates", "dcgm", "amd"], default="roofwatch",
                       help="roofwatch agents' series (default); the recording rules' aggregates alone (aggregates: "
                            "a global store that holds no per-GPU series); or dcgm-exporter's (dcgm) or AMD Device "
                            "Metrics Exporter's (amd) classified by roofwatch's classifier")
    fleet.add_argument("--cost-per-gpu-hour", dest="costs", action="append", default=[], metavar="MODEL=USD",
                       help="price of a GPU-hour by spec (h100-sxm) or model name; default=USD for the rest (default 2.0)")
    fleet.add_argument("--header", dest="headers", action="append", default=[], metavar="'NAME: VALUE'",
                       help="extra HTTP header for every query (e.g. X-Scope-OrgID: team-a for Mimir)")
    fleet.add_argument("--bearer-token-file", metavar="FILE", help="send the token in FILE as a bearer token")
    fleet.add_argument("--basic-auth-file", metavar="FILE", help="send user:password from FILE as basic auth")
    fleet.add_argument("--timeout", dest="timeout_s", type=float, default=60.0, metavar="SECONDS",
                       help="per-query timeout, passed to the server too (default 60)")
    fleet.add_argument("--deadline", dest="deadline_s", type=float, default=None, metavar="SECONDS",
                       help="for the whole command: queries not answered by then are listed as not computed "
                            "(default 5 x (--timeout + 5 s): 325)")
    fleet.add_argument("--top", type=int, default=25, metavar="N", help="rows of the worst-jobs and incident tables (default 25)")
    fleet.add_argument("--max-gpus", type=int, default=64, metavar="N", help="--source dcgm/amd: GPUs read at most (default 64)")
    fleet.add_argument("--amd-profiler-window-us", dest="amd_window_us", type=float, default=1000.0, metavar="US",
                       help="--source amd: rocpctl's sampling window in microseconds, which /metrics does not say "
                            "(the agent's amd_exporter_profiler_window_us; default 1000, DME 1.4.1+)")
    fleet.add_argument("--title", metavar="TEXT", help="page title")
    fleet.add_argument("--config", metavar="FILE", help="YAML settings file whose classifier: section sets the thresholds (dcgm, amd)")


def cmd_fleet_report(args: argparse.Namespace) -> int:
    from agent.app.output_files import OutputRefused, check_target, write_whole
    from agent.views.fleet_report.render import build_page
    from agent.views.fleet_report.run import OptionError, Options, build, outcome, terminal_progress

    for flag, target in (("--out", args.out), ("--json", args.json)):
        try:
            if target:
                check_target(Path(target))
        except OutputRefused as exc:
            raise CliError(f"{flag}: {exc}", EXIT_USAGE) from None
    settings = settings_from(argparse.Namespace(config=args.config))
    opts = Options(prometheus=args.prometheus, range=args.range, end=args.end, cluster=args.cluster, source=args.source,
                   costs=args.costs, headers=args.headers, bearer_token_file=args.bearer_token_file,
                   basic_auth_file=args.basic_auth_file, timeout_s=args.timeout_s, deadline_s=args.deadline_s, top=args.top,
                   max_gpus=args.max_gpus, amd_window_us=args.amd_window_us, title=args.title)
    progress = terminal_progress()
    try:
        report = build(opts, settings.classifier, progress)
    except OptionError as exc:
        raise CliError(str(exc), EXIT_USAGE if exc.usage else 1) from None
    finally:
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[K")
    outputs = [(args.out, build_page(report, title=args.title))]
    if args.json:
        outputs.append((args.json, report.to_json_text(indent=1) + "\n"))
    for target, text in outputs:
        try:
            write_whole(target, text.encode("utf-8", "replace"))
        except OutputRefused as exc:
            raise CliError(f"{'--out' if target == args.out else '--json'}: {exc}", EXIT_USAGE) from None
        except OSError as exc:
            raise CliError(f"cannot write {target}: {exc.strerror or exc}") from None
    print(outcome(report, args.out))
    return EXIT_OK
