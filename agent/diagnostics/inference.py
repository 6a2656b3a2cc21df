"""``roofwatch doctor`` on the configured inference servers: reachable, recognised, and which serving signals they give.

A serving verdict rests on what the server exports (batch, queue, KV-cache usage, inter-token
latency, prefill time) and on what only the configuration can say (the model's weight bytes): each
finding names what is there, what is missing, and what that costs. One scrape per endpoint, with
the agent's own fetch and parser, so doctor sees what the agent will see: the line names the workload
figures (tokens/s only with both token counters), the serving signals, the lines of the body that
were no sample (how many, and the first), and which GPUs the figures reach.
"""

from __future__ import annotations

from typing import Any

from agent.context.workload.inference.fetch import describe_error, http_fetch
from agent.context.workload.inference.parse import Exposition, ExpositionError, Totals, parse, recognise, totals
from agent.diagnostics.findings import Finding
from agent.model.redact import safe_url
from exporters.metrics.labels import clip_label

MAX_BYTES = 4 * 1024 * 1024
SIGNALS = (("running", "running requests"), ("waiting", "waiting requests"), ("kv_usage", "KV-cache usage"),
           ("itl", "inter-token latency"), ("prefill_s", "prefill time"), ("ttft", "time to first token"),
           ("preemptions", "preemptions"), ("kv_pool_tokens", "KV-cache pool size"))
"""Serving figures the agent reads (:class:`ServingTotals` field, words), in the order the line names them."""
EXTRAS = (("max_running", "running-batch cap"),)
"""Figures few servers export (SGLang <= 0.3 the batch cap): named when there, never listed as missing."""
WORKLOAD = (("engine steps", ("steps",)), ("server FLOP estimates", ("flops",)),
            ("server byte estimates", ("read_bytes", "write_bytes")))
"""Workload figures besides tokens/s (words, the :class:`Totals` fields any of which gives them)."""


def inference_findings(settings: Any, *, timeout_s: float | None = None) -> list[Finding]:
    """One finding per configured endpoint (none when no endpoint is configured)."""
    timeout = timeout_s if timeout_s is not None else getattr(settings, "inference_timeout_s", 2.0)
    endpoints, models = getattr(settings, "inference_endpoints", ()), getattr(settings, "models", {})
    no_pids = getattr(settings, "backend", None) == "dcgm-exporter"
    return [_matched(i, endpoint, _endpoint(i, endpoint, models, timeout), no_pids) for i, endpoint in enumerate(endpoints)]


def _matched(i: int, ep: Any, finding: Finding, no_pids: bool) -> Finding:
    """Which GPUs the server's figures will reach. Without ``gpus`` the agent finds them by the server's
    PIDs among each GPU's processes; ``--backend dcgm-exporter`` has no process list, so there the
    figures would reach no GPU: a warning, whatever the scrape found."""
    if ep.gpus is not None:
        return Finding(finding.check, finding.status, finding.detail + f"; used for GPUs {', '.join(ep.gpus)}",
                       finding.impact, finding.fix)
    if not no_pids:
        return Finding(finding.check, finding.status, finding.detail + "; used for the GPUs its processes hold",
                       finding.impact, finding.fix)
    return Finding(finding.check, "warn", finding.detail + "; used for no GPU: with --backend dcgm-exporter there is "
                   "no process list to find the GPUs it runs on", "its serving figures, workload MFU/MBU and serving "
                   "view", f"set inference_endpoints[{i}].gpus to the GPU indexes or UUIDs the server runs on")


def _endpoint(i: int, ep: Any, models: dict[str, Any], timeout_s: float) -> Finding:
    check = f"inference endpoint {safe_url(ep.url)}"
    costs = "workload MFU/MBU and the serving view (decode floor, TPOT/floor, advice) of the GPUs it serves"
    try:
        expo = parse(http_fetch(ep.url, timeout_s, MAX_BYTES))
        kind = recognise(expo, ep.kind)
        current = totals(expo, kind)
    except Exception as exc:
        detail = str(exc) if isinstance(exc, ExpositionError) else describe_error(exc, timeout_s)
        return Finding(check, "warn", detail, costs, "check the URL (vLLM, SGLang and TGI serve /metrics on their API port; "
                       "SGLang needs --enable-metrics, llama.cpp's server --metrics; Triton serves them on "
                       "its metrics port, 8002 by default) and that the agent can reach it")
    serving = current.serving
    present = [label for name, label in SIGNALS if serving is not None and getattr(serving, name) is not None]
    missing = [label for name, label in SIGNALS if label not in present]
    present += [label for name, label in EXTRAS if serving is not None and getattr(serving, name) is not None]
    model = ep.model or (current.models[0] if len(current.models) == 1 else None)
    facts = models.get(model) if model else None
    weights = ep.model_bytes if ep.model_bytes is not None else getattr(facts, "model_bytes", None)
    names = ", ".join(clip_label(name) for name in ((model,) if model else current.models))
    detail = (f"{kind}, model {names or 'not named'}; workload figures: "
              f"{_workload(current)}; serving signals: {', '.join(present) or 'none'}"
              + (f"; not exported: {', '.join(missing)}" if missing else "") + _skipped(expo))
    refused = [note for note in (expo.refused_note, serving.rejected.note() if serving is not None else None) if note]
    if refused:
        return Finding(check, "warn", detail + "; " + "; ".join(refused), "the refused series' and values' share of "
                       "the serving figures (the rest are kept)", "check that the URL is the inference server's own "
                       "metrics (a server serves a handful of models and engines, and no latency of hours); "
                       "docs/serving.md lists the bounds")
    if weights is None:
        name = clip_label(model) if model else "<model name>"  # as every view shows a name
        return Finding(check, "warn", detail + "; weight bytes unknown", "the decode floor, TPOT/floor and the serving "
                       "advice (the serving state stays unknown)", f"set inference_endpoints[{i}].model_bytes, or "
                       f"models: {{{name!r}: {{model_bytes: ...}}}} (parameters x bytes per parameter)")
    gaps = [(impact, fix) for lacking, impact, fix in (
        ("inter-token latency" in missing, "TPOT/floor and the serving state",
         "upgrade the server: its metrics lack an inter-token latency histogram"),
        (not current.has_tokens, "workload MFU/MBU of the GPUs it serves",
         "a server release that exports both token counters, reached without a filter in between"),
    ) if lacking]
    if gaps:
        impacts, fixes = zip(*gaps)
        return Finding(check, "warn", detail, "; ".join(impacts), "; ".join(fixes))
    return Finding(check, "ok", detail + f"; weights {weights / 1e9:.3g} GB")


def _workload(current: Totals) -> str:
    """What the workload report (MFU/MBU) will rest on: tokens/s needs both token counters, so a server
    with one or none gives no tokens/s, and the line says so rather than implying a zero."""
    used = [label for label, fields in WORKLOAD if any(getattr(current, f) is not None for f in fields)]
    if current.has_tokens:
        return ", ".join(["tokens/s", *used])
    have = [name for name, series in (("prompt", current.prompt), ("generated", current.generated))
            if series is not None]
    lacking = f"only the {have[0]} token counter" if have else "no token counters"
    return ", ".join([*used, f"no tokens/s ({lacking})"])


def _skipped(expo: Exposition) -> str:
    """How many lines of the body were no sample (a pasted ``curl`` line, a proxy's banner), and the first."""
    if not expo.skipped:
        return ""
    return f"; {expo.skipped} unreadable line{'s' if expo.skipped != 1 else ''} skipped, first {expo.first_bad}"
