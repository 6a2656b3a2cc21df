"""An uncatalogued GPU: verdicts without a peak, MFU unknown, and a doctor line whose config entry
really gives the model its peaks (issue 24 §4).

The round trip is tested end to end: the snippet doctor prints, filled in, is loaded by the real
settings loader from a YAML file, installed by the backend registry, and then resolved for the
driver's name the way discovery resolves it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from agent.app.config import ConfigError, load_settings
from agent.backends.registry import install_spec_overrides
from agent.classifier.engine import classify_samples
from agent.diagnostics.spec_advice import config_snippet, spec_finding
from agent.model.specs import estimate_spec, resolve_spec, spec_by_key
from agent.model.specs.override import override_for, set_overrides
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import parse_scenario

MYSTERY = 'NVIDIA Mystery X9 "Pro" 64GB'


@pytest.fixture(autouse=True)
def _no_overrides_left_behind():
    yield
    set_overrides({})


def _config(tmp_path: Path, body: str):
    path = tmp_path / "roofwatch.yaml"
    path.write_text(body, encoding="utf-8")
    return load_settings(path)


def test_doctor_snippet_filled_in_gives_the_model_its_peaks(tmp_path: Path) -> None:
    finding = spec_finding(MYSTERY, None, "0", set())
    assert finding.status == "warn" and MYSTERY in finding.detail and "MFU" in finding.impact
    snippet = config_snippet(MYSTERY)
    assert snippet in finding.fix
    filled = (snippet.replace("<dense TFLOP/s>", "400").replace("<TFLOP/s>", "50")
              .replace("<TB/s>", "2.5"))
    settings = _config(tmp_path, filled + "\n")
    assert resolve_spec(vendor="nvidia", name=MYSTERY) is None  # not yet installed
    install_spec_overrides(settings.specs)
    spec = resolve_spec(vendor="nvidia", name=MYSTERY, pci_device_id=0xFFFF)
    assert spec.key.startswith("override:") and not spec.estimated
    assert spec.peak_flops["bf16"] == pytest.approx(400e12) and spec.peak_flops["fp16"] == spec.peak_flops["bf16"]
    assert spec.peak_flops["fp32"] == pytest.approx(50e12)
    assert spec.ridge_point("bf16") == pytest.approx(160)


def test_override_wins_over_catalogue_and_estimate(tmp_path: Path) -> None:
    settings = _config(tmp_path, 'specs:\n  "AMD Instinct MI308X": {bf16_tflops: 300, mem_bandwidth_tbs: 5}\n')
    install_spec_overrides(settings.specs)
    assert resolve_spec(vendor="amd", name="AMD Instinct MI308X", pci_device_id=0x74A2).peak_flops["bf16"] == 3e14
    assert resolve_spec(vendor="nvidia", name="NVIDIA H100 80GB HBM3").key == "h100-sxm"  # others untouched
    install_spec_overrides(_config(tmp_path, "{}\n").specs)
    assert override_for("AMD Instinct MI308X") is None  # a reload without the entry removes it


@pytest.mark.parametrize(
    ("body", "names"),
    [('specs: {"NVIDIA X": {bf16_tflop: 1}}\n', ["NVIDIA X", "bf16_tflop"]),
     ('specs: {"NVIDIA X": {bf16_tflops: -3}}\n', ["NVIDIA X", "bf16_tflops"]),
     ('specs: {"NVIDIA X": {mem_bandwidth_tbs: "fast"}}\n', ["NVIDIA X", "mem_bandwidth_tbs"])],
)
def test_bad_override_is_refused_naming_the_model_and_field(tmp_path: Path, body: str, names: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, body)
    for name in names:
        assert name in str(err.value)


def test_catalogued_model_gets_no_advice_and_each_model_is_advised_once() -> None:
    seen: set[str] = set()
    assert spec_finding("NVIDIA H100 80GB HBM3", spec_by_key("h100-sxm"), "0", seen) is None
    assert spec_finding(MYSTERY, None, "0", seen) is not None
    assert spec_finding(MYSTERY, None, "1", seen) is None
    mig = spec_finding("NVIDIA Mystery Z MIG 1g.10gb", None, "2/1", seen)
    assert '"NVIDIA Mystery Z"' in mig.fix and "MIG" not in mig.fix  # the parent's name is the key
    est = estimate_spec(vendor="nvidia", name="NVIDIA Mystery E", cuda_cores=100, max_sm_clock_mhz=1000)
    assert "estimated" in spec_finding("NVIDIA Mystery E", est, "3", seen).detail
    assert "without FLOP peaks" in spec_finding("AMD Instinct MI308X", spec_by_key("mi308x"), "4", seen).detail


def test_uncatalogued_model_still_gets_verdicts_with_mfu_unknown() -> None:
    """Activity ratios need no peak: the class survives, the MFU reads unknown (None, never 0)."""
    scenario = {"name": "t", "seed": 3, "nodes": [{"name": "n", "model": "h100-sxm", "gpus": 1, "workloads": [
        {"job": "j", "gpus": [0], "phases": [{"kind": "compute", "duration_s": 300, "mfu": 0.6}]}]}]}
    samples = list(VirtualEngine(parse_scenario(scenario)).iter_trace(150, 1.0, start_ts=1_700_000_000.0))
    known = [v for v in classify_samples(samples, dtype="bf16") if v.window_end - 1_700_000_000.0 >= 60]
    renamed = [dataclasses.replace(s, model=MYSTERY) for s in samples]
    unknown = [v for v in classify_samples(renamed, dtype="bf16") if v.window_end - 1_700_000_000.0 >= 60]
    assert known and unknown
    assert Counter(v.cls for v in unknown).most_common(1)[0][0] == "compute_bound"
    assert any(v.roofline.mfu is not None for v in known)
    assert all(v.roofline.mfu is None for v in unknown)
