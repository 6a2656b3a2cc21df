"""The Helm chart and kustomize tree as the deploy tests see them: paths, rendering, validation, tools.

Shared by tests/test_deploy_helm*.py and tests/test_deploy_kustomize.py. Offline throughout: the
chart is rendered with helm_python through deploy/sync.py, built-in objects are validated against
the Kubernetes OpenAPI schemas of the oldest and newest versions we support (kubernetes-validate,
strict: unknown fields fail), and the prometheus-operator objects against the fields their CRDs require.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate as kv  # test extra: offline OpenAPI schemas for Kubernetes 1.25-1.37
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "roofwatch"
RULES_COPY = CHART / "files" / "roofwatch-rules.yml"
KUSTOMIZE = REPO / "deploy" / "kubernetes"
README = KUSTOMIZE / "README.md"

K8S_OLDEST = "1.25"  # Chart.yaml kubeVersion >=1.25.0-0
K8S_NEWEST = "1.37"  # newest schemas kubernetes-validate 1.37.0 ships
K8S_VERSIONS = (K8S_OLDEST, K8S_NEWEST)
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
THRESHOLDS_GROUP = "roofwatch-thresholds"

_spec = importlib.util.spec_from_file_location("roofwatch_deploy_sync", REPO / "deploy" / "sync.py")
sync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync)


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return sync.objects(sync.render_chart(values))


def only(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, got {len(matches)}"
    return matches[0]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def check_operator_object(obj: dict[str, Any]) -> None:
    """The fields the prometheus-operator CRDs require (and that a typo would lose)."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert obj["metadata"]["name"] and obj["metadata"]["namespace"]
    assert all(isinstance(v, str) for v in obj["metadata"]["labels"].values())
    spec = obj["spec"]
    if obj["kind"] == "ServiceMonitor":
        assert set(spec) <= {"jobLabel", "selector", "namespaceSelector", "endpoints", "targetLabels",
                             "podTargetLabels", "sampleLimit", "attachMetadata"}, spec.keys()
        assert spec.get("selector", {}).get("matchLabels"), "a ServiceMonitor without a selector selects every Service"
        assert spec.get("endpoints") and all(isinstance(e.get("port"), str) and e["port"] for e in spec["endpoints"])
        for endpoint in spec["endpoints"]:
            for relabel in endpoint.get("relabelings", []) + endpoint.get("metricRelabelings", []):
                assert set(relabel) <= {"sourceLabels", "separator", "targetLabel", "regex", "modulus",
                                        "replacement", "action"}, relabel
    elif obj["kind"] == "PrometheusRule":
        assert set(spec) == {"groups"}
        assert spec["groups"], "a PrometheusRule needs at least one group"
        for group in spec["groups"]:
            assert isinstance(group.get("name"), str) and group["name"]
            assert isinstance(group.get("rules"), list) and group["rules"]
            for rule in group["rules"]:
                assert ("record" in rule) != ("alert" in rule), rule
                assert isinstance(rule.get("expr"), str) and rule["expr"].strip(), rule
    else:
        raise AssertionError(f"not a prometheus-operator kind: {obj['kind']}")


def validate_all(objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        if obj["kind"] in OPERATOR_KINDS:
            check_operator_object(obj)
            continue
        for version in K8S_VERSIONS:
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as exc:
                raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: "
                                     f"{exc.message} at {list(exc.path)}") from None


def rules_file() -> dict[str, Any]:
    return yaml.safe_load(RULES_COPY.read_text(encoding="utf-8"))


def rendered_groups(prometheus_rule: dict[str, Any]) -> list[dict[str, Any]]:
    return only(render({"prometheusRule": {"enabled": True, **prometheus_rule}}), "PrometheusRule")["spec"]["groups"]


def alert_rules(groups: list[dict[str, Any]], name: str | None = None) -> list[dict[str, Any]]:
    return [r for g in groups for r in g["rules"] if "alert" in r and (name is None or r["alert"] == name)]


def thresholds_in_file() -> dict[str, str]:
    """threshold key -> the file's expr."""
    (group,) = [g for g in rules_file()["groups"] if g["name"] == THRESHOLDS_GROUP]
    return {r["record"].rsplit(":", 1)[1]: r["expr"] for r in group["rules"]}


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed (it builds the kustomize directories)")
    return path


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is required (Debian package 'prometheus'; ./dev.sh test installs it)"
    return path


def most_repeated_alert() -> str:
    names = [r["alert"] for r in alert_rules(rules_file()["groups"])]
    assert names, "the rules file has no alerts"
    return max(sorted(set(names)), key=names.count)
