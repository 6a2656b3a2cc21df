"""Shipping the Grafana dashboards: provisioning files, the chart's dashboard ConfigMaps for the
Grafana sidecar, the kustomize overlay deploy/kubernetes/grafana-dashboards, and deploy/sync.py's
copies of dashboards/*.json in the chart.

Offline, with the same tools as tests/test_deploy_helm.py (tests/helm_chart.py) (helm_python, strict kubernetes-validate
for the oldest and newest Kubernetes we support, `kubectl kustomize`), whose helpers are reused.
The dashboards themselves are tested in tests/test_dashboards.py; here they are payload.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.helm_chart import (CHART, K8S_NEWEST, K8S_OLDEST, KUSTOMIZE, REPO, kustomize_build, render, sync,
                               validate_all)

DASHBOARDS = sorted((REPO / sync.DASHBOARDS_SOURCE).glob("*.json"))
PROVIDER = REPO / "deploy" / "grafana" / "provisioning" / "dashboards" / "roofwatch.yaml"
DATASOURCE = REPO / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
OVERLAY = KUSTOMIZE / "grafana-dashboards"
ENABLED: dict[str, Any] = {"grafanaDashboards": {"enabled": True}}
CONFIGMAP_MAX_BYTES = 1024 * 1024  # the API server's limit on a ConfigMap's keys plus values
ANNOTATIONS_MAX_BYTES = 256 * 1024  # the API server's limit on all annotations of an object
SECRET_MAX_BYTES = 1024 * 1024  # Helm stores each release in a Secret


def dashboard_configmaps(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "ConfigMap"
            and o["metadata"]["labels"].get("app.kubernetes.io/component") == "dashboards"]


def dashboards_in(values: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
    merged = {**values, "grafanaDashboards": {**ENABLED["grafanaDashboards"], **values.get("grafanaDashboards", {})}}
    return dashboard_configmaps(sync.objects(sync.render_chart(merged, **kwargs)))


def payload(configmap: dict[str, Any]) -> tuple[str, str]:
    """(data key, value) of a dashboard ConfigMap, which must hold exactly one file."""
    assert "binaryData" not in configmap
    (item,) = configmap["data"].items()
    return item


def configmap_size(configmap: dict[str, Any]) -> int:
    """What the API server counts against the 1 MiB limit: UTF-8 bytes of every key and value."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in configmap["data"].items())


@pytest.fixture(scope="module")
def dashboards() -> dict[str, bytes]:
    assert DASHBOARDS, f"no {sync.DASHBOARDS_SOURCE}/*.json to ship (the dashboards are generated into it)"
    return {p.name: p.read_bytes() for p in DASHBOARDS}


def chart_holding(tmp_path: Path, dashboard_files: dict[str, bytes]) -> Path:
    """A copy of the chart whose files/dashboards/ holds exactly ``dashboard_files``."""
    rules = (REPO / sync.RULES_SOURCE).read_bytes()
    return sync.chart_with_sources(CHART, rules, dashboard_files, tmp_path)


# -- provisioning files -------------------------------------------------------------------------------


def test_dashboard_provider_loads_files_into_the_roofwatch_folder():
    config = yaml.safe_load(PROVIDER.read_text())
    assert config["apiVersion"] == 1
    (provider,) = config["providers"]
    assert provider["name"] == "roofwatch" and provider["orgId"] == 1
    assert provider["type"] == "file"
    assert provider["folder"] == "roofwatch"
    assert provider["allowUiUpdates"] is False
    assert isinstance(provider["disableDeletion"], bool)
    assert isinstance(provider["updateIntervalSeconds"], int) and provider["updateIntervalSeconds"] > 0
    options = provider["options"]
    assert options["path"] == "/var/lib/grafana/dashboards/roofwatch"
    # With foldersFromFilesStructure true Grafana ignores `folder` (it must then be empty).
    assert options["foldersFromFilesStructure"] is False
    assert set(provider) <= {"name", "orgId", "folder", "folderUid", "type", "disableDeletion",
                             "updateIntervalSeconds", "allowUiUpdates", "options"}, provider.keys()


