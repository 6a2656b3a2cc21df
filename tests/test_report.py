"""``roofwatch report``: the post-mortem page of a recorded trace."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections import Counter

import pytest

from agent.classifier.engine import classify_samples
from agent.views import report
from agent.views.report import build_report, histories
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import resolve_scenario
from agent.trace import TraceWriter
from tests.agent_process import clean_env, roofwatch_cmd
from tests.test_status_page import elements

START = 1_800_000_000.0


@pytest.fixture(scope="module")
def trace():
    """Five minutes of the demo node, labelled with the true class, and its verdicts."""
    samples = list(VirtualEngine(resolve_scenario("demo")).iter_trace(300, 1.0, start_ts=START))
    return samples, list(classify_samples(samples))


def test_spans_cover_the_verdicts_without_overlap(trace):
    samples, verdicts = trace
    for h in histories(samples, verdicts):
        spans = h.spans()
        assert spans, h.key
        assert all(a[1] == pytest.approx(b[0]) for a, b in zip(spans, spans[1:])), "contiguous, no overlap"
        assert sum(h.durations().values()) == pytest.approx(spans[-1][1] - spans[0][0])


def test_summary_names_each_gpus_main_class_as_labelled(trace):
    samples, verdicts = trace
    html = build_report(samples, verdicts)
    rows = re.findall(r'<tr data-gpu="(\d+)">(.*?)</tr>', html)
    assert [gpu for gpu, _ in rows] == [str(i) for i in range(8)]
    truth = {gpu: Counter(s.label for s in samples if s.gpu == gpu).most_common(1)[0][0] for gpu, _ in rows}
    mostly = {gpu: re.search(r'<span class="badge[^"]*" style="[^"]*" data-class="(\w+)"', row).group(1) for gpu, row in rows}
    steady = ("0", "1", "2", "3", "6")  # GPUs whose scripted workload does not change over the trace
    assert {g: mostly[g] for g in steady} == {g: truth[g] for g in steady}


def test_findings_rank_the_wasted_gpus(trace):
    """The GPUs wasted in 5% of their windows or more (held idle, input-starved, comm-jittered: an idle GPU nobody
    holds is spare), worst first by the time they lost, each naming both measures."""
    samples, verdicts = trace
    html = build_report(samples, verdicts)
    findings = re.search(r'<ul id="findings">(.*?)</ul>', html, re.S).group(1)
    items = re.findall(r'<li data-gpu="(\w+)" data-lost="([0-9.]+)" data-windows="([0-9.]+)">(.*?)</li>', findings)
    wasted_windows = {h.key: sum(end - start for start, end, v in h.spans()
                                 if v.cls in ("input_starved", "communication_jittered")
                                 or (v.cls == "idle" and v.detail != "idle_free")) / sum(h.durations().values())
                      for h in histories(samples, verdicts)}
    expected = {g for g, share in wasted_windows.items() if share >= 0.05}
    assert {g for g, *_ in items} == expected and "6" in expected and "0" not in expected
    lost = [float(x) for _, x, _, _ in items]
    assert lost == sorted(lost, reverse=True), "worst first, by the time lost"
    for gpu, lost_share, windows, text in items:
        assert f"lost {float(lost_share) * 100:.0f}% of its time" in text, text
        assert f"in {float(windows) * 100:.0f}% of its windows (whole windows)" in text, text
        assert float(windows) == pytest.approx(wasted_windows[gpu], abs=1e-3)


def test_timeline_merges_windows_into_runs_and_shows_labels(trace):
    samples, verdicts = trace
    html = build_report(samples, verdicts)
    runs = Counter(r["data-gpu"] for r in elements(html, "rect", **{"class": "run"}))
    per_gpu = Counter(v.gpu for v in verdicts)
    assert set(runs) == set(per_gpu)
    assert runs["0"] < per_gpu["0"] / 5, "steady GPU: a few runs, not one rect per verdict"
    assert len(elements(html, "rect", **{"class": "truth"})) >= 8
    unlabelled = [dataclasses.replace(s, label=None) for s in samples]
    html = build_report(unlabelled, list(classify_samples(unlabelled)))
    assert not elements(html, "rect", **{"class": "truth"})


def test_series_are_thinned_to_a_bound(trace, monkeypatch):
    samples, verdicts = trace
    monkeypatch.setattr(report, "MAX_LINE_POINTS", 12)
    monkeypatch.setattr(report, "MAX_SCATTER_POINTS", 7)
    html = build_report(samples, verdicts)
    lines = elements(html, "polyline", **{"class": "mfu-line"})
    assert len(lines) == 8 and all(int(line["data-points"]) <= 12 for line in lines)
    assert all(len(line["points"].split()) == int(line["data-points"]) for line in lines)
    roofline = re.search(r'<svg id="roofline".*?</svg>', html, re.S).group(0)
    assert 0 < roofline.count("<circle") <= 8 * 7


def test_thinning_averages_so_a_dip_survives():
    points = [(float(t), 0.5) for t in range(1000)]
    points[500:510] = [(float(t), 0.0) for t in range(500, 510)]
    thinned = report._thin_mean(points, 100)
    assert len(thinned) == 100
    assert min(m for _, m in thinned) == 0.0 and max(m for _, m in thinned) == 0.5
    assert report._thin_mean(points[:50], 100) == points[:50]


def test_multi_node_traces_qualify_gpus_with_the_node(trace):
    samples, _ = trace
    two = [s for s in samples if s.gpu in ("0", "6")]
    two += [dataclasses.replace(s, node="other") for s in two]
    html = build_report(two, list(classify_samples(two)))
    assert [r["data-gpu"] for r in elements(html, "tr") if "data-gpu" in r] == ["demo-node:0", "demo-node:6", "other:0", "other:6"]


def test_report_is_self_contained(trace):
    samples, verdicts = trace
    html = build_report(samples, verdicts, title="<post-mortem>")
    assert "<title>&lt;post-mortem&gt;</title>" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html) and "<script" not in html


# -- the command ------------------------------------------------------------------------------


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(roofwatch_cmd(*args), capture_output=True, text=True, timeout=120, env=clean_env())


@pytest.fixture(scope="module")
def trace_file(trace, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "demo.jsonl.gz"
    with TraceWriter(path, node="demo-node") as writer:
        writer.write_many(trace[0])
    return path


@pytest.mark.slow
def test_command_writes_the_page(trace_file, tmp_path):
    out = tmp_path / "report.html"
    result = run("report", str(trace_file), "--out", str(out), "--title", "Job 42")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(f"wrote {out}: ") and "of 8 GPUs" in result.stdout
    html = out.read_text()
    assert "<title>Job 42</title>" in html and 'id="timeline"' in html and 'id="mfu"' in html
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


@pytest.mark.slow
def test_command_errors_are_one_line_and_leave_nothing(trace_file, tmp_path):
    missing = run("report", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "r.html"))
    assert missing.returncode == 1 and "cannot read trace" in missing.stderr and "Traceback" not in missing.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = run("report", str(empty), "--out", str(tmp_path / "r.html"))
    assert result.returncode == 1 and "no samples in" in result.stderr
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"ts": 1, "gpu": "0"}\n{not json\n')
    result = run("report", str(bad_line), "--out", str(tmp_path / "r.html"))
    assert result.returncode == 2 and "bad.jsonl" in result.stderr and ":2" in result.stderr  # bad input: usage
    unwritable = run("report", str(trace_file), "--out", str(tmp_path / "no-such-dir" / "r.html"))
    assert unwritable.returncode == 1 and "cannot write" in unwritable.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "empty.jsonl"]
