"""The Kubernetes deployment: the Helm chart, the kustomize base generated from it, deploy/sync.py.

Offline throughout: the chart is linted and rendered with helm_python (the Helm v4 SDK through
ctypes), built-in objects are validated against the Kubernetes OpenAPI schemas of the oldest and
newest versions we support (kubernetes-validate, strict: unknown fields fail), the
prometheus-operator objects are checked against the fields their CRDs require and the rules
through the real `promtool check rules`, and the kustomize directories are built with kubectl.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm  # test extra helm-python-sdk: the Helm v4 SDK, no helm binary needed
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


# -- helpers ------------------------------------------------------------------------------------


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return sync.objects(sync.render_chart(values))


def only(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, got {len(matches)}"
    return matches[0]


def agent_container(values: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, the agent container) of the rendered DaemonSet."""
    pod = only(render(values), "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


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
    name = _most_repeated_alert()
    return {"thresholds": {sorted(thresholds_in_file())[0]: 0.25}, "additionalRuleLabels": {"team": "ml"},
            "alerts": {name: {"for": "1h", "labels": {"severity": "page"}}}}


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
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}
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
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "metrics"}
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


# -- PrometheusRule processing (derived from the rules file, not hard-coded) -------------------------------


def test_rules_pass_through_unchanged_without_overrides():
    assert rendered_groups({}) == rules_file()["groups"]


def test_threshold_override_changes_only_that_threshold():
    thresholds = thresholds_in_file()
    assert thresholds, "the rules file has no roofwatch-thresholds group"
    key = sorted(thresholds)[0]
    groups = rendered_groups({"thresholds": {key: 0.123}})
    (group,) = [g for g in groups if g["name"] == THRESHOLDS_GROUP]
    got = {r["record"].rsplit(":", 1)[1]: r["expr"] for r in group["rules"]}
    assert got == {**thresholds, key: "vector(0.123)"}
    assert [g for g in groups if g["name"] != THRESHOLDS_GROUP] == [
        g for g in rules_file()["groups"] if g["name"] != THRESHOLDS_GROUP]


def test_unknown_threshold_or_alert_fails_naming_it():
    with pytest.raises(helm.HelmRenderError, match=r"prometheusRule\.thresholds\.no_such_key.*known thresholds"):
        rendered_groups({"thresholds": {"no_such_key": 1}})
    with pytest.raises(helm.HelmRenderError, match=r"prometheusRule\.alerts\.NoSuchAlert.*known alerts"):
        rendered_groups({"alerts": {"NoSuchAlert": {"enabled": False}}})


def _most_repeated_alert() -> str:
    names = [r["alert"] for r in alert_rules(rules_file()["groups"])]
    assert names, "the rules file has no alerts"
    return max(sorted(set(names)), key=names.count)


def test_disabling_an_alert_drops_every_rule_of_that_name():
    name = _most_repeated_alert()
    before = alert_rules(rules_file()["groups"])
    after = alert_rules(rendered_groups({"alerts": {name: {"enabled": False}}}))
    assert [r for r in before if r["alert"] != name] == after
    assert len(before) - len(after) == [r["alert"] for r in before].count(name)
    kept = alert_rules(rendered_groups({"alerts": {name: {"enabled": True}}}))
    assert kept == before


def test_for_and_label_overrides_apply_to_every_rule_of_that_name():
    name = _most_repeated_alert()
    others = [r for r in alert_rules(rules_file()["groups"]) if r["alert"] != name]
    groups = rendered_groups({
        "alerts": {name: {"for": "2h", "labels": {"severity": "page", "owner": "override"}}},
        "additionalRuleLabels": {"team": "ml-infra", "owner": "additional"},
    })
    changed = alert_rules(groups, name)
    originals = alert_rules(rules_file()["groups"], name)
    assert len(changed) == len(originals) >= 1
    for got, original in zip(changed, originals):
        assert got["for"] == "2h"
        assert got["labels"] == {**original.get("labels", {}), "severity": "page", "team": "ml-infra",
                                 "owner": "override"}
        assert got["annotations"] == original["annotations"]
    for got, original in zip([r for r in alert_rules(groups) if r["alert"] != name], others):
        assert got.get("for") == original.get("for")
        assert got["labels"] == {**original.get("labels", {}), "team": "ml-infra", "owner": "additional"}
    recording = [r for g in groups for r in g["rules"] if "record" in r]
    assert recording and all("labels" not in r or "team" not in r["labels"] for r in recording)


def test_prometheus_templates_in_annotations_survive_literally():
    text = RULES_COPY.read_text()
    templated = re.findall(r"\{\{ \$labels\.\w+ \}\}", text)
    assert templated, "the rules file has no {{ $labels.x }} templates to check"
    annotations = [v for r in alert_rules(rendered_groups({})) for v in r.get("annotations", {}).values()]
    joined = "\n".join(annotations)
    for template in set(templated):
        assert template in joined


