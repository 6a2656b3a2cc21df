"""Per-model facts of AMD Instinct parts that the catalogue and DeviceInfo do not hold.

They decide what the fake metrics table looks like: which gpu_metrics revision the driver
exports (MI250X: v1.3, socket power as a 1 s average, no accumulators or XCP stats; MI300-class:
v1.7, instantaneous socket power, accumulators, per-partition XCP stats), how many XCCs share a
socket, and the clock, bus and memory facts amd-smi shows. Values are typical datasheet /
amd-smi figures; nothing derives peaks from them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agent.virtual.fake_amdsmi import codes


@dataclass(frozen=True, slots=True)
class AsicTraits:
    gfx_target: int
    """target_graphics_version as amdsmi_asic_info_t holds it (0x942 reads back as "gfx942")."""
    xcc_count: int
    """Compute dies (XCCs) per socket; the partitions of a socket split them evenly."""
    metrics_revision: int
    """gpu_metrics content revision (format 1): 3 on MI250X, 7 on MI300-class."""
    current_power: bool
    """True: current_socket_power is the reading (MI300-class); False: average_socket_power (MI250X)."""
    edge_sensor: bool
    vram_type: int
    vram_vendor: str
    vram_bit_width: int
    uclk_mhz: tuple[int, int]
    """Memory clock (min, max); max while the DRAM is busy."""
    socclk_mhz: tuple[int, int]
    gfx_min_mhz: int
    pcie_gen: int
    pcie_width: int
    xgmi_width: int
    xgmi_gbps: int
    """XGMI lane rate (Gb/s); a link moves width x rate bits per second and direction."""
    hotspot_critical_c: int
    mem_critical_c: int
    jpeg_engines: int
    vcn_engines: int

    @property
    def accumulators(self) -> bool:
        """gpu_metrics v1.6+ carries accumulation_counter, residencies and XCP stats."""
        return self.metrics_revision >= 6

    @property
    def pcie_speed_mts(self) -> int:
        return {3: 8000, 4: 16000, 5: 32000, 6: 64000}.get(self.pcie_gen, 16000)

    @property
    def xgmi_link_gbps(self) -> int:
        return self.xgmi_width * self.xgmi_gbps


MI300X = AsicTraits(
    gfx_target=0x942, xcc_count=8, metrics_revision=7, current_power=True, edge_sensor=False,
    vram_type=codes.VRAM_TYPE_HBM3, vram_vendor="HYNIX", vram_bit_width=8192, uclk_mhz=(900, 1300),
    socclk_mhz=(28, 1143), gfx_min_mhz=500, pcie_gen=5, pcie_width=16, xgmi_width=16, xgmi_gbps=32,
    hotspot_critical_c=110, mem_critical_c=105, jpeg_engines=32, vcn_engines=4)
MI325X = replace(MI300X, vram_vendor="SAMSUNG", uclk_mhz=(900, 1500))
MI355X = replace(MI300X, gfx_target=0x950, vram_vendor="SAMSUNG", uclk_mhz=(900, 2000), xgmi_gbps=38)
MI250X = AsicTraits(
    gfx_target=0x90A, xcc_count=1, metrics_revision=3, current_power=False, edge_sensor=True,
    vram_type=codes.VRAM_TYPE_HBM2E, vram_vendor="SAMSUNG", vram_bit_width=4096, uclk_mhz=(400, 1600),
    socclk_mhz=(500, 1090), gfx_min_mhz=500, pcie_gen=4, pcie_width=16, xgmi_width=16, xgmi_gbps=25,
    hotspot_critical_c=110, mem_critical_c=95, jpeg_engines=4, vcn_engines=2)

_BY_PREFIX: tuple[tuple[str, AsicTraits], ...] = (
    ("mi300", MI300X), ("mi325", MI325X), ("mi355", MI355X), ("mi350", MI355X), ("mi250", MI250X),
)


def asic_traits(model_key: str) -> AsicTraits:
    """Traits of catalogue model ``model_key``; unknown AMD parts look like an MI300X."""
    return next((t for prefix, t in _BY_PREFIX if model_key.startswith(prefix)), MI300X)
