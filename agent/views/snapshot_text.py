"""Human-readable snapshot for ``roofwatch snapshot``, and fetching one from a running agent."""

from __future__ import annotations

import json
from typing import Any

from agent.views.http_get import FetchError, agent_endpoint, bounded_get
from agent.model.text import printable

MAX_CELL = 64
"""Widest a cell may be: a 10 kB model or error string would push every other column off screen."""


def _pct(value: Any) -> str:
    return "—" if value is None else f"{value * 100:5.1f}%"


def _num(value: Any, unit: str, scale: float = 1.0) -> str:
    return "—" if value is None else f"{value * scale:.0f} {unit}"


def snapshot_table(data: dict[str, Any]) -> str:
    """One line per GPU: state, duty, SM, tensor, DRAM, power, clock, memory, and the verdict with its waste (the
    ``waste`` the snapshot carries: agent.model.waste); the summary counts wasted GPUs in whole windows and spare ones."""
    header = ("GPU", "MODEL", "STATE", "ENGINE", "SM", "TENSOR", "DRAM", "POWER", "SM CLOCK", "MEMORY USED", "CLASS",
              "WASTE", "MFU")
    rows = [header]
    verdicts = {v["gpu"]: v for v in data.get("verdicts") or []}
    for device in data["devices"]:
        info, sample = device["info"], device.get("sample") or {}
        state = "up" if device["up"] else f"DOWN ({device.get('error') or 'unknown'})"
        used = sample.get("mem_used_bytes")
        rows.append(
            (
                info["gpu"], info["model"], state,
                _pct(sample.get("gr_active")), _pct(sample.get("sm_active")),
                _pct(sample.get("tensor_active")), _pct(sample.get("dram_active")),
                _num(sample.get("power_w"), "W"), _num(sample.get("sm_clock_mhz"), "MHz"),
                "—" if used is None else f"{used / 2**30:.1f} GiB",
                *_verdict_cells(verdicts.get(info["gpu"]) if device["up"] else None),
            )
        )
    rows = [tuple(printable(cell, MAX_CELL) for cell in row) for row in rows]  # names come from jobs and remote agents
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    health = data["health"]
    summary = printable(
        f"node {data['node']}: {data['visible_devices']}/{data['expected_devices']} GPUs up, "
        f"backend {health['backend']}, cycle {health['cycles_total']}{_waste_summary(data, verdicts)}"
    )
    return "\n".join([summary, *lines])


def _waste_of(verdict: dict[str, Any] | None) -> dict[str, Any]:
    waste = (verdict or {}).get("waste")
    return waste if isinstance(waste, dict) else {}


def _waste_summary(data: dict[str, Any], verdicts: dict[str, Any]) -> str:
    """``, wasted 4/8 (whole windows), time lost 24%, spare 1``; nothing for an agent whose snapshot has no waste."""
    up = [verdicts.get(d["info"]["gpu"]) for d in data["devices"] if d["up"] and d["info"]["gpu"] in verdicts]
    wastes = [_waste_of(v) for v in up if _waste_of(v)]
    if not wastes:
        return ""
    wasted = sum(1 for w in wastes if w.get("wasted") is True)
    lost = sum(w["lost_fraction"] for w in wastes if isinstance(w.get("lost_fraction"), (int, float)))
    unmeasured = any(w.get("wasted") is True and w.get("lost_fraction") is None for w in wastes)
    spare = sum(1 for w in wastes if w.get("label") == "spare")
    return (f", wasted {wasted}/{len(data['devices'])} (whole windows), time lost {'≥ ' if unmeasured else ''}"
            f"{lost / len(wastes) * 100:.0f}%" + (f", spare {spare}" if spare else ""))


def _verdict_cells(verdict: dict[str, Any] | None) -> tuple[str, str, str]:
    if verdict is None:
        return "—", "—", "—"
    cls = verdict["class"] + (" (throttled)" if verdict.get("throttled") else "")
    mfu = _pct(verdict.get("mfu"))
    waste = _waste_of(verdict)
    label = str(waste.get("label") or "—")
    if waste.get("wasted") is True and isinstance(waste.get("lost_fraction"), (int, float)):
        label += f" (lost {waste['lost_fraction'] * 100:.0f}%)"
    return cls, label, mfu if verdict.get("mfu_source") != "counters" else f"{mfu} est."


class SnapshotFetchError(Exception):
    """The agent at a URL could not be reached or did not answer with a snapshot (one printable line)."""


FETCH_TIMEOUT_S = 5.0
"""Longest wait for any one read (connecting, the headers, each part of the body)."""

FETCH_DEADLINE_S = 10.0
"""Longest the whole GET may take: a server sending a byte a second cannot hold the command."""