def test_additional_groups_are_appended_as_they_are():
    extra = {"name": "site", "rules": [{"alert": "Site", "expr": "vector(1)", "annotations": {"x": "{{ $labels.node }}"}}]}
    groups = rendered_groups({"additionalGroups": [extra]})
    assert groups[-1] == extra and groups[:-1] == rules_file()["groups"]


# -- ServiceMonitor ------------------------------------------------------------------------------------


def test_service_monitor_scrapes_the_metrics_port_with_job_roofwatch_and_node_instances():
    objs = render({"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}})
    monitor, service = only(objs, "ServiceMonitor"), only(objs, "Service")
    spec = monitor["spec"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert service["metadata"]["labels"][spec["jobLabel"]] == "roofwatch"
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance",
            "action": "replace"} in endpoint["relabelings"]
    assert all(r.get("targetLabel") != "node" for r in endpoint["relabelings"])


def test_service_monitor_follows_the_web_config():
    secured = {"serviceMonitor": {"enabled": True, "tlsConfig": {"ca": {"secret": {"name": "ca", "key": "ca.crt"}}},
                                  "basicAuth": {"username": {"name": "s", "key": "u"}, "password": {"name": "s", "key": "p"}}},
               "webConfig": {"secretName": "roofwatch-web"}}
    (endpoint,) = only(render(secured), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["ca"]["secret"]["name"] == "ca"
    assert endpoint["basicAuth"]["password"] == {"name": "s", "key": "p"}
    (plain,) = only(render({"serviceMonitor": {"enabled": True}}), "ServiceMonitor")["spec"]["endpoints"]
    assert plain["scheme"] == "http" and "tlsConfig" not in plain and "basicAuth" not in plain
    with pytest.raises(helm.HelmValuesError, match="basicAuth"):
        render({"serviceMonitor": {"enabled": True, "basicAuth": {"user": "x"}}})


def test_service_monitor_needs_the_service():
    with pytest.raises(helm.HelmRenderError, match="service.enabled"):
        render({"serviceMonitor": {"enabled": True}, "service": {"enabled": False}})
    assert all(o["kind"] != "Service" for o in render({"service": {"enabled": False}}))


# -- deploy/sync.py and the kustomize directories -----------------------------------------------------------


def test_generated_files_are_up_to_date(capsys):
    assert sync.main(["--check"]) == 0, capsys.readouterr().err
    assert RULES_COPY.read_bytes() == (REPO / "deploy" / "prometheus" / "roofwatch-rules.yml").read_bytes()


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


def test_kustomize_base_builds_and_validates():
    objs = kustomize_build(KUSTOMIZE)
    assert sorted(o["kind"] for o in objs) == ["ConfigMap", "DaemonSet", "Namespace", "Service", "ServiceAccount"]
    validate_all(objs)
    for obj in objs:
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kustomize"
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "roofwatch"
    assert only(objs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_kustomize_prometheus_operator_builds_and_validates():
    objs = kustomize_build(KUSTOMIZE / "prometheus-operator")
    assert sorted(o["kind"] for o in objs) == sorted(OPERATOR_KINDS)
    validate_all(objs)
    assert all(o["metadata"]["namespace"] == "roofwatch" for o in objs)


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


# -- plain Prometheus scrape config from the docs ---------------------------------------------------------


SCRAPE_CONFIG_DOCS = [p for p in (README, REPO / "docs" / "deploy.md") if p.is_file()]


@pytest.mark.parametrize("doc", SCRAPE_CONFIG_DOCS, ids=[p.name for p in SCRAPE_CONFIG_DOCS])
def test_documented_scrape_config_passes_promtool(tmp_path, doc):
    snippets = [b for b in re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S) if "kubernetes_sd_configs" in b]
    if doc != README and not snippets:
        pytest.skip(f"{doc.name} has no kubernetes_sd_configs example")
    (snippet,) = snippets
    config = yaml.safe_load(snippet)
    (job,) = config["scrape_configs"]
    sd = job["kubernetes_sd_configs"]
    assert sd == [{"role": "pod", "namespaces": {"names": ["roofwatch"]}}]
    keeps = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keeps == {("__meta_kubernetes_pod_label_app_kubernetes_io_name",): "roofwatch",
                     ("__meta_kubernetes_pod_container_port_name",): "metrics"}

    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"}, **config}, sort_keys=False))
    result = subprocess.run([promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        # Debian builds Prometheus without Kubernetes service discovery: check everything else
        # (relabel rules, timeouts) by promtool with static targets in place of the discovery.
        job.pop("kubernetes_sd_configs")
        job["static_configs"] = [{"targets": ["127.0.0.1:9477"]}]
        path.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"}, **config}, sort_keys=False))
        result = subprocess.run([promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
