"""The published dcgm-exporter captures (tests/fixtures/captures/dcgm-exporter) in join mode: the NVML
backend, the real pynvml over the project's fake NVML driver (``roofwatch demo --backend nvml-virtual``
on a scenario naming the capture's node, model and GPU count), joined to the capture served as the
node's dcgm-exporter (``--dcgm-exporter-url``) with its UUIDs swapped for the fake's.

What the join takes (docs/nvidia.md, "dcgm-exporter as a source"): the profiling fields as one set
while NVML reads no GPM (every model here is pre-Hopper, so never GPM), ``gr_active`` from
``PROF_GR_ENGINE_ACTIVE`` or else ``GPU_UTIL``; every other field only where NVML left it unknown, so
NVML's own power, temperature, clock, memory, memory busy time and PCIe rates win. Each GPU runs a
GEMM on the fake (engine about 1, power, clock and memory high), so every capture value (idle boxes)
is told apart from NVML's. Expected values are read from the capture's own lines (``fields``).

Captures NOT replayed in join mode, and why:

- ``issue272-lowercase-mig-oldns-excerpt``, ``issue317-a30-mig-excerpt``, ``issue68-a30-mig-tfbench-excerpt``:
  MIG layouts, outside this module (whole GPUs only). The fake cannot play the two A30 ones anyway
  (virtual-fleet MIG is for ``a100-*``, ``h100-*``, ``h200-*``, ``gh200-*``, ``b200`` only), and
  issue272 labels its UUID in lower case (``uuid=``), which ``replace_uuids`` does not swap.
- ``nvdocs-a100-mig-busy``: whole GPU 0 beside its MIG instance 13. The fake discovers a GPU in MIG
  mode only as its instances, numbered from 1, so it has neither a whole GPU 0 nor an instance 13.
- ``nvdocs-sentinel-2.1.4``: no ``modelName`` (exporter 2.1.4) so no model to play, and its labels read
  ``{gpu="0", UUID=...}`` (a space), which ``replace_uuids`` does not match; its one reading, SM_CLOCK,
  is NVML's in a join anyway.
- ``vks-grid-a100-10c``: a vGPU (``a100-pcie-40gb-vgpu-a100-10c``), not a model the virtual fleet
  plays (its scenario keys are the catalogue's physical GPUs).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from agent.model.specs import spec_by_key
from agent.virtual.devices import device_uuid
from tests.agent_process import clean_env, http_get, poll, roofwatch_cmd
from tests.capture_replays import DCGM_CAPTURES, MIB, REPLAY_OF, capture, fields, stop_all
from tests.dcgm_exporter_server import FakeExporter, replace_uuids
from tests.prometheus_server import free_port

pytestmark = pytest.mark.slow

SEED = 11
FAST = {"ROOFWATCH_DCGM_EXPORTER_INTERVAL_S": "0.2", "ROOFWATCH_CLASSIFIER__WINDOW_S": "2",
        "ROOFWATCH_CLASSIFIER__LONG_WINDOW_S": "4", "ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S": "0.5"}
WAIT_S = 60.0

JOINED = sorted(f"dcgm-exporter/{name}.txt" for name in (
    "dcgm226-l40s-pods-excerpt", "issue250-v100-excerpt", "kops-l4", "linode-rtx4000ada-pod",
    "rafay-t4-concat", "upcloud-l40s", "viettel-l40s-elided"))
NOT_JOINED = {f"dcgm-exporter/{name}.txt" for name in (
    "issue272-lowercase-mig-oldns-excerpt", "issue317-a30-mig-excerpt", "issue68-a30-mig-tfbench-excerpt",
    "nvdocs-a100-mig-busy", "nvdocs-sentinel-2.1.4", "vks-grid-a100-10c")}
"""Listed, with the reason, in the module docstring."""

PROFILING = {"DCGM_FI_PROF_SM_ACTIVE": "sm_active", "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy",
             "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active", "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
             "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "fp64_active", "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "fp32_active",
             "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "fp16_active"}
"""DCGM profiling ratio -> the sample field the join takes it into (besides gr_active, below)."""
NVML_OWN = {"DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0), "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_w", 1.0),
            "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", 1.0), "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
            "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", MIB), "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_busy", 0.01),
            "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_per_s", 1.0),
            "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_per_s", 1.0)}
"""Capture field -> (the sample field NVML reads itself, factor to its unit): NVML's value must win."""


def _gpu_count(file: str) -> tuple[str, int]:
    """(catalogue key, GPU count) from the capture's entry; whole GPUs 0..n-1 of one model."""
    info = REPLAY_OF[file].info
    (key,) = {spec for _, spec in info.values()}
    assert key and sorted(info) == [str(i) for i in range(len(info))], f"{file}: not whole GPUs of one model"
    return key, len(info)


