"""The shipped rules under vmalert and VictoriaMetrics give what promtool's unit tests expect.

deploy/prometheus/roofwatch-rules.yml is the one rule file for both engines, loaded unchanged. Its
promtool unit tests (deploy/prometheus/roofwatch-rules.test.yml) are read as data
(tests/promtool_cases.py): every case's input series are imported into a real VictoriaMetrics with
their timestamps, a real vmalert replays every rule over them at the tests' 1-minute evaluation
interval (its ``-replay`` mode: range queries, recording results and ALERTS series written back by
remote write, chained rules reading what the earlier rules wrote), and then:

- every ``alert_rule_test`` holds: at each eval_time exactly the expected alerts of that name are
  firing (the ALERTS series vmalert wrote at that timestamp), with exactly the expected labels;
- every ``promql_expr_test`` holds: the expression, evaluated by VictoriaMetrics at eval_time over
  the recorded series, gives the expected label sets and values (float tolerance).

Cases are laid out side by side in time, six hours apart (the longest runs 130 minutes and no rule
looks back further than an hour, except RoofwatchAgentDown's day over roofwatch_build_info, which
only the coverage case has), all in one replay. promtool starts every case at the Unix epoch; here
case i starts at a recent whole hour, so series whose values are Unix times (``*_timestamp_seconds``,
compared with ``time()`` by the rules) are shifted by the same start: the same scenario, later.

Two adaptations, made here and each checked to change nothing else. The replayed copy has no annotations:
vmalert 1.79's replay refuses to create an alert whose annotations call the ``query`` template
function ("`query` template isn't supported in replay mode"), which three shipped alerts use for
their descriptions; annotations decide nothing about firing. And it is replayed a level at a time
(recordings over stored series first, then what reads them, and so on), each level its own run with
the groups' names and options, rather than as one run that pauses 2 s after each of its 63 rules so
that chained rules find what the one before wrote: in replay mode vmalert evaluates each rule over the
whole range before the next, so both orders evaluate the same expressions over the same data. The
unchanged file, annotations and all, is what the live test (tests/test_victoriametrics_e2e.py) gives vmalert.
"""

from __future__ import annotations

import datetime
import math
import re
import time
from pathlib import Path

import pytest
import yaml

from tests.agent_process import poll
from tests.promtool_cases import Case, read_cases
from tests.victoriametrics import VictoriaMetrics, available, replay_by_level, rule_levels

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not available(), reason="victoria-metrics missing: apt-get install victoria-metrics")]

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "roofwatch-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "roofwatch-rules.test.yml"
CASES = read_cases(yaml.safe_load(RULE_TESTS.read_text()))
SLOT = 6 * 3600
ALERT_META = {"__name__", "alertname", "alertstate", "alertgroup"}
"""Labels vmalert puts on ALERTS series that promtool's exp_labels leave out."""


def without_annotations(text: str) -> str:
    """The rule file as YAML with every ``annotations`` map removed, nothing else touched."""
    document = yaml.safe_load(text)
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return yaml.safe_dump(document, sort_keys=False)


