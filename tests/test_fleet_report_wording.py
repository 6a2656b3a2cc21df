"""What the fleet report's page says, without a store (issue 43, item 8): a fleet outside Kubernetes is not
"Incomplete", a period reads as people say it, the cells of a row add up to the row, and where it finds no
straggler it says by which rule. Quick: the report is collected from a stand-in client in-process and
rendered to a string; the real command against real stores is in test_fleet_report_shipped.py and
test_fleet_report_waste.py."""

from __future__ import annotations

import html
import math
import re

import pytest

from agent.classifier.thresholds import Thresholds
from agent.model import WORKLOAD_CLASSES
from agent.views.fleet_report.collect import FleetReport, collect
from agent.views.fleet_report.data import Prices, group_rows
from agent.views.fleet_report.promapi import Answer, PromClient, Series
from agent.views.fleet_report.render import build_page
from agent.views.fleet_report.render_tables import class_table, waste_table
from agent.views.fleet_report.window import Window

AT = 1795478400


class Canned(PromClient):
    """Answers every query from ``answer(expr)`` and counts them, as the real client does; nothing is sent."""

    def __init__(self, answer) -> None:
        super().__init__("http://stand-in:9090")
        self.answer = answer

    def query(self, expr: str, at: float) -> Answer:
        self.queries += 1
        return Answer(Series(labels, ((at, value),)) for labels, value in self.answer(expr))


def outside_kubernetes(expr: str) -> list[tuple[dict[str, str], float]]:
    """A fleet with jobs but no Kubernetes: every query finds its rows except the namespace table's."""
    if "roofwatch_gpu_pod_info" in expr:
        return []
    row = {"cluster": "lab", "user": "alice", "job_id": "j1", "model": "m", "spec": "", "class": "compute_bound",
           "waste": "none"}
    return [(row, 1.0)]


