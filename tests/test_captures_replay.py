"""Every published capture (tests/fixtures/captures, README.md there says where each was published)
replayed through a real ``roofwatch run --backend dcgm-exporter``, one agent process per capture.

The dcgm-exporter captures are served as they are, stray lines and all (a ``$ kubectl`` line, ``> ``
quoting, ``...`` elisions), and what the agent exports is checked against the capture's own lines:
its GPU and MIG keys, node, model, pods, verdicts, and every reading the capture gives, in
roofwatch's units (W, °C, Hz, bytes), with the families the capture does not give absent, not 0.
Each inference capture is served as an ``inference_endpoints`` entry of an agent beside the
``upcloud-l40s`` exporter capture, and must reach GPU 0 as a ``roofwatch_serving_info`` series.

What each capture shows is in tests/capture_replays.py. Every agent (and every ``roofwatch doctor``) is started once for the module,
before any is polled, and all are stopped in the fixture's ``finally``: the module takes seconds.
"""

from __future__ import annotations

import functools
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import clean_env, http_get, poll, roofwatch_cmd
from tests.capture_replays import (
    BESIDE, COUNTER_FIELDS, DCGM_CAPTURES, IDLE_HELD, INFERENCE_CAPTURES, MODEL_BYTES, NEVER_GIVEN, READINGS,
    REPLAY_OF, SERVED_OF, SMG813, Replay, capture, fields, stop_all,
)
from tests.dcgm_exporter_server import FakeExporter
from tests.prometheus_server import free_port

pytestmark = pytest.mark.slow

FAST = {"ROOFWATCH_DCGM_EXPORTER_INTERVAL_S": "0.2", "ROOFWATCH_INFERENCE_INTERVAL_S": "0.5",
        "ROOFWATCH_CLASSIFIER__WINDOW_S": "2", "ROOFWATCH_CLASSIFIER__LONG_WINDOW_S": "4",
        "ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S": "0.5"}
WAIT_S = 90.0
"""Per poll: some 35 processes start at once, so a 2-core machine needs 15-20 s before the first answers."""


def _params() -> list:
    """One case per dcgm-exporter capture, named after it."""
    return [pytest.param(file, id=Path(file).stem) for file in DCGM_CAPTURES]


# ---------------------------------------------------------------- the processes


@dataclass
class Agent:
    """One ``roofwatch run`` (and maybe its ``roofwatch doctor``), output in files so no pipe fills."""

    name: str
    url: str
    proc: subprocess.Popen
    log: Path
    doctor: subprocess.Popen | None = None
    doctor_out: Path | None = None

    def get(self, path: str) -> bytes:
        if self.proc.poll() is not None:
            stderr = self.log.with_name(self.log.name + ".err").read_text()
            raise AssertionError(f"the agent for {self.name} exited ({self.proc.returncode}): {stderr[-3000:]}")
        status, body = http_get(self.url + path)
        if status != 200:
            raise ValueError(f"{path}: HTTP {status}")
        return body

    def metrics(self) -> str:
        return self.get("metrics").decode()

    def wait_healthy(self) -> None:
        poll(lambda: self.get("healthz") is not None, WAIT_S, what=f"/healthz of the agent for {self.name}")

    def snapshot(self) -> dict:
        return json.loads(self.get("api/v1/snapshot"))

    def doctor_findings(self) -> list[dict]:
        assert self.doctor is not None and self.doctor_out is not None
        self.doctor.wait(timeout=WAIT_S)
        text, stderr = self.doctor_out.read_text(), self.doctor_out.with_name(self.doctor_out.name + ".err").read_text()
        assert self.doctor.returncode in (0, 3), f"doctor exited {self.doctor.returncode}: {stderr[-3000:]}"
        return json.loads(text)["findings"]


def _start(args: list[str], out: Path, env: dict[str, str], procs: list[subprocess.Popen]) -> subprocess.Popen:
    """``roofwatch`` with stdout to ``out`` and stderr to ``out`` + ``.err`` (so a doctor's JSON stays JSON)."""
    with out.open("w") as sink, out.with_name(out.name + ".err").open("w") as errors:
        proc = subprocess.Popen(roofwatch_cmd(*args), stdout=sink, stderr=errors, text=True, env=env)
    procs.append(proc)
    return proc


