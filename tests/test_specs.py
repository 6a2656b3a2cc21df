"""Tests for the GPU spec catalogue (agent/model/specs/).

Expected numbers come from ../shared/reference/gpu-specs.md (the doc), not from the code: the
ridge points of §3, the bandwidth formula check of §4 and the FP8 = 2 x BF16 dense relation.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, strategies as st

from agent.model import DTYPES, GpuSpec
from agent.model.specs import (
    CATALOGUE,
    achieved_flops,
    estimate_spec,
    lookup,
    normalise_name,
    resolve_spec,
    scale_spec,
    spec_by_key,
)
from agent.views.specs_table import specs_json, specs_table

MIB = 2**20
GIB = 2**30
BY_KEY = {s.key: s for s in CATALOGUE}

# Every GPU of gpu-specs.md §2, under the keys the rest of the agent uses.
EXPECTED_KEYS = {
    "v100-sxm2-16gb", "v100-sxm2-32gb", "v100-pcie-16gb", "v100-pcie-32gb", "t4", "a30", "a40",
    "rtx-6000-ada", "rtx-4000-ada", "rtx-2000-ada", "rtx-pro-6000-blackwell", "h20", "h800-sxm", "h800-pcie", "gb200", "b300", "gb300",
    "mi350x", "mi308x",
    "a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "h100-sxm", "h100-pcie",
    "h100-nvl", "h200-sxm", "gh200-96gb", "gh200-144gb", "b200", "l40s", "l4", "a10", "a10g",
    "mi250x", "mi300x", "mi325x", "mi355x",
}


# Catalogued (recognised by PCI id and name) although no bandwidth or memory figure could be sourced.
NO_MEMORY_FIGURES = {"mi308x"}


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# --- catalogue integrity -------------------------------------------------------------------


def test_catalogue_holds_every_gpu_of_the_doc() -> None:
    assert {s.key for s in CATALOGUE} == EXPECTED_KEYS


def test_keys_are_unique() -> None:
    keys = [s.key for s in CATALOGUE]
    assert len(keys) == len(set(keys))


def test_pci_id_and_memory_pairs_are_unique() -> None:
    pairs = [(pci, s.memory_bytes) for s in CATALOGUE for pci in s.pci_device_ids]
    assert len(pairs) == len(set(pairs))


@pytest.mark.parametrize("spec", CATALOGUE, ids=lambda s: s.key)
def test_units_are_si_and_plausible(spec: GpuSpec) -> None:
    """Catches TFLOP/s-vs-FLOP/s and GB-vs-bytes slips: every value must sit in a sane SI range."""
    assert set(spec.peak_flops) <= set(DTYPES)
    for dtype, peak in spec.peak_flops.items():
        assert 1e12 <= peak <= 1e16, (dtype, peak)
    if spec.key in NO_MEMORY_FIGURES:  # nothing sourced: unknown, and the notes say so
        assert spec.mem_bandwidth_bytes_per_s is None and "unknown" in spec.notes
        return
    assert spec.mem_bandwidth_bytes_per_s is not None
    assert 1e11 <= spec.mem_bandwidth_bytes_per_s <= 2e13
    assert spec.memory_bytes is not None and 16 * GIB <= spec.memory_bytes <= 512 * GIB
    assert spec.tdp_w is None or 50 <= spec.tdp_w <= 2000
    assert spec.link_bandwidth_bytes_per_s is None or 1e10 <= spec.link_bandwidth_bytes_per_s <= 2e12
    assert spec.pci_device_ids, "every catalogued GPU has a confirmed PCI id"
    assert not spec.estimated
    assert spec.notes, "every entry says where its numbers come from"


@pytest.mark.parametrize("spec", CATALOGUE, ids=lambda s: s.key)
def test_precision_ordering(spec: GpuSpec) -> None:
    p = spec.peak_flops
    if "fp8" in p and "bf16" in p:
        assert p["bf16"] <= p["fp8"]
        # Dense FP8 is twice dense BF16 on Hopper, Blackwell, Ada and MI300/MI355.
        assert rel(p["fp8"], 2 * p["bf16"]) < 0.02
    if "bf16" in p:
        assert p["fp16"] == p["bf16"]
    if "tf32" in p:
        # 3%: NVIDIA rounds B200 TF32 to 2.2 PF sparse (1.1 dense) against 4.5 PF sparse BF16.
        assert rel(p["tf32"], p["bf16"] / 2) < 0.03
    if "fp32" in p and "bf16" in p:
        assert p["fp32"] < p["bf16"]


@pytest.mark.parametrize("spec", CATALOGUE, ids=lambda s: s.key)
def test_clocks_and_sm_counts_are_consistent(spec: GpuSpec) -> None:
    if spec.ref_clock_mhz is not None and spec.max_clock_mhz is not None:
        assert 500 <= spec.ref_clock_mhz <= spec.max_clock_mhz <= 3000
    if spec.sm_count is not None:
        assert 20 <= spec.sm_count <= 400  # the RTX 2000 Ada has 22


@pytest.mark.parametrize(
    ("key", "dtype", "ridge"),
    [("h100-sxm", "bf16", 295), ("h100-sxm", "fp8", 591), ("h200-sxm", "bf16", 206),
     ("h200-sxm", "fp8", 412), ("h100-pcie", "bf16", 378), ("h100-pcie", "fp8", 756),
     ("a100-sxm-80gb", "bf16", 153)],
)
def test_ridge_points_match_the_doc(key: str, dtype: str, ridge: float) -> None:
    """gpu-specs.md §3 ridge-point table, +-2%."""
    assert rel(BY_KEY[key].ridge_point(dtype), ridge) < 0.02


def test_h100_sxm_reference_clock_is_the_tensor_clock_not_max_boost() -> None:
    """§4: 989.4 TFLOP/s = 540,672 FLOP/clk x 1.83 GHz, while the max boost is 1.98 GHz."""
    h100 = BY_KEY["h100-sxm"]
    assert rel(h100.peak_flops["bf16"], 540_672 * h100.ref_clock_mhz * 1e6) < 0.002
    assert h100.sm_count == 132 and h100.max_clock_mhz == 1980


def test_mi250x_is_per_gcd() -> None:
    """§2/§5: MI250X values are for two GCDs; each GCD is one device, so halve them."""
    mi = BY_KEY["mi250x"]
    assert rel(mi.peak_flops["bf16"], 383e12 / 2) < 0.01
    assert rel(mi.mem_bandwidth_bytes_per_s, 3.2e12 / 2) < 0.01
    assert rel(mi.memory_bytes, 128 * GIB / 2) < 0.01
    assert "tf32" not in mi.peak_flops


def test_a10g_has_no_guessed_tensor_peak() -> None:
    a10g = BY_KEY["a10g"]
    assert not {"bf16", "fp16", "fp8", "tf32"} & set(a10g.peak_flops)
    assert "unconfirmed" in a10g.notes
    assert achieved_flops(a10g, "bf16", 0.5, 1500) is None


def test_no_sparse_numbers_slipped_in() -> None:
    """§1: the sparse H100 SXM BF16 number is 1979 and the sparse L40S BF16 733: dense is half."""
    assert BY_KEY["h100-sxm"].peak_flops["bf16"] < 1000e12
    assert BY_KEY["l40s"].peak_flops["bf16"] < 400e12
    assert BY_KEY["mi300x"].peak_flops["bf16"] < 1400e12


# --- lookup ---------------------------------------------------------------------------------

# (driver name, memory the driver reports, expected key). NVML names and amdsmi market names.
DRIVER_NAMES = [
    ("NVIDIA H100 80GB HBM3", 81559 * MIB, "h100-sxm"),
    ("NVIDIA H100 PCIe", 81559 * MIB, "h100-pcie"),
    ("NVIDIA H100 NVL", 95830 * MIB, "h100-nvl"),
    ("NVIDIA H200", 143771 * MIB, "h200-sxm"),
    ("NVIDIA A100-SXM4-80GB", 81920 * MIB, "a100-sxm-80gb"),
    ("NVIDIA A100-SXM4-40GB", 40960 * MIB, "a100-sxm-40gb"),
    ("NVIDIA A100-PCIE-40GB", 40960 * MIB, "a100-pcie-40gb"),
    ("NVIDIA A100 80GB PCIe", 81920 * MIB, "a100-pcie-80gb"),
    ("NVIDIA L40S", 46068 * MIB, "l40s"),
    ("NVIDIA L4", 23034 * MIB, "l4"),
    ("NVIDIA A10", 23028 * MIB, "a10"),
    ("NVIDIA A10G", 23028 * MIB, "a10g"),
    ("NVIDIA GH200 480GB", 97280 * MIB, "gh200-96gb"),
    ("NVIDIA GH200 480GB", 146000 * MIB, "gh200-144gb"),
    ("NVIDIA B200", 183359 * MIB, "b200"),
    ("AMD Instinct MI300X", 196592 * MIB, "mi300x"),
    ("AMD Instinct MI250X", 65520 * MIB, "mi250x"),
    ("AMD Instinct MI325X", 262128 * MIB, "mi325x"),
    ("AMD Instinct MI355X", 294896 * MIB, "mi355x"),
]


@pytest.mark.parametrize(("name", "memory", "key"), DRIVER_NAMES)
def test_lookup_by_driver_name(name: str, memory: int, key: str) -> None:
    assert lookup(name=name, memory_bytes=memory).key == key


@pytest.mark.parametrize(
    ("name", "memory", "key"), [t for t in DRIVER_NAMES if not t[0].startswith("NVIDIA GH200")]
)
def test_unique_names_need_no_memory(name: str, memory: int, key: str) -> None:
    assert lookup(name=name).key == key


def test_name_that_does_not_give_the_size_needs_memory() -> None:
    assert lookup(name="NVIDIA GH200 480GB") is None
    assert lookup(name="NVIDIA GH200 480GB", memory_bytes=40 * GIB) is None  # outside +-15%


@pytest.mark.parametrize(
    "name",
    ["Instinct MI210", "AMD Instinct MI210", "AMD Instinct MI250", "NVIDIA H200 NVL", "NVIDIA H100",
     "NVIDIA GeForce RTX 4090", "NVIDIA A100", "NVIDIA L40", "Tesla P100-PCIE-16GB", "Tesla V100S-PCIE-32GB",
     "NVIDIA H20-3e", "", "  "],
)
def test_unknown_or_partial_names_return_none(name: str) -> None:
    """Exact matches only: a prefix or a sibling model must never borrow another model's peaks."""
    assert lookup(name=name, memory_bytes=80 * GIB) is None


