"""The shipped Prometheus rules and Alertmanager routing, checked by the real promtool and amtool.

The rule logic itself is unit-tested in deploy/prometheus/roofwatch-rules.test.yml (promtool's
own format); these tests run it, make sure it covers every alert both ways, prove that it can
fail, and keep the annotations and docs/alerts.md complete.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "roofwatch-rules.yml"
RULE_TESTS = RULES_DIR / "roofwatch-rules.test.yml"
ALERTMANAGER = RULES_DIR / "alertmanager.yml"
PROMETHEUS = RULES_DIR / "prometheus.yml"
ALERT_DOCS = ROOT / "docs" / "alerts.md"
SEVERITIES = {"info", "warning", "critical"}

PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: apt-get install prometheus")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool missing: apt-get install prometheus-alertmanager")


def run(*cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alert_rules() -> list[dict]:
    return [rule for rule in rules() if "alert" in rule]


def alert_names() -> set[str]:
    return {rule["alert"] for rule in alert_rules()}


@pytest.mark.slow
@needs_promtool
def test_promtool_check_rules_is_clean():
    result = run(PROMTOOL, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout
    assert "warning" not in (result.stdout + result.stderr).lower()


@pytest.mark.slow
@needs_promtool
def test_promtool_unit_tests_pass():
    result = run(PROMTOOL, "test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested_firing_and_silent():
    fires: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
    assert fires >= alert_names(), f"never shown firing: {sorted(alert_names() - fires)}"
    assert silent >= alert_names(), f"never shown silent: {sorted(alert_names() - silent)}"


@pytest.mark.slow
@needs_promtool
def test_unit_tests_have_teeth(tmp_path):
    """A wrong threshold must fail the suite: the expectations are not just what the rules say."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    text = RULES.read_text()
    weakened = text.replace("record: roofwatch:alert_threshold:low_mfu_ratio\n        expr: vector(0.4)",
                            "record: roofwatch:alert_threshold:low_mfu_ratio\n        expr: vector(0.1)")
    assert weakened != text
    (tmp_path / RULES.name).write_text(weakened)
    result = run(PROMTOOL, "test", "rules", str(tmp_path / RULE_TESTS.name))
    assert result.returncode != 0
    assert "alertname: LowMFU" in result.stdout + result.stderr


@pytest.mark.slow
@needs_promtool
def test_moving_a_threshold_moves_only_its_alert(tmp_path):
    """Thresholds are series: moving one moves its alert, with no expression edited."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    text = RULES.read_text().replace("expr: vector(0.15)", "expr: vector(0.5)")  # straggler lead
    (tmp_path / RULES.name).write_text(text)
    result = run(PROMTOOL, "test", "rules", str(tmp_path / RULE_TESTS.name))
    assert result.returncode != 0
    failing = set(re.findall(r"alertname: (\w+),", result.stdout + result.stderr))
    assert failing == {"GpuJobStraggler"}


def test_thresholds_are_one_group_of_constant_series():
    groups = {g["name"]: g["rules"] for g in yaml.safe_load(RULES.read_text())["groups"]}
    thresholds = groups["roofwatch-thresholds"]
    assert thresholds, "no thresholds"
    used = RULES.read_text()
    for rule in thresholds:
        assert re.fullmatch(r"roofwatch:alert_threshold:[a-z_]+", rule["record"]), rule
        assert re.fullmatch(r"vector\([0-9.]+\)", rule["expr"].strip()), rule
        assert used.count(rule["record"]) >= 2, f"{rule['record']} is never used"


def test_serving_thresholds_are_the_classifiers_defaults():
    """The serving alerts judge what the agent's verdict judges: ServingUnderBatched is the
    classifier's far-above-the-floor and under-batched limits, ServingKvCacheSaturated its
    kv_full and queue limits (agent/classifier/thresholds.py), so the two cannot drift apart."""
    from agent.classifier.thresholds import DEFAULT_THRESHOLDS

    values = {rule["record"].rsplit(":", 1)[1]: float(re.fullmatch(r"vector\(([0-9.]+)\)", rule["expr"].strip())[1])
              for rule in rules() if rule.get("record", "").startswith("roofwatch:alert_threshold:serving_")}
    assert set(values) == {"serving_far_ratio", "serving_under_batched", "serving_kv_full", "serving_queue"}
    for key, value in values.items():
        assert value == getattr(DEFAULT_THRESHOLDS, key), key


def test_serving_rules_keep_one_series_per_replica():
    """Every per-server rule keeps node with server and model: a server is named by its metrics URL,
    the same localhost:8000 on every node, and merging those would join unrelated replicas."""
    serving = [r for r in rules() if r.get("record", "").startswith("roofwatch_server:serving_")]
    assert len(serving) >= 10
    for rule in serving:
        for by in re.findall(r"by \(([^)]*)\)", rule["expr"]):
            assert {"cluster", "node", "server", "model"} <= {x.strip() for x in by.split(",")}, rule["record"]


def test_alerts_say_what_why_and_what_to_do():
    docs = ALERT_DOCS.read_text()
    anchors = {"#" + re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^## (.+)$", docs, re.MULTILINE)}
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        notes = rule["annotations"]
        for key in ("summary", "description", "runbook", "runbook_url"):
            assert notes.get(key, "").strip(), f"{name} has no {key}"
        anchor = "#" + notes["runbook_url"].rsplit("#", 1)[1]
        assert anchor in anchors, f"{name}: docs/alerts.md has no section for {anchor}"


def test_docs_list_every_alert_and_threshold():
    docs = ALERT_DOCS.read_text()
    for name in alert_names():
        assert f"## {name}" in docs, name
    for rule in rules():
        if rule.get("record", "").startswith("roofwatch:alert_threshold:"):
            assert rule["record"].rsplit(":", 1)[1] in docs, rule["record"]


@pytest.mark.slow
@needs_promtool
def test_example_prometheus_config_is_valid():
    result = run(PROMTOOL, "check", "config", str(PROMETHEUS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@pytest.mark.slow
@needs_amtool
def test_alertmanager_example_is_valid():
    result = run(AMTOOL, "check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.slow
@needs_amtool
@pytest.mark.parametrize(("labels", "receiver"), [
    (["alertname=GpuCriticalXid", "severity=critical", "xid=79"], "gpu-oncall"),
    (["alertname=GpuLost", "severity=critical"], "gpu-oncall"),
    (["alertname=LowMFU", "severity=warning", "scope=job"], "ml-efficiency"),
    (["alertname=GpuJobStraggler", "severity=warning"], "ml-efficiency"),
    (["alertname=GpuThrottled", "severity=warning"], "gpu-hardware"),
    (["alertname=ServingUnderBatched", "severity=warning", "model=llama-70b"], "ml-efficiency"),
    (["alertname=ServingKvCacheSaturated", "severity=warning"], "ml-efficiency"),
    (["alertname=RoofwatchAgentDown", "severity=warning"], "monitoring"),
    (["alertname=SomethingElse"], "gpu-platform"),
])
def test_alertmanager_routes(labels, receiver):
    result = run(AMTOOL, "config", "routes", "test", f"--config.file={ALERTMANAGER}",
                 f"--verify.receivers={receiver}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@needs_amtool
def test_every_alert_has_a_deliberate_route():
    """No shipped alert falls through to the default receiver by accident."""
    for name in sorted(alert_names()):
        result = run(AMTOOL, "config", "routes", "test", f"--config.file={ALERTMANAGER}", f"alertname={name}")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() != "gpu-platform", f"{name} has no route of its own"
