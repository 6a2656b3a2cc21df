"""JSON form of a node snapshot, for ``roofwatch snapshot --json`` and the agent's ``/api/v1/snapshot``.

The fields whose values are label values in ``/metrics`` (:data:`LABEL_FIELDS`: node, GPU, UUID,
model, attribution, process and server names) pass through the exposition's one clipping rule
(:func:`exporters.metrics.clip_label`: 128 characters, valid UTF-8), whatever source gave them, so
the JSON, the ``/`` page built from it and ``/metrics`` name a GPU alike and none carries a
kilobytes-long name from a dcgm-exporter label, a pod or a process.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from agent.model import NodeSnapshot, Verdict
from agent.model.attention import attention_of
from agent.model.counter_source import device_basis_sources, source_label
from agent.model.device import DeviceState
from agent.model.waste import waste_of
from exporters.metrics import clip_label

LABEL_FIELDS = frozenset({
    "node", "gpu", "uuid", "vendor", "model", "pci_bus_id", "partition", "backend", "key",
    "job_id", "user", "namespace", "pod", "container", "job", "name", "server", "claim", "account",
})
"""Field names whose string values are exported as label values somewhere in ``/metrics``."""


def _field(name: str, value: Any) -> Any:
    out = to_jsonable(value)
    return clip_label(out) if isinstance(out, str) and name in LABEL_FIELDS else out


def to_jsonable(value: Any) -> Any:
    """Dataclasses to dicts, tuples to lists, non-finite floats to ``None`` (JSON has no NaN); label
    fields clipped as in ``/metrics``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _field(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _field(str(k), v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


EVIDENCE_FIELDS = (
    "comm_wait_fraction", "fabric_wait_fraction", "power_fabric_r", "memory_fabric_r", "power_cv",
    "step_cv", "steps", "steps_inferred", "step_time_mean",
)
"""The window features a verdict's ``evidence`` object carries (agent.model.WindowFeatures): what the
status page shows behind a communication-jittered verdict, whichever signals the GPU has."""


def verdict_evidence(verdict: Verdict) -> dict[str, Any]:
    """The figures behind a verdict beyond its reasons: waits, correlation of power and memory activity
    with fabric bytes, power and step-time variation (``None`` where unknown)."""
    f = verdict.features
    out: dict[str, Any] = {}
    for name in EVIDENCE_FIELDS:
        value = getattr(f, name, None)
        out[name] = round(value, 4) if isinstance(value, float) and math.isfinite(value) else value
    return out


def verdict_waste(verdict: Verdict) -> dict[str, Any]:
    """Whether the verdict's GPU is wasted (agent.model.waste): ``label`` (a waste kind, ``spare`` or ``none``),
    ``wasted`` (counted in whole verdict windows) and ``lost_fraction`` (the lost-time measure; None when unknown)."""
    w = waste_of(verdict)
    return {"label": w.label, "wasted": w.wasted,
            "lost_fraction": None if w.lost_fraction is None else round(w.lost_fraction, 4)}


def verdict_to_dict(verdict: Verdict, device: DeviceState | None = None) -> dict[str, Any]:
    """One verdict of ``/api/v1/snapshot``: its JSON line plus its ``evidence``, its ``waste``, the reasons it
    needs ``attention`` (agent.model.attention), which the ``/`` page lists as they are here, and where the
    counters its basis reads came from (``basis_sources``, ``basis_source``: agent.model.counter_source; none
    named without the ``device``)."""
    sources = device_basis_sources(verdict.basis, device) if device is not None else ()
    return to_jsonable({**verdict.to_json(), "evidence": verdict_evidence(verdict), "waste": verdict_waste(verdict),
                        "attention": [a.to_json() for a in attention_of(verdict)],
                        "basis_sources": list(sources), "basis_source": source_label(sources)})


def snapshot_to_dict(snapshot: NodeSnapshot) -> dict[str, Any]:
    data = to_jsonable(dataclasses.replace(snapshot, verdicts=()))
    devices = {d.info.gpu: d for d in snapshot.devices}
    data["verdicts"] = [verdict_to_dict(v, devices.get(v.gpu)) for v in snapshot.verdicts]
    data["visible_devices"] = snapshot.visible_devices
    return data
