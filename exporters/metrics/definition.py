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
    optional: str = ""
    """The :data:`OPTIONAL_GROUPS` group that must be listed in ``optional_metrics`` for this family
    to be exported; "" for a family always exported. Opt-in is for what no shipped panel, rule or
    alert reads (issue 36: series per GPU bound what a fleet's Prometheus holds)."""

    @property
    def family_name(self) -> str:
        """Name handed to prometheus_client, which appends ``_total`` / ``_info`` itself."""
        for suffix in ("_total", "_info"):
            if self.kind in ("counter", "info") and self.name.endswith(suffix):
                return self.name[: -len(suffix)]
        return self.name


OPTIONAL_GROUPS: dict[str, str] = {
    "scores": "roofwatch_gpu_workload_score_ratio: each class's score before hysteresis (6 series per GPU)",
    "pipes": "roofwatch_gpu_pipe_active_ratio and roofwatch_gpu_tensor_pipe_active_ratio: each math and tensor "
             "pipe (up to 7 per GPU)",
    "roofline_detail": "roofwatch_gpu_ridge_point_flops_per_byte, roofwatch_gpu_roof_headroom_ratio, and "
                       "roofwatch_gpu_peak_flops for every precision, not only the one the roofline is drawn for",
    "one_hot_zeros": "the 0-valued series of the one-hot families: roofwatch_gpu_workload_class for the six "
                     "classes a GPU is not in, roofwatch_gpu_clock_event_active for the reasons not active (up to 15 "
                     "per GPU)",
    "fabric_links": "roofwatch_gpu_fabric_link_bytes_total: bytes per GPU-to-GPU link and direction (14 per MI300X; "
                    "roofwatch_gpu_link_bytes_total has the sum and roofwatch_gpu_fabric_link_up each link's state)",
}
"""Series left out by default, by the name a user lists in the ``optional_metrics`` setting."""
