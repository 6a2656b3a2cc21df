"""JSON form of a node snapshot, for ``roofwatch snapshot --json`` and the agent's ``/api/v1/snapshot``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from agent.model import NodeSnapshot


def to_jsonable(value: Any) -> Any:
    """Dataclasses to dicts, tuples to lists, non-finite floats to ``None`` (JSON has no NaN)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def snapshot_to_dict(snapshot: NodeSnapshot) -> dict[str, Any]:
    data = to_jsonable(dataclasses.replace(snapshot, verdicts=()))
    data["verdicts"] = [to_jsonable(v.to_json()) for v in snapshot.verdicts]
    data["visible_devices"] = snapshot.visible_devices
    return data