@pytest.mark.parametrize(
    ("pci", "memory", "key"),
    [(0x2330, 81559 * MIB, "h100-sxm"), (0x2331, None, "h100-pcie"), (0x2321, None, "h100-nvl"),
     (0x2335, None, "h200-sxm"), (0x2342, None, "gh200-96gb"), (0x2348, None, "gh200-144gb"),
     (0x20B0, 40960 * MIB, "a100-sxm-40gb"), (0x20B2, 81920 * MIB, "a100-sxm-80gb"),
     (0x20F1, None, "a100-pcie-40gb"), (0x20B1, None, "a100-pcie-40gb"),
     (0x20B5, None, "a100-pcie-80gb"), (0x2901, None, "b200"), (0x26B9, None, "l40s"),
     (0x27B8, None, "l4"), (0x2236, None, "a10"), (0x2237, None, "a10g"),
     (0x7408, None, "mi250x"), (0x74A1, None, "mi300x"), (0x74A5, None, "mi325x"),
     (0x75A3, None, "mi355x")],
)
def test_lookup_by_pci_id(pci: int, memory: int | None, key: str) -> None:
    assert lookup(pci_device_id=pci, memory_bytes=memory).key == key


def test_pci_id_wins_over_a_conflicting_name() -> None:
    assert lookup(pci_device_id=0x2330, name="NVIDIA L4").key == "h100-sxm"


