"""What each phase should show, in one table: the bound, a one-line reason, and where it comes from.

Bounds are on interval averages over the phase (GPM on Hopper and newer, the same numbers DCGM's
profiling fields report there), on the classifier's own features, or on the ratio of the counters'
throughput estimate to the throughput the workload timed itself with CUDA events. A value that is
unknown (no GPM, a counter refused) is never read as passing: the check reports ``unknown``, which
fails the run, because a node that cannot show a counter cannot have its semantics checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from agent.diagnostics.selftest.phases import PHASES

Status = Literal["ok", "fail", "unknown"]

SOURCES: dict[str, str] = {
    "DCGM-FO": "NVIDIA DCGM user guide, feature overview, profiling metrics: "
               "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/feature-overview.html",
    "DCGM#40": "NVIDIA engineers on cuBLAS/CUTLASS tensor activity (0.90-0.95): https://github.com/NVIDIA/DCGM/issues/40",
    "NVML-UTIL": "NVML nvmlUtilization_t (GPU utilisation is the share of time a kernel ran): "
                 "https://docs.nvidia.com/deploy/nvml-api/structnvmlUtilization__t.html",
    "NVML-GPM": "NVML GPM metrics (GRAPHICS_UTIL, SM_UTIL, ANY_TENSOR_UTIL, DRAM_BW_UTIL): "
                "https://docs.nvidia.com/deploy/nvml-api/api/group__nvmlGpmEnums.html",
    "OFU": "achieved tensor FLOP/s ~ tensor activity x dense peak x clock ratio (Pedersen et al., "
           "'Instant GPU Efficiency Visibility at Fleet Scale'); docs/classification.md section 4",
    "classifier": "roofwatch's own thresholds (agent/classifier/thresholds.py, docs/classification.md section 5)",
    "nvidia.md": "docs/nvidia.md, Cost: about 10 NVML calls per interval on a Hopper GPU running a process",
}


@dataclass(frozen=True, slots=True)
class Expectation:
    """A bound on one observed value of one phase (``phase="all"``: over the whole run)."""

    phase: str
    metric: str
    low: float | None = None
    high: float | None = None
    equals: str | None = None
    reason: str = ""
    source: str = ""

    @property
    def check(self) -> str:
        """The bound as people read it: ``tensor_active >= 0.80``, ``0.80 <= flops_ratio <= 1.25``."""
        if self.equals is not None:
            return f"{self.metric} = {self.equals}"
        if self.low is not None and self.high is not None:
            return f"{self.low:.2f} <= {self.metric} <= {self.high:.2f}"
        if self.low is not None:
            return f"{self.metric} >= {self.low:.2f}"
        return f"{self.metric} <= {self.high:.2f}"

    def judge(self, value: Any) -> Status:
        if value is None:
            return "unknown"
        if self.equals is not None:
            return "ok" if value == self.equals else "fail"
        ok = (self.low is None or value >= self.low) and (self.high is None or value <= self.high)
        return "ok" if ok else "fail"


_GEMM = (
    ("gr_active", 0.90, None, "matmuls back to back keep a kernel resident all the time", "NVML-UTIL"),
    ("sm_active", 0.80, None, "a large GEMM tiles every SM; NVIDIA: 0.8 or more is needed for effective use", "DCGM-FO"),
    ("tensor_active", 0.80, None, "cuBLAS GEMMs keep the tensor pipe busy: 0.90-0.95 with dcgmproftester", "DCGM#40"),
    ("flops_ratio", 0.80, 1.25, "counter MFU (tensor activity x clock ratio x dense peak) must match the FLOP/s "
                                "timed with CUDA events (2mnk per matmul) within 25%", "OFU"),
)


def _table() -> tuple[Expectation, ...]:
    rows: list[Expectation] = [
        Expectation("idle", "gr_active", high=0.05, reason="no kernel resident: the engine is busy 0% of the time",
                    source="NVML-UTIL"),
        Expectation("idle", "sm_active", high=0.05, reason="no warp resident on any SM", source="DCGM-FO"),
        Expectation("idle", "tensor_active", high=0.02, reason="no matrix math", source="NVML-GPM"),
        Expectation("idle", "dram_active", high=0.05, reason="no memory traffic; the classifier's idle floor is 5%",
                    source="classifier"),
    ]
    for name in ("gemm_bf16", "gemm_fp8"):
        rows += [Expectation(name, metric, low=low, high=high, reason=why, source=src)
                 for metric, low, high, why, src in _GEMM]
    rows += [
        Expectation("copy", "gr_active", low=0.90, reason="copies back to back keep a kernel resident", source="NVML-UTIL"),
        Expectation("copy", "dram_active", low=0.70, reason="streaming HBM near its practical maximum (~0.8 DRAM_ACTIVE)",
                    source="DCGM-FO"),
        Expectation("copy", "tensor_active", high=0.10, reason="a copy does no matrix math", source="NVML-GPM"),
        Expectation("copy", "bytes_ratio", low=0.80, high=1.25,
                    reason="DRAM bandwidth utilisation x peak bandwidth must match the bytes timed with CUDA events "
                           "(2 x size per copy: read + write) within 25%", source="DCGM-FO"),
        Expectation("tiny_kernels", "gr_active", low=0.80,
                    reason="graph-launched kernels follow each other with no host gap: resident (the classifier's "
                           "busy level is 0.8)", source="classifier"),
        Expectation("tiny_kernels", "tensor_active", high=0.05, reason="elementwise kernels do no matrix math",
                    source="NVML-GPM"),
        Expectation("tiny_kernels", "dram_active", high=0.30, reason="a small working set stays in L2: below the "
                    "classifier's memory roof (DRAM ~0.36)", source="classifier"),
        Expectation("starved", "gr_active", high=0.80,
                    reason="the GPU waits for the loader between batches: 20% or more of the time has no kernel "
                           "(the classifier's starvation level)", source="classifier"),
        Expectation("starved", "duty_error", low=-0.15, high=0.15,
                    reason="engine activity is the share of time a kernel ran, so it must match the duty the loop "
                           "timed itself (busy GPU time / wall time) within 0.15", source="NVML-UTIL"),
        Expectation("stream_wait", "gr_active", low=0.80, reason="the spinning kernel keeps the engine busy while "
                                                                 "the other stream waits", source="NVML-UTIL"),
        Expectation("stream_wait", "comm_wait_fraction", low=0.50,
                    reason="most samples show the collective-wait signature: resident, SM <= 0.3, tensor <= 0.05, "
                           "DRAM <= 0.15", source="classifier"),
        Expectation("all", "driver_calls", high=12.0,
                    reason="the agent's cost on the driver: about 10 NVML calls per sample on Hopper with the "
                           "selftest's own process running (its process reads included; 11 where nvidia-ml-py 13.615+ "
                           "and the driver read GPM's cumulative metrics too)", source="nvidia.md"),
    ]
    rows += [Expectation(p.name, "verdict", equals=p.label,
                         reason="the class roofwatch gives must be the class this phase produces", source="classifier")
             for p in PHASES]
    return tuple(rows)


EXPECTATIONS: tuple[Expectation, ...] = _table()


@dataclass(frozen=True, slots=True)
class Check:
    """One expectation judged against what was observed."""

    phase: str
    check: str
    value: Any
    status: Status
    reason: str
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "check": self.check, "value": _rounded(self.value), "status": self.status,
                "reason": self.reason, "source": self.source}

    def describe(self) -> str:
        """``gemm_bf16: tensor_active >= 0.80 (got 0.62)``: how a failed check is named."""
        got = "unknown" if self.value is None else _shown(self.value)
        return f"{self.phase}: {self.check} (got {got})"


def expectations_for(phase: str) -> tuple[Expectation, ...]:
    return tuple(e for e in EXPECTATIONS if e.phase == phase)


def judge(phase: str, observed: Mapping[str, Any], table: tuple[Expectation, ...] = EXPECTATIONS) -> list[Check]:
    """Every expectation of ``phase`` in ``table`` against ``observed`` (metric -> value, None unknown)."""
    return [Check(phase, e.check, observed.get(e.metric), e.judge(observed.get(e.metric)), e.reason, e.source)
            for e in table if e.phase == phase]


def _rounded(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def _shown(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)
