"""The evidence behind a communication-jittered verdict in the views: the status page and ``top``.

The verdicts come from the real classifier over a published MI300X trace (no SM or tensor counter;
tests/jitter_fixtures.py): one of the job that reports nothing, judged by power against fabric bytes,
and one of the job that reports step times without step ids. The status page reads them through the
snapshot JSON, ``top`` through the exposition, as the agent serves both.
"""

from __future__ import annotations

import copy
import re
from html import escape

import pytest
from rich.console import Console

from agent.model import EVIDENCE_BASES
from agent.views.jitter_evidence import BASIS_SHORT, evidence_parts, snapshot_evidence
from agent.views.status_page import status_page
from agent.views.top_jitter import TITLE, evidence_line, render_jitter
from agent.views.top_render import TopState, render_frame
from agent.views.top_source import GpuRow, parse_exposition
from exporters.snapshot_json import EVIDENCE_FIELDS, snapshot_to_dict
from tests.jitter_fixtures import NOSTEP, jittered_snapshot, jittered_verdict
from tests.serving_fixtures import exposition
from tests.top_exposition import FIXTURE, per_gpu, series

URL = "http://jit-mi300x-noreport-0:9477/metrics"


@pytest.fixture(scope="module")
def snapshot():
    return jittered_snapshot()


@pytest.fixture
def data(snapshot):
    return copy.deepcopy(snapshot_to_dict(snapshot))


def card(html: str) -> str:
    match = re.search(r'<div class="card" data-gpu="0".*?<div class="facts', html, re.S)
    assert match, html
    return match.group(0)


def rendered(renderable, width: int = 200) -> str:
    console = Console(record=True, width=width, force_terminal=True, color_system="truecolor")
    console.print(renderable)
    return console.export_text()


def jitter_row(**fields) -> GpuRow:
    return GpuRow(node="n", gpu="0", uuid="U0", up=True, cls="communication_jittered", **fields)


# -- the verdict and the snapshot JSON --------------------------------------------------------


def test_the_verdict_is_jitter_seen_by_power_against_fabric_bytes_on_a_counter_less_gpu(snapshot):
    sample, verdict = snapshot.devices[0].sample, snapshot.verdicts[0]
    assert sample.vendor == "amd" and sample.sm_active is None and sample.tensor_active is None
    assert sample.power_w is not None and sample.link_tx_bytes_per_s is not None and sample.net_tx_bytes_per_s is not None
    assert (verdict.cls, verdict.basis) == ("communication_jittered", "fabric_and_power")
    f = verdict.features
    assert f.comm_wait_fraction is None and f.fabric_wait_fraction > 0 and f.power_fabric_r < 0 and f.steps == 0


def test_the_snapshot_verdict_carries_its_evidence(data, snapshot):
    (verdict,) = data["verdicts"]
    f = snapshot.verdicts[0].features
    assert set(verdict["evidence"]) == set(EVIDENCE_FIELDS)
    assert verdict["evidence"]["power_fabric_r"] == pytest.approx(f.power_fabric_r, abs=1e-4)
    assert verdict["evidence"]["fabric_wait_fraction"] == pytest.approx(f.fabric_wait_fraction, abs=1e-4)
    assert verdict["evidence"]["step_cv"] is None and verdict["evidence"]["steps_inferred"] is False


# -- status page ------------------------------------------------------------------------------


def test_status_page_card_shows_the_basis_and_the_fabric_evidence(data, snapshot):
    f = snapshot.verdicts[0].features
    html = card(status_page(data, refresh_s=0))
    said = re.search(r'<li class="basis muted"[^>]*>verdict rests on: (.*?)</li>', html).group(1)
    assert said == escape("communication jitter seen by power and memory activity from amdsmi falling as fabric bytes "
                          "rise; no step reports, no SM or tensor counter"), "the MI300X's power and memory: amdsmi's"
    evidence = re.search(r'<li class="evidence muted">evidence: (.*?)</li>', html).group(1)
    assert f"waiting on the fabric in {f.fabric_wait_fraction * 100:.0f}% of samples" in evidence
    assert f"power vs fabric bytes r {f.power_fabric_r:.2f}" in evidence
    assert f"memory vs fabric bytes r {f.memory_fabric_r:.2f}" in evidence
    assert f"power CV {f.power_cv * 100:.1f}% (no step reports)" in evidence
    assert "step time CV" not in evidence


def test_status_page_says_when_step_times_came_without_step_ids():
    verdict = jittered_verdict(NOSTEP, "step_reports")
    f = verdict.features
    assert f.steps_inferred and f.step_cv is not None and f.steps >= 2
    html = card(status_page(snapshot_to_dict(jittered_snapshot(NOSTEP, "step_reports")), refresh_s=0))
    assert escape(EVIDENCE_BASES["step_reports"]) in html
    evidence = re.search(r'<li class="evidence muted">evidence: (.*?)</li>', html).group(1)
    assert f"step time CV {f.step_cv * 100:.0f}% (no step ids)" in evidence
    assert f"power vs fabric bytes r {f.power_fabric_r:.2f}" in evidence
    assert "power CV" not in evidence, "with a step CV, power's variation is not the evidence"


def test_no_evidence_line_for_a_verdict_that_is_not_jittered(data):
    data["verdicts"][0]["class"] = "compute_bound"
    assert 'class="evidence' not in status_page(data, refresh_s=0)
    assert snapshot_evidence({"class": "communication_jittered"}) == []


