"""promtool's rule unit-test file (``promtool test rules``) read as data, so that another engine can
be given the same inputs and held to the same expectations.

Only what deploy/prometheus/roofwatch-rules.test.yml uses is supported, and anything else fails
loudly rather than being skipped: the expanding notation of input values (``a+bxn``, ``a-bxn``,
``axn``, ``_``, ``_xn``, plain numbers), durations in s/m/h, and series selectors written as
``name{label="value",...}``. Semantics as promtool documents them: ``axn`` is n+1 samples,
``_xn`` is n missing ones, sample k of a series is at k x the test's interval from time 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_DURATION = re.compile(r"(\d+)([smh])")
_UNITS = {"s": 1, "m": 60, "h": 3600}
_SELECTOR = re.compile(r"\s*([A-Za-z_:][A-Za-z0-9_:]*)?\s*(?:\{(.*)\})?\s*")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_EXPANDING = re.compile(r"(-?[0-9.eE+]+?)(?:([+-])([0-9.eE+]+))?x(\d+)")


def seconds(duration: str) -> int:
    """``"10m"`` -> 600; promtool's durations are sums of such parts (``1h30m``)."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"duration {duration!r}: expected digits with s, m or h")
    return sum(int(n) * _UNITS[u] for n, u in parts)


def parse_selector(text: str) -> dict[str, str]:
    """``name{a="b"}`` -> ``{"__name__": "name", "a": "b"}``; ``{}`` -> ``{}``."""
    match = _SELECTOR.fullmatch(text)
    if not match:
        raise ValueError(f"series {text!r}: expected name{{label=\"value\",...}}")
    labels = {"__name__": match.group(1)} if match.group(1) else {}
    body = match.group(2) or ""
    position = 0
    while position < len(body.rstrip()):
        pair = _LABEL.match(body, position)
        if not pair:
            raise ValueError(f"series {text!r}: cannot read the labels from {body[position:]!r}")
        labels[pair.group(1)] = bytes(pair.group(2), "utf-8").decode("unicode_escape")
        position = pair.end()
    return labels


def expand_values(text: str) -> list[float | None]:
    """One entry per interval step; ``None`` where the series has no sample.

    The field must have reached us as text: YAML 1.1 reads an unquoted ``0x40`` as the hexadecimal 64,
    where promtool reads "0 for 41 samples", so a number here means the two would replay different data."""
    if not isinstance(text, str):
        raise ValueError(f"values {text!r}: quote it in the test file (YAML read it as a number; promtool reads text)")
    out: list[float | None] = []
    for token in str(text).split():
        if token == "_":
            out.append(None)
        elif token.startswith("_x"):
            out.extend([None] * int(token[2:]))
        elif "x" in token:
            match = _EXPANDING.fullmatch(token)
            if not match:
                raise ValueError(f"values token {token!r}: expected a+bxn, a-bxn or axn")
            start, sign, step, count = match.groups()
            delta = float(step or 0) * (-1 if sign == "-" else 1)
            out.extend(float(start) + delta * k for k in range(int(count) + 1))
        elif token == "stale":
            raise ValueError("values token 'stale': staleness markers are not supported by this reader")
        else:
            out.append(float(token))
    return out


@dataclass(frozen=True)
class InputSeries:
    labels: dict[str, str]
    values: list[float | None]


@dataclass(frozen=True)
class AlertCheck:
    at: int  # seconds from the test's time 0
    alertname: str
    expected: list[dict[str, str]]  # the exp_labels of each alert expected to fire


@dataclass(frozen=True)
class ExprCheck:
    at: int
    expr: str
    expected: list[tuple[dict[str, str], float]]


@dataclass(frozen=True)
class Case:
    name: str
    interval: int
    series: list[InputSeries]
    alerts: list[AlertCheck] = field(default_factory=list)
    exprs: list[ExprCheck] = field(default_factory=list)

    @property
    def end(self) -> int:
        """The last second anything in this case happens: its last sample or check."""
        last_sample = max((len(s.values) - 1) * self.interval for s in self.series)
        return max([last_sample, *[a.at for a in self.alerts], *[e.at for e in self.exprs]])


def read_cases(document: dict) -> list[Case]:
    """Every test case of a parsed promtool test file."""
    default_interval = document.get("evaluation_interval", "1m")
    cases = []
    for test in document["tests"]:
        cases.append(Case(
            name=test.get("name", ""),
            interval=seconds(test.get("interval", default_interval)),
            series=[InputSeries(parse_selector(s["series"]), expand_values(s["values"]))
                    for s in test.get("input_series", [])],
            alerts=[AlertCheck(seconds(a["eval_time"]), a["alertname"],
                               [{str(k): str(v) for k, v in (e.get("exp_labels") or {}).items()} for e in a.get("exp_alerts") or []])
                    for a in test.get("alert_rule_test", [])],
            exprs=[ExprCheck(seconds(e["eval_time"]), e["expr"],
                             [(parse_selector(s["labels"]), float(s["value"])) for s in e.get("exp_samples") or []])
                   for e in test.get("promql_expr_test", [])],
        ))
    return cases
