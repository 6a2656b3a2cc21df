"""What older and forked inference servers export beyond the common figures, read off published captures.

* SGLang <= 0.3 exports its running-batch cap, ``sglang:max_running_requests`` (``log_config_stats``
  of ``srt/metrics/metrics_collector.py``): sgl-project/sglang PR #1853's capture shows 2231.0. It is
  the cap the serving view calls ``max_running`` (vLLM's ``max_num_seqs``), so it reaches the report
  unless the configuration names one.
* A vLLM behind IBM's TGIS front end (IBM/vllm PR #18, later opendatahub-io/vllm-tgis-adapter) feeds
  ``tgi_batch_inference_duration`` with vLLM's own per-request stats: ``method="next_token"`` each time
  per output token, ``method="prefill"`` each time to first token, in seconds. PR #18 passed a dict to
  ``labels()``, hence the label value ``{'method': 'prefill'}`` in ibmvllm18's capture, which is cut
  before the histogram's ``_sum``; the continuation below follows prometheus_client's layout for it.
* Lines of a body that are no sample are counted in the endpoint's status, not only in doctor's line.
"""

from __future__ import annotations

import pytest

import agent.diagnostics.inference as doctor_inference
from agent.app.config import Settings
from agent.context.local_host import LocalHost
from agent.context.workload.inference.endpoint import InferenceEndpoint, ModelFacts
from agent.context.workload.inference.parse import detect, parse, totals
from agent.context.workload.inference.scraper import InferenceScraper
from tests.test_inference_field_shapes import capture, with_shell_lines

T0, DT = 1_000.0, 5.0
PR1853 = "sglang/pr1853-llama32-3b-name-label-excerpt.txt"
TGIS = "tgi-style/ibmvllm18-tgis-excerpt.txt"
URL = "http://127.0.0.1:30000/metrics"


def scraped(bodies: list[str], **endpoint) -> InferenceScraper:
    """A scraper that read ``bodies`` one after the other, ``DT`` apart, for GPU 0."""
    queue = list(bodies)
    scraper = InferenceScraper([InferenceEndpoint(url=URL, gpus=["0"], **endpoint)],
                               fetch=lambda url, timeout_s, max_bytes: queue.pop(0).encode("utf-8"))
    for i in range(len(bodies)):
        scraper.scrape_once(now=T0 + i * DT)
    return scraper


def test_sglang_03_running_batch_cap_reaches_the_serving_report():
    body = capture(PR1853)
    assert "sglang:max_running_requests{name=" in body and body.count(" 2231.0") == 1
    report = scraped([body, body]).report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    assert report is not None and report.serving is not None
    assert report.serving.max_running == 2231.0


def test_the_configured_batch_cap_wins_over_the_exported_one():
    body = capture(PR1853)
    report = scraped([body, body], max_running=64).report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    assert report.serving.max_running == 64
    models = {capture(PR1853).split('name="')[1].split('"')[0]: ModelFacts(max_running=128)}
    scraper = InferenceScraper([InferenceEndpoint(url=URL, gpus=["0"])], models=models,
                               fetch=lambda url, timeout_s, max_bytes: body.encode("utf-8"))
    scraper.scrape_once(now=T0)
    scraper.scrape_once(now=T0 + DT)
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT).serving.max_running == 128


def test_the_slo_estimate_of_newer_sglang_is_not_read_as_the_cap():
    expo = parse('sglang:num_running_reqs{model_name="m"} 3\nsglang:max_running_requests_under_SLO{model_name="m"} 9\n')
    assert totals(expo, "sglang").serving.max_running is None


