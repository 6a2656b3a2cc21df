"""The evidence behind a communication-jittered verdict, as the views show it: the numbers that exist.

A jitter verdict can rest on the job's step times, on SM and tensor counters, on power and memory
activity falling as fabric bytes rise (a GPU without SM or tensor counters: A100 or L40S through
NVML alone, MI300X through amdsmi), on the spread between ranks, or on the NIC's counters
(``EVIDENCE_BASES`` in agent.model.verdict). The status page (from the snapshot's verdict
``evidence``) and ``top`` (from the exposition's series) say which, and give the figures behind it,
so a verdict on a counter-less GPU can be checked rather than taken on trust. Unknown figures are
left out, never shown as 0.
"""

from __future__ import annotations

import math

JITTERED = "communication_jittered"

BASIS_SHORT: dict[str, str] = {
    "step_reports": "step times",
    "comm_counters": "SM/tensor counters",
    "fabric_and_power": "power vs fabric",
    "rank_spread": "rank spread",
    "network_counters": "NIC counters",
}
"""The jitter bases in a few words, for a terminal line (the status page uses ``EVIDENCE_BASES``)."""


def _known(value: object) -> float | None:
    """A finite number, else None (JSON nulls, NaN from an exposition, a label where a number was expected)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%" if value >= 0.1 or value == 0 else f"{value * 100:.1f}%"


def _seconds(value: float) -> str:
    return f"{value:.3g} s"


def evidence_parts(*, wait: object = None, wait_on: str = "", power_r: object = None, memory_r: object = None,
                   step_cv: object = None, steps_inferred: bool = False, power_cv: object = None,
                   step_time_s: object = None, short: bool = False) -> list[str]:
    """The figures behind a jitter verdict, one phrase each, strongest first; unknown ones left out.

    ``wait``: share of samples waiting on peers (counters) or on the fabric (power against fabric
    bytes), ``wait_on`` saying which (``peers``, ``the fabric``); ``power_r``/``memory_r``:
    correlation of power / memory activity with fabric bytes;
    ``step_cv``: CV of the reported step times (``steps_inferred``: the job reports no step ids);
    ``power_cv``: CV of 5 s power blocks, shown only without a step CV (no step reports).
    ``short`` gives the terminal's wording."""
    wait, power_r, memory_r = _known(wait), _known(power_r), _known(memory_r)
    step_cv, power_cv, step_time_s = _known(step_cv), _known(power_cv), _known(step_time_s)
    parts: list[str] = []
    if wait is not None:
        on = f" on {wait_on}" if wait_on else ""
        parts.append(f"wait {_pct(wait)}" if short else f"waiting{on} in {_pct(wait)} of samples")
    if power_r is not None:
        parts.append(f"power~fabric r {power_r:.2f}" if short else f"power vs fabric bytes r {power_r:.2f}")
    if memory_r is not None:
        parts.append(f"memory~fabric r {memory_r:.2f}" if short else f"memory vs fabric bytes r {memory_r:.2f}")
    if step_cv is not None:
        ids = " (no step ids)" if steps_inferred else ""
        parts.append(f"step CV {_pct(step_cv)}{ids}" if short else f"step time CV {_pct(step_cv)}{ids}")
    elif power_cv is not None:
        parts.append(f"power CV {_pct(power_cv)}" + (" (no step reports)" if step_time_s is None else ""))
    if step_time_s is not None:
        parts.append(f"{_seconds(step_time_s)} steps" if short else f"mean step {_seconds(step_time_s)}")
    return parts


def snapshot_evidence(verdict: dict[str, object]) -> list[str]:
    """:func:`evidence_parts` of one verdict of the snapshot JSON (its ``evidence`` object,
    exporters.snapshot_json); empty for a verdict that is not communication-jittered."""
    if verdict.get("class") != JITTERED:
        return []
    e = verdict.get("evidence")
    if not isinstance(e, dict):
        return []
    counters, fabric = _known(e.get("comm_wait_fraction")), _known(e.get("fabric_wait_fraction"))
    steps = _known(e.get("steps"))
    step_cv = e.get("step_cv") if steps is not None and steps >= 2 else None
    # The counters' waits where they saw any (or nothing else was measured), else the fabric's.
    by_counters = bool(counters) or fabric is None
    return evidence_parts(
        wait=counters if by_counters else fabric,
        wait_on=("peers" if counters is not None else "") if by_counters else "the fabric",
        power_r=e.get("power_fabric_r"), memory_r=e.get("memory_fabric_r"), step_cv=step_cv,
        steps_inferred=e.get("steps_inferred") is True, power_cv=e.get("power_cv"),
        step_time_s=e.get("step_time_mean"))
