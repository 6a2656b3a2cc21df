"""Vendor-neutral data model shared by backends, the collector, the classifier and exporters.

Everything here is plain, immutable data in SI units and 0..1 ratios. ``None`` always means
*unknown* (not supported, not yet measured, or lost), never zero: a GPU whose tensor counter
is unavailable must not look like a GPU whose tensor pipes are idle.

The types live in small modules by what they describe (terms, sample, device, verdict,
snapshot) and are re-exported here, so ``from agent.model import GpuSample`` is the one
import the rest of the agent needs. ``agent.model.specs`` holds the GPU peak-spec catalogue.
"""

from agent.model.device import DeviceCounters, DeviceInfo, DeviceState, GpuSpec
from agent.model.sample import (
    SAMPLE_FIELDS,
    Attribution,
    GpuSample,
    HostSample,
    LinkTraffic,
    ProcessSample,
    RemappedRows,
    WorkloadReport,
    XidCount,
)
from agent.model.serving import SERVING_ADVICE, SERVING_STATES, ServingReport, ServingState, ServingView
from agent.model.snapshot import SOURCE_STATES, CollectorHealth, NicPort, NodeSnapshot, RejectedValues, SourceState
from agent.model.terms import (
    CLOCK_EVENT_REASONS,
    DTYPES,
    THROTTLE_REASON_MASK,
    WORKLOAD_CLASSES,
    Dtype,
    NonNegative,
    NonNegativeInt,
    Ratio,
    Vendor,
    WorkloadClass,
)
from agent.model.verdict import EVIDENCE_BASES, Roofline, Verdict, WindowFeatures, evidence_basis

__all__ = [
    "Attribution",
    "CLOCK_EVENT_REASONS",
    "CollectorHealth",
    "DTYPES",
    "DeviceCounters",
    "DeviceInfo",
    "DeviceState",
    "Dtype",
    "GpuSample",
    "GpuSpec",
    "HostSample",
    "LinkTraffic",
    "NicPort",
    "NodeSnapshot",
    "SOURCE_STATES",
    "SourceState",
    "EVIDENCE_BASES",
    "NonNegative",
    "NonNegativeInt",
    "ProcessSample",
    "RejectedValues",
    "Ratio",
    "RemappedRows",
    "Roofline",
    "SAMPLE_FIELDS",
    "SERVING_ADVICE",
    "SERVING_STATES",
    "ServingReport",
    "ServingState",
    "ServingView",
    "THROTTLE_REASON_MASK",
    "Vendor",
    "Verdict",
    "WORKLOAD_CLASSES",
    "WindowFeatures",
    "WorkloadClass",
    "WorkloadReport",
    "XidCount",
    "evidence_basis",
]
