"""One GPU reads the same through every release's names and units: before DCGM 4.6, DCGM 4.6, dcgm-exporter 4.9
(DCGM 4.7) and 4.10 (DCGM 4.8); and a name no release table knows is read by its stem and unit suffix, its
magnitude checked, with what was assumed said for ``doctor``.

The fixtures are the A100 node of ``a100-8x-pods.prom`` as each release prints it (their headers say where
every name and unit came from). Before, dcgm-exporter 4.9's names read as a GPU without clocks, energy,
utilisation or memory (``DCGM_FI_DEV_SM_CLOCK_HERTZ`` and the others were no field this backend knew), and a
whole node busy at ``DCGM_FI_DEV_GPU_UTIL_RATIO 1.000000`` read 1 % busy.
"""

from __future__ import annotations

import pytest

from agent.app.config import load_settings
from agent.backends.dcgm_exporter.exposition import read_records
from agent.backends.dcgm_exporter.mapping import sample_values
from agent.classifier.engine import classify_samples
from agent.diagnostics.doctor import run_doctor
from agent.model import GpuSample
from tests.dcgm_exporter_server import FakeExporter, fixture

RELEASES = {
    "DCGM 4.6 names": "a100-8x-pods.dcgm-4.6-names.prom",
    "dcgm-exporter 4.9 (DCGM 4.7)": "a100-8x-pods.exporter-4.9.prom",
    "dcgm-exporter 4.10 (DCGM 4.8)": "a100-8x-pods.exporter-4.10.prom",
}
ENERGY_RESOLUTION_J = 1.0
"""DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL is an int64 of whole joules; the old counter is millijoules."""


def samples_of(body: str) -> dict[str, dict]:
    return {key: sample_values(record) for key, record in read_records(body).records.items()}


def verdicts(body: str) -> dict[str, tuple[str, str, float | None]]:
    records = read_records(body).records
    samples = [GpuSample(ts=1000.0 + t, gpu=key, node="n", uuid=r.uuid, vendor="nvidia", model=r.model,
                         interval_s=1.0, **sample_values(r)) for t in range(90) for key, r in records.items()]
    last: dict[str, tuple[str, str, float | None]] = {}
    for v in classify_samples(samples):
        last[v.gpu] = (v.cls, v.detail, v.roofline.mfu)
    return last


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_gives_the_samples_of_the_old_names(release):
    expected, got = samples_of(fixture("a100-8x-pods.prom")), samples_of(fixture(RELEASES[release]))
    assert sorted(got) == sorted(expected) == [str(i) for i in range(8)]
    for gpu, values in expected.items():
        assert set(got[gpu]) == set(values), (gpu, set(values) ^ set(got[gpu]))
        for field, value in values.items():
            if field == "energy_j":
                assert abs(got[gpu][field] - value) < ENERGY_RESOLUTION_J, (gpu, got[gpu][field], value)
            else:
                assert got[gpu][field] == pytest.approx(value, rel=1e-9, abs=1e-12), (gpu, field, got[gpu][field])
    busy = got["0"]
    assert busy["sm_clock_mhz"] == 1410 and busy["util_gpu"] == 1.0 and busy["mem_busy"] == pytest.approx(0.43)
    assert busy["mem_used_bytes"] == 71234 * 2**20 and busy["mem_total_bytes"] == 81920 * 2**20


@pytest.mark.parametrize("release", RELEASES)
def test_and_the_same_verdicts_and_counter_mfu(release):
    original = verdicts(fixture("a100-8x-pods.prom"))
    assert len(original) == 8 and "unknown" not in {c for c, _, _ in original.values()}
    assert verdicts(fixture(RELEASES[release])) == original


@pytest.mark.parametrize("release", RELEASES)
def test_a_release_whose_names_say_their_units_needs_no_correction_and_no_assumption(release):
    parsed = read_records(fixture(RELEASES[release]))
    assert parsed.units == () and parsed.notes == (), (parsed.units, parsed.notes)
    assert {r.driver for r in parsed.records.values()} == {"535.183.01"}
    assert {r.hostname for r in parsed.records.values()} == {"dgx-a100-017"}


def test_gpu_util_ratio_is_typed_by_how_the_exporter_prints_it():
    """One name, two fields: DCGM 4.6's int64 percent (``%d``) and DCGM 4.7's double ratio (``%f``). A node
    whose every GPU is busy prints 1.000000 under 4.7: 100 %, not 1 %."""
    as_47 = "".join(f'DCGM_FI_DEV_GPU_UTIL_RATIO{{gpu="{i}",UUID="GPU-{i}"}} 1.000000\n' for i in range(4))
    as_46 = "".join(f'DCGM_FI_DEV_GPU_UTIL_RATIO{{gpu="{i}",UUID="GPU-{i}"}} 1\n' for i in range(4))
    assert {v["gr_active"] for v in samples_of(as_47).values()} == {1.0}
    assert {v["gr_active"] for v in samples_of(as_46).values()} == {0.01}
    assert read_records(as_47).units == (), "the name and its printing say the unit: nothing to correct"


