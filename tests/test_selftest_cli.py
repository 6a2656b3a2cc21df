"""``roofwatch selftest`` as a user runs it: a real process over nvml-virtual, its report, files and exit status."""

from __future__ import annotations

import gzip
import json
import subprocess

import pytest

from agent.diagnostics.selftest.phases import PHASES
from tests.agent_process import clean_env, roofwatch_cmd
from tests.selftest_helpers import NO_GPM, write_yaml

pytestmark = pytest.mark.slow


def _selftest(*args: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(roofwatch_cmd("selftest", *args), capture_output=True, text=True, timeout=timeout,
                          env=clean_env(), cwd=cwd)


def test_virtual_selftest_reports_every_phase_and_writes_traces_classify_evaluate_scores(tmp_path):
    out = tmp_path / "run"
    result = _selftest("--backend", "nvml-virtual", "--phase-seconds", "45", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    for p in PHASES:
        assert f"] {p.name}: expect {p.label}" in result.stdout
    assert "result: every expectation holds (exit 0)" in result.stdout and "Traceback" not in result.stderr

    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["virtual"] is True and summary["failed"] == []
    assert [p["name"] for p in summary["phases"]] == [p.name for p in PHASES]
    for entry in summary["phases"]:
        assert entry["status"] == "ran" and entry["verdict"] == entry["label"]
        assert entry["checks"] and {c["status"] for c in entry["checks"]} == {"ok"}
        with gzip.open(out / entry["trace"], "rt") as trace:
            lines = [json.loads(line) for line in trace]
        assert lines[0]["format"] == "roofwatch-trace" and "selftest phase" in lines[0]["note"]
        assert {line["label"] for line in lines[1:]} == {entry["label"]} and len(lines) > 150
    assert summary["driver"]["calls_per_sample"] > 0 and summary["driver"]["ms_per_sample"] > 0

    traces = sorted(str(p) for p in out.glob("*.jsonl.gz"))
    scored = subprocess.run(roofwatch_cmd("classify", *traces, "--evaluate", "--json", "-q"), capture_output=True,
                            text=True, timeout=120, env=clean_env())
    assert scored.returncode == 0, scored.stderr
    classes = json.loads(scored.stdout)["evaluation"]["classes"]
    for label in {p.label for p in PHASES}:
        assert classes[label]["recall"] >= 0.5, (label, classes)


def test_without_a_gpu_or_torch_or_cupy_it_says_what_is_missing_and_exits_1(tmp_path):
    result = _selftest(cwd=tmp_path)  # backend auto, on this machine: no NVIDIA driver, neither library installed
    assert result.returncode == 1
    assert "no NVIDIA GPU to test" in result.stderr and "libnvidia-ml.so.1 not found" in result.stderr
    assert "pip install torch" in result.stderr and "pip install cupy-cuda12x" in result.stderr
    assert "--backend nvml-virtual" in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # the output directory it made for the run is gone again


def test_a_node_whose_gpm_is_refused_exits_3_naming_the_checks_it_could_not_make(tmp_path):
    scenario = write_yaml(tmp_path / "sandbox.yaml", NO_GPM)
    result = _selftest("--backend", "nvml-virtual", "--scenario", str(scenario), "--phases", "idle,gemm_bf16",
                       "--out", str(tmp_path / "run"))
    assert result.returncode == 3, result.stderr
    assert "WARN GPM: unavailable" in result.stdout
    assert "gemm_bf16: tensor_active >= 0.80 (got unknown)" in result.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "gemm_bf16: tensor_active >= 0.80 (got unknown)" in summary["failed"]
    assert any(f["check"] == "GPM" and f["status"] == "warn" for f in summary["findings"])


@pytest.mark.parametrize(("args", "message"), [
    (["--backend", "nvml-virtual", "--gpu", "8"], "--gpu 8: no such GPU; simulated node 'selftest-node' has GPUs 0-7"),
    (["--backend", "nvml-virtual", "--phases", "idle,warp_drive"], "unknown phase warp_drive"),
    (["--backend", "nvml-virtual", "--runner", "torch"], "--runner torch needs a real GPU"),
    (["--backend", "nvml-virtual", "--phase-seconds", "1"], "--phase-seconds: between 2 and 60"),
    (["--backend", "nvml-virtual", "--phase-seconds", "61"], "--phase-seconds: between 2 and 60"),
    (["--backend", "nvml-virtual", "--interval", "0.05"], "GPM's shortest span"),
    (["--backend", "nvml-virtual", "--scenario", "demo", "--virtual-node", "nope"],
     "--virtual-node nope: scenario 'demo' has node(s) demo-node"),
    (["--real-time"], "go with --backend nvml-virtual"),
    (["--backend", "nvml-virtual", "--out", "taken"], "not an empty directory"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, args, message):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "old.txt").write_text("keep me")
    result = _selftest(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "taken" / "old.txt").read_text() == "keep me"
