"""deploy/sync.py and the kustomize directories it generates from the Helm chart.

The generated files are checked up to date (and --check checked to catch edits and stale files),
and the kustomize base, the prometheus-operator directory and the README's overlay example are
built with `kubectl kustomize` and validated offline. Helpers: tests/helm_chart.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from tests.helm_chart import (KUSTOMIZE, OPERATOR_KINDS, README, REPO, RULES_COPY, env_of, kustomize_build, only,
                              sync, validate_all)

# -- deploy/sync.py and the kustomize directories -----------------------------------------------------------


def test_generated_files_are_up_to_date(capsys):
    assert sync.main(["--check"]) == 0, capsys.readouterr().err
    assert RULES_COPY.read_bytes() == (REPO / "deploy" / "prometheus" / "roofwatch-rules.yml").read_bytes()


@pytest.mark.slow
def test_check_reports_edited_and_outdated_files(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "deploy", root / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "dashboards", root / "dashboards", ignore=lambda _, names: [n for n in names if not n.endswith(".json")])
    daemonset = root / "deploy" / "kubernetes" / "daemonset.yaml"
    daemonset.write_text(daemonset.read_text().replace("maxUnavailable: 1", "maxUnavailable: 2"))
    source = root / "deploy" / "prometheus" / "roofwatch-rules.yml"
    source.write_text(source.read_text() + "\n# edited\n")
    stale = root / "deploy" / "kubernetes" / "old.yaml"
    stale.write_text(sync.HEADER + "kind: ConfigMap\n")
    script = [sys.executable, str(root / "deploy" / "sync.py")]

    result = subprocess.run([*script, "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    listed = dict(re.findall(r"^  (\S+): (.+)$", result.stderr, re.M))
    assert listed == {
        "deploy/helm/roofwatch/files/roofwatch-rules.yml": "differs",
        "deploy/kubernetes/daemonset.yaml": "differs",
        "deploy/kubernetes/old.yaml": "stale: no longer generated",
    }
    assert daemonset.read_text().count("maxUnavailable: 2") == 1  # --check wrote nothing

    assert subprocess.run(script, capture_output=True, timeout=60).returncode == 0
    assert subprocess.run([*script, "--check"], capture_output=True, timeout=60).returncode == 0
    assert not stale.exists()


def test_generated_manifests_carry_the_header():
    generated = sorted(KUSTOMIZE.rglob("*.yaml"))
    assert len(generated) >= 8
    for path in generated:
        assert path.read_text().startswith(sync.HEADER), path


@pytest.mark.slow
def test_kustomize_base_builds_and_validates():
    objs = kustomize_build(KUSTOMIZE)
    assert sorted(o["kind"] for o in objs) == ["ConfigMap", "DaemonSet", "Namespace", "Service", "ServiceAccount"]
    validate_all(objs)
    for obj in objs:
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kustomize"
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "roofwatch"
    assert only(objs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


@pytest.mark.slow
def test_kustomize_prometheus_operator_builds_and_validates():
    objs = kustomize_build(KUSTOMIZE / "prometheus-operator")
    assert sorted(o["kind"] for o in objs) == sorted(OPERATOR_KINDS)
    validate_all(objs)
    assert all(o["metadata"]["namespace"] == "roofwatch" for o in objs)


@pytest.mark.slow
def test_readme_overlay_builds(tmp_path):
    """The overlay example in deploy/kubernetes/README.md works as written."""
    (overlay,) = [b for b in re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S) if "kind: Kustomization" in b]
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    directory = tmp_path / "overlays" / "gpu-prod"
    directory.mkdir(parents=True)
    (directory / "kustomization.yaml").write_text(overlay)
    (directory / "config.yaml").write_text("backend: nvml\ninterval_s: 2\nlog_format: json\n")
    objs = kustomize_build(directory)
    validate_all(objs)
    assert {o["kind"] for o in objs if o["metadata"]["labels"].get("release") == "kube-prometheus-stack"} == OPERATOR_KINDS
    container = only(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(container)["ROOFWATCH_EXPECTED_GPUS"] == "8"
    assert "interval_s: 2" in only(objs, "ConfigMap")["data"]["config.yaml"]
