"""The catalogue: every model we know the peaks of, and the driver names and PCI ids that point at them."""

from __future__ import annotations

from agent.model import GpuSpec
from agent.model.specs.amd import AMD
from agent.model.specs.nvidia import NVIDIA
from agent.model.specs.nvidia_blackwell import NVIDIA_BLACKWELL
from agent.model.specs.nvidia_volta_turing import NVIDIA_VOLTA_TURING

CATALOGUE: tuple[GpuSpec, ...] = NVIDIA_VOLTA_TURING + NVIDIA + NVIDIA_BLACKWELL + AMD

# PCI ids that one catalogued model shares with an uncatalogued one: only a matching SM/CU count
# may confirm them, or the sibling (MI250, 104 CUs/GCD, ~6% slower) would silently get our peaks.
SHARED_PCI_IDS: frozenset[int] = frozenset({0x740C})

# PCI ids that one catalogued model shares with an uncatalogued sibling of the same SM count (pci.ids
# 28b0 "RTX 2000 / 2000E Ada Generation"): only the driver name may confirm them.
NAME_CONFIRMED_PCI_IDS: frozenset[int] = frozenset({0x28B0})


# Driver names (NVML nvmlDeviceGetName, amdsmi market_name) -> candidate keys. Each entry's own
# name and key are aliases too. Exact matches only: "NVIDIA H200 NVL" must not become an H200 SXM.
NAME_ALIASES: dict[str, tuple[str, ...]] = {
    "NVIDIA A100-SXM4-40GB": ("a100-sxm-40gb",),
    "NVIDIA A100-SXM4-80GB": ("a100-sxm-80gb",),
    "NVIDIA A100-PCIE-40GB": ("a100-pcie-40gb",),
    "NVIDIA A100 80GB PCIe": ("a100-pcie-80gb",),
    "NVIDIA A100-PCIE-80GB": ("a100-pcie-80gb",),
    "NVIDIA H100 80GB HBM3": ("h100-sxm",),
    "NVIDIA H200": ("h200-sxm",),
    "NVIDIA GH200 480GB": ("gh200-96gb", "gh200-144gb"),  # name omits the HBM size: use memory
    "NVIDIA GH200": ("gh200-96gb", "gh200-144gb"),
    "NVIDIA GH200 144G HBM3e": ("gh200-144gb",),
    # NVML names as nvidia-smi prints them (Volta/Turing keep the "Tesla" brand) and as the NVIDIA
    # driver README's supported-GPU table lists them (open-gpu-kernel-modules 595.45.04).
    "Tesla V100-SXM2-16GB": ("v100-sxm2-16gb",),
    "Tesla V100-SXM2-32GB": ("v100-sxm2-32gb",),
    "Tesla V100-PCIE-16GB": ("v100-pcie-16gb",),
    "Tesla V100-PCIE-32GB": ("v100-pcie-32gb",),
    "Tesla T4": ("t4",),
    "NVIDIA A30": ("a30",),
    "NVIDIA A40": ("a40",),
    "NVIDIA H800": ("h800-sxm",),
    "NVIDIA H800 PCIe": ("h800-pcie",),
    "NVIDIA H20": ("h20",),
    "NVIDIA RTX 6000 Ada Generation": ("rtx-6000-ada",),
    "NVIDIA GB200": ("gb200",),
    "NVIDIA B300 SXM6 AC": ("b300",),
    "NVIDIA GB300": ("gb300",),
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": ("rtx-pro-6000-blackwell",),
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": ("rtx-pro-6000-blackwell",),
}


# Names that cover an uncatalogued sibling too; like SHARED_PCI_IDS they need an SM/CU match.
SHARED_NAMES: dict[str, tuple[str, ...]] = {"AMD Instinct MI250X / MI250": ("mi250x",)}
