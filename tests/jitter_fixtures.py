"""A communication-jittered verdict on a GPU without SM or tensor counters, from the real classifier.

The samples are one MI300X (amdsmi: gfx activity, umc activity, power, XGMI and NIC bytes; no SM or
tensor counter) of traces/published/jitter_mi300x.jsonl.gz in its all-to-all jitter phase: of the job
that reports nothing (``jit-mi300x-noreport-*``: the verdict rests on power against fabric bytes), or
of the one that reports step times without step ids (``jit-mi300x-nostep-*``). Only that GPU's lines
of that phase are parsed and classified, so a test built on it stays well under the quick tier's limit.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
from pathlib import Path

from agent.classifier.engine import classify_samples
from agent.model import CollectorHealth, DeviceInfo, DeviceState, GpuSample, NodeSnapshot, Verdict
from agent.trace import read_trace

TRACE = Path(__file__).resolve().parent.parent / "traces" / "published" / "jitter_mi300x.jsonl.gz"
NOREPORT, NOSTEP, GPU = "jit-mi300x-noreport-0", "jit-mi300x-nostep-0", "0"
PHASE_S = (900.0, 1200.0)
"""The ``alltoall_jitter`` phase, seconds after the trace starts (traces/published/sources.yaml)."""


@functools.lru_cache(maxsize=2)
def samples(node_name: str = NOREPORT) -> tuple[GpuSample, ...]:
    """The phase's samples of GPU 0 of ``node_name``, read through the trace reader (header included)."""
    with gzip.open(TRACE, "rt", encoding="utf-8") as f:
        header = f.readline()
        node, gpu = f'"node":"{node_name}"', f'"gpu":"{GPU}"'
        lines = [line for line in f if node in line and gpu in line]
    start = json.loads(header)["started_at"]
    lines = [line for line in lines if start + PHASE_S[0] <= json.loads(line)["ts"] <= start + PHASE_S[1]]
    return tuple(read_trace(io.StringIO(header + "".join(lines))))


@functools.lru_cache(maxsize=2)
def jittered_verdict(node_name: str = NOREPORT, basis: str = "fabric_and_power") -> Verdict:
    """The last communication-jittered verdict of that GPU that rests on ``basis``."""
    verdicts = [v for v in classify_samples(samples(node_name))
                if v.cls == "communication_jittered" and v.basis == basis]
    assert verdicts, f"the classifier found no jitter on {basis} in the phase of {node_name}"
    return verdicts[-1]


def jittered_snapshot(node_name: str = NOREPORT, basis: str = "fabric_and_power") -> NodeSnapshot:
    """A one-GPU node snapshot holding that verdict and the GPU's last sample, as the agent publishes it."""
    verdict, last = jittered_verdict(node_name, basis), samples(node_name)[-1]
    info = DeviceInfo(gpu=last.gpu, uuid=last.uuid or "GPU-0", vendor=last.vendor, model=last.model or "AMD Instinct MI300X")
    device = DeviceState(info=info, up=True, sample=last, last_success_ts=last.ts)
    return NodeSnapshot(ts=last.ts, node=last.node, devices=(device,), health=CollectorHealth(backend="trace"),
                        expected_devices=1, verdicts=(verdict,))
