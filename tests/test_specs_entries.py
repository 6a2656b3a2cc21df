"""The catalogue entries added for the GPUs people run (issue 24 §4): each one is found by the name
its driver reports and by its PCI id, its peaks are ordered the way the hardware orders them, and
its ridge point follows from them.

Expected names and ids are the drivers' own (NVML names from the NVIDIA driver README's supported-GPU
table and nvidia-smi output; amdsmi market names) and pci.ids; they are typed here, not read from
the code, so a typo in the catalogue fails.
"""

from __future__ import annotations

import pytest

from agent.model.specs import CATALOGUE, lookup
from agent.views.specs_table import specs_table

MIB = 2**20
BY_KEY = {s.key: s for s in CATALOGUE}

# (driver name, PCI device id, memory the driver reports or None, key)
NEW_ENTRIES = [
    ("Tesla V100-SXM2-16GB", 0x1DB1, 16160 * MIB, "v100-sxm2-16gb"),
    ("Tesla V100-SXM2-32GB", 0x1DB5, 32510 * MIB, "v100-sxm2-32gb"),
    ("Tesla V100-PCIE-16GB", 0x1DB4, 16160 * MIB, "v100-pcie-16gb"),
    ("Tesla V100-PCIE-32GB", 0x1DB6, 32510 * MIB, "v100-pcie-32gb"),
    ("Tesla T4", 0x1EB8, 15360 * MIB, "t4"),
    ("NVIDIA A30", 0x20B7, 24576 * MIB, "a30"),
    ("NVIDIA A40", 0x2235, 46068 * MIB, "a40"),
    ("NVIDIA RTX 6000 Ada Generation", 0x26B1, 49140 * MIB, "rtx-6000-ada"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 0x2BB1, 97887 * MIB, "rtx-pro-6000-blackwell"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 0x2BB5, 97887 * MIB, "rtx-pro-6000-blackwell"),
    ("NVIDIA H20", 0x2329, 97871 * MIB, "h20"),
    ("NVIDIA H800", 0x2324, 81559 * MIB, "h800-sxm"),
    ("NVIDIA H800 PCIe", 0x2322, 81559 * MIB, "h800-pcie"),
    ("NVIDIA GB200", 0x2941, 189471 * MIB, "gb200"),
    ("NVIDIA B300 SXM6 AC", 0x3182, 275040 * MIB, "b300"),
    ("NVIDIA GB300", 0x31C2, 284208 * MIB, "gb300"),
    ("AMD Instinct MI350X", 0x75A0, 294896 * MIB, "mi350x"),
    ("AMD Instinct MI308X", 0x74A2, None, "mi308x"),
]


@pytest.mark.parametrize(("name", "pci", "memory", "key"), NEW_ENTRIES, ids=[e[3] + ":" + e[0] for e in NEW_ENTRIES])
def test_driver_name_resolves_with_and_without_memory(name: str, pci: int, memory: int | None, key: str) -> None:
    assert lookup(name=name).key == key
    if memory is not None:
        assert lookup(name=name, memory_bytes=memory).key == key


@pytest.mark.parametrize(("name", "pci", "memory", "key"), NEW_ENTRIES, ids=[e[3] + ":" + e[0] for e in NEW_ENTRIES])
def test_pci_id_resolves_and_wins_over_the_name(name: str, pci: int, memory: int | None, key: str) -> None:
    vendor = "amd" if name.startswith("AMD") else "nvidia"
    assert lookup(vendor=vendor, pci_device_id=pci, memory_bytes=memory).key == key
    assert lookup(pci_device_id=pci, name="NVIDIA L4").key == key


@pytest.mark.parametrize(
    "name",
    ["NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "NVIDIA H20-3e", "NVIDIA H800 NVL",
     "NVIDIA H20 NVL16", "Tesla V100-SXM3-32GB", "Tesla V100S-PCIE-32GB", "NVIDIA GB300 MaxQ", "NVIDIA RTX 6000",
     "AMD Instinct MI350P", "AMD Instinct MI300A"],
)
def test_siblings_with_other_peaks_are_not_matched(name: str) -> None:
    """A near name is a different SKU (other clocks, power or memory): unknown, never borrowed peaks."""
    assert lookup(name=name) is None


@pytest.mark.parametrize("pci", [0x2BB4, 0x232C, 0x233A, 0x230E, 0x1DB8, 0x1DF6, 0x31A1, 0x75A8, 0x74A0])
def test_sibling_pci_ids_are_not_catalogued(pci: int) -> None:
    assert lookup(pci_device_id=pci) is None


