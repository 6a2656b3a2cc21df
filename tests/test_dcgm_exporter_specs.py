"""Peaks for the GPUs real dcgm-exporter expositions describe badly or not at all (issue 33, item 6).

Each test reads a published capture (tests/fixtures/captures/dcgm-exporter/, copied verbatim) through
the real backend: an A100 that dcgm-exporter 2.x names nowhere but whose MIG instance is 1g.5gb; a GPU
named nowhere with no MIG, where doctor must say how to name it; a time-sliced vGPU ``GRID A100-10C``;
an RTX 4000 Ada; and the DCGM field each GPU's duty cycle was read from. What a test expects of a
capture (its model, profile, framebuffer, clocks, fields) is read from the capture's text; datasheet
and vGPU-table figures are typed here from their sources, not read from the code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent.app.config import load_settings
from agent.backends.dcgm_exporter import DcgmExporterBackend, ExporterReader
from agent.backends.registry import install_spec_overrides
from agent.diagnostics.dcgm_exporter import standalone_findings
from agent.diagnostics.verdict_basis import basis_findings
from agent.model.specs import lookup, mig_name_spec, resolve_spec, spec_by_key
from agent.model.specs.override import set_overrides

CAPTURES = Path(__file__).parent / "fixtures" / "captures" / "dcgm-exporter"
T0 = 1_800_000_000.0
MIB, GIB = 2**20, 2**30
UNNAMED_A100, UNNAMED_PLAIN = "nvdocs-a100-mig-busy.txt", "nvdocs-sentinel-2.1.4.txt"
VGPU, RTX_4000_ADA = "vks-grid-a100-10c.txt", "linode-rtx4000ada-pod.txt"
A100_BUS_BITS = 5120  # A100 40GB: HBM2 on 5120 bits (NVIDIA A100 datasheet)
RTX_4000_ADA_BUS_BITS = 160  # RTX 4000 Ada: GDDR6 on 160 bits


@pytest.fixture(autouse=True)
def _no_overrides_left_behind() -> Iterator[None]:
    yield
    set_overrides({})


def capture(name: str) -> str:
    return (CAPTURES / name).read_text()


def label_values(text: str, label: str) -> set[str]:
    """Every value the capture gives ``label`` (``modelName``, ``GPU_I_PROFILE``, ...)."""
    return set(re.findall(rf'[{{,]\s*{label}="([^"]*)"', text))


def value(text: str, metric: str, gpu: str = "0") -> float:
    """The capture's own number for a whole GPU's series (not a MIG instance's)."""
    for line in text.splitlines():
        if line.startswith(metric + "{") and f'gpu="{gpu}"' in line and "GPU_I_ID" not in line:
            return float(line.rsplit(None, 1)[1])
    raise KeyError(metric)


def framebuffer_mib(text: str) -> float:
    """Used + free + reserved (reserved only where the exporter prints it), as DCGM splits the total."""
    reserved = value(text, "DCGM_FI_DEV_FB_RESERVED") if "DCGM_FI_DEV_FB_RESERVED{" in text else 0.0
    return value(text, "DCGM_FI_DEV_FB_USED") + value(text, "DCGM_FI_DEV_FB_FREE") + reserved


def ddr_bandwidth(text: str, bus_bits: int) -> float:
    """2 (double data rate) x the capture's memory clock x bus width / 8, in bytes/s (gpu-specs.md §4)."""
    return 2 * value(text, "DCGM_FI_DEV_MEM_CLOCK") * 1e6 * bus_bits / 8


@contextmanager
def discovered(text: str) -> Iterator[DcgmExporterBackend]:
    """The real backend after discovery, reading ``text`` as its exporter's body (no network, no sleep)."""
    reader = ExporterReader("http://capture.invalid/metrics", fetch=lambda *_: text.encode(), clock=lambda: T0)
    backend = DcgmExporterBackend(reader)
    try:
        backend.discover()
        yield backend
    finally:
        backend.close()


# ---------------------------------------------------------------- 1. no modelName: the MIG profile


def test_a100_without_a_model_name_gets_the_peaks_its_mig_profile_identifies():
    text = capture(UNNAMED_A100)
    assert "modelName" not in text, "dcgm-exporter 2.x: nothing names the model"
    (profile,) = label_values(text, "GPU_I_PROFILE")
    (instance,) = label_values(text, "GPU_I_ID")
    slices, gb = map(int, re.fullmatch(r"(\d)g\.(\d+)gb", profile).groups())
    with discovered(text) as backend:
        whole, mig = backend.devices["0"], backend.devices[f"0/{instance}"]
    sxm, pcie = spec_by_key("a100-sxm-40gb"), spec_by_key("a100-pcie-40gb")
    assert whole.spec is not None and mig.spec is not None
    assert whole.spec.peak_flops == sxm.peak_flops == pcie.peak_flops, "the 40 GB boards' shared peaks"
    assert whole.spec.mem_bandwidth_bytes_per_s == sxm.mem_bandwidth_bytes_per_s == pcie.mem_bandwidth_bytes_per_s
    assert whole.spec.mem_bandwidth_bytes_per_s == pytest.approx(ddr_bandwidth(text, A100_BUS_BITS), rel=1e-3)
    assert whole.spec.memory_bytes == pytest.approx(framebuffer_mib(text) * MIB, rel=0.02)
    assert whole.spec.tdp_w is None and whole.spec.link_bandwidth_bytes_per_s is None, "SXM4 or PCIe: unknown"
    assert mig.spec.peak_flops["bf16"] == pytest.approx(sxm.peak_flops["bf16"] * slices / 7)
    assert mig.spec.memory_bytes == gb * GIB
    share = gb * GIB / sxm.memory_bytes
    assert mig.spec.mem_bandwidth_bytes_per_s == pytest.approx(sxm.mem_bandwidth_bytes_per_s * share)


def test_the_gpu_s_own_framebuffer_must_agree_with_its_profile():
    text = capture(UNNAMED_A100)
    free = value(text, "DCGM_FI_DEV_FB_FREE")
    doubled = text.replace(f"}} {free:.0f}\n", f"}} {free + 40960:.0f}\n", 1)  # an 80 GB GPU with a 40 GB profile
    assert framebuffer_mib(doubled) == framebuffer_mib(text) + 40960
    with discovered(doubled) as backend:
        assert all(info.spec is None for info in backend.devices.values()), "a contradiction identifies nothing"


def test_doctor_says_where_an_unnamed_gpu_s_peaks_came_from():
    text = capture(UNNAMED_A100)
    (profile,) = label_values(text, "GPU_I_PROFILE")
    with discovered(text) as backend:
        findings, _ = standalone_findings(backend, now=T0)
    (line,) = [f for f in findings if f.check == "peak specs"]
    assert line.status == "info" and profile in line.detail and "modelName" in line.detail


def test_doctor_says_how_to_name_a_gpu_nothing_identifies_and_the_entry_works(tmp_path):
    text = capture(UNNAMED_PLAIN)
    assert "modelName" not in text and "GPU_I_PROFILE" not in text
    with discovered(text) as backend:
        (info,) = backend.devices.values()
        findings, _ = standalone_findings(backend, now=T0)
    assert info.spec is None
    (warn,) = [f for f in findings if f.check == "peak specs"]
    assert warn.status == "warn" and "modelName" in warn.detail and "docs/specs.md" in warn.fix
    snippet = re.search(r"specs: \{.*?\}\}", warn.fix).group(0)
    assert info.model in snippet, "keyed by the name the agent gives such GPUs"
    filled = snippet.replace("<dense TFLOP/s>", "125").replace("<TFLOP/s>", "15.7").replace("<TB/s>", "0.9")
    (tmp_path / "roofwatch.yaml").write_text(filled + "\n", encoding="utf-8")
    install_spec_overrides(load_settings(tmp_path / "roofwatch.yaml").specs)
    with discovered(text) as backend:
        (named,) = backend.devices.values()
        findings, _ = standalone_findings(backend, now=T0)
    assert named.spec is not None and named.spec.peak_flops["bf16"] == 125e12
    assert not [f for f in findings if f.check == "peak specs"], "named: nothing left to advise"


# ---------------------------------------------------------------- 2. vGPU profiles


def test_time_sliced_grid_a100_10c_gets_its_board_s_peaks_and_its_frame_buffer():
    text = capture(VGPU)
    (model,) = label_values(text, "modelName")
    board_prefix, gb = re.fullmatch(r"GRID (\w+)-(\d+)C", model).groups()
    assert board_prefix == "A100", "NVIDIA's tables: A100-<N>C = A100 PCIe 40GB (A100X- is the HGX board)"
    board = spec_by_key("a100-pcie-40gb")
    with discovered(text) as backend:
        info = backend.devices["0"]
    assert info.spec is not None
    assert info.spec.peak_flops == board.peak_flops, "time-sliced: every SM while its slice runs"
    assert info.spec.mem_bandwidth_bytes_per_s == board.mem_bandwidth_bytes_per_s
    assert info.spec.mem_bandwidth_bytes_per_s == pytest.approx(ddr_bandwidth(text, A100_BUS_BITS), rel=1e-3)
    assert info.spec.sm_count == board.sm_count
    assert info.spec.memory_bytes == int(gb) * GIB, "its own frame buffer, 10240 MB in NVIDIA's table"
    assert info.spec.memory_bytes == pytest.approx(framebuffer_mib(text) * MIB, rel=0.01)
    assert "POWER_USAGE" not in text and info.spec.tdp_w is None, "the board's power is shared, and unread here"


# (name as the guest driver prints it, board key, MIG slices or None, frame buffer GB): NVIDIA vGPU
# C-series tables for the A100 PCIe 40GB (A100-*), A100 HGX 40GB (A100X-*), A100 HGX 80GB (A100DX-*).
VGPU_NAMES = [
    ("GRID A100X-10C", "a100-sxm-40gb", None, 10),
    ("GRID A100DX-16C", "a100-sxm-80gb", None, 16),
    ("GRID A100-40C", "a100-pcie-40gb", None, 40),
    ("GRID A100-2-10C", "a100-pcie-40gb", 2, 10),
    ("GRID A100-1-5CME", "a100-pcie-40gb", 1, 5),
    ("GRID A100DX-3-40C", "a100-sxm-80gb", 3, 40),
]


@pytest.mark.parametrize(("name", "key", "slices", "gb"), VGPU_NAMES, ids=[n[0] for n in VGPU_NAMES])
def test_vgpu_profiles_share_their_board(name: str, key: str, slices: int | None, gb: int) -> None:
    board, spec = spec_by_key(key), resolve_spec(vendor="nvidia", name=name)
    assert spec is not None and spec.memory_bytes == gb * GIB
    share = (slices or 7) / 7  # time-sliced: the whole board; MIG-backed: its slices of seven
    assert spec.peak_flops["fp32"] == pytest.approx(board.peak_flops["fp32"] * share)
    bandwidth_share = 1.0 if slices is None else gb * GIB / board.memory_bytes
    assert spec.mem_bandwidth_bytes_per_s == pytest.approx(board.mem_bandwidth_bytes_per_s * bandwidth_share)


def test_a_vgpu_name_wins_over_the_board_s_pci_id():
    """In a guest NVML reports the board's PCI id (A100 PCIe 40GB: 20f1) with the vGPU's name."""
    spec = resolve_spec(vendor="nvidia", name="GRID A100-10C", pci_device_id=0x20F1, memory_bytes=10 * GIB)
    assert spec is not None and spec.memory_bytes == 10 * GIB


@pytest.mark.parametrize("name", ["GRID A100D-10C", "GRID A100-12C", "GRID A100-2-20C", "GRID A100-2-10CME",
                                  "GRID T4-4C", "GRID A100-10Q"])
def test_vgpu_names_no_table_pins_to_one_catalogued_board_are_not_guessed(name: str) -> None:
    """A100D is the A100 PCIe 80GB's and the A100X converged card's; the others are not in the tables."""
    assert resolve_spec(vendor="nvidia", name=name) is None


# ---------------------------------------------------------------- 3. RTX 4000 / 2000 Ada


def test_the_published_rtx_4000_ada_resolves_to_its_entry():
    text = capture(RTX_4000_ADA)
    (model,) = label_values(text, "modelName")
    with discovered(text) as backend:
        info = backend.devices["0"]
    assert info.spec is not None and info.spec.key == "rtx-4000-ada" and info.spec.name == model
    assert info.spec.memory_bytes == pytest.approx(framebuffer_mib(text) * MIB, rel=0.01)
    assert info.spec.mem_bandwidth_bytes_per_s == pytest.approx(ddr_bandwidth(text, RTX_4000_ADA_BUS_BITS), rel=1e-3)


# (NVML name, pci.ids device id, key, datasheet FP32 TF, tensor TF with sparsity, GB/s, W, GB)
ADA_ENTRIES = [
    ("NVIDIA RTX 4000 Ada Generation", 0x27B2, "rtx-4000-ada", 26.7, 327.6, 360, 130, 20),
    ("NVIDIA RTX 2000 Ada Generation", 0x28B0, "rtx-2000-ada", 12.0, 191.9, 224, 70, 16),
]


@pytest.mark.parametrize(("name", "pci", "key", "fp32", "sparse", "gbs", "tdp", "gb"), ADA_ENTRIES,
                         ids=[e[2] for e in ADA_ENTRIES])
def test_rtx_ada_entries_hold_their_datasheet_figures(name: str, pci: int, key: str, fp32: float, sparse: float,
                                                      gbs: float, tdp: float, gb: int) -> None:
    spec = lookup(name=name)
    assert spec is not None and spec.key == key
    assert lookup(vendor="nvidia", pci_device_id=pci, name=name).key == key
    assert spec.peak_flops["fp32"] == pytest.approx(fp32 * 1e12)
    assert spec.peak_flops["fp8"] == pytest.approx(sparse / 2 * 1e12, rel=1e-3), "dense: half the sparse figure"
    assert spec.peak_flops["bf16"] == pytest.approx(sparse / 4 * 1e12, rel=1e-3)
    assert (spec.mem_bandwidth_bytes_per_s, spec.tdp_w, spec.memory_bytes) == (gbs * 1e9, tdp, gb * GIB)


@pytest.mark.parametrize(("name", "pci"), [("NVIDIA RTX 4000 SFF Ada Generation", 0x27B0),
                                           ("NVIDIA RTX 2000E Ada Generation", 0x28B0),
                                           ("NVIDIA RTX 4000 Ada Generation Laptop GPU", 0x27BA)])
def test_ada_siblings_with_other_clocks_are_not_matched(name: str, pci: int) -> None:
    """28b0 is "RTX 2000 / 2000E Ada Generation" in pci.ids: the id alone names no single card."""
    assert lookup(name=name) is None
    assert lookup(vendor="nvidia", pci_device_id=pci, name=name) is None
    assert lookup(vendor="nvidia", pci_device_id=pci) is None


# ---------------------------------------------------------------- 4. the duty source doctor names


def duty_field(text: str) -> str:
    """What the capture's duty cycle is built from: engine activity when exported, else GPU_UTIL."""
    return "DCGM_FI_PROF_GR_ENGINE_ACTIVE" if "DCGM_FI_PROF_GR_ENGINE_ACTIVE{" in text else "DCGM_FI_DEV_GPU_UTIL"


def basis_line(text: str) -> str:
    with discovered(text) as backend:
        (line,) = [f for f in basis_findings(backend, list(backend.devices.values())) if f.check == "verdict basis"]
    return line.detail


@pytest.mark.parametrize("name", [RTX_4000_ADA, VGPU])
def test_doctor_names_the_dcgm_field_the_duty_came_from(name: str) -> None:
    text = capture(name)
    assert "DCGM_FI_DEV_GPU_UTIL{" in text, "both captures export GPU_UTIL: the field read must be told"
    detail = basis_line(text)
    assert duty_field(text) in detail and "utilization.gpu" not in detail


def test_a_duty_only_gpu_names_gpu_util_not_utilization_gpu():
    kept = ("DCGM_FI_DEV_GPU_UTIL{", "DCGM_FI_DEV_SM_CLOCK{")
    text = "".join(line for line in capture(VGPU).splitlines(keepends=True) if line.startswith(kept))
    detail = basis_line(text)
    assert "(basis duty)" in detail and "(DCGM_FI_DEV_GPU_UTIL)" in detail and "utilization.gpu" not in detail


def test_doctor_names_the_exporter_s_duty_field_where_it_fills_nvml_s_samples(tmp_path):
    """NVML joined with the exporter: a pre-Hopper GPU's duty comes from the exporter as the profiling set."""
    from agent.diagnostics.doctor import run_doctor
    from agent.virtual.devices import device_uuid
    from tests.dcgm_exporter_server import FakeExporter, replace_uuids

    scenario = tmp_path / "a100.yaml"
    scenario.write_text('{"name": "join", "seed": 5, "nodes": [{"name": "n1", "model": "a100-sxm-80gb", "gpus": 1}]}')
    text = capture(RTX_4000_ADA)
    with FakeExporter(replace_uuids(text, {"0": device_uuid(5, "n1", 0, "nvidia")})) as exporter:
        settings = load_settings(backend="nvml-virtual", scenario=str(scenario), dcgm_exporter_url=exporter.url)
        report = run_doctor(settings)
    (line,) = [f for f in report.findings if f.check == "verdict basis"]
    assert duty_field(text) in line.detail and "utilization.gpu" not in line.detail


@pytest.mark.parametrize(("name", "quarters"), [("NVIDIA A30 MIG 1g.6gb", 1), ("NVIDIA A30 MIG 2g.12gb", 2),
                                                ("NVIDIA A30 MIG 1c.2g.12gb", 1)])
def test_an_a30_mig_instance_gets_quarters_of_the_board_not_sevenths(name: str, quarters: int) -> None:
    """The A30 divides into four compute slices (MIG user guide, A30-24GB profiles: a 1g.6gb has a quarter
    of the SMs); the catalogue once sliced every MIG GPU by sevenths, a 1g.6gb at 4/7 of its peaks."""
    board = spec_by_key("a30")
    spec = mig_name_spec(board, name)
    assert spec is not None
    assert spec.peak_flops["fp32"] == pytest.approx(board.peak_flops["fp32"] * quarters / 4)
    assert spec_by_key("a100-sxm-80gb").key == "a100-sxm-80gb"
    seventh = mig_name_spec(spec_by_key("a100-sxm-80gb"), "NVIDIA A100-SXM4-80GB MIG 1g.10gb")
    assert seventh is not None and seventh.peak_flops["fp32"] == pytest.approx(
        spec_by_key("a100-sxm-80gb").peak_flops["fp32"] / 7), "every other MIG GPU keeps sevenths"
