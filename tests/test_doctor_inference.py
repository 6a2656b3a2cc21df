"""``roofwatch doctor`` on inference endpoints: which serving signals each server gives, and what is missing.

Against the real fixture HTTP server (tests/inference_server.py) and, once, the real CLI in a child process.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from agent.app.config import Settings
from agent.diagnostics.inference import inference_findings
from tests.agent_process import clean_env, roofwatch_cmd
from tests.inference_bodies import long_names
from tests.inference_server import server  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow


def findings(**settings):
    return inference_findings(Settings(backend="nvml-virtual", **settings), timeout_s=5.0)


def test_a_full_vllm_endpoint_with_weight_bytes_is_ok_and_names_its_signals(server):
    (f,) = findings(inference_endpoints=[{"url": server.seq("vllm-serving-1.prom"), "model_bytes": 16.06e9}])
    assert f.status == "ok", f
    assert "vllm, model meta-llama/Llama-3.1-8B-Instruct" in f.detail
    assert "running requests, waiting requests, KV-cache usage, inter-token latency, prefill time" in f.detail
    assert "weights 16.1 GB" in f.detail


def test_weight_bytes_from_the_models_setting_count_and_their_absence_is_a_warning_with_the_fix(server):
    url = server.seq("vllm-serving-1.prom")
    (known,) = findings(inference_endpoints=[{"url": url}],
                        models={"meta-llama/Llama-3.1-8B-Instruct": {"model_bytes": 16.06e9}})
    assert known.status == "ok"
    (unknown,) = findings(inference_endpoints=[{"url": url}])
    assert unknown.status == "warn" and "weight bytes unknown" in unknown.detail
    assert "models: {'meta-llama/Llama-3.1-8B-Instruct': {model_bytes: ...}}" in unknown.fix


def test_a_server_without_latency_histograms_or_a_missing_endpoint_is_a_warning(server):
    tgi, missing = findings(inference_endpoints=[{"url": server.seq("tgi-1.prom"), "model_bytes": 16e9},
                                                 {"url": server.seq("404")}])
    assert tgi.status == "warn" and "not exported: KV-cache usage, inter-token latency" in tgi.detail
    assert "inter-token latency histogram" in tgi.fix
    assert missing.status == "warn" and "404" in missing.detail
    from agent.context.workload.inference.parse import KIND_NAMES
    assert all(name in missing.fix for name in KIND_NAMES.values()), missing.fix  # where each server serves them


def test_the_line_says_which_gpus_the_figures_reach_and_warns_where_no_gpu_can_be_found(server):
    """Without ``gpus`` an endpoint is matched by its server's PIDs among a GPU's processes;
    ``--backend dcgm-exporter`` has none, so there its figures would reach no GPU (doctor used to call
    such an endpoint ok while the agent did not even scrape it)."""
    endpoint = {"url": server.seq("vllm-serving-1.prom"), "model_bytes": 16.06e9}
    (by_pid,) = findings(inference_endpoints=[endpoint])
    assert by_pid.status == "ok" and "used for the GPUs its processes hold" in by_pid.detail
    sidecar = Settings(backend="dcgm-exporter", dcgm_exporter_url="http://127.0.0.1:9/metrics")
    (lost,) = inference_findings(sidecar.model_copy(update={"inference_endpoints": Settings(
        inference_endpoints=[endpoint]).inference_endpoints}), timeout_s=5.0)
    assert lost.status == "warn" and "used for no GPU" in lost.detail and "inference_endpoints[0].gpus" in lost.fix
    (named,) = inference_findings(sidecar.model_copy(update={"inference_endpoints": Settings(
        inference_endpoints=[{**endpoint, "gpus": ["2", "3"]}]).inference_endpoints}), timeout_s=5.0)
    assert named.status == "ok" and "used for GPUs 2, 3" in named.detail


def test_the_cli_reports_endpoints_and_exits_degraded_on_a_warning(server, tmp_path):
    config = tmp_path / "roofwatch.yaml"
    config.write_text(json.dumps({"inference_endpoints": [{"url": server.seq("vllm-serving-1.prom")}]}))
    result = subprocess.run(roofwatch_cmd("doctor", "--backend", "nvml-virtual", "--config", str(config), "--json"),
                            capture_output=True, text=True, timeout=120, env=clean_env())
    report = json.loads(result.stdout)
    (endpoint,) = [f for f in report["findings"] if f["check"].startswith("inference endpoint")]
    assert endpoint["status"] == "warn" and result.returncode == 3, (result.returncode, endpoint)


def test_model_names_are_clipped_as_every_view_clips_them(server, tmp_path):
    """A vLLM whose one model is named by 204,000 characters made a doctor line as long, where every other view
    cuts a name at 128 characters (exporters.metrics.clip_label); a server naming 20 models lists the 16 the
    label bound keeps, each cut alike, and the refusal."""
    config = tmp_path / "roofwatch.yaml"
    config.write_text(json.dumps({"inference_endpoints": [{"url": server.gen("longnames-204000-1"), "gpus": ["0"]}]}))
    result = subprocess.run(roofwatch_cmd("doctor", "--backend", "nvml-virtual", "--config", str(config)),
                            capture_output=True, text=True, timeout=120, env=clean_env())
    (name,) = long_names(204_000, 1)
    (line,) = [line for line in result.stdout.splitlines() if "inference endpoint" in line]
    assert f"model {name[:128]};" in line and name[:129] not in line
    assert max(len(line) for line in result.stdout.splitlines()) < 1_000
    (many,) = findings(inference_endpoints=[{"url": server.gen("longnames-20000-20"), "model_bytes": 16e9}])
    names = long_names(20_000, 20)
    assert many.detail.startswith(f"vllm, model {', '.join(name[:128] for name in names[:16])}; "), \
        "the first 16 models (the label bound), each cut at 128 characters"
    assert many.status == "warn" and "4 samples refused past the label bounds (model_name > 16 values)" in many.detail
