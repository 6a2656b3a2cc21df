"""A hostile AMD Device Metrics Exporter against the real agent process (issue 42, findings 5 and 8): values that
cannot be converted and index labels that are no index (``roofwatch run --backend amd-exporter``), and a
``/gpumetrics`` of 15 MiB of empty entries (``roofwatch demo --backend amd-virtual`` joined to the exporter, which
reads ``/gpumetrics`` where board serials are missing). The exporter is the stand-in of tests/amd_exporter_server.py
on loopback; the agent's memory is read from ``/proc/<pid>/status``, as the unit's limit would see it."""

from __future__ import annotations

import json
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests import amd_exporter_fixtures as fx
from tests.agent_process import clean_env, gauge_values, http_get, poll, roofwatch_cmd
from tests.amd_exporter_server import FakeDme
from tests.prometheus_server import free_port

pytestmark = pytest.mark.slow

BODY = fx.FILES["mi300x-spx-profiler.prom"]()
BAD_LINK = 'gpu_xgmi_link_rx{gpu_id="0",link_index="\u00b2",serial_number="692407004230"} 5\n'
FAST = {"ROOFWATCH_AMD_EXPORTER_INTERVAL_S": "0.2"}
GROWTH = 64 * 2**20
"""RSS the hostile /gpumetrics may add over the same agent's own baseline: the finding took it from 62 to 443 MiB."""