NEW_KEYS = sorted({e[3] for e in NEW_ENTRIES})


@pytest.mark.parametrize("key", NEW_KEYS)
def test_peaks_are_ordered_like_the_hardware(key: str) -> None:
    """fp8 >= bf16 >= tf32 > fp32 where present (dense); fp16 equals bf16 where both exist."""
    p = BY_KEY[key].peak_flops
    chain = [p[d] for d in ("fp8", "bf16", "tf32", "fp32") if d in p]
    assert chain == sorted(chain, reverse=True), p
    if "tf32" in p:
        assert p["tf32"] > p["fp32"]
    if "bf16" in p:
        assert p["fp16"] == p["bf16"]
    if "fp64" in p and "fp32" in p:
        assert p["fp64"] <= p["fp32"] or key == "a30"  # A30: FP64 tensor = FP32 vector (10.3 TF)


@pytest.mark.parametrize("key", NEW_KEYS)
def test_ridge_point_follows_from_peak_and_bandwidth(key: str) -> None:
    spec = BY_KEY[key]
    for dtype, peak in spec.peak_flops.items():
        if spec.mem_bandwidth_bytes_per_s is None:
            assert spec.ridge_point(dtype) is None
        else:
            assert spec.ridge_point(dtype) == pytest.approx(peak / spec.mem_bandwidth_bytes_per_s)


@pytest.mark.parametrize("key", NEW_KEYS)
def test_every_entry_names_its_source(key: str) -> None:
    notes = BY_KEY[key].notes.lower()
    sources = ("datasheet", "data sheet", "third-party", "§", "table", "copies", "copy", "hot chips", "log")
    assert any(word in notes for word in sources), notes


def test_volta_and_turing_have_fp16_but_no_bf16_tf32_or_fp8() -> None:
    for key in ("v100-sxm2-16gb", "v100-sxm2-32gb", "v100-pcie-16gb", "v100-pcie-32gb", "t4"):
        p = BY_KEY[key].peak_flops
        assert "fp16" in p and not {"bf16", "tf32", "fp8"} & set(p), (key, p)
    assert BY_KEY["v100-sxm2-16gb"].peak_flops["fp16"] == pytest.approx(125e12)  # no sparsity on Volta
    assert BY_KEY["v100-sxm2-16gb"].ridge_point("fp16") == pytest.approx(125e12 / 0.9e12)


def test_export_variants_keep_the_h100_compute_but_not_its_fabric() -> None:
    """H800 = H100 compute with NVLink 400 GB/s bidirectional (200 per direction) instead of 900."""
    h100, h800 = BY_KEY["h100-sxm"], BY_KEY["h800-sxm"]
    assert h800.peak_flops["bf16"] == h100.peak_flops["bf16"]
    assert h800.link_bandwidth_bytes_per_s == pytest.approx(200e9)
    assert h100.link_bandwidth_bytes_per_s == pytest.approx(450e9)
    assert h800.peak_flops["fp64"] < h100.peak_flops["fp64"] / 10
    assert BY_KEY["h20"].peak_flops["bf16"] < h100.peak_flops["bf16"] / 5


def test_blackwell_peaks_are_the_dense_halves_of_the_printed_sparse_figures() -> None:
    """GB200 per GPU: NVIDIA prints BF16 5 PF and FP8 10 PF with sparsity -> 2.5 and 5 PF dense."""
    assert BY_KEY["gb200"].peak_flops["bf16"] == pytest.approx(2.5e15)
    assert BY_KEY["gb300"].peak_flops["fp8"] == pytest.approx(5e15)
    assert BY_KEY["b300"].peak_flops["bf16"] == pytest.approx(BY_KEY["b200"].peak_flops["bf16"])
    assert BY_KEY["b300"].peak_flops["fp64"] < BY_KEY["gb200"].peak_flops["fp64"] / 10  # Ultra: FP64 cut


def test_mi308x_is_recognised_but_has_no_guessed_peaks() -> None:
    mi308x = BY_KEY["mi308x"]
    assert mi308x.peak_flops == {} and mi308x.ridge_point("bf16") is None
    assert mi308x.sm_count == 80 and "specs" in mi308x.notes


def test_specs_table_shows_fp16_for_gpus_without_bf16() -> None:
    lines = specs_table().splitlines()
    v100 = next(line for line in lines if line.startswith("v100-sxm2-16gb "))
    assert "125.0*" in v100 and "139*" in v100  # 125 TF / 0.9 TB/s
    h100 = next(line for line in lines if line.startswith("h100-sxm "))
    assert "*" not in h100