def test_evidence_values_that_are_not_numbers_are_left_out_and_nothing_is_unescaped(data):
    evidence = data["verdicts"][0]["evidence"]
    evidence.update(power_fabric_r="<script>alert(1)</script>", fabric_wait_fraction=float("nan"),
                    memory_fabric_r=True, power_cv=None)
    html = card(status_page(data, refresh_s=0))
    assert "<script>" not in html and "alert(1)" not in html
    assert not re.search(r'class="evidence', html), "nothing known is left to show"


# -- top --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def view(snapshot):
    return parse_exposition(exposition(snapshot), URL, fetched_at=0.0)


def test_top_reads_the_basis_and_the_evidence_series(view, snapshot):
    f = snapshot.verdicts[0].features
    (row,) = view.rows
    assert (row.cls, row.basis) == ("communication_jittered", "fabric_and_power")
    assert row.comm_wait == pytest.approx(f.fabric_wait_fraction)
    assert row.power_fabric_r == pytest.approx(f.power_fabric_r, abs=1e-3)
    assert row.step_cv is None and row.step_time_s is None, "absent series stay unknown"


def test_top_shows_the_evidence_line_of_a_jittered_gpu(view, snapshot):
    f = snapshot.verdicts[0].features
    state = TopState(url=URL)
    state.apply(view)
    lines = rendered(render_frame(state, 200)).splitlines()
    at = lines.index(TITLE)
    line = lines[at + 1]
    assert line.startswith(f"GPU 0  {BASIS_SHORT['fabric_and_power']}: ")
    assert f"wait {f.fabric_wait_fraction * 100:.0f}%" in line and f"power~fabric r {f.power_fabric_r:.2f}" in line
    assert "step CV" not in line


@pytest.mark.parametrize("parts", [0, 1, 2, 3])
def test_top_evidence_fits_the_width_leaving_figures_out_last_first(view, parts):
    """A figure is left out whole, never cut to "…"; only the basis is cut, and only when nothing else fits."""
    row = view.rows[0]
    head = f"GPU 0  {BASIS_SHORT['fabric_and_power']}"
    pieces = [head, f": wait {row.comm_wait * 100:.0f}%", f" · power~fabric r {row.power_fabric_r:.2f}"]
    shown = "".join(pieces[:parts]) if parts else head[:12] + "…"
    width = len(shown) + 1 if parts else len(shown)
    state = TopState(url=URL)
    state.apply(view)
    screen = rendered(render_frame(state, width), width)
    assert all(len(line) <= width for line in screen.splitlines())
    assert evidence_line(row, width).plain == shown
    assert shown in screen.splitlines()


def test_top_golden_fixture_shows_a_line_per_jittered_gpu_and_none_for_others():
    text = FIXTURE.read_text()
    state = TopState(url=URL)
    state.apply(parse_exposition(text, URL, fetched_at=0.0))
    screen = rendered(render_frame(state, 200))
    jittered = sorted(labels["gpu"] for labels, v in series(text, "roofwatch_gpu_workload_class")
                      if v == 1 and labels["class"] == "communication_jittered")
    basis = {labels["gpu"]: labels["basis"] for labels, _ in series(text, "roofwatch_gpu_workload_reason_info")}
    lines = screen.splitlines()
    lines = lines[lines.index(TITLE) + 1:-1]  # up to the key footer
    assert [line.split()[1] for line in lines] == jittered
    waits = per_gpu(text, "roofwatch_gpu_comm_wait_ratio")
    for gpu, line in zip(jittered, lines):
        assert BASIS_SHORT[basis[gpu]] in line and f"wait {waits[gpu] * 100:.0f}%" in line


def test_top_has_no_evidence_section_without_a_jittered_gpu_that_answers():
    idle = GpuRow(node="n", gpu="1", uuid="U1", up=True, cls="idle")
    down = GpuRow(node="n", gpu="2", uuid="U2", up=False, cls="communication_jittered")
    assert render_jitter([jitter_row(), idle]).plain == f"{TITLE}\nGPU 0  basis unknown"
    assert render_jitter([idle, down]) is None


def test_top_draws_labels_as_text_without_control_characters():
    line = evidence_line(jitter_row(basis="\x1b[2J[bold]x", comm_wait=0.3), 120)
    assert line.plain == "GPU 0  \ufffd[2J[bold]x: wait 30%"
    other_node = GpuRow(node="\x1b]52;c;", gpu="0", uuid="U", up=True, cls="communication_jittered")
    several = render_jitter([jitter_row(power_fabric_r=-0.9), other_node], 120)
    assert "\x1b" not in several.plain and "n GPU 0  basis unknown: power~fabric r -0.90" in several.plain


def test_evidence_parts_leave_out_what_is_unknown():
    assert evidence_parts() == []
    assert evidence_parts(wait=0.3, step_cv=0.18, steps_inferred=True, power_cv=0.07, short=True) == [
        "wait 30%", "step CV 18% (no step ids)"]
    assert evidence_parts(power_cv=0.07, step_time_s=1.2) == ["power CV 7.0%", "mean step 1.2 s"]


def test_the_wait_shown_is_the_counters_where_they_saw_waits_else_the_fabrics():
    def wait(**evidence) -> list[str]:
        return snapshot_evidence({"class": "communication_jittered", "evidence": evidence})

    assert wait(comm_wait_fraction=0.2, fabric_wait_fraction=0.3) == ["waiting on peers in 20% of samples"]
    assert wait(comm_wait_fraction=0.0, fabric_wait_fraction=0.3) == ["waiting on the fabric in 30% of samples"]
    assert wait(comm_wait_fraction=0.0) == ["waiting on peers in 0% of samples"]
