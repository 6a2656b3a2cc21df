"""Bus C functions: PCIe link state and traffic, XGMI link metrics and status.

Traffic is the virtual engine's, through the gpu_metrics table: XGMI per-link counters are the
fabric bytes spread over the model's links with fixed uneven weights (read = rx, write = tx,
cumulative KB of 1024 bytes). Only partition 0 reports socket traffic (the bus and the links
belong to the socket); other partitions see the static link facts with all-ones counters.

amdsmi_get_pcie_info and amdsmi_get_link_metrics are the table's fields copied (amd_smi.cc, ROCm
6.2 and 6.3), so they fail with it. ``pcie_metric.pcie_bandwidth`` is ``pcie_bandwidth_inst``
as is: whole GB/s, though amdsmi.h documents the field in Mb/s.
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.api_identity import bdf_value
from agent.virtual.fake_amdsmi.device import AmdDevice
from agent.virtual.fake_amdsmi.arguments import out_struct, put
from agent.virtual.fake_nvml.symbols import c_function


class BusFunctions:
    """Mixin of :class:`~agent.virtual.fake_amdsmi.library.FakeAmdSmiLibrary`: uses its state and helpers."""

    @c_function("amdsmi_get_pcie_info", handle=True)
    def _c_pcie_info(self, dev: AmdDevice, out: Any) -> None:
        info = out_struct(out)
        ctypes.memset(ctypes.addressof(info), 0, ctypes.sizeof(info))
        traits = self.traits
        static, metric = info.pcie_static, info.pcie_metric
        static.max_pcie_width = traits.pcie_width  # sysfs max_link_width / max_link_speed
        static.max_pcie_speed = traits.pcie_speed_mts
        static.pcie_interface_version = traits.pcie_gen
        put(static, "max_pcie_interface_version", traits.pcie_gen)  # amdsmi 6.4+
        static.slot_type = codes.CARD_FORM_FACTOR_OAM
        table = self._derived(dev)
        width, speed = table.get("pcie_link_width"), table.get("pcie_link_speed")
        metric.pcie_width = codes.UINT16_MAX if width is None else width
        metric.pcie_speed = codes.UINT32_MAX if speed is None else speed * 100  # 0.1 GT/s -> MT/s
        inst = table.get("pcie_bandwidth_inst")
        metric.pcie_bandwidth = codes.UINT32_MAX if inst is None else inst  # GB/s, copied as is
        for name, key in (("pcie_replay_count", "pcie_replay_count_acc"),
                          ("pcie_l0_to_recovery_count", "pcie_l0_to_recov_count_acc"),
                          ("pcie_replay_roll_over_count", "pcie_replay_rover_count_acc"),
                          ("pcie_nak_sent_count", "pcie_nak_sent_count_acc"),
                          ("pcie_nak_received_count", "pcie_nak_rcvd_count_acc")):
            setattr(metric, name, codes.UINT64_MAX if table.get(key) is None else table[key])
        recovery = table.get("pcie_lc_perf_other_end_recovery")
        put(metric, "pcie_lc_perf_other_end_recovery_count", codes.UINT32_MAX if recovery is None else recovery)

    def _peers(self, dev: AmdDevice) -> list[int]:
        """bdf of the GPU at the far end of each link: the hive's other sockets in order."""
        return [bdf_value(s.primary.info.pci_bus_id) for s in self.sockets if s.index != dev.index]

    @c_function("amdsmi_get_link_metrics", handle=True)
    def _c_link_metrics(self, dev: AmdDevice, out: Any) -> None:
        """Per-link counters as the metrics table has them (all ones where it has none, e.g. MI250X).

        amdsmi 6.x always reports AMDSMI_MAX_NUM_XGMI_LINKS links, with the table's link speed and
        width as bit rate and bandwidth (amd_smi.cc); 7.0 names each link's peer (its bdf) and
        counts only the links there are.
        """
        metrics = out_struct(out)
        table = self._derived(dev)
        socket = self._socket_of(dev)
        reads = table.get("xgmi_read_data_acc") or []
        writes = table.get("xgmi_write_data_acc") or []
        newer = self.release.at_least(7, 0)
        count = (min(socket.link_count, len(metrics.links)) if dev.partition == 0 else 0) if newer else \
            min(codes.MAX_NUM_XGMI_LINKS, len(metrics.links))
        peers = self._peers(dev)
        metrics.num_links = count
        for i in range(count):
            link = metrics.links[i]
            if newer:
                link.bdf.as_uint = peers[i] if i < len(peers) else 0
                link.bit_rate = link.max_bandwidth = self.traits.xgmi_link_gbps
            else:
                speed, width = table.get("xgmi_link_speed"), table.get("xgmi_link_width")
                link.bit_rate = codes.UINT16_MAX if speed is None else speed
                link.max_bandwidth = codes.UINT16_MAX if width is None else width
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
