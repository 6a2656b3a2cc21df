"""Bus C functions: PCIe link state and traffic, XGMI link metrics and status.

Traffic is the virtual engine's: PCIe bandwidth is the host-link rate (tx + rx, in Mb/s) over
the latest advance; XGMI per-link counters are the fabric bytes spread over the model's links
with fixed uneven weights (read = rx, write = tx, cumulative KB of 1024 bytes). Only partition 0
reports socket traffic (the bus and the links belong to the socket); other partitions see the
static link facts with N/A counters and no XGMI links.
"""

from __future__ import annotations

from typing import Any

from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.api_identity import bdf_value
from agent.virtual.fake_amdsmi.device import AmdDevice
from agent.virtual.fake_amdsmi.arguments import out_struct
from agent.virtual.fake_amdsmi.metrics_table import pcie_rate
from agent.virtual.fake_nvml.symbols import c_function


class BusFunctions:
    """Mixin of :class:`~agent.virtual.fake_amdsmi.library.FakeAmdSmiLibrary`: uses its state and helpers."""

    @c_function("amdsmi_get_pcie_info", handle=True)
    def _c_pcie_info(self, dev: AmdDevice, out: Any) -> None:
        info = out_struct(out)
        self._fresh(dev)
        traits = self.traits
        static, metric = info.pcie_static, info.pcie_metric
        static.max_pcie_width = traits.pcie_width
        static.max_pcie_speed = traits.pcie_speed_mts
        static.pcie_interface_version = traits.pcie_gen
        static.max_pcie_interface_version = traits.pcie_gen
        static.slot_type = codes.CARD_FORM_FACTOR_OAM
        metric.pcie_width = traits.pcie_width
        metric.pcie_speed = traits.pcie_speed_mts
        rate = pcie_rate(self._socket_of(dev)) if dev.partition == 0 else None
        metric.pcie_bandwidth = codes.UINT32_MAX if rate is None else round(rate * 8 / 1e6)
        counters = ("pcie_replay_count", "pcie_l0_to_recovery_count", "pcie_replay_roll_over_count",
                    "pcie_nak_sent_count", "pcie_nak_received_count")
        for name in counters:
            setattr(metric, name, 0 if dev.partition == 0 else codes.UINT64_MAX)
        metric.pcie_lc_perf_other_end_recovery_count = 0 if dev.partition == 0 else codes.UINT32_MAX

    def _peers(self, dev: AmdDevice) -> list[int]:
        """bdf of the GPU at the far end of each link: the hive's other sockets in order."""
        return [bdf_value(s.primary.info.pci_bus_id) for s in self.sockets if s.index != dev.index]

    @c_function("amdsmi_get_link_metrics", handle=True)
    def _c_link_metrics(self, dev: AmdDevice, out: Any) -> None:
        """Per-link counters as the metrics table has them (all ones where it has none, e.g. MI250X)."""
        metrics = out_struct(out)
        self._fresh(dev)
        socket = self._socket_of(dev)
        table = self._table(dev)
        reads = table.get("xgmi_read_data_acc") or []
        writes = table.get("xgmi_write_data_acc") or []
        count = min(socket.link_count, len(metrics.links)) if dev.partition == 0 else 0
        peers = self._peers(dev)
        metrics.num_links = count
        for i in range(count):
            link = metrics.links[i]
            link.bdf.as_uint = peers[i] if i < len(peers) else 0
            link.bit_rate = self.traits.xgmi_link_gbps
            link.max_bandwidth = self.traits.xgmi_link_gbps
            link.link_type = codes.LINK_TYPE_XGMI
            link.read = reads[i] if i < len(reads) and reads[i] is not None else codes.UINT64_MAX
            link.write = writes[i] if i < len(writes) and writes[i] is not None else codes.UINT64_MAX

    @c_function("amdsmi_get_gpu_xgmi_link_status", handle=True)
    def _c_xgmi_link_status(self, dev: AmdDevice, out: Any) -> None:
        status = out_struct(out)
        links = min(self._socket_of(dev).link_count, len(status.status)) if dev.partition == 0 else 0
        status.total_links = links
        for i in range(len(status.status)):
            status.status[i] = codes.XGMI_LINK_UP if i < links else 2  # AMDSMI_XGMI_LINK_DISABLE
