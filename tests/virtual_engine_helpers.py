"""Shared helpers for the virtual engine tests: one-GPU engines and sample series.

A plain module (not a conftest) so the split test files import exactly what they use, as the
NVML tests do with :mod:`tests.nvml_harness`.
"""

from __future__ import annotations

import statistics
from typing import Any

from agent.model import CLOCK_EVENT_REASONS, GpuSample
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import parse_scenario

RATIO_FIELDS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active",
                "fp16_active", "dram_active", "tensor_hmma_active", "tensor_imma_active", "tensor_dmma_active",
                "tensor_dfma_active")
POWER_CAP = CLOCK_EVENT_REASONS["sw_power_cap"]


def one_gpu(*phases: dict[str, Any], model: str = "h100-sxm", seed: int = 1, counters: str | None = None,
            **workload: Any) -> VirtualEngine:
    """An engine with one node of one GPU running ``phases`` (``counters``: the node's preset)."""
    node: dict[str, Any] = {"name": "n", "model": model, "gpus": 1,
                            "workloads": [{"job": "j", "gpus": [0], "phases": list(phases), **workload}]}
    if counters is not None:
        node["counters"] = counters
    return VirtualEngine(parse_scenario({"name": "t", "seed": seed, "nodes": [node]}))


def series(engine: VirtualEngine, gpu: int = 0, *, start: float = 0.0, seconds: float = 60.0,
           interval: float = 1.0, node: str = "n") -> list[GpuSample]:
    count = int(round(seconds / interval))
    return [engine.sample(node, gpu, start + k * interval, start + (k + 1) * interval) for k in range(count)]


def mean(samples: list[GpuSample], name: str) -> float:
    return statistics.fmean(getattr(s, name) for s in samples)