UNKNOWN_NAMES = """\
DCGM_FI_DEV_FB_TOTAL_BYTES{gpu="0",UUID="GPU-a",modelName="NVIDIA A100-SXM4-80GB"} 85899345920
DCGM_FI_DEV_FB_USED_BYTES{gpu="0",UUID="GPU-a",modelName="NVIDIA A100-SXM4-80GB"} 74694262784
DCGM_FI_DEV_MAX_SM_CLOCK_HERTZ{gpu="0",UUID="GPU-a",modelName="NVIDIA A100-SXM4-80GB"} 1410000000
DCGM_FI_DEV_MEM_COPY_UTIL_RATIO{gpu="0",UUID="GPU-a",modelName="NVIDIA A100-SXM4-80GB"} 43
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_JOULES{gpu="0",UUID="GPU-a",modelName="NVIDIA A100-SXM4-80GB"} 129931554
DCGM_FI_PROF_PCIE_TX_BYTES_TOTAL{gpu="0",UUID="GPU-a",modelName="NVIDIA A100-SXM4-80GB"} 98765432101234
DCGM_FI_DEV_FB_USED_RATIO{gpu="0",UUID="GPU-a",modelName="NVIDIA A100-SXM4-80GB"} 0.87
"""
"""Names no release table holds (invented, each from a field's stem and a Field Naming Standard unit suffix),
one whose magnitude contradicts its suffix (percent under ``_RATIO``), a cumulative counter whose stem is a
rate's name (``PCIE_TX_BYTES_TOTAL``, DCGM 4.6 field 1091) and a ratio of a field read in MiB (DCGM's real
``FB_USED_RATIO``): the last two must not be read as the rate or the memory."""


def test_an_unknown_name_is_read_by_its_stem_and_suffix_with_its_magnitude_checked():
    parsed = read_records(UNKNOWN_NAMES)
    values = sample_values(parsed.records["0"])
    assert values["mem_total_bytes"] == 85899345920 and values["mem_used_bytes"] == 74694262784
    assert values["sm_clock_max_mhz"] == 1410.0
    assert values["mem_busy"] == pytest.approx(0.43), "43 under a _RATIO name is a percent: its magnitude says so"
    assert values["energy_j"] == 129931554.0
    assert "pcie_tx_bytes_per_s" not in values, "a cumulative counter is not the byte rate its stem names"
    notes = "\n".join(parsed.notes)
    for name in ("DCGM_FI_DEV_FB_TOTAL_BYTES", "DCGM_FI_DEV_MAX_SM_CLOCK_HERTZ", "DCGM_FI_DEV_MEM_COPY_UTIL_RATIO",
                 "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_JOULES"):
        assert f"{name} is no name this roofwatch knows" in notes, notes
    assert "DCGM_FI_DEV_FB_USED_BYTES" not in notes, "a DCGM 4.7 name is known, not assumed"
    assert "PCIE_TX_BYTES_TOTAL" not in notes and "FB_USED_RATIO" not in notes
    assert any("DCGM_FI_DEV_MEM_COPY_UTIL_RATIO reads up to 43: a percent under a ratio name" in u
               for u in parsed.units), parsed.units


def test_doctor_says_what_was_assumed_for_a_name_it_does_not_know():
    with FakeExporter(UNKNOWN_NAMES) as exporter:
        report = run_doctor(load_settings(backend="dcgm-exporter", dcgm_exporter_url=exporter.url))
    assumed = [f.detail for f in report.findings if f.check == "dcgm-exporter" and f.detail.startswith("assumed: ")]
    assert any("DCGM_FI_DEV_MAX_SM_CLOCK_HERTZ is no name this roofwatch knows: read as DCGM_FI_DEV_MAX_SM_CLOCK "
               "by its stem, in Hz by its suffix; values up to 1.41e+09 read as 1410 MHz" in a for a in assumed), assumed
    corrected = [f.detail for f in report.findings if f.detail.startswith("unit corrected: ")]
    assert any("DCGM_FI_DEV_MEM_COPY_UTIL_RATIO reads up to 43" in c for c in corrected), corrected


@pytest.mark.parametrize(("version", "names"), [
    ("4.5.3", ("PIPE_TENSOR_ACTIVE", "PCIE_TX_BYTES")), ("4.6.1", ("TENSOR_UTIL_RATIO", "PCIE_TX_BYTES")),
    ("4.7.0", ("TENSOR_UTIL_RATIO", "PCIE_TX_BYTES")), ("4.8.0", ("TENSOR_UTIL_RATIO", "PCIE_TX_BYTES_PER_SECOND")),
])
def test_doctor_names_dcgm_profiling_fields_as_the_host_engines_release_does(version, names):
    """The DCGM source asks by field id (1004, 1009), which no release moved; only the names doctor prints do."""
    from agent.backends.dcgm.fields import field_name

    assert (field_name(1004, version), field_name(1009, version)) == names


def test_doctor_explains_profiling_fields_missing_on_a_node_of_several_models():
    """dcgm-exporter 4.10 collects on a mixed-model node only the profiling fields every GPU supports."""
    body = fixture("h100-8x-mig.prom").replace('gpu="7",UUID="GPU-8c3f5a1d-e9b2-6074-c2f5-a7d08e1b4f37",'
                                               'pci_bus_id="00000000:DB:00.0",device="nvidia7",'
                                               'modelName="NVIDIA H100 80GB HBM3"',
                                               'gpu="7",UUID="GPU-8c3f5a1d-e9b2-6074-c2f5-a7d08e1b4f37",'
                                               'pci_bus_id="00000000:DB:00.0",device="nvidia7",'
                                               'modelName="NVIDIA H200"')
    assert body.count('modelName="NVIDIA H200"') > 10
    with FakeExporter(body) as exporter:
        report = run_doctor(load_settings(backend="dcgm-exporter", dcgm_exporter_url=exporter.url))
    missing = {f.gpu: f for f in report.findings if f.check == "profiling counters"}
    assert "several models (NVIDIA H100 80GB HBM3, NVIDIA H200)" in missing["2"].fix, missing["2"].fix
    with FakeExporter(fixture("h100-8x-mig.prom")) as exporter:
        single = run_doctor(load_settings(backend="dcgm-exporter", dcgm_exporter_url=exporter.url))
    assert not any("several models" in f.fix for f in single.findings if f.check == "profiling counters")
