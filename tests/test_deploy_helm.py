"""The Kubernetes deployment's Helm chart: lint, schema validation, the DaemonSet, values.schema.json.

Offline throughout: the chart is linted and rendered with helm_python (the Helm v4 SDK through
ctypes), built-in objects are validated against the Kubernetes OpenAPI schemas of the oldest and
newest versions we support (kubernetes-validate, strict: unknown fields fail), the
prometheus-operator objects are checked against the fields their CRDs require and the rules
through the real `promtool check rules`. Helpers: tests/helm_chart.py. The PrometheusRule,
ServiceMonitor and documented scrape config are in test_deploy_helm_monitoring.py; deploy/sync.py
and the kustomize directories in test_deploy_kustomize.py.
"""

from __future__ import annotations

import copy
import re
import subprocess
from typing import Any

import helm_python as helm  # test extra helm-python-sdk: the Helm v4 SDK, no helm binary needed
import kubernetes_validate as kv
import pytest
import yaml

from tests.helm_chart import (CHART, K8S_NEWEST, K8S_OLDEST, OPERATOR_KINDS, check_operator_object, env_of,
                              most_repeated_alert, only, promtool, render, sync, thresholds_in_file, validate_all)
# tests/test_deploy_grafana.py imports these from here too:

ALL_TOGGLES: dict[str, Any] = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "amd": {"enabled": True},
    "podResources": {"enabled": False},
    "hostPID": True,
    "runtimeClassName": "nvidia",
    "priorityClassName": "system-node-critical",
    "imagePullSecrets": [{"name": "regcred"}],
    "env": [{"name": "ROOFWATCH_EXPECTED_GPUS", "value": "8"}],
    "nodeSelector": {"pool": "gpu"},
}


