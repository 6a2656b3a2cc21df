"""What every verdict's explanation must hold, checked from the verdict alone (issue 43, item 3).

Shared by the quick tests (tests/test_classifier_explanations.py) and the property test over every
built-in scenario and labelled trace (tests/test_classifier_reason_properties.py). Each function returns
the problems it finds as sentences, so a failing test names the verdict and the reason.
"""

from __future__ import annotations

import re
from typing import Iterable

from agent.classifier.thresholds import Thresholds
from agent.model import Verdict

SHOWN_AS_PERCENT = {
    "duty", "idle_share", "u_compute", "u_memory", "comm_wait_fraction", "fabric_wait_fraction", "step_cv",
    "step_cv_long", "power_cv", "activity_cv", "link_utilization", "iowait", "io_pressure", "cpu_pressure",
    "clock_ratio", "throttle_fraction", "power_ratio", "mem_busy", "rank_skew", "peer_skew", "step_spread",
    "reported_compute", "spin_wait_fraction", "tail_iowait", "tail_io_pressure", "stall_share", "stall_iowait",
    "clock_vs_job", "working_duty",
}
"""Figures a reason words as a whole percentage: the percentage of the value compared must be in its text."""

FROM_FEATURES = {
    "duty", "u_compute", "u_memory", "comm_wait_fraction", "fabric_wait_fraction", "step_cv", "step_cv_long",
    "power_cv", "activity_cv", "link_utilization", "iowait", "io_pressure", "cpu_pressure", "process_cpu_cores",
    "main_cpu_cores", "loader_cpu_cores", "clock_ratio", "throttle_fraction", "power_ratio", "mem_busy",
    "valid_fraction", "net_congestion_per_s", "net_retransmits_per_s", "net_link_downs", "memory_held_bytes",
    "spin_wait_fraction",
}
"""Quantities that are window features: the value a check carries must be the verdict's own feature."""

KNOWN = FROM_FEATURES | SHOWN_AS_PERCENT | {
    "process_alive", "compute_lead", "memory_lead", "reported_lead", "proxy_power", "power_between_waits",
    "lockstep", "valid_share", "duty_gap", "stand_in_score", "score", "challenger_wins", "held_s", "loader_share",
    "workload_mfu", "workload_mbu", "quiet_tail_s", "tail_cpu_cores", "tail_pcie_bytes", "stall_regularity",
    "stall_copy_bytes",
}


def percent(x: float) -> str:
    return f"{100.0 * x:.0f}%"


def _holds(value: float, threshold: float, direction: str) -> bool:
    """The comparison as the issue states it, written here rather than taken from the code under test."""
    assert direction in ("above", "below"), direction
    return value >= threshold if direction == "above" else value < threshold


def _setting_value(setting: str, t: Thresholds) -> float | None:
    """The threshold a setting expression names (``a``, ``-a``, ``a + b - c`` over classifier settings), or
    None when it names none."""
    tokens = re.findall(r"[+-]|[a-z_]+", setting)
    if not tokens or any(tok not in "+-" and tok not in Thresholds.model_fields for tok in tokens):
        return None
    total, sign = 0.0, 1.0
    for tok in tokens:
        if tok in "+-":
            sign = 1.0 if tok == "+" else -1.0
        else:
            total += sign * getattr(t, tok)
    return total


def problems(verdict: Verdict, t: Thresholds) -> list[str]:
    """Everything wrong with one verdict's reasons and evidence against (empty when it is sound)."""
    out: list[str] = []
    where = f"{verdict.node}/{verdict.gpu}@{verdict.window_end} {verdict.cls}"
    if tuple(r.text for r in verdict.supporting) != verdict.reasons:
        out.append(f"{where}: reasons are not the texts of its supporting records")
    if tuple("against: " + r.text for r in verdict.opposing) != verdict.against:
        out.append(f"{where}: against entries do not read 'against: ...'")
    f = verdict.features
    for side, records in (("reason", verdict.supporting), ("against", verdict.opposing)):
        for r in records:
            if re.search(r"\d+%", r.text) and not r.checks:
                out.append(f"{where}: {side} {r.text!r} quotes a figure and carries no comparison")
            held = []
            for c in r.checks:
                if c.quantity not in KNOWN:
                    out.append(f"{where}: {side} {r.text!r}: unknown quantity {c.quantity}")
                held.append(_holds(c.value, c.threshold, c.direction))
                if c.quantity in SHOWN_AS_PERCENT and percent(c.value) not in r.text:
                    out.append(f"{where}: {side} {r.text!r} does not show the {c.quantity} it compared "
                               f"({percent(c.value)})")
                if c.quantity in FROM_FEATURES:
                    own = getattr(f, c.quantity)
                    if own is None or abs(float(own) - c.value) > 1e-9:
                        out.append(f"{where}: {side} {r.text!r}: {c.quantity} {c.value} is not the window's {own}")
                if c.quantity == "rank_skew" and verdict.rank_skew is not None and abs(verdict.rank_skew - c.value) > 1e-9:
                    out.append(f"{where}: {side} {r.text!r}: rank skew {c.value} is not the verdict's {verdict.rank_skew}")
                if c.setting is not None and (expected := _setting_value(c.setting, t)) is not None \
                        and abs(expected - c.threshold) > 1e-9:
                    out.append(f"{where}: {side} {r.text!r}: threshold {c.threshold} is not {c.setting} = {expected}")
            if side == "reason" and not all(held):
                out.append(f"{where}: reason {r.text!r} has a comparison that points the other way: {r.checks}")
            if side == "against" and (not held or all(held)):
                out.append(f"{where}: against {r.text!r} has no comparison that points the other way")
    return out


def all_problems(verdicts: Iterable[Verdict], t: Thresholds) -> list[str]:
    return [p for v in verdicts for p in problems(v, t)]


def detail_flaps(verdicts: Iterable[Verdict], t: Thresholds) -> list[str]:
    """Details that changed while the class held, sooner than the class's own hysteresis allows: within
    ``min_dwell_s`` of the class's start or of the detail's last change (``unknown`` changes at once)."""
    out = []
    last: dict[tuple[str, str], tuple[str, str, float]] = {}
    for v in verdicts:
        key = (v.node, v.gpu)
        before = last.get(key)
        since = v.window_end
        if before is not None and before[0] == v.cls:
            since = before[2]
            if v.detail != before[1]:
                if v.cls != "unknown" and v.window_end - before[2] < t.min_dwell_s:
                    out.append(f"{key} {v.cls}: {before[1]} -> {v.detail} at {v.window_end}, "
                               f"{v.window_end - before[2]:.0f} s after the last change")
                since = v.window_end
        last[key] = (v.cls, v.detail, since)
    return out
