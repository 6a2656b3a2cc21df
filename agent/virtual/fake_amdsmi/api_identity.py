"""Identity C functions: UUID, PCI address, ASIC, VRAM, KFD node, partitions, driver, XGMI hive.

Identity comes from the virtual :class:`~agent.model.DeviceInfo` so that amdsmi discovery agrees
with the virtual backend's: a partition has its own UUID, its parent's bus and device with the
partition id as PCI function, and 1/N of the compute units and memory.
"""

from __future__ import annotations

import hashlib
from typing import Any

from agent.virtual.devices import MIB, partition_count, partitionable
from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.device import AmdDevice
from agent.virtual.fake_amdsmi.arguments import Fail, out_struct, put, set_value, write_string
from agent.virtual.fake_nvml.symbols import c_function

VENDOR_NAME = "Advanced Micro Devices Inc. [AMD/ATI]"
DRIVER_DATE = "2015/01/01 00:00"
"""What amdgpu reports as its date (the DRM driver date has not changed since 2015)."""
RENDER_MINOR_BASE = 128
VRAM_VENDORS_BEFORE_6_4 = {"SAMSUNG": 1, "INFINEON": 2, "ELPIDA": 3, "ETRON": 4, "NANYA": 5, "HYNIX": 6,
                           "MOSEL": 7, "WINBOND": 8, "ESMT": 9}
"""amdsmi_vram_vendor_type_t of amdsmi 6.2 and 6.3 (value 0 is a placeholder)."""
VRAM_VENDORS_6_4 = {"SAMSUNG": 0, "INFINEON": 1, "ELPIDA": 2, "ETRON": 3, "NANYA": 4, "HYNIX": 5, "MOSEL": 6,
                    "WINBOND": 7, "ESMT": 8, "MICRON": 9}
"""amdsmi 6.4 renumbered the enum (CHANGELOG 6.4.0); 7.0 replaced it with a string."""


def parse_bdf(bus_id: str | None) -> tuple[int, int, int, int]:
    """``"0000:18:00.3"`` -> (domain, bus, device, function)."""
    if not bus_id:
        return 0, 0, 0, 0
    head, _, function = bus_id.partition(".")
    domain, bus, device = (int(x, 16) for x in head.split(":"))
    return domain, bus, device, int(function or 0, 16)


def bdf_value(bus_id: str | None) -> int:
    """The amdsmi_bdf_t union's ``as_uint``: function:3, device:5, bus:8, domain:48 from bit 0."""
    domain, bus, device, function = parse_bdf(bus_id)
    return (function & 0x7) | (device & 0x1F) << 3 | (bus & 0xFF) << 8 | domain << 16


def decimal_gfx(target: int) -> int:
    """gfx target as libamd_smi before 6.4 stored it: each hex digit in decimal (gfx942 -> 942,
    gfx90a -> 9010), which the 6.3 package decodes back; from 6.4 the value is hex (0x942)."""
    return int("".join(str(int(c, 16)) for c in format(target, "x")))


def _digest(text: str, size: int) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=size).digest(), "big")


def board_serial(node: str, index: int) -> str:
    """The board's product serial (FRU) of physical GPU ``index`` on ``node``: twelve digits, as on an
    MI300X OAM; shared by the GPU's partitions, and what the Device Metrics Exporter prints as ``serial_number``."""
    return f"{_digest(f'{node}/{index}/board', 8) % 10**12:012d}"