def test_example_datasource_is_prometheus_at_the_scrape_interval():
    config = yaml.safe_load(DATASOURCE.read_text())
    assert config["apiVersion"] == 1
    (source,) = config["datasources"]
    assert (source["type"], source["uid"], source["access"]) == ("prometheus", "prometheus", "proxy")
    assert source["url"] == "http://prometheus:9090"
    assert "isDefault" not in source or source["isDefault"] is False
    # timeInterval is Grafana's lower bound on the query step; it must be the scrape interval.
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())["global"]["scrape_interval"]
    chart_interval = yaml.safe_load((CHART / "values.yaml").read_text())["serviceMonitor"]["interval"]
    assert source["jsonData"]["timeInterval"] == scrape == chart_interval == "15s"


def _datasource_refs(node: Any) -> list[Any]:
    """Every value of a "datasource" key anywhere in a dashboard."""
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "datasource"] + [r for v in node.values() for r in _datasource_refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _datasource_refs(v)]
    return []


def test_dashboards_choose_the_datasource_by_variable_not_by_the_provisioned_uid(dashboards):
    """What the datasource file's comment promises: any Prometheus datasource will do."""
    for name, body in dashboards.items():
        dashboard = json.loads(body)
        variables = [v for v in dashboard.get("templating", {}).get("list", []) if v.get("name") == "datasource"]
        assert [(v["type"], v["query"]) for v in variables] == [("datasource", "prometheus")], name
        uids = {r.get("uid") if isinstance(r, dict) else r for r in _datasource_refs(dashboard)}
        assert "prometheus" not in uids, f"{name} names the example datasource's uid instead of ${{datasource}}"


# -- the chart's ConfigMaps ------------------------------------------------------------------------------


def test_enabled_renders_one_configmap_per_dashboard_holding_its_exact_bytes(dashboards):
    objs = render(ENABLED)
    configmaps = dashboard_configmaps(objs)
    assert sorted(payload(c)[0] for c in configmaps) == sorted(dashboards)
    assert len({c["metadata"]["name"] for c in configmaps}) == len(dashboards)
    for configmap in configmaps:
        key, value = payload(configmap)
        assert value.encode() == dashboards[key], f"{key}: the chart's copy is stale (run: python deploy/sync.py)"
        assert json.loads(value) == json.loads(dashboards[key])
        assert configmap_size(configmap) < CONFIGMAP_MAX_BYTES
        metadata = configmap["metadata"]
        assert metadata["namespace"] == sync.NAMESPACE
        assert metadata["labels"]["grafana_dashboard"] == "1"
        assert metadata["labels"]["app.kubernetes.io/instance"] == sync.RELEASE
        assert metadata["labels"]["app.kubernetes.io/part-of"] == "roofwatch"
        assert metadata["annotations"] == {"grafana_folder": "roofwatch"}
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", metadata["name"]), metadata["name"]
    # Everything else is what the default render has: the dashboards add ConfigMaps and nothing more.
    assert sorted(o["kind"] for o in objs if o not in configmaps) == sorted(o["kind"] for o in render())


def test_dashboard_configmaps_validate_for_oldest_and_newest_kubernetes(dashboards):
    configmaps = dashboard_configmaps(render(ENABLED))
    assert len(configmaps) == len(dashboards)
    validate_all(configmaps)


def test_helm_lint_reports_nothing_with_the_dashboards():
    for kube_version in (f"v{K8S_OLDEST}.0", f"v{K8S_NEWEST}.0"):
        report = helm.lint(str(CHART), ENABLED, strict=True, kube_version=kube_version)
        assert report["errors"] == [] and report["messages"] == [], report


