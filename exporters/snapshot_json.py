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

from agent.model import NodeSnapshot
from exporters.metrics import clip_label

LABEL_FIELDS = frozenset({
    "node", "gpu", "uuid", "vendor", "model", "pci_bus_id", "partition", "backend", "key",
    "job_id", "user", "namespace", "pod", "container", "job", "name", "server",
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


def snapshot_to_dict(snapshot: NodeSnapshot) -> dict[str, Any]:
    data = to_jsonable(dataclasses.replace(snapshot, verdicts=()))
    data["verdicts"] = [to_jsonable(v.to_json()) for v in snapshot.verdicts]
    data["visible_devices"] = snapshot.visible_devices
    return data