def agent_container(values: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, the agent container) of the rendered DaemonSet."""
    pod = only(render(values), "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


# -- lint and schema validation ---------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, ALL_TOGGLES], ids=["defaults", "all-toggles"])
def test_helm_lint_reports_nothing(values):
    for kube_version in (f"v{K8S_OLDEST}.0", f"v{K8S_NEWEST}.0"):
        report = helm.lint(str(CHART), values, strict=True, kube_version=kube_version)
        assert report["errors"] == [], report
        assert report["messages"] == [], report  # not even info ("icon is recommended")


@pytest.mark.parametrize("values", [{}, ALL_TOGGLES], ids=["defaults", "all-toggles"])
def test_every_rendered_object_validates_for_oldest_and_newest_kubernetes(values):
    objs = render(values)
    kinds = sorted(o["kind"] for o in objs)
    expected = ["ConfigMap", "DaemonSet", "Service", "ServiceAccount"]
    if values:
        expected = sorted(expected + list(OPERATOR_KINDS))
    assert kinds == expected
    validate_all(objs)


def test_the_validator_has_teeth():
    daemonset = only(render(), "DaemonSet")
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["hostPid"] = True  # misspelt hostPID
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, K8S_NEWEST, strict=True)
    objs = render(ALL_TOGGLES)
    with pytest.raises(AssertionError, match="selector"):
        check_operator_object({**only(objs, "ServiceMonitor"), "spec": {"endpoints": [{"port": "metrics"}]}})
    with pytest.raises(AssertionError):
        check_operator_object({**only(objs, "PrometheusRule"), "spec": {"groups": [{"name": "g", "rules": [{"record": "r"}]}]}})


def _overrides() -> dict[str, Any]:
    name = most_repeated_alert()
    return {"thresholds": {sorted(thresholds_in_file())[0]: 0.25}, "additionalRuleLabels": {"team": "ml"},
            "alerts": {name: {"for": "1h", "labels": {"severity": "page"}}}}


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [dict, _overrides], ids=["file-defaults", "overridden"])
def test_prometheus_rule_spec_passes_promtool(tmp_path, overrides):
    rule = only(render({"prometheusRule": {"enabled": True, **overrides()}}), "PrometheusRule")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    n_rules = sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert f"SUCCESS: {n_rules} rules found" in result.stdout


# -- the DaemonSet ----------------------------------------------------------------------------------


def test_pod_resources_socket_is_mounted_read_only_and_runs_as_root_without_capabilities():
    pod, container = agent_container()
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    sc = container["securityContext"]
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostPID" not in pod and "runtimeClassName" not in pod and "priorityClassName" not in pod


def test_without_pod_resources_the_agent_runs_as_nobody():
    pod, container = agent_container({"podResources": {"enabled": False}})
    assert all(m["name"] != "pod-resources" for m in container["volumeMounts"])
    assert all("hostPath" not in v for v in pod["volumes"])
    for sc in (pod["securityContext"], container["securityContext"]):
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65534 and sc["runAsGroup"] == 65534
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_security_context_can_be_overridden_without_losing_the_rest():
    _, container = agent_container({"securityContext": {"runAsUser": 1000, "runAsNonRoot": True}})
    sc = container["securityContext"]
    assert sc["runAsUser"] == 1000 and sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True


def test_amd_mounts_device_nodes_privileged():
    pod, container = agent_container({"amd": {"enabled": True}})
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/dev/kfd", "/dev/dri"} <= mounts
    host_paths = {v["hostPath"]["path"]: v["hostPath"]["type"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths["/dev/kfd"] == "CharDevice" and host_paths["/dev/dri"] == "Directory"
    sc = container["securityContext"]
    assert sc["privileged"] is True
    assert sc.get("allowPrivilegeEscalation") is not False  # the API server rejects privileged + false
    _, default = agent_container()
    assert not {"/dev/kfd", "/dev/dri"} & {m["mountPath"] for m in default["volumeMounts"]}


def test_web_config_secret_is_mounted_and_probes_switch_to_https():
    pod, container = agent_container({"webConfig": {"secretName": "roofwatch-web"}})
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ROOFWATCH_WEB_CONFIG_FILE"] == "/etc/roofwatch/web/web.yml"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "web-config")
    assert mount["mountPath"] == "/etc/roofwatch/web" and mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "web-config")
    assert volume["secret"]["secretName"] == "roofwatch-web"
    assert volume["secret"]["defaultMode"] == 0o444  # readable by the nobody user the agent may run as
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTPS"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}
    _, plain_auth = agent_container({"webConfig": {"secretName": "roofwatch-web", "tls": False}})
    assert "scheme" not in plain_auth["readinessProbe"]["httpGet"]
    _, default = agent_container()
    assert "ROOFWATCH_WEB_CONFIG_FILE" not in {e["name"] for e in default["env"]}
    assert "scheme" not in default["livenessProbe"]["httpGet"]


def test_toggles_reach_the_pod_spec():
    pod, container = agent_container(ALL_TOGGLES)
    assert pod["hostPID"] is True
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert env_of(container)["ROOFWATCH_EXPECTED_GPUS"] == "8"


def test_probes_resources_and_env():
    pod, container = agent_container()
    (port,) = container["ports"]
    assert port == {"name": "metrics", "containerPort": 9477, "protocol": "TCP"}
    for probe, path in ((container["readinessProbe"], "/readyz"), (container["livenessProbe"], "/healthz")):
        assert probe["httpGet"] == {"path": path, "port": "metrics"}  # both answered without a password
        assert 0 < probe["initialDelaySeconds"] <= 10
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert readiness["periodSeconds"] < liveness["periodSeconds"]
    assert (readiness["periodSeconds"] * readiness["failureThreshold"]
            < liveness["periodSeconds"] * liveness["failureThreshold"])
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
    env = env_of(container)
    assert env["ROOFWATCH_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["ROOFWATCH_LISTEN"] == ":9477"
    assert env["ROOFWATCH_LOG_FORMAT"] == "json"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    (config_mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert env["ROOFWATCH_CONFIG"] == config_mount["mountPath"] + "/config.yaml"
    assert container["image"] == f"ghcr.io/roofwatch/roofwatch:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert pod["terminationGracePeriodSeconds"] == 10


def test_port_value_moves_container_listen_address_and_service_together():
    objs = render({"port": 9500})
    container = only(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"][0]["containerPort"] == 9500
    assert env_of(container)["ROOFWATCH_LISTEN"] == ":9500"
    service = only(objs, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9500, "targetPort": "metrics", "protocol": "TCP"}]


def test_scheduling_targets_gpu_nodes_and_tolerates_gpu_taints():
    pod, _ = agent_container()
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {expr["key"] for term in terms for expr in term["matchExpressions"]}
    assert {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present",
            "feature.node.kubernetes.io/pci-1002.present", "feature.node.kubernetes.io/amd-gpu"} <= keys
    assert all(len(term["matchExpressions"]) == 1 for term in terms), "terms are ORed; one label each"
    for vendor in ("nvidia.com/gpu", "amd.com/gpu"):
        assert {"key": vendor, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert "nodeSelector" not in pod


def test_config_checksum_follows_the_config_only():
    def checksum(values):
        return only(render(values), "DaemonSet")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    base = checksum({})
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    assert checksum({"config": {"interval_s": 2.0}}) != base
    assert checksum({"podAnnotations": {"team": "ml"}}) == base


def test_configmap_holds_settings_the_agent_accepts(tmp_path):
    from agent.app.config import load_settings

    data = only(render({"config": {"expected_gpus": 8, "dtype": "fp8"}}), "ConfigMap")["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(data)
    settings = load_settings(path)
    assert (settings.backend, settings.interval_s, settings.expected_gpus, settings.dtype) == ("auto", 1.0, 8, "fp8")
    assert settings.log_format == "json"


@pytest.mark.parametrize("field", ["listen", "node_name"])
def test_config_rejects_settings_the_chart_sets_through_env(field):
    with pytest.raises(helm.HelmRenderError, match=rf"config\.{field}: not allowed"):
        render({"config": {field: "x"}})


def test_schema_config_keys_are_the_agents_settings():
    from agent.app.config import Settings

    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    config = schema["properties"]["config"]
    assert set(config["properties"]) == set(Settings.model_fields)
    agent_schema = Settings.model_json_schema()["properties"]
    for name, prop in config["properties"].items():
        if "enum" in prop:
            assert prop["enum"] == agent_schema[name]["enum"], name


def test_schema_inference_kinds_are_the_servers_the_agent_recognises():
    """A server the agent reads (llama.cpp, Triton, ...) must not be refused by the chart before it starts."""
    from agent.context.workload.inference.parse import KINDS

    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    endpoint = schema["properties"]["config"]["properties"]["inference_endpoints"]["items"]
    assert endpoint["properties"]["kind"]["enum"] == ["auto", *KINDS]


# -- values.schema.json ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"servicee": {"enabled": True}}, "servicee"),  # typo'd top-level key
        ({"port": "9477x"}, "/port"),  # wrong type
        ({"service": {"enabled": "yes"}}, "/service/enabled"),
        ({"serviceMonitor": {"intervall": "15s"}}, "intervall"),
        ({"config": {"intervall_s": 1}}, "intervall_s"),
        ({"config": {"backend": "cuda"}}, "/config/backend"),
        ({"prometheusRule": {"thresholds": {"low_mfu_ratio": "high"}}}, "/prometheusRule/thresholds/low_mfu_ratio"),
        ({"prometheusRule": {"alerts": {"LowMFU": {"for": "half an hour"}}}}, "/prometheusRule/alerts/LowMFU/for"),
        ({"prometheusRule": {"alerts": {"LowMFU": {"enable": False}}}}, "enable"),
    ],
)
def test_schema_rejects_bad_values_naming_the_field(values, field):
    with pytest.raises(helm.HelmValuesError) as caught:
        sync.render_chart(values)
    assert field in str(caught.value)


def test_every_value_is_commented():
    """Each value the chart defines (a key in values.schema.json) has a comment right above it;
    a group header (image:, service:, ...) may instead hold commented keys. Keys inside free-form
    Kubernetes objects (resources, affinity, probes) are the object's own and are left alone."""
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str]] = []
    checked = 0
    for i, line in enumerate(lines):
        key = re.match(r"^(\s*)([A-Za-z]\w*):", line)
        if not key:
            continue
        indent = len(key.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = schema
        for _, name in stack:
            parent = parent.get("properties", {}).get(name, {})
        stack.append((indent, key.group(2)))
        if "properties" not in parent:
            continue  # inside a free-form object
        node = parent["properties"].get(key.group(2))
        assert node is not None, f"values.yaml:{i + 1}: {key.group(2)} is not in values.schema.json"
        checked += 1
        if "properties" in node:
            continue  # a group header; its keys are checked themselves
        assert lines[i - 1].lstrip().startswith("#"), f"values.yaml:{i + 1}: {key.group(2)} has no comment"
    assert checked > 40