def _agent(name: str, exporter: FakeExporter, tmp: Path, procs: list[subprocess.Popen], *extra: str) -> Agent:
    port = free_port()
    log = tmp / f"{name}.log"
    proc = _start(["run", "--backend", "dcgm-exporter", "--dcgm-exporter-url", exporter.url,
                   "--listen", f"127.0.0.1:{port}", "--interval", "0.2", *extra], log, clean_env(**FAST), procs)
    return Agent(name, f"http://127.0.0.1:{port}/", proc, log)


def _doctor(agent: Agent, exporter: FakeExporter, tmp: Path, procs: list[subprocess.Popen], *extra: str) -> None:
    agent.doctor_out = tmp / f"{agent.name}.doctor.json"
    agent.doctor = _start(["doctor", "--backend", "dcgm-exporter", "--json", *extra], agent.doctor_out,
                          clean_env(ROOFWATCH_DCGM_EXPORTER_URL=exporter.url), procs)


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Agent]]:
    """One agent per capture, and a doctor per exporter capture (and for smg813), all started before any
    is polled; every process is stopped and every stand-in server closed on the way out."""
    tmp = tmp_path_factory.mktemp("replays")
    procs: list[subprocess.Popen] = []
    exporters: list[FakeExporter] = []
    out: dict[str, Agent] = {}
    try:
        for file in DCGM_CAPTURES:
            exporters.append(exporter := FakeExporter(capture(file)))
            name = Path(file).stem
            out[file] = _agent(name, exporter, tmp, procs)
            _doctor(out[file], exporter, tmp, procs)
        exporters.append(beside := FakeExporter(capture(BESIDE)))
        for file in INFERENCE_CAPTURES:
            exporters.append(server := FakeExporter(capture(file)))
            config = tmp / f"{Path(file).stem}.yaml"
            config.write_text(yaml.safe_dump({"inference_endpoints": [
                {"url": server.url, "gpus": ["0"], "model_bytes": MODEL_BYTES}]}))
            out[file] = _agent(f"served-{Path(file).stem}", beside, tmp, procs, "--config", str(config))
            if file == SMG813:
                _doctor(out[file], beside, tmp, procs, "--config", str(config))
        yield out
    finally:
        stop_all(procs, exporters)


