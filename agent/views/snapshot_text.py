"""Human-readable snapshot for ``roofwatch snapshot``, and fetching one from a running agent."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from agent.views.safe_text import printable

MAX_CELL = 64
"""Widest a cell may be: a 10 kB model or error string would push every other column off screen."""


def _pct(value: Any) -> str:
    return "—" if value is None else f"{value * 100:5.1f}%"


def _num(value: Any, unit: str, scale: float = 1.0) -> str:
    return "—" if value is None else f"{value * scale:.0f} {unit}"


def snapshot_table(data: dict[str, Any]) -> str:
    """One line per GPU: state, duty, SM, tensor, DRAM, power, clock, memory, and the verdict."""
    header = ("GPU", "MODEL", "STATE", "ENGINE", "SM", "TENSOR", "DRAM", "POWER", "SM CLOCK", "MEMORY USED", "CLASS", "MFU")
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
        f"backend {health['backend']}, cycle {health['cycles_total']}"
    )
    return "\n".join([summary, *lines])


def _verdict_cells(verdict: dict[str, Any] | None) -> tuple[str, str]:
    if verdict is None:
        return "—", "—"
    cls = verdict["class"] + (" (throttled)" if verdict.get("throttled") else "")
    mfu = _pct(verdict.get("mfu"))
    return cls, mfu if verdict.get("mfu_source") != "counters" else f"{mfu} est."


class SnapshotFetchError(Exception):
    """The agent at a URL could not be reached or did not answer with a snapshot."""


def fetch_snapshot_json(url: str, timeout: float = 5.0) -> dict[str, Any]:
    """GET ``/api/v1/snapshot`` from an agent at ``url`` (base URL or the full endpoint)."""
    endpoint = url if url.rstrip("/").endswith("/api/v1/snapshot") else url.rstrip("/") + "/api/v1/snapshot"
    try:
        with urllib.request.urlopen(endpoint, timeout=timeout) as response:  # noqa: S310 - user-given URL
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SnapshotFetchError(f"cannot read a snapshot from {endpoint}: {exc}") from None
