"""The Helm chart's Prometheus side: the PrometheusRule, the ServiceMonitor, the documented scrape config.

The PrometheusRule is derived from deploy/prometheus/roofwatch-rules.yml, so every check reads the
rules file rather than hard-coding it; the plain scrape config in the docs goes through the real
`promtool check config`. Helpers: tests/helm_chart.py.
"""

from __future__ import annotations

import re
import subprocess

import helm_python as helm  # test extra helm-python-sdk: the Helm v4 SDK, no helm binary needed
import pytest
import yaml

from tests.helm_chart import (README, REPO, RULES_COPY, THRESHOLDS_GROUP, alert_rules, most_repeated_alert, only,
                              promtool, render, rendered_groups, rules_file, thresholds_in_file)

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


def test_disabling_an_alert_drops_every_rule_of_that_name():
    name = most_repeated_alert()
    before = alert_rules(rules_file()["groups"])
    after = alert_rules(rendered_groups({"alerts": {name: {"enabled": False}}}))
    assert [r for r in before if r["alert"] != name] == after
    assert len(before) - len(after) == [r["alert"] for r in before].count(name)
    kept = alert_rules(rendered_groups({"alerts": {name: {"enabled": True}}}))
    assert kept == before


def test_for_and_label_overrides_apply_to_every_rule_of_that_name():
    name = most_repeated_alert()
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


# -- plain Prometheus scrape config from the docs ---------------------------------------------------------


SCRAPE_CONFIG_DOCS = [p for p in (README, REPO / "docs" / "deploy.md") if p.is_file()]


@pytest.mark.slow
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
