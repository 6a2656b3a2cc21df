"""What one exported metric family is: the record every catalogue module is written in.

One frozen record per family carries everything the exposition and ``docs/metrics.md`` need
(name, type, unit, help, label names, where each backend reads it), so neither can say something
the other does not.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

MetricKind = Literal["gauge", "counter", "info"]


@dataclasses.dataclass(frozen=True)
class MetricDef:
    """One exported metric family. ``name`` is the full exposed name (with ``_total``/``_info``)."""

    name: str
    kind: MetricKind
    unit: str
    help: str
    labels: tuple[str, ...]
    nvidia: str = "—"
    amd: str = "—"
    virtual: str = "simulated"

    @property
    def family_name(self) -> str:
        """Name handed to prometheus_client, which appends ``_total`` / ``_info`` itself."""
        for suffix in ("_total", "_info"):
            if self.kind in ("counter", "info") and self.name.endswith(suffix):
                return self.name[: -len(suffix)]
        return self.name
