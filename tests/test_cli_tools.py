"""``roofwatch snapshot``, ``record`` and ``specs`` as a user runs them."""

from __future__ import annotations

import json
import subprocess

import pytest

from agent.trace import TraceReader
from tests.agent_process import AgentProcess, clean_env, gauge_values, poll, roofwatch_cmd


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(roofwatch_cmd(*args), capture_output=True, text=True, timeout=timeout, env=clean_env())


@pytest.mark.slow
def test_snapshot_table_and_json_from_virtual_backend():
    table = run("snapshot", "--backend", "virtual", "--interval", "0.2")
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("node demo-node: 8/8 GPUs up, backend virtual")
    assert table.stdout.count("NVIDIA H100 80GB HBM3") == 8
    data = json.loads(run("snapshot", "--backend", "virtual", "--interval", "0.2", "--json").stdout)
    assert [d["info"]["gpu"] for d in data["devices"]] == [str(i) for i in range(8)]
    assert all(d["sample"]["interval_s"] == pytest.approx(0.2, abs=0.15) for d in data["devices"])


@pytest.mark.slow
def test_record_simulate_writes_a_labelled_trace(tmp_path):
    out = tmp_path / "demo.jsonl.gz"
    result = run("record", "--simulate", "--duration", "30", "--out", str(out))
    assert result.returncode == 0, result.stderr
    with TraceReader(out) as reader:
        samples = list(reader)
        header = reader.header
    assert header["format"] == "roofwatch-trace" and "demo" in header["note"]
    assert len(samples) == 30 * 8 and result.stdout.strip() == f"wrote 240 samples to {out}"
    labels = {s.gpu: s.label for s in samples if s.ts == samples[-1].ts}
    assert labels["0"] == "compute_bound" and labels["2"] == "memory_bound" and labels["6"] == "idle"
    assert labels["3"] == "input_starved" and labels["4"] == "communication_jittered"


@pytest.mark.slow
def test_record_live_from_virtual_backend(tmp_path):
    out = tmp_path / "live.jsonl"
    result = run("record", "--backend", "virtual", "--interval", "0.2", "--duration", "1.5", "--out", str(out))
    assert result.returncode == 0, result.stderr
    samples = list(TraceReader(out))
    assert len(samples) >= 8 * 3
    assert all(s.label is None for s in samples)  # a live trace has no ground truth
    per_gpu = {}
    for s in samples:
        per_gpu.setdefault(s.gpu, []).append(s.ts)
    assert sorted(per_gpu) == [str(i) for i in range(8)]


@pytest.mark.slow
def test_record_shows_its_progress_on_a_terminal_and_nothing_in_a_pipe(tmp_path):
    """A minute of recording used to print nothing until the end: on a terminal it now says how far it is."""
    import os
    import pty

    out = tmp_path / "live.jsonl"
    args = roofwatch_cmd("record", "--backend", "virtual", "--interval", "0.2", "--duration", "2.5", "--out", str(out))
    pid, fd = pty.fork()
    if pid == 0:  # the child: the recording, its stderr on the terminal
        os.execvpe(args[0], args, clean_env())
    seen = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the terminal closed: the child ended
            break
        if not chunk:
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert f"recording to {out}: 1 of 2.5 s" in text and " samples" in text, text
    assert f"wrote " in text.rsplit("recording to", 1)[1], "the last line is the summary, on a line of its own"
    piped = run("record", "--backend", "virtual", "--interval", "0.2", "--duration", "1.5", "--out", str(out))
    assert piped.returncode == 0 and "recording to" not in piped.stderr + piped.stdout, piped.stderr


@pytest.mark.slow
def test_record_without_a_gpu_suggests_recording_a_simulation_not_the_demo(tmp_path):
    result = run("record", "--backend", "auto", "--duration", "1", "--out", str(tmp_path / "x.jsonl"))
    assert result.returncode == 1
    assert "record --simulate" in result.stderr and "--backend nvml-virtual" in result.stderr, result.stderr
    assert "roofwatch demo" not in result.stderr


@pytest.mark.slow
def test_record_bad_duration_is_usage_error(tmp_path):
    result = run("record", "--simulate", "--duration", "0", "--out", str(tmp_path / "x.jsonl"))
    assert result.returncode == 2 and "--duration" in result.stderr


@pytest.mark.slow
def test_record_unwritable_path_is_a_clear_error(tmp_path):
    result = run("record", "--simulate", "--duration", "5", "--out", str(tmp_path / "missing" / "x.jsonl"))
    assert result.returncode == 1 and "missing/x.jsonl" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_record_live_to_an_unwritable_path_says_so_once(tmp_path):
    target = tmp_path / "missing" / "x.jsonl"
    result = run("record", "--backend", "virtual", "--duration", "1", "--out", str(target))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("cannot write trace") == 1 and str(target) in result.stderr


@pytest.mark.slow
def test_disk_full_while_recording_keeps_exporting():
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--interval", "0.2", "--record", "/dev/full")
    try:
        agent.wait_healthy()
        first = gauge_values(agent.metrics(), "roofwatch_gpu_last_sample_timestamp_seconds")["0"]
        poll(
            lambda: gauge_values(agent.metrics(), "roofwatch_gpu_last_sample_timestamp_seconds")["0"] > first + 0.5,
            timeout=15, what="export to continue after the trace write failed",
        )
        code, _, err = agent.stop()
        assert code == 0
        assert "trace recording stopped" in err and "No space left on device" in err
    finally:
        agent.kill()


@pytest.mark.slow
def test_specs_json_lists_the_catalogue():
    data = json.loads(run("specs", "--json").stdout)
    h100 = next(d for d in data if d["key"] == "h100-sxm")
    assert h100["peak_flops"]["bf16"] == pytest.approx(989.4e12)
    table = run("specs").stdout
    assert "h100-sxm" in table and "mi300x" in table



def test_first_cycle_of_the_demo_already_shows_the_workloads():
    from agent.backends.options import BackendOptions
    from agent.backends.registry import open_virtual
    from agent.collector import Collector
    from agent.app.config import load_settings

    collector = Collector(open_virtual(BackendOptions.of(load_settings(backend="virtual"))), node="n")
    first = {d.info.gpu: d.sample.gr_active for d in collector.collect_once().devices}
    collector.stop()
    assert first["0"] > 0.9 and first["2"] > 0.9 and first["6"] < 0.05


@pytest.mark.slow
def test_snapshot_from_unreachable_agent_is_a_clear_error():
    from tests.prometheus_server import free_port

    port = free_port()  # nothing listens there
    result = run("snapshot", "--url", f"http://127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"cannot read a snapshot from http://127.0.0.1:{port}/api/v1/snapshot" in result.stderr
    assert "Traceback" not in result.stderr