def test_unknown_pci_id_falls_back_to_the_name() -> None:
    assert lookup(pci_device_id=0xFFFF, name="NVIDIA L4").key == "l4"
    assert lookup(pci_device_id=0x233B, name="NVIDIA H200 NVL") is None  # H200 NVL: not catalogued


def test_vendor_filters_and_unknown_vendor_matches_nothing() -> None:
    assert lookup(vendor="NVIDIA", pci_device_id=0x2330).key == "h100-sxm"
    assert lookup(vendor="amd", pci_device_id=0x2330) is None
    assert lookup(vendor="intel", name="NVIDIA H100 80GB HBM3") is None


def test_pci_id_shared_with_an_uncatalogued_model_needs_the_cu_count() -> None:
    """740c is "Instinct MI250X/MI250": only 110 CUs per GCD (MI250X, not MI250's 104) confirm it."""
    assert lookup(pci_device_id=0x740C) is None
    assert lookup(pci_device_id=0x740C, sm_count=104) is None
    assert lookup(pci_device_id=0x740C, sm_count=110).key == "mi250x"
    assert lookup(pci_device_id=0x740C, name="AMD Instinct MI250X").key == "mi250x"
    assert lookup(name="AMD Instinct MI250X / MI250") is None
    assert lookup(name="AMD Instinct MI250X / MI250", sm_count=110).key == "mi250x"


def _fake(key: str, memory_gib: float, pci: int = 0x1234) -> GpuSpec:
    return GpuSpec(key=key, name=f"Fake {key}", vendor="nvidia", peak_flops={"bf16": 1e14},
                   mem_bandwidth_bytes_per_s=1e12, memory_bytes=int(memory_gib * GIB), tdp_w=300,
                   pci_device_ids=(pci,))