def test_disabled_by_default():
    assert yaml.safe_load((CHART / "values.yaml").read_text())["grafanaDashboards"]["enabled"] is False
    objs = render()
    assert dashboard_configmaps(objs) == []
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"] == [sync.RELEASE]  # the agent's only


def test_namespace_override_moves_only_the_dashboards(dashboards):
    objs = render({"grafanaDashboards": {"enabled": True, "namespace": "monitoring"}})
    configmaps = dashboard_configmaps(objs)
    assert len(configmaps) == len(dashboards)
    assert {c["metadata"]["namespace"] for c in configmaps} == {"monitoring"}
    assert {o["metadata"]["namespace"] for o in objs if o not in configmaps} == {sync.NAMESPACE}


def test_custom_labels_and_annotations_replace_the_defaults(dashboards):
    configmaps = dashboards_in({"grafanaDashboards": {
        "labels": {"grafana_dashboard": None, "team-grafana/dashboard": "gpu"},  # null drops a default key
        "annotations": {"grafana_folder": None, "k8s-sidecar-target-directory": "/tmp/dashboards/GPU"},
    }})
    assert len(configmaps) == len(dashboards)
    for configmap in configmaps:
        labels = configmap["metadata"]["labels"]
        assert labels["team-grafana/dashboard"] == "gpu" and "grafana_dashboard" not in labels
        assert labels["app.kubernetes.io/component"] == "dashboards"  # the chart's own labels stay
        assert configmap["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "/tmp/dashboards/GPU"}
    (other_value,) = {c["metadata"]["labels"]["grafana_dashboard"]
                      for c in dashboards_in({"grafanaDashboards": {"labels": {"grafana_dashboard": "true"}}})}
    assert other_value == "true"
    assert all("annotations" not in c["metadata"] for c in dashboards_in({"grafanaDashboards": {"annotations": None}}))


def test_a_dashboard_configmap_without_a_label_fails_the_render():
    with pytest.raises(helm.HelmRenderError, match=r"grafanaDashboards\.labels: empty"):
        dashboards_in({"grafanaDashboards": {"labels": {"grafana_dashboard": None}}})


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"grafanaDashboards": {"enabled": True, "lables": {"grafana_dashboard": "1"}}}, "lables"),
        ({"grafanaDashbords": {"enabled": True}}, "grafanaDashbords"),
        ({"grafanaDashboards": {"enabled": "yes"}}, "/grafanaDashboards/enabled"),
        ({"grafanaDashboards": {"labels": {"grafana_dashboard": 1}}}, "/grafanaDashboards/labels/grafana_dashboard"),
        ({"grafanaDashboards": {"namespace": "Monitoring"}}, "/grafanaDashboards/namespace"),
    ],
)
def test_schema_rejects_bad_grafana_values_naming_the_field(values, field):
    with pytest.raises(helm.HelmValuesError) as caught:
        sync.render_chart(values)
    assert field in str(caught.value)


