"""Hardware fixtures: selftest runs recorded on real GPUs, replayed through classify --evaluate and the table.

No fixture exists yet (no GPU was at hand when the replay was built), so the first test reports
itself skipped, with the reason, until a directory is committed under tests/fixtures/hardware/. The others prove the replay path on a
selftest output made here by the virtual runner (a virtual trace, never committed as hardware), and
that a malformed directory fails loudly instead of passing with nothing checked.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.diagnostics.selftest.phases import PHASES
from tests.agent_process import clean_env, roofwatch_cmd
from tests.hardware_replay import FixtureError, classify_evaluate, fixture_dirs, replay

_RECALLED = 0.5


def _committed() -> list:
    found = fixture_dirs()  # a stray file there fails collection loudly
    if found:
        return [pytest.param(d, id=d.name) for d in found]
    return [pytest.param(None, id="none", marks=pytest.mark.skip(
        reason="no hardware fixtures committed yet: record one on a GPU node (docs/nvidia.md, roofwatch selftest)"))]


@pytest.mark.parametrize("directory", _committed())
def test_a_committed_hardware_fixture_holds_roofwatchs_semantics(directory):
    assert replay(directory) == [], directory
    classes = classify_evaluate(directory)["classes"]
    labels = {e["label"] for e in json.loads((directory / "summary.json").read_text())["phases"] if e["status"] == "ran"}
    assert all(classes[label]["recall"] >= _RECALLED for label in labels), (directory, classes)


@pytest.fixture(scope="module")
def virtual_output(tmp_path_factory) -> Path:
    """A whole selftest output from the virtual runner, long enough for classify --evaluate to score."""
    out = tmp_path_factory.mktemp("selftest") / "h100-sxm"
    result = subprocess.run(roofwatch_cmd("selftest", "--backend", "nvml-virtual", "--phase-seconds", "45", "--out",
                                          str(out)), capture_output=True, text=True, timeout=180, env=clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.mark.slow
def test_the_replay_checks_every_phase_of_a_selftest_output(virtual_output):
    assert replay(virtual_output, allow_virtual=True) == []
    classes = classify_evaluate(virtual_output)["classes"]
    assert {p.label for p in PHASES} <= set(classes)


@pytest.mark.slow
def test_the_replay_finds_a_phase_whose_counters_and_class_are_wrong(virtual_output, tmp_path):
    broken = tmp_path / "h100-sxm"
    shutil.copytree(virtual_output, broken)
    entry = next(e for e in json.loads((broken / "summary.json").read_text())["phases"] if e["name"] == "copy")
    path = broken / entry["trace"]
    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f]
    for line in lines[1:]:  # the copy as an idle GPU would show it: the replay must notice
        line.update(gr_active=0.0, sm_active=0.0, dram_active=0.0, tensor_active=0.0)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    problems = replay(broken, allow_virtual=True)
    assert "copy: dram_active >= 0.70 (got 0.00)" in problems
    assert any(p.startswith("copy: classify --evaluate recalls memory_bound in 0%") for p in problems)
    assert all(p.startswith("copy:") for p in problems)


def _summary(directory: Path) -> dict:
    return json.loads((directory / "summary.json").read_text())


def _edit(directory: Path, change) -> None:
    summary = _summary(directory)
    change(summary)
    (directory / "summary.json").write_text(json.dumps(summary))


@pytest.mark.slow
@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: (d / "summary.json").unlink(), "no summary.json"),
    (lambda d: (d / "summary.json").write_text("{not json"), "not JSON"),
    (lambda d: _edit(d, lambda s: s.update(format="something-else")), "not a roofwatch selftest summary"),
    (lambda d: (d / _summary(d)["phases"][1]["trace"]).unlink(), "cannot be read"),
    (lambda d: _edit(d, lambda s: s["phases"][0].update(name="warp_drive")), "unknown phase 'warp_drive'"),
    (lambda d: _edit(d, lambda s: s["phases"][1].update(trace=s["phases"][0]["trace"])),
     "phase gemm_bf16 must be 'compute_bound'"),
    (lambda d: _edit(d, lambda s: s.update(phase_seconds=12, phases=[s["phases"][0] | {"trace": "short.jsonl.gz"}]))
     or _short_trace(d), "record fixtures with --phase-seconds 45"),
])
def test_a_malformed_fixture_fails_loudly(virtual_output, tmp_path, damage, message):
    broken = tmp_path / "h100-sxm"
    shutil.copytree(virtual_output, broken)
    damage(broken)
    with pytest.raises(FixtureError, match=message.replace("(", r"\(")):
        replay(broken, allow_virtual=True)


def _short_trace(directory: Path) -> None:
    """The idle phase cut to its first 12 s, as a run with --phase-seconds 12 would have left it."""
    with gzip.open(directory / _first_trace(directory), "rt") as f:
        lines = f.readlines()
    with gzip.open(directory / "short.jsonl.gz", "wt") as f:
        f.writelines(lines[:49])


def _first_trace(directory: Path) -> str:
    return sorted(p.name for p in directory.glob("01-*.jsonl.gz"))[0]


@pytest.mark.slow
def test_a_virtual_run_is_refused_as_a_hardware_fixture_and_must_be_named_after_its_gpu(virtual_output, tmp_path):
    with pytest.raises(FixtureError, match="a virtual run; hardware fixtures must come from a real GPU"):
        replay(virtual_output)
    renamed = tmp_path / "a100-sxm-80gb"
    shutil.copytree(virtual_output, renamed)
    _edit(renamed, lambda s: s.update(virtual=False))
    with pytest.raises(FixtureError, match="name it after the GPU's spec key"):
        replay(renamed)


def test_stray_files_beside_the_model_directories_are_an_error(tmp_path):
    (tmp_path / "h100-sxm").mkdir()
    assert fixture_dirs(tmp_path) == [tmp_path / "h100-sxm"]
    (tmp_path / "trace.jsonl.gz").write_bytes(b"")
    with pytest.raises(FixtureError, match="trace.jsonl.gz"):
        fixture_dirs(tmp_path)