def test_shared_pci_id_is_disambiguated_by_memory_within_15_percent() -> None:
    """Like A100 40/80 GB under one id: the nearest size wins, but only within +-15%."""
    cat = (_fake("small", 40), _fake("large", 80))
    assert lookup(pci_device_id=0x1234, memory_bytes=40960 * MIB, catalogue=cat).key == "small"
    assert lookup(pci_device_id=0x1234, memory_bytes=79 * GIB, catalogue=cat).key == "large"
    assert lookup(pci_device_id=0x1234, memory_bytes=60 * GIB, catalogue=cat) is None
    assert lookup(pci_device_id=0x1234, catalogue=cat) is None


def test_unique_pci_id_ignores_a_slice_sized_memory() -> None:
    """A MIG-sized memory figure must not unmatch a GPU whose id is unique."""
    assert lookup(pci_device_id=0x2330, memory_bytes=10 * GIB).key == "h100-sxm"


def test_normalise_name_strips_brands_and_punctuation() -> None:
    assert normalise_name("AMD Instinct MI300X") == "mi300x"
    assert normalise_name("NVIDIA A100-SXM4-80GB") == "a100 sxm4 80gb"


def test_spec_by_key() -> None:
    assert spec_by_key("mi300x").name == "AMD Instinct MI300X"
    with pytest.raises(KeyError) as err:
        spec_by_key("h100")
    assert "h100-sxm" in str(err.value) and "mi355x" in str(err.value)


# --- estimates ------------------------------------------------------------------------------


def test_estimate_for_an_a100_like_gpu_matches_the_datasheet() -> None:
    """§4: 1593 MHz x 5120 bit -> 2.04 TB/s; 6912 cores x 2 x 1410 MHz = the 19.5 TF FP32 peak."""
    est = estimate_spec(vendor="nvidia", name="NVIDIA Mystery 80GB", memory_bytes=80 * GIB,
                        cuda_cores=6912, max_sm_clock_mhz=1410, mem_bus_width_bits=5120,
                        max_mem_clock_mhz=1593)
    assert est.estimated and est.key == "estimated:mystery-80gb"
    assert rel(est.mem_bandwidth_bytes_per_s, BY_KEY["a100-sxm-80gb"].mem_bandwidth_bytes_per_s) < 0.01
    assert rel(est.peak_flops["fp32"], BY_KEY["a100-sxm-80gb"].peak_flops["fp32"]) < 0.01
    assert set(est.peak_flops) == {"fp32"}, "tensor peaks cannot be derived"
    assert "5120 bit" in est.notes and "6912 CUDA cores" in est.notes


def test_estimate_reproduces_h100_bandwidth_from_nvml_clocks() -> None:
    """deviceQuery on H100 SXM: memory clock 2619 MHz, 5120-bit bus -> the 3.35 TB/s of §2."""
    est = estimate_spec(vendor="nvidia", name="x", mem_bus_width_bits=5120, max_mem_clock_mhz=2619)
    assert rel(est.mem_bandwidth_bytes_per_s, BY_KEY["h100-sxm"].mem_bandwidth_bytes_per_s) < 0.01
    assert est.peak_flops == {}


def test_estimate_returns_none_when_nothing_can_be_derived() -> None:
    assert estimate_spec(vendor="nvidia", name="NVIDIA Mystery", memory_bytes=GIB) is None
    assert estimate_spec(vendor="nvidia", name="x", cuda_cores=1000) is None  # no clock
    assert estimate_spec(vendor="via", name="x", cuda_cores=1, max_sm_clock_mhz=1) is None


def test_amd_estimate_uses_only_reported_bandwidth() -> None:
    """NVML's DDR formula does not hold for amdsmi clocks: only a reported bandwidth is used."""
    assert estimate_spec(vendor="amd", name="AMD Instinct MI210", cuda_cores=6656,
                         max_sm_clock_mhz=1700, mem_bus_width_bits=4096,
                         max_mem_clock_mhz=1600) is None
    est = estimate_spec(vendor="amd", name="AMD Instinct MI210",
                        reported_mem_bandwidth_bytes_per_s=1.6e12)
    assert est.estimated and est.mem_bandwidth_bytes_per_s == 1.6e12 and est.peak_flops == {}


