"""``roofwatch doctor`` prints only printable text, whatever its neighbours call themselves.

An inference server's ``model_name`` label and dcgm-exporter's ``modelName`` and ``Hostname`` labels
are chosen by whoever runs those servers. Printed raw, an OSC 0 retitles the operator's terminal, a
CSI 2J clears it and an OSC 52 writes their clipboard. Each case serves such names from a real HTTP
server on 127.0.0.1:0 (a thread: tests/dcgm_exporter_server.py) and reads doctor's text output.
"""

from __future__ import annotations

import json
import subprocess
import unicodedata

import pytest

from agent.app.config import Settings, load_settings
from agent.diagnostics.doctor import run_doctor
from agent.diagnostics.findings import Finding, Report
from agent.diagnostics.inference import inference_findings
from tests.agent_process import clean_env, roofwatch_cmd
from tests.dcgm_exporter_server import FakeExporter, fixture
from tests.inference_server import FIXTURES as INFERENCE_FIXTURES

TITLE, CLEAR, CLIPBOARD = "\x1b]0;owned\x07", "\x1b[2J", "\x1b]52;c;cm0gLXJmIH4=\x07"
HOSTILE_MODEL = f"Qwen-通义千问-Modèle{TITLE}{CLEAR}{CLIPBOARD}\x9b31m\x7f\u202egnp.exe"
"""A model name with every trick: OSC 0, CSI 2J, OSC 52, a C1 CSI, DEL and a bidi override, between
letters that must stay readable (Chinese, an accent)."""

VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def assert_printable(text: str) -> None:
    """No control or format character but the line breaks between findings: no ESC, no BEL, no C1."""
    bad = sorted({f"U+{ord(c):04X}" for c in text if c != "\n" and (
        ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or unicodedata.category(c) in ("Cf", "Cs", "Zl", "Zp"))})
    assert bad == [], f"doctor printed {bad}"


def vllm_body(model: str) -> str:
    return (INFERENCE_FIXTURES / "vllm-serving-1.prom").read_text().replace(VLLM_MODEL, model)


def test_an_inference_servers_model_name_is_printed_as_printable_text():
    with FakeExporter(vllm_body(HOSTILE_MODEL)) as server:
        findings = inference_findings(Settings(backend="nvml-virtual", inference_endpoints=[{"url": server.url}]),
                                      timeout_s=5.0)
    report = Report()
    report.add(*findings)
    text = report.text()
    assert_printable(text)
    (warn,) = [line for line in text.splitlines() if line.startswith("WARN inference endpoint")]
    assert "model Qwen-通义千问-Modèle" in warn and "owned" in warn, "the name is still readable"
    (fix,) = [line for line in text.splitlines() if line.lstrip().startswith("fix:")]
    assert "Qwen-通义千问-Modèle" in fix and "model_bytes" in fix


def test_dcgm_exporters_model_and_host_names_are_printed_as_printable_text():
    body = (fixture("a100-8x-pods.prom").replace("NVIDIA A100-SXM4-80GB", "NVIDIA A100 Modèle" + TITLE + CLEAR)
            .replace("dgx-a100-017", "dgx" + CLIPBOARD + "\u202e017"))
    with FakeExporter(body) as exporter:
        report = run_doctor(load_settings(backend="dcgm-exporter", dcgm_exporter_url=exporter.url))
    text = report.text()
    assert_printable(text)
    gpu_lines = [line for line in text.splitlines() if line.lstrip().startswith("GPU [GPU 0]:")]
    assert gpu_lines and "NVIDIA A100 Modèle" in gpu_lines[0] and "owned" in gpu_lines[0]


def test_every_field_of_every_finding_is_made_printable_where_it_is_rendered():
    """Whatever the source (a driver's GPU name, a kubelet pod, a Slurm job, an error's text): the
    one place findings become text makes them printable; line breaks in an error become spaces."""
    hostile = "pod" + TITLE + "\x00\x1b\\\u2028\udcff"
    report = Report(gpus=1)
    report.add(Finding("check " + CLEAR, "warn", "job " + hostile + "\nsecond line", "impact " + CLIPBOARD,
                       "fix " + hostile, gpu="0" + CLEAR))
    text = report.text()
    assert_printable(text)
    assert "job pod" in text and "second line" in text and "\nsecond line" not in text
    assert text.encode("utf-8")  # a lone surrogate would make the line unwritable
    data = report.to_json()
    assert data["findings"][0]["detail"].startswith("job " + hostile), "JSON keeps the value; json.dumps escapes it"
    assert_printable(json.dumps(data))


def test_ordinary_names_are_printed_unchanged():
    report = Report(gpus=1)
    report.add(Finding("GPU", "info", "NVIDIA H100 80GB HBM3 (GPU-1), spec h100-sxm; 模型 Modèle ‍👩‍💻", gpu="0/7"))
    assert "     GPU [GPU 0/7]: NVIDIA H100 80GB HBM3 (GPU-1), spec h100-sxm; 模型 Modèle ‍👩‍💻" in report.text()


@pytest.mark.slow
def test_the_doctor_command_prints_a_hostile_model_name_as_printable_text(tmp_path):
    with FakeExporter(vllm_body(HOSTILE_MODEL)) as server:
        config = tmp_path / "roofwatch.yaml"
        config.write_text(json.dumps({"inference_endpoints": [{"url": server.url}]}))
        runs = [subprocess.run(roofwatch_cmd("doctor", "--backend", "nvml-virtual", "--config", str(config), *extra),
                               capture_output=True, timeout=120, env=clean_env()) for extra in ((), ("--json",))]
    text, as_json = (run.stdout.decode("utf-8") for run in runs)
    assert runs[0].returncode == 3, runs[0].stderr
    assert_printable(text + runs[0].stderr.decode("utf-8"))
    assert "model Qwen-通义千问-Modèle" in text
    assert_printable(as_json)
    (endpoint,) = [f for f in json.loads(as_json)["findings"] if f["check"].startswith("inference endpoint")]
    assert HOSTILE_MODEL in endpoint["detail"], "the JSON form carries the exact name, escaped"



def test_findings_that_differ_only_in_their_gpu_are_one_line_naming_the_gpus():
    """Eight GPUs of one node with the same counter sources printed eight near-identical lines."""
    from agent.diagnostics.findings import Finding, Report, gpu_list

    report = Report(gpus=10)
    for gpu in ("0", "1", "2", "3", "5", "7", "7/1", "10", "²"):
        report.add(Finding("GPU", "info", f"model of {gpu}", gpu=gpu),
                   Finding("counter source", "info", "nvml: power_w", gpu=gpu))
    report.add(Finding("persistence mode", "warn", "off", "clocks", "nvidia-smi -pm 1", gpu="4"))
    text = report.text()
    source_lines = [line for line in text.splitlines() if "counter source" in line]
    assert source_lines == ["     counter source [GPUs 0-3, 5, 7, 7/1, 10, ²]: nvml: power_w"], text
    assert text.index("model of ²") < text.index("counter source"), "each GPU's own lines come first"
    assert "WARN persistence mode [GPU 4]: off" in text
    assert sum(1 for line in text.splitlines() if line.startswith("     GPU [GPU ")) == 9
    assert report.to_json()["findings"].__len__() == 19, "the JSON keeps one finding per GPU"
    assert gpu_list(["0", "1"]) == "GPUs 0, 1" and gpu_list(["3"]) == "GPU 3"