def test_the_release_record_fits_helm_s_secret(dashboards):
    """Helm keeps each release (the chart with all its files, the values and the rendered manifest)
    as gzipped, base64-encoded JSON in one Secret, which holds at most 1 MiB: every dashboard is
    in there twice, as a chart file and in the manifest. This rebuilds that record closely enough
    (Helm's JSON adds only field names and metadata) to see how much room is left."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    chart_files = [p for p in sorted(CHART.rglob("*")) if p.is_file()]
    rendered = sync.render_chart(ENABLED)
    record = {
        "chart": {"files": [{"name": str(p.relative_to(CHART)), "data": b64(p.read_bytes())} for p in chart_files]},
        "config": ENABLED,
        "manifest": "\n---\n".join(rendered.values()),
    }
    stored = base64.b64encode(gzip.compress(json.dumps(record).encode(), compresslevel=9))
    assert len(stored) < SECRET_MAX_BYTES / 2, f"the Helm release record would take about {len(stored)} bytes of 1 MiB"


# -- edge cases of the template, on a copy of the chart with made-up dashboards ------------------------------


YAML_LOOKALIKES = {
    "yaml-lookalikes.json": b'{\n  "a": "--- # &anchor *alias !!tag {{ helm }} \\" \' \\t\tx"\n}\n',
    "document-markers.json": b'[\n---\n...\n# not a comment\n]\n',
}
"""JSON text that YAML would misread outside a literal block."""


@pytest.mark.slow
def test_yaml_lookalikes_survive_the_render_and_kustomize_byte_for_byte(tmp_path):
    """Go's YAML (kustomize, the API server) reads the literal blocks exactly as Helm wrote them."""
    chart = chart_holding(tmp_path / "chart", YAML_LOOKALIKES)
    rendered = sync.render_chart(ENABLED, chart_dir=chart)["grafana-dashboards.yaml"]
    got = dict(payload(c) for c in dashboard_configmaps(sync.objects({"grafana-dashboards.yaml": rendered})))
    assert {k: v.encode() for k, v in got.items()} == YAML_LOOKALIKES
    directory = tmp_path / "overlay"
    directory.mkdir()
    (directory / "dashboards.yaml").write_text(rendered, encoding="utf-8")
    (directory / "kustomization.yaml").write_text("resources: [dashboards.yaml]\n")
    got = dict(payload(o) for o in kustomize_build(directory))
    assert {k: v.encode() for k, v in got.items()} == YAML_LOOKALIKES


@pytest.mark.parametrize("content", [
    b'{"title": "x"}',                       # no final newline
    b'{\n  "title": "x"\n}\n\n',             # two
    b'{\r\n  "title": "x"\r\n}\r\n',          # CRLF
    b'  {"title": "x"}\n',                   # leading whitespace
    '{"title": "GPU \u2014 \u00fc"}\n'.encode(),  # non-ASCII
], ids=["no-newline", "two-newlines", "crlf", "leading-space", "non-ascii"])
def test_a_file_the_generator_would_not_write_fails_the_render_naming_it(tmp_path, content):
    chart = chart_holding(tmp_path, {"odd.json": content})
    with pytest.raises(helm.HelmRenderError, match=r"odd\.json: not as dashboards/generate\.py writes it"):
        sync.render_chart(ENABLED, chart_dir=chart)


def test_a_dashboard_over_one_mebibyte_fails_the_render(tmp_path):
    padding = b" " * CONFIGMAP_MAX_BYTES
    chart = chart_holding(tmp_path, {"huge.json": b'{"title": "x",' + padding + b'"panels": []}\n'})
    with pytest.raises(helm.HelmRenderError, match=r"huge\.json: \d+ bytes with its key; a ConfigMap holds at most 1048576"):
        sync.render_chart(ENABLED, chart_dir=chart)


def test_a_dashboard_just_under_the_limit_renders(tmp_path):
    name = "big.json"
    body = b'{"title": "x", "pad": "' + b"x" * (CONFIGMAP_MAX_BYTES - len(name) - 40) + b'"}\n'
    chart = chart_holding(tmp_path, {name: body})
    (configmap,) = dashboards_in({}, chart_dir=chart)
    assert configmap_size(configmap) == len(name) + len(body) <= CONFIGMAP_MAX_BYTES


@pytest.mark.parametrize(("files", "message"), [
    ({}, r"holds no files/dashboards/\*\.json \(run: python deploy/sync.py\)"),
    ({"GPU Overview.json": b"{}\n"}, r"GPU Overview\.json: a dashboard file name must be lower-case"),
])
def test_missing_or_badly_named_dashboards_fail_the_render(tmp_path, files, message):
    with pytest.raises(helm.HelmRenderError, match=message):
        sync.render_chart(ENABLED, chart_dir=chart_holding(tmp_path, files))


# -- the kustomize overlay -------------------------------------------------------------------------------