def test_resolve_prefers_the_catalogue_then_estimates_then_none() -> None:
    known = resolve_spec(vendor="nvidia", name="NVIDIA H100 80GB HBM3", cuda_cores=1,
                         max_sm_clock_mhz=1)
    assert known.key == "h100-sxm" and not known.estimated
    est = resolve_spec(vendor="nvidia", name="NVIDIA GeForce RTX 4090", cuda_cores=16384,
                       max_sm_clock_mhz=2520, mem_bus_width_bits=384, max_mem_clock_mhz=10501)
    assert est.estimated and est.key.startswith("estimated:")
    assert resolve_spec(vendor="nvidia", name="NVIDIA GeForce RTX 4090") is None


# --- scaling and achieved FLOP/s ------------------------------------------------------------


def test_scale_spec_halves_peaks_and_keeps_bandwidth_unless_asked() -> None:
    h100 = BY_KEY["h100-sxm"]
    half = scale_spec(h100, 0.5, suffix="/mig-3g.40gb")
    assert half.key == "h100-sxm/mig-3g.40gb"
    for dtype, peak in h100.peak_flops.items():
        assert math.isclose(half.peak_flops[dtype], peak / 2)
    assert half.sm_count == 66
    assert half.mem_bandwidth_bytes_per_s == h100.mem_bandwidth_bytes_per_s
    both = scale_spec(h100, 0.5, suffix="/x", mem_fraction=0.5)
    assert math.isclose(both.mem_bandwidth_bytes_per_s, h100.mem_bandwidth_bytes_per_s / 2)
    assert math.isclose(both.ridge_point("bf16"), h100.ridge_point("bf16"))


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan")])
def test_scale_spec_rejects_bad_fractions(bad: float) -> None:
    with pytest.raises(ValueError):
        scale_spec(BY_KEY["mi300x"], bad, suffix="/cpx")
    with pytest.raises(ValueError):
        scale_spec(BY_KEY["mi300x"], 0.5, suffix="/cpx", mem_fraction=bad)


def test_achieved_flops_scales_with_activity_and_clock() -> None:
    h100 = BY_KEY["h100-sxm"]
    peak = h100.peak_flops["bf16"]
    assert math.isclose(achieved_flops(h100, "bf16", 0.5, 1980), 0.5 * peak)  # above ref: capped
    assert math.isclose(achieved_flops(h100, "bf16", 1.0, 915), 0.5 * peak)  # half the ref clock
    assert math.isclose(achieved_flops(h100, "bf16", 0.25, None), 0.25 * peak)  # unknown clock
    assert achieved_flops(h100, "bf16", None, 1830) is None
    assert achieved_flops(BY_KEY["a100-sxm-80gb"], "fp8", 0.5, 1410) is None  # A100 has no FP8


@given(
    spec=st.sampled_from(CATALOGUE),
    dtype=st.sampled_from(DTYPES),
    tensor_active=st.floats(min_value=0.0, max_value=1.0),
    clock=st.one_of(st.none(), st.floats(min_value=0.0, max_value=3000.0)),
)
def test_achieved_flops_never_exceeds_the_peak(spec: GpuSpec, dtype: str, tensor_active: float,
                                              clock: float | None) -> None:
    value = achieved_flops(spec, dtype, tensor_active, clock)
    if dtype not in spec.peak_flops:
        assert value is None
    else:
        assert 0.0 <= value <= spec.peak_flops[dtype]


# --- output ---------------------------------------------------------------------------------


def test_specs_table_has_one_line_per_gpu_and_every_key() -> None:
    lines = specs_table().splitlines()
    assert len(lines) == 2 + len(CATALOGUE)  # header + rule + one row each
    for spec in CATALOGUE:
        assert sum(line.split()[0] == spec.key for line in lines) == 1
    a10g = next(line for line in lines if line.startswith("a10g "))
    assert "—" in a10g
    h100 = next(line for line in lines if line.startswith("h100-sxm "))
    assert "989.4" in h100 and "1978.9" in h100 and " 295 " in h100 and "2330" in h100


def test_specs_table_marks_estimates() -> None:
    est = estimate_spec(vendor="nvidia", name="NVIDIA Mystery", cuda_cores=100, max_sm_clock_mhz=1000)
    assert "(estimated)" in specs_table([est])


def test_specs_json_is_serialisable_si_with_ridge_points() -> None:
    data = json.loads(json.dumps(specs_json()))
    assert [d["key"] for d in data] == [s.key for s in CATALOGUE]
    h100 = next(d for d in data if d["key"] == "h100-sxm")
    assert h100["peak_flops"]["bf16"] == pytest.approx(989.4e12)
    assert h100["ridge_points"]["bf16"] == pytest.approx(295, rel=0.02)
    assert h100["pci_device_ids"] == ["0x2330"]
    a10g = next(d for d in data if d["key"] == "a10g")
    assert a10g["peak_flops"] == {} and a10g["ridge_points"] == {}