# ---------------------------------------------------------------- reading the agent's answers


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> dict[str, list[dict]]:
    """Sample name -> its samples' labels and value: one parse of an exposition for all the questions."""
    out: dict[str, list[dict]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append({**s.labels, "value": s.value})
    return out


def samples(text: str, name: str) -> list[dict]:
    return [dict(s) for s in _parsed(text).get(name, [])]


def values(text: str, name: str, *labels: str) -> dict:
    """GPU key (with ``labels``' values after it, as a tuple) -> value of sample ``name``."""
    return {(s["gpu"], *(s[k] for k in labels)) if labels else s["gpu"]: s["value"] for s in samples(text, name)}


def settled(agent: Agent, replay: Replay) -> tuple[dict, dict[str, dict], str]:
    """(snapshot, verdicts by GPU, /metrics) once every GPU of the capture has a verdict past warming up."""
    def ready():
        snap = agent.snapshot()
        verdicts = {v["gpu"]: v for v in snap["verdicts"]}
        done = set(verdicts) == set(replay.verdicts) and all(v["detail"] != "warming_up" for v in verdicts.values())
        return done and (snap, verdicts)

    agent.wait_healthy()
    snap, verdicts = poll(ready, WAIT_S, what=f"a verdict for each GPU of {replay.file}")
    return snap, verdicts, agent.metrics()


def _replay(file: str) -> Replay:
    assert file in REPLAY_OF, f"{file}: add what it shows to REPLAYS"
    return REPLAY_OF[file]


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("file", _params())
def test_a_dcgm_exporter_capture_reads_as_it_shows(agents, file):
    """GPU keys, node, model and peaks, pods, verdicts, every reading in roofwatch's unit, and the rest absent."""
    replay = _replay(file)
    snap, verdicts, metrics = settled(agents[file], replay)
    got = fields(file)
    keys = set(replay.verdicts)
    assert set(got) == keys, "REPLAYS lists the capture's GPU keys"

    assert snap["node"] == replay.node
    assert {s["node"] for s in samples(metrics, "roofwatch_gpu_up")} == {replay.node}
    assert values(metrics, "roofwatch_gpu_up") == {k: 1.0 for k in keys}
    info = {s["gpu"]: (s["model"], s["spec"]) for s in samples(metrics, "roofwatch_gpu_info")}
    assert info == replay.info
    assert set(values(metrics, "roofwatch_gpu_peak_memory_bandwidth_bytes_per_second")) == \
        {k for k, (_, spec) in replay.info.items() if spec}, "peaks only where a spec names the GPU"

    assert {k: (v["class"], v["detail"]) for k, v in verdicts.items()} == replay.verdicts
    pods = {s["gpu"]: (s["namespace"], s["pod"], s["container"]) for s in samples(metrics, "roofwatch_gpu_pod_info")}
    assert pods == replay.pods
    for gpu, (namespace, pod, _) in replay.pods.items():
        if replay.verdicts[gpu] == IDLE_HELD:
            assert any(f"pod {namespace}/{pod}" in r for r in verdicts[gpu]["reasons"]), verdicts[gpu]["reasons"]

    given = {name for name, convert in READINGS.items() if any(convert(f) is not None for f in got.values())}
    assert given == replay.read, "REPLAYS lists the families the capture gives"
    for name, convert in READINGS.items():
        expected = {k: v for k in keys if (v := convert(got[k])) is not None}
        exported = values(metrics, name)
        assert set(exported) == set(expected), f"{name}: exported for {sorted(exported)}, capture gives {sorted(expected)}"
        for key, value in expected.items():
            assert exported[key] == pytest.approx(value, rel=1e-9), f"{name} of GPU {key}"
    for name, wanted in NEVER_GIVEN.items():
        assert not any(w in f for f in got.values() for w in wanted), f"the capture gives {name}: move it to READINGS"
        assert samples(metrics, name) == [], f"{name}: the capture has none of {wanted}"


@pytest.mark.parametrize("file", _params())
def test_the_duty_cross_check_is_there_only_where_the_capture_has_both_counters(agents, file):
    """``roofwatch_gpu_counters_suspect``: 0 where PROF_GR_ENGINE_ACTIVE and GPU_UTIL agree, absent where
    the capture has one of them or neither (docs/metrics.md)."""
    replay = _replay(file)
    _, _, metrics = settled(agents[file], replay)
    both = {k for k, f in fields(file).items() if "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in f and "DCGM_FI_DEV_GPU_UTIL" in f}
    assert values(metrics, "roofwatch_gpu_counters_suspect") == {k: 0.0 for k in both}


@pytest.mark.parametrize("file", _params())
def test_since_start_counters_only_where_the_capture_gives_their_field(agents, file):
    """Energy where the capture has the energy counter or power, PCIe and NVLink bytes where it has
    their byte rates (then growing at the capture's rate); absent elsewhere, not 0."""
    replay = _replay(file)
    got = fields(file)
    agent = agents[file]
    settled(agent, replay)
    rates = {k: f.get("DCGM_FI_PROF_PCIE_TX_BYTES", 0.0) for k, f in got.items()}
    metrics = poll(lambda: (m := agent.metrics()) and all(
        values(m, "roofwatch_gpu_pcie_bytes_total", "direction").get((k, "tx"), 0.0) > 0 for k, r in rates.items() if r > 0)
        and m, WAIT_S, what="PCIe bytes counted where the capture gives a rate")
    for name, wanted in COUNTER_FIELDS.items():
        expected = {k for k in replay.verdicts if any(w in got[k] for w in wanted)}
        exported = {s["gpu"] for s in samples(metrics, name)}
        assert exported == expected, f"{name}: exported for {sorted(exported)}, the capture gives {sorted(expected)}"


@pytest.mark.parametrize("file", _params())
def test_doctor_counts_the_capture_lines_that_are_no_sample(agents, file):
    """A shell line, ``> `` quoting or an ``...`` elision costs its line, counted and shown, never the body."""
    replay = _replay(file)
    lines = capture(file).splitlines()
    found = [f["detail"] for f in agents[file].doctor_findings()
             if f["check"] == "dcgm-exporter" and "unreadable line(s) skipped" in f["detail"]]
    count, first = replay.skipped
    if not count:
        assert found == []
        return
    (detail,) = found
    assert detail.startswith(f"{count} unreadable line(s) skipped, first line {first}: "), detail
    assert repr(lines[first - 1].strip()[:60])[:-1] in detail, (lines[first - 1], detail)


@pytest.mark.parametrize("file", INFERENCE_CAPTURES, ids=[Path(f).stem for f in INFERENCE_CAPTURES])
def test_an_inference_capture_reaches_gpu_0_as_its_server(agents, file):
    """The capture as an ``inference_endpoints`` entry with ``gpus: ["0"]`` and ``model_bytes``: GPU 0 gets a
    ``roofwatch_serving_info`` of the capture's server and model, the figures the capture has, and no
    series for those it lacks."""
    assert file in SERVED_OF, f"{file}: add what it shows to SERVED"
    served = SERVED_OF[file]
    agent = agents[file]
    present = {("roofwatch_serving_requests", "running"): served.running,
               ("roofwatch_serving_requests", "waiting"): served.waiting,
               ("roofwatch_serving_kv_cache_usage_ratio", None): served.kv_usage,
               ("roofwatch_serving_output_tokens_per_second_per_gpu", None): served.tokens_per_gpu}

    def serving_value(text: str, name: str, state: str | None) -> float | None:
        found = [s["value"] for s in samples(text, name) if s["gpu"] == "0" and s.get("state", state) == state]
        return found[0] if found else None

    def ready():
        m = agent.metrics()
        return (any(s["gpu"] == "0" for s in samples(m, "roofwatch_serving_info"))
                and all(serving_value(m, n, st) is not None for (n, st), v in present.items() if v is not None) and m)

    agent.wait_healthy()
    metrics = poll(ready, WAIT_S, what=f"GPU 0's serving series from {file}")
    (info,) = samples(metrics, "roofwatch_serving_info")
    assert info["gpu"] == "0"
    assert info["server"].split()[0] == served.server and info["model"] == served.model, info
    assert info["state"] == "unknown", "a static body generates no token between scrapes: no time per output token"
    for (name, state), expected in present.items():
        assert serving_value(metrics, name, state) == expected, (name, state)
    weights = [s["value"] for s in samples(metrics, "roofwatch_serving_step_read_bytes") if s["kind"] == "weights"]
    assert weights == [MODEL_BYTES]
    (bandwidth,) = values(metrics, "roofwatch_gpu_peak_memory_bandwidth_bytes_per_second").values()
    (floor,) = values(metrics, "roofwatch_serving_decode_floor_seconds").values()
    assert floor == pytest.approx(MODEL_BYTES / bandwidth), "an idle batch reads the weights once per step"


def test_doctor_says_what_the_agent_reads_from_a_body_with_no_serving_signal(agents):
    """smg813's excerpt has no running, waiting or KV-cache series and no token counters, only SGLang's
    decode CUDA-graph pass counter: the serving series GPU 0 shows for it rest on the configured
    ``model_bytes`` alone. ``doctor`` is where the agent says what it took from the body."""
    (finding,) = [f for f in agents[SMG813].doctor_findings() if f["check"].startswith("inference endpoint")]
    assert finding["status"] == "warn", finding
    assert ("sglang, model meta-llama/Llama-3.1-8B-Instruct; workload figures: engine steps, no tokens/s "
            "(no token counters); serving signals: none; not exported: running requests, waiting requests, "
            "KV-cache usage") in finding["detail"], finding
    assert finding["detail"].endswith("; used for GPUs 0"), finding