class IdentityFunctions:
    """Mixin of :class:`~agent.virtual.fake_amdsmi.library.FakeAmdSmiLibrary`: uses its state and helpers."""

    @c_function("amdsmi_get_gpu_device_uuid", handle=True)
    def _c_uuid(self, dev: AmdDevice, length: Any, buffer: Any) -> None:
        write_string(buffer, length, dev.info.uuid)

    @c_function("amdsmi_get_gpu_device_bdf", handle=True)
    def _c_bdf(self, dev: AmdDevice, out: Any) -> None:
        out_struct(out).as_uint = bdf_value(dev.info.pci_bus_id)

    @c_function("amdsmi_get_gpu_bdf_id", handle=True)
    def _c_bdf_id(self, dev: AmdDevice, out: Any) -> None:
        domain, bus, device, function = parse_bdf(dev.info.pci_bus_id)
        set_value(out, domain << 32 | bus << 8 | device << 3 | function)

    @c_function("amdsmi_get_gpu_asic_info", handle=True)
    def _c_asic_info(self, dev: AmdDevice, out: Any) -> None:
        info = out_struct(out)
        device_id = dev.info.pci_device_id or 0
        gfx = self.traits.gfx_target
        for name, data in (("market_name", dev.info.model), ("vendor_id", codes.AMD_VENDOR_ID),
                           ("vendor_name", VENDOR_NAME), ("subvendor_id", codes.AMD_VENDOR_ID),
                           ("device_id", device_id), ("rev_id", 0),
                           ("asic_serial", f"{_digest(dev.info.uuid, 8):016X}"), ("oam_id", dev.index),
                           ("num_of_compute_units", dev.info.sm_count if dev.info.sm_count is not None
                            else codes.UINT32_MAX),  # amdsmi 6.3+
                           ("target_graphics_version", gfx if self.release.at_least(6, 4) else decimal_gfx(gfx)),
                           ("subsystem_id", device_id)):  # amdsmi 7.0+
            put(info, name, data)

    @c_function("amdsmi_get_gpu_board_info", handle=True)
    def _c_board_info(self, dev: AmdDevice, out: Any) -> None:
        info = out_struct(out)  # amdsmi_board_info_t: the FRU's strings; the wrapper turns "" into "N/A"
        for name, data in (("product_serial", board_serial(self.backend.node, dev.index)),
                           ("product_name", dev.info.model), ("manufacturer_name", "AMD")):
            put(info, name, data)

    @c_function("amdsmi_get_gpu_vram_info", handle=True)
    def _c_vram_info(self, dev: AmdDevice, out: Any) -> None:
        info = out_struct(out)
        spec = dev.info.spec
        vendor = self.traits.vram_vendor
        info.vram_type = self.traits.vram_type
        if not put(info, "vram_vendor", vendor):  # a string from 7.0; before, an enum renumbered in 6.4
            table = VRAM_VENDORS_6_4 if self.release.at_least(6, 4) else VRAM_VENDORS_BEFORE_6_4
            info.vram_vendor = table[vendor]
        info.vram_size = (dev.info.memory_total_bytes or 0) // MIB  # MB, as amd-smi means it: MiB
        put(info, "vram_bit_width", self.traits.vram_bit_width)  # amdsmi 6.3+
        bandwidth = spec.mem_bandwidth_bytes_per_s if spec is not None else None
        put(info, "vram_max_bandwidth", round(bandwidth / 1e9) if bandwidth else codes.UINT64_MAX)  # GB/s, 6.4+

    @c_function("amdsmi_get_gpu_kfd_info", handle=True)
    def _c_kfd_info(self, dev: AmdDevice, out: Any) -> None:
        info = out_struct(out)
        put(info, "kfd_id", _digest(f"{self.backend.node}/{dev.info.uuid}", 2))  # KFD's gpu_id: a 16-bit hash
        put(info, "node_id", 1 + self._ordinal(dev))  # KFD node 0 is the CPU
        put(info, "current_partition_id", dev.partition)

    @c_function("amdsmi_get_gpu_enumeration_info", handle=True)
    def _c_enumeration_info(self, dev: AmdDevice, out: Any) -> None:
        info = out_struct(out)
        ordinal = self._ordinal(dev)
        for name, data in (("drm_card", ordinal), ("drm_render", RENDER_MINOR_BASE + ordinal), ("hsa_id", 1 + ordinal),
                           ("hip_id", ordinal), ("hip_uuid", f"GPU-{_digest(dev.info.uuid, 8):016x}")):
            put(info, name, data)

    @c_function("amdsmi_get_gpu_compute_partition", handle=True)
    def _c_compute_partition(self, dev: AmdDevice, buffer: Any, length: Any) -> None:
        if not partitionable(self.node.model):
            raise Fail(codes.STATUS_NOT_SUPPORTED)
        write_string(buffer, length, self.profile.compute_partition)

    @c_function("amdsmi_get_gpu_memory_partition", handle=True)
    def _c_memory_partition(self, dev: AmdDevice, buffer: Any, length: Any) -> None:
        if not partitionable(self.node.model):
            raise Fail(codes.STATUS_NOT_SUPPORTED)
        write_string(buffer, length, self.profile.memory_partition)

    @c_function("amdsmi_get_gpu_xcd_counter", handle=True)
    def _c_xcd_counter(self, dev: AmdDevice, out: Any) -> None:
        parts = partition_count(self.node.model, self.profile.compute_partition)
        set_value(out, max(1, self.traits.xcc_count // parts))

    @c_function("amdsmi_get_gpu_driver_info", handle=True)
    def _c_driver_info(self, dev: AmdDevice, out: Any) -> None:
        info = out_struct(out)
        put(info, "driver_name", "amdgpu")
        put(info, "driver_version", self.profile.driver_version)
        put(info, "driver_date", DRIVER_DATE)

    @c_function("amdsmi_get_xgmi_info", handle=True)
    def _c_xgmi_info(self, dev: AmdDevice, out: Any) -> None:
        if not self._socket_of(dev).link_count:
            raise Fail(codes.STATUS_NOT_SUPPORTED)
        info = out_struct(out)
        put(info, "xgmi_lanes", self.traits.xgmi_width)
        put(info, "xgmi_hive_id", _digest(f"{self.backend.engine.scenario.seed}/{self.backend.node}/hive", 8))
        put(info, "xgmi_node_id", _digest(f"{self.backend.node}/{dev.index}/xgmi", 8))
        put(info, "index", dev.index)
