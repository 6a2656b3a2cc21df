"""Per-GPU hardware health: ECC errors, HBM row remapping and XID critical errors.

These are the families that say a GPU needs service rather than tuning, so they are grouped for
alerting rules; each is absent on a backend that cannot read it, never exported as 0.
"""

from __future__ import annotations

from exporters.metrics.definition import MetricDef
from exporters.metrics.labels import GPU_LABELS

ECC_ERRORS = MetricDef(
    "roofwatch_gpu_ecc_errors_total", "counter", "errors",
    "ECC errors since the driver loaded (volatile); any uncorrected error needs attention.",
    GPU_LABELS + ("type",), nvidia="fields ECC_SBE_VOL_TOTAL / ECC_DBE_VOL_TOTAL",
    amd="amdsmi_get_gpu_total_ecc_count (since boot)",
)
REMAPPED_ROWS = MetricDef(
    "roofwatch_gpu_remapped_rows", "gauge", "rows",
    "HBM rows remapped to spares, by the error type that caused it.",
    GPU_LABELS + ("type",), nvidia="fields REMAPPED_COR / REMAPPED_UNC", amd="—",
)
REMAPPED_ROWS_PENDING = MetricDef(
    "roofwatch_gpu_remapped_rows_pending", "gauge", "boolean",
    "1 when a row remap waits for the next GPU reset to take effect.", GPU_LABELS,
    nvidia="field REMAPPED_PENDING", amd="—",
)
REMAPPED_ROWS_FAILURE = MetricDef(
    "roofwatch_gpu_remapped_rows_failure", "gauge", "boolean",
    "1 when a row remap failed (no spare rows left): the GPU needs service.", GPU_LABELS,
    nvidia="field REMAPPED_FAILURE", amd="—",
)
XID_ERRORS = MetricDef(
    "roofwatch_gpu_xid_errors_total", "counter", "events",
    "XID critical-error events since the agent started, per XID code (xid 0 = codes beyond the per-GPU cap).",
    GPU_LABELS + ("xid",), nvidia="nvmlEventSetWait (nvmlEventTypeXidCriticalError)", amd="—",
)
XID_LAST_SEEN = MetricDef(
    "roofwatch_gpu_xid_last_seen_timestamp_seconds", "gauge", "seconds",
    "Unix time of the latest XID event of this code.", GPU_LABELS + ("xid",),
    nvidia="nvmlEventSetWait", amd="—",
)