@dataclass
class Joined:
    file: str
    url: str
    proc: subprocess.Popen
    log: Path
    uuids: dict[str, str]

    def get(self, path: str) -> bytes:
        if self.proc.poll() is not None:
            raise AssertionError(f"the agent for {self.file} exited ({self.proc.returncode}): "
                                 f"{self.log.read_text()[-3000:]}")
        status, body = http_get(self.url + path)
        if status != 200:
            raise ValueError(f"{path}: HTTP {status}")
        return body

    def samples(self) -> dict[str, dict]:
        """GPU -> its latest sample, once every GPU of the scenario has one with engine and power."""
        def ready():
            snap = json.loads(self.get("api/v1/snapshot"))
            got = {d["info"]["gpu"]: d["sample"] for d in snap["devices"] if d["sample"]}
            return (set(got) == set(self.uuids) and all(s["gr_active"] is not None and s["power_w"] is not None
                                                        for s in got.values()) and got)
        return poll(ready, WAIT_S, what=f"a sample of each GPU joined to {self.file}")


def _start(file: str, tmp: Path, procs: list[subprocess.Popen], exporters: list[FakeExporter]) -> Joined:
    replay = REPLAY_OF[file]
    key, count = _gpu_count(file)
    uuids = {str(i): device_uuid(SEED, replay.node, i, "nvidia") for i in range(count)}
    exporters.append(exporter := FakeExporter(replace_uuids(capture(file), uuids)))
    cap = round(0.8 * spec_by_key(key).tdp_w)  # a limit of NVML's own, unlike any capture's
    scenario = tmp / f"{Path(file).stem}.yaml"
    scenario.write_text(yaml.safe_dump({"name": f"join-{Path(file).stem}", "seed": SEED, "nodes": [{
        "name": replay.node, "model": key, "gpus": count, "workloads": [
            {"job": "gemm", "gpus": list(range(count)), "dtype": "fp16",
             "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600, "power_cap_w": cap}]}]}]}))
    port = free_port()
    log = tmp / f"{Path(file).stem}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(roofwatch_cmd("demo", "--backend", "nvml-virtual", "--scenario", str(scenario),
                                              "--dcgm-exporter-url", exporter.url, "--listen", f"127.0.0.1:{port}",
                                              "--interval", "0.2"),
                                stdout=sink, stderr=subprocess.STDOUT, text=True, env=clean_env(**FAST))
    procs.append(proc)
    return Joined(file, f"http://127.0.0.1:{port}/", proc, log, uuids)


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Joined]]:
    """One joined agent per capture, all started before any is polled, all stopped on the way out."""
    tmp = tmp_path_factory.mktemp("joins")
    procs: list[subprocess.Popen] = []
    exporters: list[FakeExporter] = []
    try:
        yield {file: _start(file, tmp, procs, exporters) for file in JOINED}
    finally:
        stop_all(procs, exporters)


def test_every_capture_is_joined_or_said_why_not():
    assert set(JOINED) | NOT_JOINED == set(DCGM_CAPTURES)
    assert not set(JOINED) & NOT_JOINED


@pytest.mark.parametrize("file", JOINED, ids=[Path(f).stem for f in JOINED])
def test_a_capture_joined_to_nvml_gives_its_profiling_and_leaves_nvml_its_own(agents, file):
    agent = agents[file]
    got = fields(file)
    samples = agent.samples()
    assert set(got) <= set(samples), "every GPU the capture reads is one of the fake's"

    for gpu, sample in samples.items():
        theirs = got.get(gpu, {})
        assert sample["uuid"] == agent.uuids[gpu]
        # profiling: the capture's, as one set; what the capture lacks stays NVML's (no GPM: unknown)
        for metric, name in PROFILING.items():
            if metric in theirs:
                assert sample[name] == pytest.approx(theirs[metric], abs=1e-9), f"GPU {gpu} {name}: the capture's"
            else:
                assert sample[name] is None, f"GPU {gpu} {name}: neither NVML (no GPM) nor the capture has it"
        if "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in theirs:
            engine = theirs["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
        elif "DCGM_FI_DEV_GPU_UTIL" in theirs:
            engine = theirs["DCGM_FI_DEV_GPU_UTIL"] / 100
        else:
            engine = None
        if engine is not None:
            assert sample["gr_active"] == pytest.approx(engine, abs=1e-9), f"GPU {gpu} gr_active: the capture's"
        else:
            assert sample["gr_active"] > 0.5, f"GPU {gpu}: no duty in the capture, NVML's GEMM engine stays"
        # NVML's own fields win wherever both have a value
        for metric, (name, factor) in NVML_OWN.items():
            if metric in theirs:
                assert sample[name] is not None, f"GPU {gpu} {name}: NVML reads it"
                assert sample[name] != pytest.approx(theirs[metric] * factor, rel=1e-6), \
                    f"GPU {gpu} {name}: NVML's {sample[name]}, not the capture's {theirs[metric] * factor}"
        if "DCGM_FI_DEV_POWER_USAGE" in theirs:
            assert sample["power_w"] > 2 * theirs["DCGM_FI_DEV_POWER_USAGE"], "a GEMM's power, not the idle box's"

    metrics = agent.get("metrics").decode()
    assert any(line.startswith("roofwatch_source_up{") and 'source="dcgm-exporter"' in line
               and line.rsplit(" ", 1)[1] == "1.0" for line in metrics.splitlines()), "the exporter is an up source"