def tgis_body(prefill: tuple[float, float], next_token: tuple[float, float], *, fork: bool = True) -> str:
    """ibmvllm18's capture with the rest of its histogram: (count, sum) of the prefill and next_token series."""
    def label(method: str) -> str:
        return f"{{'method': '{method}'}}" if fork else method
    lines = [capture(TGIS).rstrip("\n")]
    for le in ("20.0", "50.0", "+Inf"):
        lines.append(f'tgi_batch_inference_duration_bucket{{le="{le}",method="{label("prefill")}"}} {prefill[0]}')
    lines += [f'tgi_batch_inference_duration_count{{method="{label("prefill")}"}} {prefill[0]}',
              f'tgi_batch_inference_duration_sum{{method="{label("prefill")}"}} {prefill[1]}',
              f'tgi_batch_inference_duration_bucket{{le="0.05",method="{label("next_token")}"}} {next_token[0]}',
              f'tgi_batch_inference_duration_bucket{{le="+Inf",method="{label("next_token")}"}} {next_token[0]}',
              f'tgi_batch_inference_duration_count{{method="{label("next_token")}"}} {next_token[0]}',
              f'tgi_batch_inference_duration_sum{{method="{label("next_token")}"}} {next_token[1]}']
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("fork", [True, False], ids=["ibm-vllm-pr18-labels", "tgis-adapter-labels"])
def test_tgis_per_token_and_first_token_histograms_give_tpot_and_ttft(fork: bool):
    """Between the scrapes: 400 output tokens in 10 s of per-token time, 10 first tokens in 0.5 s."""
    first = tgis_body((215.0, 6.0), (1000.0, 25.0), fork=fork)
    second = tgis_body((225.0, 6.5), (1400.0, 35.0), fork=fork)
    scraper = scraped([first, second], model_bytes=16e9)
    (status,) = scraper.status()
    assert status.up and status.kind == "tgi", status.error
    serving = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT).serving
    assert serving.tpot_s == pytest.approx(10.0 / 400)
    assert serving.ttft_s == pytest.approx(0.5 / 10)
    assert (serving.running, serving.waiting) == (0.0, 0.0)


def test_hf_tgi_batch_calls_are_not_read_as_per_token_or_first_token_times():
    """HF TGI's ``tgi_batch_inference_duration{method="prefill"|"decode"}`` times whole batch calls."""
    body = ('tgi_queue_size 0\ntgi_batch_inference_duration_sum{method="prefill"} 3.0\n'
            'tgi_batch_inference_duration_count{method="prefill"} 10\n'
            'tgi_batch_inference_duration_sum{method="decode"} 9.0\n'
            'tgi_batch_inference_duration_count{method="decode"} 300\n')
    serving = totals(parse(body), "tgi").serving
    assert (serving.itl, serving.ttft) == (None, None)


def test_doctor_names_the_exported_cap_and_the_tgis_latency(monkeypatch):
    def line(body: str) -> str:
        monkeypatch.setattr(doctor_inference, "http_fetch", lambda url, timeout_s, max_bytes: body.encode("utf-8"))
        settings = Settings(backend="nvml-virtual", inference_endpoints=[{"url": URL, "model_bytes": 6.4e9}])
        (finding,) = doctor_inference.inference_findings(settings, timeout_s=1.0)
        return finding.detail
    assert "serving signals: KV-cache pool size, running-batch cap;" in line(capture(PR1853))
    tgis = line(tgis_body((215.0, 6.0), (1000.0, 25.0)))
    assert "serving signals: running requests, waiting requests, inter-token latency, time to first token;" in tgis


def test_the_endpoint_status_counts_unreadable_lines_and_keeps_the_first_printable(tmp_path):
    body = with_shell_lines(capture("sglang/pr1461-gemma2-9b-wip-excerpt.txt")).replace(
        "curl -s http://", "curl -s \x1b]52;c;aGk=\x07\u202ehttp://")
    scraper = scraped([body])
    (status,) = scraper.status()
    assert status.up and status.skipped_lines == 2
    assert status.first_bad_line.startswith("line 14: '$ kubectl -n llm exec")
    assert status.skipped_note.startswith("2 unreadable lines skipped (first: line 14: '$ kubectl")
    (state,) = LocalHost(proc_root=tmp_path, workloads=[scraper]).source_states(T0)
    assert (state.name, state.state) == (f"inference {URL}", "up")
    assert state.detail == status.skipped_note and state.detail.isprintable()
    clean = scraped([capture("sglang/pr1461-gemma2-9b-wip-excerpt.txt")])
    assert clean.status()[0].skipped_note is None
    assert LocalHost(proc_root=tmp_path, workloads=[clean]).source_states(T0)[0].detail is None


def test_an_unreadable_line_with_controls_stays_printable_in_the_status():
    body = "\x1b[2J\x9b31m\u202ebanner\n" + capture(PR1853)
    (status,) = scraped([body]).status()
    assert status.skipped_lines == 1 and status.first_bad_line.isprintable(), status.first_bad_line
    assert detect(parse(body)) == "sglang"