def text_of(page: str) -> str:
    """The page as a reader sees it: tags and scripts gone, entities decoded, whitespace collapsed."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


# -- (b) no namespaces outside Kubernetes: expected, said neutrally ------------------------------------------


def test_a_fleet_outside_kubernetes_gets_a_neutral_note_not_an_incomplete_banner() -> None:
    window = Window.pick(AT, 7 * 86400)
    report = collect(Canned(outside_kubernetes), window, cluster=None, prices=Prices())
    assert [p.section for p in report.problems] == [], "an empty namespace section is not a problem"
    page = build_page(report)
    assert 'class="banner"' not in page and "Incomplete" not in page
    note = re.search(r'<p class="([^"]*)"[^>]*>([^<]*roofwatch_gpu_pod_info[^<]*)</p>', page)
    assert note, "the namespace section says why it is empty"
    assert note.group(1) == "muted" and "outside Kubernetes" in note.group(2) and "expected" in note.group(2)
    assert "incomplete" not in note.group(2).lower()
    assert "Nothing: every query answered." in page


def test_a_namespace_query_that_fails_is_still_a_problem() -> None:
    """Only an empty answer is expected; a query the store refused is listed as before."""
    from agent.views.fleet_report.promapi import PromError

    class Failing(Canned):
        def query(self, expr: str, at: float) -> Answer:
            if "roofwatch_gpu_pod_info" in expr:
                self.queries += 1
                raise PromError("bad_data: parse error")
            return super().query(expr, at)

    report = collect(Failing(outside_kubernetes), Window.pick(AT, 86400), cluster=None, prices=Prices())
    assert [p.section for p in report.problems] == ["Waste by namespace"]
    assert "Incomplete: Waste by namespace" in build_page(report)


# -- (c) durations for people ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("range_s", "said"), [(600, "10 min"), (6 * 3600, "6 h"), (2 * 86400 + 3 * 3600, "2 d 3 h"),
                                               (5400, "1 h 30 min"), (7 * 86400, "7 d")])
def test_the_period_reads_as_people_say_it(range_s: int, said: str) -> None:
    report = FleetReport(window=Window.pick(AT, range_s), cluster=None, prices=Prices())
    header = text_of(re.search(r'<p class="muted">.*?</p>', build_page(report), re.S).group(0))
    assert f"({said}), compared with the {said} before" in header, header
    assert not re.search(r"\d\.\d{3,}", header), f"no machine fractions: {header}"


# -- (d) rounded cells add up to their row -------------------------------------------------------------------------


ROUNDING_ROWS = [
    {"compute_bound": 0.14, "memory_bound": 0.14, "latency_bound": 0.14},          # 0.1 x 3 beside 0.4
    {"idle": 0.15, "input_starved": 0.15, "communication_jittered": 0.15, "unknown": 0.15},
    {"compute_bound": 1234.56, "idle": 0.04, "memory_bound": 0.049},
    {"compute_bound": 0.05, "memory_bound": 0.05},                                  # 0.1 total from 0.0 + 0.0
]


def numbers(cells: list[str]) -> list[float]:
    return [float(c.replace(",", "")) for c in cells]


@pytest.mark.parametrize("hours", ROUNDING_ROWS)
def test_class_cells_add_up_to_the_row(hours: dict[str, float]) -> None:
    rows = [({"cluster": "c", "class": cls, "model": "m", "spec": "", "waste": "none"}, h) for cls, h in hours.items()]
    table = class_table(group_rows(rows, ("cluster",), Prices()))
    row = re.search(r'<tr data-cluster="c">(.*?)</tr>', table).group(1)
    cells = numbers(re.findall(r'<td class="num">([\d,.]+)</td>', row))
    per_class, total = cells[:len(WORKLOAD_CLASSES)], cells[len(WORKLOAD_CLASSES)]
    assert math.isclose(sum(per_class), total, abs_tol=1e-9), (per_class, total)
    assert math.isclose(total, round(sum(hours.values()), 1), abs_tol=1e-9), "the row is its true total, rounded"
    for cls, shown in zip(WORKLOAD_CLASSES, per_class):
        assert abs(shown - hours.get(cls, 0.0)) < 0.1, (cls, shown)


WASTE_ROWS = [("idle", "idle_held", 0.14), ("input_starved", "input_starved", 0.14),
              ("communication_jittered", "communication_jittered", 0.14), ("compute_bound", "none", 2.0)]


def test_waste_cells_add_up_to_the_wasted_cell() -> None:
    rows = [({"cluster": "c", "class": cls, "waste": waste, "model": "m", "spec": ""}, h) for cls, waste, h in WASTE_ROWS]
    table = waste_table(group_rows(rows, ("cluster",), Prices()), ("cluster",), "waste-cluster")
    row = re.search(r'<tr data-cluster="c">(.*?)</tr>', table).group(1)
    cells = re.findall(r'<td class="num[^"]*">(?:<b>)?([\d,.]+)', row)
    kinds, wasted = numbers(cells[1:4]), numbers(cells[4:5])[0]
    assert math.isclose(sum(kinds), wasted, abs_tol=1e-9) and math.isclose(wasted, 0.4, abs_tol=1e-9), cells


# -- (e) where it finds no straggler, it says by which rule -------------------------------------------------------


def test_no_stragglers_names_the_rule_and_its_minimum_beside_the_live_pages() -> None:
    report = FleetReport(window=Window.pick(AT, 86400), cluster=None, prices=Prices())
    text = text_of(build_page(report))
    section = text[text.index("Stragglers"):text.index("Communication jitter")]
    assert "No straggler by this rule" in section and "15%" in section
    assert "3 or more GPUs" in section, "the lead over the job's median needs three GPUs: said where nothing is found"
    skew = f"{Thresholds().rank_skew:.0%}"
    assert "status page" in section and "2 ranks" in section and skew in section, "the live page's rule, stated"