def test_replayed_rules_differ_from_the_shipped_ones_only_in_annotations():
    shipped = yaml.safe_load(RULES.read_text())
    replayed = yaml.safe_load(without_annotations(RULES.read_text()))
    assert any("annotations" in r for g in shipped["groups"] for r in g["rules"])
    for group in shipped["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    assert replayed == shipped


def test_the_levels_replay_every_rule_once_in_its_own_group_after_what_it_reads():
    """The replay runs the file a level at a time (tests/victoriametrics.py, replay_by_level): together the
    levels hold every rule exactly once, each in a group with its own group's name and options, and no rule
    reads a recording of its own level or a later one."""
    shipped = yaml.safe_load(without_annotations(RULES.read_text()))
    levels = rule_levels(shipped)
    assert len(levels) >= 3, "the file chains recordings three deep (per GPU, aggregates, hourly)"
    options = {g["name"]: {k: v for k, v in g.items() if k != "rules"} for g in shipped["groups"]}
    placed = [(g["name"], json_key(rule)) for level in levels for g in level["groups"] for rule in g["rules"]]
    assert sorted(placed) == sorted((g["name"], json_key(r)) for g in shipped["groups"] for r in g["rules"])
    for level in levels:
        assert all({k: v for k, v in g.items() if k != "rules"} == options[g["name"]] for g in level["groups"])
    recorded_at = {r["record"]: n for n, level in enumerate(levels) for g in level["groups"] for r in g["rules"]
                   if "record" in r}
    for n, level in enumerate(levels):
        for rule in (r for g in level["groups"] for r in g["rules"]):
            reads = {name for name in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", rule["expr"]) if name in recorded_at}
            assert all(recorded_at[name] < n for name in reads), (rule, reads)
            assert n == 0 or any(recorded_at[name] == n - 1 for name in reads), f"{rule} could run a level earlier"


def json_key(rule: dict) -> str:
    return yaml.safe_dump(rule, sort_keys=True)


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def import_lines(case: Case, start: int) -> list[str]:
    """The case's samples as text-format lines with millisecond timestamps, from ``start``."""
    lines = []
    for series in case.series:
        labels = dict(series.labels)
        name = labels.pop("__name__")
        shift = start if name.endswith("_timestamp_seconds") else 0
        body = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for k, value in enumerate(series.values):
            if value is not None:
                lines.append(f"{name}{{{body}}} {value + shift!r} {(start + k * case.interval) * 1000}")
    return lines


def test_case_layout_keeps_cases_apart():
    """The layout's premise: each case ends, with an hour of windows to spare, before the next."""
    assert all(case.end + 3600 < SLOT for case in CASES), [(c.name, c.end) for c in CASES]
    assert all(case.interval == 60 for case in CASES), "the replay runs at one interval: 1m"
    assert sum(len(c.alerts) for c in CASES) >= 20 and sum(len(c.exprs) for c in CASES) >= 15


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """``(vm, starts)``: every case imported at its own start, every rule replayed over them all."""
    workdir = tmp_path_factory.mktemp("vm-rules")
    first = (int(time.time()) // 86400 - 10) * 86400  # ten days ago at midnight: well in the past
    starts = [first + i * SLOT for i in range(len(CASES))]
    vm = VictoriaMetrics(workdir)
    try:
        for case, start in zip(CASES, starts):
            vm.import_prometheus(import_lines(case, start))
        distinct = len({tuple(sorted(s.labels.items())) for c in CASES for s in c.series})
        # Imported rows become searchable after VictoriaMetrics' next in-memory flush (about a second).
        poll(lambda: len(vm.api("series", **{"match[]": '{__name__=~".+"}', "start": str(first),
                                              "end": str(starts[-1] + SLOT)})) >= distinct,
             timeout=30, interval=0.5, what=f"the {distinct} imported series")
        rules = yaml.safe_load(without_annotations(RULES.read_text()))
        for result in replay_by_level(rules, vm, workdir, rfc3339(first), rfc3339(starts[-1] + SLOT)):
            assert result.returncode == 0, result.stdout + result.stderr
            assert "error" not in result.stderr.lower(), result.stderr
        yield vm, starts
    finally:
        log = vm.stop()
        if "error" in log.lower():
            print(log)


def firing(vm: VictoriaMetrics, alertname: str, at: int) -> list[dict[str, str]]:
    """The label sets of ``alertname``'s firing alerts in the sample vmalert wrote at ``at``."""
    series = vm.export(f'ALERTS{{alertname="{alertname}",alertstate="firing"}}', at, at)
    return [{k: v for k, v in s["metric"].items() if k not in ALERT_META}
            for s in series if at * 1000 in s["timestamps"]]


def canonical(labels: list[dict[str, str]]) -> list[tuple]:
    return sorted(tuple(sorted(d.items())) for d in labels)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.name[:40] for c in CASES])
def test_alerts_fire_as_promtool_expects(replayed, index):
    vm, starts = replayed
    case, start = CASES[index], starts[index]
    problems = []
    for check in case.alerts:
        got = canonical(firing(vm, check.alertname, start + check.at))
        if got != canonical(check.expected):
            problems.append(f"{check.alertname} at {check.at // 60}m: expected {canonical(check.expected)}, "
                            f"vmalert fired {got}")
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("index", [i for i, c in enumerate(CASES) if c.exprs],
                         ids=[c.name[:40] for c in CASES if c.exprs])
def test_recorded_series_have_promtools_values(replayed, index):
    vm, starts = replayed
    case, start = CASES[index], starts[index]
    problems = []
    for check in case.exprs:
        result = vm.query(check.expr, at=start + check.at)
        got = {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in result}
        want = {tuple(sorted(labels.items())): value for labels, value in check.expected}
        if set(got) != set(want):
            problems.append(f"{check.expr} at {check.at // 60}m: labels {sorted(got)} != expected {sorted(want)}")
            continue
        for key, value in want.items():
            if not math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-12):
                problems.append(f"{check.expr} at {check.at // 60}m {dict(key)}: {got[key]} != expected {value}")
    assert problems == [], "\n".join(problems)


def referenced_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(roofwatch[a-z_]*:[a-z0-9_:]+|roofwatch_[a-z0-9_]+|up)\b", expr))


def test_every_recording_rule_with_inputs_wrote_series(replayed):
    """Each recording rule that the promtool cases give inputs to left series in VictoriaMetrics
    (none silently failing to evaluate under MetricsQL). A rule has inputs when every series it
    reads is an input series or recorded by a rule that has inputs (the serving floor, latency and
    prefill rules have none: the promtool cases give no such series)."""
    vm, starts = replayed
    records = {rule["record"]: rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"]
               for rule in group["rules"] if "record" in rule}
    fed = {s.labels["__name__"] for case in CASES for s in case.series}
    for record, expr in records.items():  # file order: a rule reads only rules above it
        if referenced_names(expr) <= fed:
            fed.add(record)
    expected = {name for name in records if name in fed}
    assert len(expected) >= 30, sorted(set(records) - expected)
    names = set(vm.api("label/__name__/values", start=str(starts[0]), end=str(starts[-1] + SLOT)))
    assert "ALERTS" in names and "ALERTS_FOR_STATE" in names
    missing = sorted(expected - names)
    assert missing == [], f"recording rules with no series after the replay: {missing}"


def test_promtool_notation_is_read_as_promtool_documents_it():
    from tests.promtool_cases import expand_values, parse_selector, seconds
    assert expand_values("1x2 _x2 0+60x2 5-1x1 _ 7") == [1, 1, 1, None, None, 0, 60, 120, 5, 4, None, 7]
    assert parse_selector('up{job="a",instance="n1:9477"}') == {"__name__": "up", "job": "a", "instance": "n1:9477"}
    assert parse_selector("{}") == {} and parse_selector("vector_name") == {"__name__": "vector_name"}
    assert seconds("1h30m") == 5400
    for bad, reader in (("stale", expand_values), ("1y", seconds), ('up{job=a}', parse_selector)):
        with pytest.raises(ValueError, match=re.escape(bad)):
            reader(bad)