@contextmanager
def agent(log: Path, *args: str, **env: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """``roofwatch ARGS --listen 127.0.0.1:PORT`` with its log in ``log``; (process, base URL) once /healthz is 200."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with log.open("w") as sink:
        proc = subprocess.Popen(roofwatch_cmd(*args, "--listen", f"127.0.0.1:{port}", "--interval", "0.2"),
                                stdout=subprocess.DEVNULL, stderr=sink, text=True, env=clean_env(**FAST, **env))
    try:
        def healthy() -> bool:
            assert proc.poll() is None, f"the agent exited {proc.returncode}: {log.read_text()[-3000:]}"
            return http_get(url + "healthz")[0] == 200

        poll(healthy, 60, what="/healthz 200")
        yield proc, url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def metrics(url: str) -> str:
    status, body = http_get(url + "metrics")
    assert status == 200
    return body.decode()


def test_start_up_past_an_unconvertible_total_and_a_bad_link_index_and_a_used_vram_of_1e308_while_running(tmp_path):
    """Start-up with ``gpu_total_vram 1e308`` on GPU 0 and an extra ``link_index="²"`` line (each stopped the start
    with a traceback) serves /metrics with every GPU and GPU 0's other readings; then ``gpu_used_vram 1e308``
    served while running (it marked GPU 0 down for as long as it lasted) leaves GPU 0 up, less its used memory."""
    log = tmp_path / "agent.log"
    with FakeDme(fx.set_value(BODY, "gpu_total_vram", 0, "1e308") + BAD_LINK) as dme, \
            agent(log, "run", "--backend", "amd-exporter", "--amd-exporter-url", dme.url) as (_, url):
        text = poll(lambda: (t := metrics(url)) and len(gauge_values(t, "roofwatch_gpu_power_watts")) == 8 and t,
                    30, what="all 8 GPUs' power")
        assert gauge_values(text, "roofwatch_gpu_up") == {str(g): 1.0 for g in range(8)}
        assert gauge_values(text, "roofwatch_gpu_power_watts")["0"] == fx.GEMM[7]
        total = gauge_values(text, "roofwatch_gpu_memory_total_bytes")
        assert "0" not in total and total["1"] == 196592 * 2**20, total
        assert "0" in gauge_values(text, "roofwatch_gpu_memory_used_bytes")

        dme.set("/metrics", fx.set_value(BODY, "gpu_used_vram", 0, "1e308"))
        reads = dme.asked("/metrics")

        def still_up_after_reads() -> str | None:
            now = metrics(url)
            assert gauge_values(now, "roofwatch_gpu_up")["0"] == 1.0, "GPU 0 marked down"
            used = gauge_values(now, "roofwatch_gpu_memory_used_bytes")
            return now if dme.asked("/metrics") >= reads + 10 and "0" not in used else None

        text = poll(still_up_after_reads, 30, interval=0.1, what="ten reads of gpu_used_vram 1e308, GPU 0 up")
        assert gauge_values(text, "roofwatch_gpu_power_watts")["0"] == fx.GEMM[7]
        assert "1" in gauge_values(text, "roofwatch_gpu_memory_used_bytes")
        status, snapshot = http_get(url + "api/v1/snapshot")
        device = next(d for d in json.loads(snapshot)["devices"] if d["info"]["gpu"] == "0")
        assert device["up"] and device["sample"]["mem_used_bytes"] is None and device["sample"]["power_w"] == fx.GEMM[7]
    text = log.read_text()
    assert "Traceback" not in text and "OverflowError" not in text and "ValueError" not in text, text[-3000:]
    skipped = [line for line in text.splitlines() if "unreadable line(s) skipped" in line]
    assert len(skipped) == 1 and "gpu_total_vram" in skipped[0], skipped


def rss(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of ``pid`` in bytes, from /proc/<pid>/status."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}


def tiny_entries(size: int) -> bytes:
    """``{"Response": [{}, {}, ...]}`` of about ``size`` bytes: the finding's document."""
    return b'{"Response": [' + b",".join([b"{}"] * (size // 3)) + b"]}"


def without_gpu(body: str, gpu_id: int) -> str:
    """``body`` without any series of ``gpu_id``: the gpu_id set changes, so the join reads /gpumetrics again."""
    return "".join(line for line in body.splitlines(keepends=True) if f'gpu_id="{gpu_id}"' not in line)


def test_a_huge_gpumetrics_leaves_the_agents_memory_flat_and_is_refused_in_one_line_named_in_doctor(tmp_path):
    """DME without board serials, so the join reads /gpumetrics; 15 MiB of ``{}`` entries (over the cap) and then
    4 MiB of them (under it, past the entry bound) each cost the agent less than 64 MiB over its own baseline, are
    refused in one log line each, and doctor names the refusal."""
    no_serials = BODY.replace('serial_number="6924070042', 'card_serial="')
    good = (fx.FIXTURES / "mi300x-gpumetrics.json").read_bytes()
    log = tmp_path / "agent.log"
    with FakeDme(no_serials, good) as dme, \
            agent(log, "demo", "--backend", "amd-virtual", ROOFWATCH_AMD_EXPORTER_URL=dme.url) as (proc, url):
        poll(lambda: "PCI addresses of 8 gpu_id(s)" in log.read_text(), 30, what="the first /gpumetrics read")
        poll(lambda: len(gauge_values(metrics(url), "roofwatch_gpu_up")) == 8, 30, what="8 GPUs in /metrics")
        baseline = rss(proc.pid)

        def refused(words: str, count: int) -> list[str]:
            """The refusal lines once the count-th is logged; the peak RSS checked at every poll, so a breach
            fails at once (the old agent parsed the document whole, and logged nothing)."""
            peak = rss(proc.pid)["VmHWM"]
            assert peak < baseline["VmHWM"] + GROWTH, (
                f"peak {peak / 2**20:.0f} MiB against a baseline of {baseline['VmHWM'] / 2**20:.0f} MiB")
            lines = [line for line in log.read_text().splitlines() if "/gpumetrics unusable" in line]
            return lines if len(lines) == count and words in lines[-1] else []

        for step, (document, words, gone) in enumerate((
                (tiny_entries(15 * 2**20), "answer larger than 4194304 bytes", 7),
                (tiny_entries(4 * 2**20 - 1024), "more than 128 GPU entries (max_devices)", 6))):
            dme.set("/gpumetrics", document)
            dme.set("/metrics", without_gpu(no_serials, gone))  # another gpu_id set: the map is read again
            lines = poll(lambda: refused(words, step + 1), 30, what=f"the refusal: {words}")
            assert dme.asked("/gpumetrics") == 2 * step + 2, "one read of each document"
            print(f"{words}: peak RSS {rss(proc.pid)['VmHWM'] / 2**20:.0f} MiB, baseline "
                  f"{baseline['VmHWM'] / 2**20:.0f} MiB")
            assert "Traceback" not in log.read_text() and len(lines[-1]) < 600, lines[-1]
            dme.set("/gpumetrics", good)
            dme.set("/metrics", no_serials)
            poll(lambda: log.read_text().count("PCI addresses of 8 gpu_id(s)") == step + 2, 30,
                 what="the map read again from a good document")
        assert http_get(url + "healthz")[0] == 200 and len(gauge_values(metrics(url), "roofwatch_gpu_up")) == 8
        dme.set("/gpumetrics", tiny_entries(15 * 2**20))
        doctor = subprocess.run(roofwatch_cmd("doctor", "--backend", "amd-virtual", "--json"), capture_output=True,
                                text=True, timeout=120, env=clean_env(ROOFWATCH_AMD_EXPORTER_URL=dme.url))
    findings = json.loads(doctor.stdout)["findings"]
    join = [f for f in findings if f["check"] == "amd-exporter join" and "answer larger than 4194304" in f["detail"]]
    assert len(join) == 1 and join[0]["status"] == "warn", [f["detail"] for f in findings if "join" in f["check"]]
    assert "Traceback" not in doctor.stderr
