"""What a TGI router's ``/metrics`` says about one serving job at one virtual time.

TGI exports through the Rust ``metrics-exporter-prometheus`` crate, not prometheus_client, so its
page looks different and is written by hand here: ``# TYPE`` lines without ``# HELP``, counters
without a ``_total`` suffix and without ``_created``, no model or rank labels, no
``process_start_time_seconds``, numbers in Rust's shortest form (``24``, not ``24.0``). Buckets
as ``router/src/server.rs`` sets them: every ``*duration`` histogram 0.0001 x 1.5^k for k = 1..35,
input lengths ``max_input_tokens / 100 x (i + 1)`` and generated tokens ``max_total_tokens / 100 x
(i + 1)`` for i = 0..99. Names as agent.context.workload.inference.serving_parse lists them.
"""

from __future__ import annotations

from typing import Sequence

from agent.virtual.serving.figures import tgi_token_budget
from agent.virtual.serving.job import Observed, ServingJob


def _durations() -> tuple[float, ...]:
    """``value *= 1.5`` from 0.0001, 35 times: by repeated multiplication, as the router computes them."""
    out, value = [], 0.0001
    for _ in range(35):
        value *= 1.5
        out.append(value)
    return tuple(out)


TGI_DURATION_BUCKETS = _durations()


def request_limits(prompt_tokens: float, output_tokens: float) -> tuple[int, int]:
    """(max_input_tokens, max_total_tokens) a launcher would be given for these requests: the next power of
    two of at least 4096 that holds prompt and output, and one less for the input."""
    total = 4096
    while total < prompt_tokens + output_tokens:
        total *= 2
    return total - 1, total


def rust_number(value: float) -> str:
    """A number as Rust's ``Display`` writes it: whole numbers without a fraction, others shortest round-trip."""
    if value == int(value) and abs(value) < 1e16:
        return str(int(value))
    return repr(float(value))


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


def _histogram(lines: list[str], name: str, series: Sequence[tuple[dict[str, str], Observed]],
               bounds: Sequence[float]) -> None:
    lines.append(f"# TYPE {name} histogram")
    for labels, observed in series:
        for bound, count in zip([*map(rust_number, bounds), "+Inf"], observed.cumulative(bounds)):
            lines.append(f"{name}_bucket{_labels({**labels, 'le': bound})} {rust_number(count)}")
        lines.append(f"{name}_sum{_labels(labels)} {rust_number(observed.sum)}")
        lines.append(f"{name}_count{_labels(labels)} {rust_number(observed.count)}")


def _scalar(lines: list[str], name: str, kind: str, series: Sequence[tuple[dict[str, str], float]]) -> None:
    lines.append(f"# TYPE {name} {kind}")
    lines.extend(f"{name}{_labels(labels)} {rust_number(value)}" for labels, value in series)


def tgi_metrics(job: ServingJob, t: float, start: float) -> bytes:
    """The router's page at virtual time ``t`` (``start``, the server's start, is not exported by TGI)."""
    f = job.figures_at(t)
    totals = job.totals(t)
    c, o = totals.counters, totals.observed
    steady = f or next(x for x in job.figures if x is not None)
    used, budget = tgi_token_budget(steady, job.kv_bytes_per_token)
    used = used if f is not None else 0
    max_input, max_total = request_limits(steady.prompt_tokens, steady.output_tokens)
    decode_forward = o["decode_forward"]
    prefill = Observed(o["prefill_forward"].points)
    lines: list[str] = []
    _scalar(lines, "tgi_request_count", "counter", [({}, c["requests"])])
    _scalar(lines, "tgi_request_success", "counter", [({}, c["requests"])])
    _scalar(lines, "tgi_queue_size", "gauge", [({}, f.waiting if f else 0.0)])
    _scalar(lines, "tgi_batch_current_size", "gauge", [({}, f.running if f else 0.0)])
    _scalar(lines, "tgi_batch_current_max_tokens", "gauge", [({}, float(used))])
    _scalar(lines, "tgi_batch_max_total_tokens", "gauge", [({}, float(budget))])
    calls = [({"method": "prefill"}, prefill.count), ({"method": "decode"}, decode_forward.count)]
    _scalar(lines, "tgi_batch_inference_count", "counter", calls)
    _scalar(lines, "tgi_batch_inference_success", "counter", calls)
    _histogram(lines, "tgi_batch_forward_duration", [({"method": "decode"}, decode_forward), ({"method": "prefill"}, prefill)],
               TGI_DURATION_BUCKETS)
    _histogram(lines, "tgi_request_input_length", [({}, o["prompt_len"])],
               [max_input / 100.0 * (i + 1) for i in range(100)])
    _histogram(lines, "tgi_request_generated_tokens", [({}, o["output_len"])],
               [max_total / 100.0 * (i + 1) for i in range(100)])
    for name, key in (("tgi_request_mean_time_per_token_duration", "request_tpot"), ("tgi_request_queue_duration", "queue"),
                      ("tgi_request_inference_duration", "inference"), ("tgi_request_duration", "e2e")):
        _histogram(lines, name, [({}, o[key])], TGI_DURATION_BUCKETS)
    return ("\n".join(lines) + "\n").encode()
