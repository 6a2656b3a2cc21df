"""A hostile inference server, in process: label bombs, values no server can have, counters going backwards,
and servers that share a host and port (issue 42: findings 12 and 14, and items d and e of 15).

The bodies are tests/inference_bodies.py's, the ones the real server of the end-to-end tests serves
(tests/test_inference_hostile_e2e.py, which runs them through a real agent process). Here the parser and the
scraper read them directly, with the scraper's fetch replaced by the body: nothing else differs.

Before: a body naming 10,000 models was kept whole (27 MiB of series for one scrape, kept twice for the
rates); an engine's latency sum of 1e308 gave a time per token of 1e+306 s, two such engines an
OverflowError that marked the endpoint down; a counter going backwards logged at every scrape; and two
endpoints on one host and port were one server in ``top``.
"""

from __future__ import annotations

import itertools
import logging
import re
import tracemalloc

import pytest
from rich.console import Console

from agent.classifier.serving import serving_view
from agent.classifier.thresholds import DEFAULT_THRESHOLDS
from agent.context.local_host import LocalHost
from agent.context.workload.inference.parse import parse, totals
from agent.context.workload.inference.scraper import InferenceEndpoint, InferenceScraper
from agent.model import WorkloadReport
from agent.model.specs import spec_by_key
from agent.views.top_serving import render_serving
from agent.views.top_source import parse_exposition
from tests.inference_bodies import MODEL, RUNNING, TPOT_S, body, bomb_values, generated, replica
from tests.serving_fixtures import demo_snapshot, exposition, serving_snapshot

T0, DT = 1_000.0, 5.0
URL = "http://10.0.0.7:8000/metrics"
MIB = 2**20


def scraper_of(*bodies: str, url: str = URL, **endpoint) -> InferenceScraper:
    """A scraper whose endpoint answers ``bodies`` in turn (the last one again afterwards)."""
    answers = itertools.chain(bodies, itertools.repeat(bodies[-1]))
    return InferenceScraper([InferenceEndpoint(url=url, gpus=["0"], **endpoint)],
                            fetch=lambda url, timeout_s, max_bytes: next(answers).encode())


def scrape(scraper: InferenceScraper, times: int, start: int = 0) -> None:
    for i in range(start, start + times):
        scraper.scrape_once(now=T0 + i * DT)


def lines(caplog: pytest.LogCaptureFixture, words: str, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage() and r.levelno >= level]


# -- finding 12: a bound on the distinct values of each label one endpoint gives ---------------------------

# The bounds docs/serving.md documents, typed here so that changing one means changing the documentation.
LABEL_BOUNDS = [("model_name", 16), ("name", 16), ("engine", 64), ("dp_rank", 64), ("tp_rank", 256),
                ("stage", 256)]


@pytest.mark.parametrize("label, bound", LABEL_BOUNDS)
def test_each_label_keeps_its_first_values_up_to_its_bound_and_refuses_the_rest(label: str, bound: int):
    values = [f"v{i}" for i in range(bound + 100)]
    text = "".join(f'vllm:num_requests_running{{{label}="{v}"}} 1\n' for v in values)
    expo = parse(text)
    kept = [dict(key)[label] for key in expo.samples["vllm:num_requests_running"]]
    assert kept == values[:bound]
    assert expo.refused == 100
    assert f"100 samples refused past the label bounds ({label} > {bound} values); first {label}='v{bound}'" \
        == expo.refused_note


def test_label_names_and_series_are_bounded_as_well():
    names = "".join(f'vllm:num_requests_running{{l{i}="x"}} 1\n' for i in range(100))
    expo = parse(names)
    assert len(expo.samples["vllm:num_requests_running"]) == 64 and expo.refused == 36
    assert "(> 64 label names)" in expo.refused_note
    # 16 models x 64 engines is within each label's bound; on five families that is 5,120 series, 1,024 past 4,096.
    families = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    grid = "".join(f"{family}{{{replica(e, f'model-{m}')}}} 1\n" for family in families for m in range(16)
                   for e in range(64))
    expo = parse(grid)
    assert sum(len(series) for series in expo.samples.values()) == 4096 and expo.refused == 1024
    assert "(> 4096 series); first a series of vllm:generation_tokens" in expo.refused_note