@pytest.mark.slow
def test_kustomize_overlay_builds_the_dashboard_configmaps(dashboards):
    objs = kustomize_build(OVERLAY)
    assert [o["kind"] for o in objs] == ["ConfigMap"] * len(dashboards)
    validate_all(objs)
    assert sorted(payload(o)[0] for o in objs) == sorted(dashboards)
    for obj in objs:
        key, value = payload(obj)
        assert value.encode() == dashboards[key]
        assert obj["metadata"]["namespace"] == sync.NAMESPACE
        assert obj["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kustomize"
        assert obj["metadata"]["annotations"]["grafana_folder"] == "roofwatch"
        # Client-side `kubectl apply` copies the whole object into the last-applied-configuration
        # annotation, and an object's annotations hold at most 256 KiB; beyond that only
        # `kubectl apply --server-side` works.
        assert len(json.dumps(obj, separators=(",", ":"))) < ANNOTATIONS_MAX_BYTES, key


@pytest.mark.slow
def test_overlay_applies_beside_the_base_without_clashes(tmp_path, dashboards):
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    directory = tmp_path / "overlays" / "all"
    directory.mkdir(parents=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../../deploy/kubernetes", "../../deploy/kubernetes/grafana-dashboards"],
    }))
    objs = kustomize_build(directory)
    names = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert len(names) == len(set(names))
    assert len(dashboard_configmaps(objs)) == len(dashboards)
    assert sum(o["kind"] == "DaemonSet" for o in objs) == 1


# -- deploy/sync.py ---------------------------------------------------------------------------------------


def test_chart_holds_exactly_the_current_dashboards(dashboards):
    copies = REPO / sync.CHART_DIR / sync.DASHBOARDS_IN_CHART
    assert {p.name: p.read_bytes() for p in copies.iterdir()} == dashboards, "run: python deploy/sync.py"
    assert sync.differences(sync.expected_files()) == []


@pytest.mark.slow
def test_sync_copies_new_dashboards_and_removes_stale_ones(tmp_path, dashboards):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "deploy", root / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "dashboards").mkdir()
    for name, body in dashboards.items():
        (root / "dashboards" / name).write_bytes(body)
    first, *_ = sorted(dashboards)
    (root / "dashboards" / first).write_bytes(dashboards[first].replace(b"{", b"{ ", 1))
    (root / "dashboards" / "roofwatch-extra.json").write_bytes(b'{"title": "extra"}\n')
    stale = root / sync.CHART_DIR / sync.DASHBOARDS_IN_CHART / "roofwatch-gone.json"
    stale.write_bytes(b"{}\n")
    script = [sys.executable, str(root / "deploy" / "sync.py")]

    result = subprocess.run([*script, "--check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    listed = dict(re.findall(r"^  (\S+): (.+)$", result.stderr, re.M))
    chart_copies = "deploy/helm/roofwatch/files/dashboards"
    assert listed == {
        f"{chart_copies}/{first}": "differs",
        f"{chart_copies}/roofwatch-extra.json": "missing",
        f"{chart_copies}/roofwatch-gone.json": "stale: no longer generated",
        "deploy/kubernetes/grafana-dashboards/grafana-dashboards.yaml": "differs",
    }
    assert stale.exists()  # --check wrote nothing

    assert subprocess.run(script, capture_output=True, timeout=120).returncode == 0
    assert subprocess.run([*script, "--check"], capture_output=True, timeout=120).returncode == 0
    assert not stale.exists()
    overlay = (root / sync.GRAFANA_DIR / "grafana-dashboards.yaml").read_text()
    assert "roofwatch-extra.json: |" in overlay and "name: roofwatch-dashboard-extra" in overlay


@pytest.mark.slow
def test_sync_refuses_to_run_without_dashboards(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "deploy", root / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, str(root / "deploy" / "sync.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "dashboards/*.json: none found" in result.stderr
