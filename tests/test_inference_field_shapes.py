"""Inference servers as the field has them: published ``/metrics`` bodies read as the agent reads them.

Each capture under tests/fixtures/captures/{vllm,sglang,tgi-style,llamacpp} (copied byte for byte from the
project's shared set; README.md there says where each was published) is parsed, recognised and
totalled. The expected kind, model and figures are read off the capture's own lines, quoted next to
each case, never taken from the parser's output. Excerpts, old releases, forks and re-exporters lack
the token counters, so a server must be known by any of its families, and a pasted ``curl`` or
``$ kubectl`` line must cost one skipped line, not the body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

import agent.diagnostics.inference as doctor_inference
from agent.app.config import Settings
from agent.context.workload.inference.endpoint import InferenceEndpoint
from agent.context.workload.inference.parse import ExpositionError, detect, parse, totals
from agent.context.workload.inference.scraper import InferenceScraper

CAPTURES = Path(__file__).parent / "fixtures" / "captures"
T0, DT = 1_000.0, 5.0


@dataclass(frozen=True)
class Shape:
    """What one capture shows, read off its lines."""

    file: str
    kind: str
    models: tuple[str, ...]
    figures: dict[str, float | None] = field(default_factory=dict)
    """ServingTotals field -> value (None: the capture has no such series)."""
    counters: dict[str, float | None] = field(default_factory=dict)
    """Totals counter field -> the summed value of its series (None: not in the capture)."""


LLAMA32 = "/shared/public/elr-models/meta-llama/Llama-3.2-3B/5cc0ffe09ee49f7be6ca7c794ee6bd7245e84e60/"
SHAPES = [
    # vllm:num_requests_running / _waiting / kv_cache_usage_perc {engine="0",...} 0.0; cache_config_info
    # num_gpu_blocks="101625" block_size="16"; prompt/generation_tokens_total 0.0; iteration_tokens_total_count 0.0.
    Shape("vllm/kops-qwen05b-v1-idle.txt", "vllm", ("Qwen/Qwen2.5-0.5B-Instruct",),
          {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0, "kv_pool_tokens": 101625 * 16.0},
          {"prompt": 0.0, "generated": 0.0, "steps": 0.0, "flops": 0.0}),
    # V0 gauges only: num_requests_running 0.0, num_requests_waiting 0.0, gpu_cache_usage_perc 0.0.
    Shape("vllm/prodstack318-qwen25coder32b-v0-excerpt.txt", "vllm", ("Qwen/Qwen2.5-Coder-32B-Instruct",),
          {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0, "itl": None},
          {"prompt": None, "generated": None, "steps": None}),
    # cache_config_info block_size="16" num_gpu_blocks="2048"; model_name="qwenvl" gauges all 0.0.
    Shape("vllm/qwen3vl55-cacheconfig-v0-excerpt.txt", "vllm", ("qwenvl",),
          {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0, "kv_pool_tokens": 2048 * 16.0},
          {"prompt": None, "generated": None}),
    # sglang:num_running_reqs 0.0 and sglang:token_usage 0.0; no queue gauge in the excerpt.
    Shape("sglang/pr4444-llama3-8b-idle-excerpt.txt", "sglang", ("/shared/public/models/Meta-Llama-3-8B-Instruct",),
          {"running": 0.0, "waiting": None, "kv_usage": 0.0}, {"prompt": None, "generated": None}),
    # {name="..."}: max_total_num_tokens 570979.0, max_running_requests 2231.0 (the batch cap), prompt_tokens_total
    # 230794.0, nothing else the agent reads.
    Shape("sglang/pr1853-llama32-3b-name-label-excerpt.txt", "sglang", (LLAMA32,),
          {"running": None, "waiting": None, "kv_usage": None, "kv_pool_tokens": 570979.0, "max_running": 2231.0},
          {"prompt": 230794.0, "generated": None}),
    # num_requests_running 0.0, num_requests_waiting 0.0, token_usage 0.0 (queue_req 0.0 beside them).
    Shape("sglang/pr1461-gemma2-9b-wip-excerpt.txt", "sglang", ("google/gemma-2-9b-it",),
          {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}, {"prompt": None, "generated": None}),
    # sglang_cuda_graph_passes_total{mode="decode_cuda_graph",...,tp_rank="0",...} 311.
    Shape("sglang/smg813-underscore-names-excerpt.txt", "sglang", ("meta-llama/Llama-3.1-8B-Instruct",),
          {"running": None, "waiting": None, "kv_usage": None}, {"steps": 311.0, "prompt": None}),
    # tgi_queue_size 0.0, tgi_batch_current_size 0.0; no model label anywhere (TGI exports none).
    # The prefill histogram is cut before its _sum and _count: no time to first token yet.
    Shape("tgi-style/ibmvllm18-tgis-excerpt.txt", "tgi", (),
          {"running": 0.0, "waiting": 0.0, "kv_usage": None, "itl": None, "ttft": None}, {"prompt": None, "steps": None}),
    # llamacpp:prompt_tokens_total 143, prompt_seconds_total 8.168, tokens_predicted_total 673,
    # tokens_predicted_seconds_total 29.567; no gauges, no labels, no n_decode_total in the excerpt.
    Shape("llamacpp/llamacpp-pr13196-vulkan-metrics-excerpt.txt", "llamacpp", (),
          {"running": None, "waiting": None, "kv_usage": None, "prefill_s": 8.168, "decode_s": 29.567},
          {"prompt": 143.0, "generated": 673.0, "steps": None}),
]


def capture(file: str) -> str:
    return (CAPTURES / file).read_text(encoding="utf-8")


SHAPE_OF = {shape.file: shape for shape in SHAPES}
INFERENCE_CAPTURES = sorted(str(p.relative_to(CAPTURES)) for d in ("vllm", "sglang", "tgi-style", "llamacpp")
                            for p in (CAPTURES / d).glob("*.txt"))


@pytest.mark.parametrize("file", INFERENCE_CAPTURES)
def test_each_capture_reads_as_its_server_with_the_figures_it_shows(file: str):
    """Every inference capture on disk, so one added without its shape fails here."""
    assert file in SHAPE_OF, f"{file}: add what it shows to SHAPES"
    shape = SHAPE_OF[file]
    expo = parse(capture(file))
    assert detect(expo) == shape.kind
    current = totals(expo, shape.kind)
    assert current.models == shape.models
    for name, expected in shape.figures.items():
        assert getattr(current.serving, name) == expected, name
    for name, expected in shape.counters.items():
        series = getattr(current, name)
        assert (None if series is None else sum(series.values())) == expected, name
    assert expo.skipped == 0, expo.first_bad  # the captures hold no stray line: every line is read


def with_shell_lines(text: str) -> str:
    """The capture with a ``$ kubectl`` line and a ``curl`` line pasted into its middle."""
    lines = text.splitlines(keepends=True)
    middle = len(lines) // 2
    return "".join(lines[:middle] + ["$ kubectl -n llm exec deploy/sglang -- curl -s localhost:30000/metrics\n",
                                     "curl -s http://127.0.0.1:30000/metrics | grep sglang\n"] + lines[middle:])


def test_shell_lines_in_the_middle_are_skipped_and_counted_and_the_series_kept():
    text = with_shell_lines(capture("sglang/pr1461-gemma2-9b-wip-excerpt.txt"))
    expo = parse(text)
    assert expo.skipped == 2
    assert expo.first_bad is not None and expo.first_bad.startswith("line 14: '$ kubectl -n llm exec")
    current = totals(expo, detect(expo))
    assert (current.kind, current.models) == ("sglang", ("google/gemma-2-9b-it",))
    assert (current.serving.running, current.serving.waiting, current.serving.kv_usage) == (0.0, 0.0, 0.0)


def test_a_body_of_shell_lines_only_fails_in_one_printable_line_that_counts_them():
    with pytest.raises(ExpositionError) as caught:
        parse("$ kubectl exec vllm-0 -- curl localhost:8000/metrics\ncurl: (7) Failed to connect \x1b[2J\n")
    message = str(caught.value)
    assert message.startswith("not a Prometheus text exposition") and "2 unreadable lines" in message
    assert "line 1: '$ kubectl exec" in message and message.isprintable()


def _fetching(body: str):
    return lambda url, timeout_s, max_bytes: body.encode("utf-8")


def test_a_server_without_token_counters_still_reports_its_queue_and_kv_cache():
    """prodstack318's V0 excerpt: running, waiting and KV usage at 0.0, no token counter."""
    body = capture("vllm/prodstack318-qwen25coder32b-v0-excerpt.txt")
    scraper = InferenceScraper([InferenceEndpoint(url="http://127.0.0.1:8000/metrics", gpus=["0"])],
                               fetch=_fetching(body))
    scraper.scrape_once(now=T0)
    scraper.scrape_once(now=T0 + DT)
    (status,) = scraper.status()
    assert status.up and status.kind == "vllm" and status.models == ("Qwen/Qwen2.5-Coder-32B-Instruct",), status.error
    report = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    assert report is not None and report.tokens_per_s is None and report.step is None
    serving = report.serving
    assert (serving.running, serving.waiting, serving.kv_usage) == (0.0, 0.0, 0.0)
    assert serving.model == "Qwen/Qwen2.5-Coder-32B-Instruct" and serving.generated_tokens_per_s is None