@pytest.mark.parametrize("label, bound", [("model_name", 16), ("engine", 64)])
def test_a_label_bomb_is_refused_while_it_is_read_and_costs_no_memory(label: str, bound: int):
    """2,000 values here (the end-to-end test serves 10,000): the old parser kept them all, 7.5 MiB at its peak."""
    text = generated(f"bomb-{label}-2000", 1).encode()
    tracemalloc.start()
    try:
        expo = parse(text)
        current = totals(expo, "vllm")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    values = bomb_values(label, 2000)
    assert {dict(key)[label] for key in expo.samples["vllm:num_requests_running"]} == set(values[:bound])
    assert expo.refused == text.count(b"\n") - 5 * bound, "every sample past the bound, on each of 5 families"
    assert expo.refused_note.startswith(f"{expo.refused} samples refused past the label bounds ({label} > {bound} "
                                        f"values, any new series after 1024 refusals); first {label}='{values[bound]}'")
    assert current.models == (tuple(sorted(values[:16])) if label == "model_name" else (MODEL,))
    assert current.serving.running == RUNNING * (16 if label == "model_name" else 64), "the kept series are summed"
    assert peak < 1 * MIB, f"{peak / MIB:.1f} MiB"


def test_a_bomb_is_logged_once_per_episode_and_counted_in_the_endpoints_state(caplog, tmp_path):
    bomb, honest = (generated("bomb-model_name-2000", 1), generated("honest-1", 1))
    scraper = scraper_of(bomb, bomb, bomb, honest, bomb)
    with caplog.at_level(logging.DEBUG, logger="roofwatch.inference"):
        scrape(scraper, 3)
        (status,) = scraper.status()
        (state,) = LocalHost(proc_root=tmp_path, workloads=[scraper]).source_states(T0)
        scrape(scraper, 2, start=3)
    refused = 5 * (2000 - 16)
    warnings = lines(caplog, "refused past the label bounds", logging.WARNING)
    assert len(warnings) == 2, "once for each of the two episodes, not once per scrape"
    assert warnings[0].startswith(f"inference endpoint {URL}: {refused} samples refused past the label bounds")
    assert len(lines(caplog, "refused past the label bounds", logging.DEBUG)) == 4, "the others at debug"
    assert status.up and status.refused_samples == refused and status.refused_note in status.skipped_note
    assert status.refused_total == 3 * refused and scraper.status()[0].refused_total == 4 * refused
    assert (state.name, state.state) == (f"inference {URL}", "up") and state.detail == status.skipped_note


# -- finding 14: the serving bounds, one replica at a time --------------------------------------------------


@pytest.mark.parametrize("bad", [1, 2], ids=["one engine", "two engines"])
def test_an_engine_reporting_1e308_costs_only_its_own_figures(bad: int, caplog):
    """Engines 1..bad report a latency sum of 1e308 and 1e308 running requests; engine 0 and the rest are honest.
    Before: one such engine gave a time per token of 1e+306 s, two an OverflowError and the endpoint down."""
    scraper = scraper_of(*(generated(f"overflow-{bad}-4", n) for n in (1, 2, 3)), model_bytes=16e9)
    with caplog.at_level(logging.DEBUG, logger="roofwatch.inference"):
        scrape(scraper, 3)
    (status,) = scraper.status()
    assert status.up and status.error is None, status.error
    serving = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + 2 * DT).serving
    assert serving.tpot_s == pytest.approx(TPOT_S) and serving.running == RUNNING * (4 - bad)
    assert serving.waiting == 1.0 * 4 and serving.kv_usage == pytest.approx(0.25), "their other figures stand"
    view = serving_view(WorkloadReport(model_bytes=16e9, serving=serving), spec_by_key("h100-sxm"), [],
                        DEFAULT_THRESHOLDS)
    assert 1 < view.floor_ratio < 10, view.floor_ratio
    # Each scrape rejects, per bad engine, its latency histogram and its running requests.
    assert status.rejected_values == 2 * bad and status.rejected_total == 3 * 2 * bad
    assert re.fullmatch(rf'{2 * bad} values outside the serving bounds rejected; first vllm:inter_token_latency_'
                        rf'seconds_sum\{{engine="1",model_name="{MODEL}"\}}: time per output token \(mean since start\) '
                        r'\S+e\+304 s, outside 0\.\.21600', status.rejected_note), status.rejected_note
    warnings = lines(caplog, "outside the serving bounds", logging.WARNING)
    assert len(warnings) == 1, "one line for the episode, not one per scrape"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], "no traceback"


