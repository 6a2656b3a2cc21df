"""Shared pieces of the selftest tests: an in-process virtual run, and scenarios for odd nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.diagnostics.selftest.phases import parse_phases
from agent.diagnostics.selftest.report import Summary
from agent.diagnostics.selftest.selftest import Options, run_selftest
from agent.virtual.scenario import parse_scenario

NO_GPM = {"name": "sandbox", "seed": 3, "nodes": [
    {"name": "sandboxed", "model": "h100-sxm", "gpus": 1, "nvml": {"gpm": False}}]}
"""An H100 whose driver refuses GPM, as a sandbox that blocks profiling counters does."""

A100 = {"name": "old", "seed": 3, "nodes": [{"name": "old-node", "model": "a100-sxm-80gb", "gpus": 2}]}


def virtual_run(phases: str = "idle,gemm_bf16", seconds: float = 8.0, scenario: dict[str, Any] | None = None,
                **options: Any) -> Summary:
    """The selftest over nvml-virtual, in process, on the manual clock unless ``real_time=True``."""
    return run_selftest(Options(phases=parse_phases(phases), phase_seconds=seconds, backend="nvml-virtual",
                                scenario=parse_scenario(scenario) if scenario else None, **options))


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path