def doctor_line(monkeypatch: pytest.MonkeyPatch, body: str, **endpoint) -> doctor_inference.Finding:
    monkeypatch.setattr(doctor_inference, "http_fetch", _fetching(body))
    settings = Settings(backend="nvml-virtual", inference_endpoints=[{"url": "http://127.0.0.1:8000", **endpoint}])
    (finding,) = doctor_inference.inference_findings(settings, timeout_s=1.0)
    return finding


def test_doctor_names_what_the_agent_uses_from_a_whole_vllm_body(monkeypatch):
    found = doctor_line(monkeypatch, capture("vllm/kops-qwen05b-v1-idle.txt"), model_bytes=1e9, gpus=["0"])
    assert found.status == "ok", found
    assert found.detail.startswith("vllm, model Qwen/Qwen2.5-0.5B-Instruct; workload figures: tokens/s, engine steps, "
                                   "server FLOP estimates, server byte estimates; serving signals: running requests, "
                                   "waiting requests, KV-cache usage, inter-token latency, prefill time")
    assert "unreadable" not in found.detail and found.detail.endswith("; used for GPUs 0")


def test_doctor_says_a_body_without_token_counters_gives_no_tokens_per_second(monkeypatch):
    found = doctor_line(monkeypatch, capture("sglang/pr4444-llama3-8b-idle-excerpt.txt"), model_bytes=16e9)
    assert found.status == "warn" and "workload MFU/MBU" in found.impact, found
    assert "sglang, model /shared/public/models/Meta-Llama-3-8B-Instruct" in found.detail
    assert "workload figures: no tokens/s (no token counters)" in found.detail
    assert "serving signals: running requests, KV-cache usage;" in found.detail


def test_doctor_says_how_many_lines_it_skipped_and_the_first(monkeypatch):
    body = with_shell_lines(capture("vllm/kops-qwen05b-v1-idle.txt"))
    found = doctor_line(monkeypatch, body, model_bytes=1e9)
    assert found.status == "ok", found
    assert "; 2 unreadable lines skipped, first line 282: '$ kubectl -n llm exec" in found.detail
    assert found.detail.endswith("; used for the GPUs its processes hold")