MAX_SNAPSHOT_BYTES = 16 * 2**20
"""A 64-GPU node with 16 processes each answers well under 2 MB; a larger answer is not a snapshot."""

MAX_DEPTH = 32
"""A snapshot nests about 7 levels deep (node, devices, one device, sample, processes, one process)."""


def fetch_snapshot_json(url: str, timeout: float = FETCH_TIMEOUT_S, deadline: float = FETCH_DEADLINE_S) -> dict[str, Any]:
    """GET ``/api/v1/snapshot`` from an agent at ``url`` (base URL or the full endpoint), bounded in
    time, size and depth, and checked for the shape :func:`snapshot_table` reads."""
    try:
        endpoint = agent_endpoint(url, "/api/v1/snapshot")  # "node:9477" as `top` takes it, not "unknown url type"
    except ValueError as exc:
        raise SnapshotFetchError(str(exc)) from None
    try:
        body = bounded_get(endpoint, accept="application/json", timeout_s=timeout, deadline_s=deadline,
                           max_bytes=MAX_SNAPSHOT_BYTES)
    except FetchError as exc:
        raise SnapshotFetchError(f"cannot read a snapshot from {endpoint}: {exc.reason}") from None
    try:
        data = json.loads(body)
    except RecursionError:
        raise SnapshotFetchError(f"{endpoint} answered JSON nested too deeply: not a roofwatch snapshot") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a 5000-digit number
        raise SnapshotFetchError(f"{endpoint} did not answer with JSON ({printable(' '.join(str(exc).split()), 80)})") from None
    if _depth(data) > MAX_DEPTH:
        raise SnapshotFetchError(f"{endpoint} answered JSON nested more than {MAX_DEPTH} deep: not a roofwatch snapshot")
    if (wrong := _shape_error(data)) is not None:
        raise SnapshotFetchError(f"{endpoint} did not answer with a roofwatch snapshot ({printable(wrong, 120)})")
    return data


def _depth(value: Any) -> int:
    """Nesting depth, walked without recursion (the printer and the checks below recurse)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


_NUMBER, _TEXT, _FLAG = (int, float), (str,), (bool,)
_SAMPLE_NUMBERS = ("gr_active", "sm_active", "tensor_active", "dram_active", "power_w", "sm_clock_mhz", "mem_used_bytes")


def _kind(value: Any, kinds: tuple[type, ...], optional: bool = True) -> bool:
    if value is None:
        return optional
    if isinstance(value, bool) and bool not in kinds:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not -1e300 <= value <= 1e300:
        return False  # a 400-digit integer would overflow the float arithmetic of the table
    return isinstance(value, kinds)


def _shape_error(data: Any) -> str | None:
    """The first field :func:`snapshot_table` reads that is missing or of the wrong type, named."""
    if not isinstance(data, dict):
        return "not a JSON object"
    for key, kinds in (("node", _TEXT), ("visible_devices", (int,)), ("expected_devices", (int,))):
        if not _kind(data.get(key), kinds, optional=False):
            return f"{key}: missing or not a {kinds[0].__name__}"
    health = data.get("health")
    if not isinstance(health, dict) or not _kind(health.get("backend"), _TEXT, False) \
            or not _kind(health.get("cycles_total"), (int,), False):
        return "health: missing backend or cycles_total"
    devices = data.get("devices")
    if not isinstance(devices, list):
        return "devices: missing or not a list"
    for i, device in enumerate(devices):
        info = device.get("info") if isinstance(device, dict) else None
        if not isinstance(info, dict) or not _kind(info.get("gpu"), _TEXT, False) or not _kind(info.get("model"), _TEXT):
            return f"devices[{i}].info: missing gpu or model"
        if not _kind(device.get("up"), _FLAG, False) or not _kind(device.get("error"), _TEXT):
            return f"devices[{i}]: up or error of the wrong type"
        sample = device.get("sample")
        if sample is not None and (not isinstance(sample, dict)
                                   or not all(_kind(sample.get(k), _NUMBER) for k in _SAMPLE_NUMBERS)):
            return f"devices[{i}].sample: not an object of numbers"
    verdicts = data.get("verdicts")
    if not isinstance(verdicts, (list, type(None))):
        return "verdicts: not a list"
    for i, v in enumerate(verdicts or []):
        if not isinstance(v, dict) or not _kind(v.get("gpu"), _TEXT, False) or not _kind(v.get("class"), _TEXT, False) \
                or not _kind(v.get("mfu"), _NUMBER) or not _kind(v.get("mfu_source"), _TEXT):
            return f"verdicts[{i}]: missing gpu or class, or mfu of the wrong type"
    return None