def test_interval_figures_and_gauges_are_judged_per_engine(caplog):
    """Engine 1's latency sum jumps by 1e7 s over 400 tokens (25,000 s each, past the 6 h bound, while its mean
    since start stays within it); engines 2 and 3 show 1e308 generated tokens from the second scrape on (new
    series: the step is 1e308, and their sum overflowed ``fsum``); engine 1's running count is negative and
    its KV-cache usage 7. Engine 0's figures are kept throughout."""
    first = body(1, [replica(e) for e in range(4)])
    second = body(2, [replica(e) for e in range(4)])
    second = second.replace(f'seconds_sum{{{replica(1)}}} {400 * TPOT_S * 2!r}', f'seconds_sum{{{replica(1)}}} 1e7')
    second = second.replace(f'running{{{replica(1)}}} {RUNNING!r}', f'running{{{replica(1)}}} -3.0')
    second = second.replace(f'perc{{{replica(1)}}} 0.25', f'perc{{{replica(1)}}} 7.0')
    for engine in (2, 3):
        second = second.replace(f'generation_tokens_total{{{replica(engine)}}} 800.0', "")
        second += f'vllm:generation_tokens_total{{{replica(engine)},extra="1"}} 1e308\n'
    scraper = scraper_of(first, second)
    with caplog.at_level(logging.DEBUG, logger="roofwatch.inference"):
        scrape(scraper, 2)
    (status,) = scraper.status()
    assert status.up, status.error
    report = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    serving = report.serving
    assert serving.tpot_s == pytest.approx(TPOT_S), "engine 1's 25,000 s per token left out, the others pooled"
    assert serving.running == RUNNING * 3 and serving.kv_usage == pytest.approx(0.25)
    assert serving.generated_tokens_per_s == pytest.approx(400 / DT * 2), "engines 0 and 1; 2 and 3 lost theirs"
    assert status.rejected_values == 5, status.rejected_note
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], "no traceback"


# -- finding 15 d: a counter that keeps going backwards -----------------------------------------------------


def test_a_counter_going_backwards_at_every_scrape_is_logged_once_per_episode(caplog):
    """Scrapes 2 to 6 each go backwards, 7 and 8 forwards, 9 backwards again: two episodes."""
    scraper = scraper_of(*(body(work, [replica(0)]) for work in (100, 99, 98, 97, 96, 95, 96, 97, 90)))
    with caplog.at_level(logging.DEBUG, logger="roofwatch.inference"):
        scrape(scraper, 6)
        (during,) = scraper.status()
        scrape(scraper, 2, start=6)
        (between,) = scraper.status()
        scrape(scraper, 1, start=8)
    resets = lines(caplog, "counter reset")
    assert len(resets) == 2, "the first reset of each episode"
    assert len([r for r in caplog.records if "backwards" in r.getMessage() and r.levelno == logging.DEBUG]) == 4
    assert during.up and "counter reset" in during.error and not during.has_rate
    assert between.has_rate and between.error is None


# -- finding 15 e: endpoints on one host and port ----------------------------------------------------------


def test_endpoints_on_one_host_and_port_are_told_apart_in_metrics_and_top():
    host = "http://10.0.0.7:8000"
    paths = {"1": "/metrics", "2": "/engine-a/metrics", "6": "/v1/replica-7/serving/metrics?token=s3cr3t",
             "7": "/v1/replica-8/serving/metrics"}
    reports = {}
    for gpu, path in paths.items():
        scraper = scraper_of(generated("honest-1", 1), generated("honest-1", 2), url=host + path, model_bytes=16e9)
        scrape(scraper, 2)
        reports[gpu] = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    names = {"1": "vllm 10.0.0.7:8000", "2": "vllm 10.0.0.7:8000/engine-a/metrics",
             "6": "vllm 10.0.0.7:8000/v1/replica-7/serving/metrics", "7": "vllm 10.0.0.7:8000/v1/replica-8/serving/metrics"}
    assert {gpu: report.serving.server for gpu, report in reports.items()} == names, "the query (a token) never shows"
    text = exposition(serving_snapshot(demo_snapshot(), reports))
    assert dict(re.findall(r'roofwatch_serving_info\{[^}]*gpu="(\d)"[^}]*server="([^"]*)"', text)) == names
    rows = parse_exposition(text, "http://node:9477/metrics").serving
    assert sorted(r.server for r in rows) == sorted(names.values())
    for width in (200, 160):
        console = Console(record=True, width=width, force_terminal=True)
        console.print(render_serving(rows, width))
        shown = [line.split("  ")[0] for line in console.export_text().splitlines() if line.startswith("vllm ")]
        assert len(set(shown)) == 4, shown
        assert any(name.endswith("a/metrics") for name in shown), "cut in the middle: the path's end stays"
        assert "s3cr3t" not in console.export_text() and "s3cr3t" not in text
