"""Per-holder series of shared GPUs (exporters.metrics.holders), built from the snapshot's device states.

The collector already bounded the holders (the largest ``max_holders_per_gpu``, then ``other`` and
``unattributed``), so this only renders what it finds; a GPU that is not shared adds nothing.
"""

from __future__ import annotations

import hashlib

from prometheus_client.core import InfoMetricFamily, Metric

from agent.model import DeviceState
from exporters import metrics as m
from exporters.families import Families, add_known


def holder_label(key: str) -> str:
    """The ``holder`` label: the key, or past the label length its head and a digest of the whole, so two long
    names that differ only past the cut (a kubelet's 253-character pod names) stay two series, never one."""
    if len(key) <= m.JOB_ID_MAX_LEN:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{key[: m.JOB_ID_MAX_LEN - 13]}~{digest}"


class HolderFamilies:
    """Collects the holder families over all GPUs of one snapshot."""

    def __init__(self, fam: Families) -> None:
        self.info = InfoMetricFamily(m.HOLDER_INFO.family_name, m.HOLDER_INFO.help, labels=fam.names(m.HOLDER_SM))
        self.sm = fam.gauge(m.HOLDER_SM)
        self.memory = fam.gauge(m.HOLDER_MEMORY)
        self.power = fam.gauge(m.HOLDER_POWER)
        self.energy = fam.counter(m.HOLDER_ENERGY)
        self.cls = fam.gauge(m.HOLDER_CLASS)
        self.mfu = fam.gauge(m.HOLDER_MFU)

    def add(self, labels: list[str], device: DeviceState) -> None:
        for share in device.holders:
            holder = share.holder
            key = labels + [holder_label(holder.key)]
            if holder.kind in ("pod", "job", "process"):
                self.info.add_metric(key, {name: m.clip_label(value) for name, value in (
                    ("kind", holder.kind), ("via", holder.via), ("namespace", holder.namespace),
                    ("pod", holder.pod), ("container", holder.container), ("job_id", holder.job_id),
                    ("claim", holder.claim), ("user", holder.user), ("account", holder.account)) if value})
            add_known(self.sm, key, share.sm_share)
            add_known(self.memory, key, share.memory_bytes)
            add_known(self.power, key, share.power_w)
            self.energy.add_metric(key, share.energy_j_total)
            if share.verdict:
                self.cls.add_metric(key + [share.verdict], 1.0)
            add_known(self.mfu, key, share.mfu)  # only a holder with its own report, on a GPU of known peak

    def families(self) -> list[Metric]:
        """Only families with a series: a node without a shared GPU exposes exactly what it did before."""
        return [f for f in (self.info, self.sm, self.memory, self.power, self.energy, self.cls, self.mfu) if f.samples]
