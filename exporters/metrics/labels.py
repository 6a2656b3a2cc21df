"""The label sets of the catalogue and how an open-ended label value is made safe to export.

Kept apart from the families because the collectors and the label options (``gpu_labels``) need
the same fixed sets: the label set per GPU is fixed so the number of series per GPU is bounded,
and the few values that come from outside (job ids, pod and process names) are clipped here so
one long or undecodable value cannot bloat every Prometheus index or break the exposition.
"""

from __future__ import annotations

import re

GPU_LABELS: tuple[str, ...] = ("node", "gpu", "uuid")
NODE_LABELS: tuple[str, ...] = ("node",)
NIC_LABELS: tuple[str, ...] = ("node", "device", "port")
ATTRIBUTION_LABELS: tuple[str, ...] = ("job_id", "namespace", "pod", "container")
"""Labels that may be copied onto every GPU series (opt-in, setting ``gpu_labels``): they change
whenever a job or pod changes, so each one multiplies series churn; the job and pod _info metrics
(:mod:`exporters.metrics.processes`) carry them without that cost, for joins."""

JOB_ID_MAX_LEN = 128
"""Longer label values are cut (job ids, pod and process names, and node, UUID and model names from any
source): a label value is held in every Prometheus series index that uses it."""


def clip_label(value: str | None) -> str:
    """A label value as exported (the rule ``exporters.prometheus.clip_labels`` applies to every label of
    every family, and the snapshot JSON to its label fields): "" when unknown, cut at :data:`JOB_ID_MAX_LEN`,
    and valid UTF-8: a lone surrogate (Python's, and psutil's, way of decoding the undecodable bytes of a
    process name) becomes U+FFFD, where it would otherwise make encoding the whole exposition fail."""
    text = (value or "")[:JOB_ID_MAX_LEN]
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")
