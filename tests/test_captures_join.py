"""The published dcgm-exporter captures (tests/fixtures/captures/dcgm-exporter) in join mode: the NVML
backend, the real pynvml over the project's fake NVML driver (``roofwatch demo --backend nvml-virtual``
on a scenario naming the capture's node, model and GPU count), joined to the capture served as the
node's dcgm-exporter (``--dcgm-exporter-url``) with its UUIDs swapped for the fake's.

What the join takes (docs/nvidia.md, "dcgm-exporter as a source"): the profiling fields as one set
while NVML reads no GPM (every model here is pre-Hopper, so never GPM), ``gr_active`` from
``PROF_GR_ENGINE_ACTIVE`` or else ``GPU_UTIL``; every other field only where NVML left it unknown, so
NVML's own power, temperature, clock, memory, memory busy time and PCIe rates win. Each GPU runs a
GEMM on the fake (engine about 1, memory high, power at a limit of NVML's own, clock throttled below its
maximum: ``start_joined``), so every capture value (idle boxes)
is told apart from NVML's. Expected values are read from the capture's own lines (``fields``).

Two captures are played on what their lines allow, as ``capture_replays.play_of`` says:

- ``nvdocs-sentinel-2.1.4`` (exporter 2.1.4): no ``modelName``, so NVML names the GPU; played as a T4, a
  GDDR board (``UNNAMED_PLAYS``: MEM_CLOCK 405 is no A100's, MEMORY_TEMP is not supported). Its labels read
  ``{gpu="0", UUID=...}`` with a space, which the join must match all the same (``doctor`` says so; its one
  reading, SM_CLOCK, is NVML's in a join anyway).
- ``vks-grid-a100-10c``: a guest's time-sliced vGPU, played as an A100 PCIe 40GB with the scenario's
  ``vgpu: GRID A100-10C``: the fake's driver names it so, gives it the profile's 10 GiB frame buffer and,
  as in a guest, no power, energy or temperature; the agent takes the vGPU's spec from NVML's name.

The MIG captures are joined in tests/test_captures_join_mig.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from agent.model.specs import spec_by_key
from agent.model.specs.vgpu import vgpu_spec
from tests.agent_process import clean_env, roofwatch_cmd
from tests.capture_replays import (
    DCGM_CAPTURES, JOIN_WAIT_S, MIB, REPLAY_OF, Joined, _memory_total, fields, play_of, start_joined, stop_all,
)

pytestmark = pytest.mark.slow

JOINED = sorted(f"dcgm-exporter/{name}.txt" for name in (
    "dcgm226-l40s-pods-excerpt", "issue250-v100-excerpt", "kops-l4", "linode-rtx4000ada-pod",
    "nvdocs-sentinel-2.1.4", "rafay-t4-concat", "upcloud-l40s", "viettel-l40s-elided", "vks-grid-a100-10c"))
JOINED_MIG = sorted(f"dcgm-exporter/{name}.txt" for name in (
    "issue272-lowercase-mig-oldns-excerpt", "issue317-a30-mig-excerpt", "issue68-a30-mig-tfbench-excerpt",
    "nvdocs-a100-mig-busy"))
"""Joined in tests/test_captures_join_mig.py."""
NOT_JOINED: set[str] = set()
"""None left: every capture is joined (issue 33)."""
SENTINEL, VGPU = "dcgm-exporter/nvdocs-sentinel-2.1.4.txt", "dcgm-exporter/vks-grid-a100-10c.txt"

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


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Joined]]:
    """One joined agent per capture, all started before any is polled, all stopped on the way out."""
    tmp = tmp_path_factory.mktemp("joins")
    procs: list[subprocess.Popen] = []
    exporters: list = []
    try:
        yield {file: start_joined(file, tmp, procs, exporters) for file in JOINED}
    finally:
        stop_all(procs, exporters)


def test_every_capture_is_joined_or_said_why_not():
    assert set(JOINED) | set(JOINED_MIG) | NOT_JOINED == set(DCGM_CAPTURES)
    assert not set(JOINED) & set(JOINED_MIG) and not (set(JOINED) | set(JOINED_MIG)) & NOT_JOINED
    assert all(play_of(f).mig for f in JOINED_MIG) and not any(play_of(f).mig for f in JOINED)


@pytest.mark.parametrize("file", JOINED, ids=[Path(f).stem for f in JOINED])
def test_a_capture_joined_to_nvml_gives_its_profiling_and_leaves_nvml_its_own(agents, file):
    agent = agents[file]
    got = fields(file)
    samples = {gpu: d["sample"] for gpu, d in agent.devices(_engine_and_memory).items()}
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


def _engine_and_memory(sample: dict) -> bool:
    return sample["gr_active"] is not None and sample["mem_used_bytes"] is not None


def test_exporter_2_1_4_labels_with_a_space_are_joined_by_uuid(agents, tmp_path):
    """``{gpu="0", UUID="..."}``: ``doctor`` on the same scenario and exporter finds GPU 0 in the exporter
    (no join warning) and says where each of its fields came from."""
    agent = agents[SENTINEL]
    agent.devices(_engine_and_memory)
    out = tmp_path / "doctor.json"
    with out.open("w") as sink:
        done = subprocess.run(roofwatch_cmd("doctor", "--backend", "nvml-virtual", "--scenario", str(agent.scenario),
                                            "--json"), stdout=sink, stderr=subprocess.PIPE, text=True,
                              env=clean_env(ROOFWATCH_DCGM_EXPORTER_URL=agent.exporter_url), timeout=JOIN_WAIT_S)
    assert done.returncode in (0, 3), done.stderr[-3000:]
    findings = [f for f in json.loads(out.read_text())["findings"] if f.get("gpu") == "0"]
    assert any(f["check"] == "counter source" for f in findings), findings
    assert not [f for f in findings if f["check"] == "dcgm-exporter join"], "the exporter's GPU 0 is NVML's GPU 0"


def test_a_vgpu_guest_is_named_by_nvml_and_gets_the_vgpu_spec(agents):
    """GRID A100-10C: the model, spec and frame buffer are NVML's, and agree with the capture's labels and
    FB fields; power and temperature stay unknown, as neither a guest's NVML nor the capture reads them."""
    agent = agents[VGPU]
    (entry,) = agent.devices(_engine_and_memory).values()
    info, sample = entry["info"], entry["sample"]
    ((model, key),) = REPLAY_OF[VGPU].info.values()
    spec = vgpu_spec(model)
    assert spec is not None and info["model"] == model and info["spec"]["key"] == key
    assert info["memory_total_bytes"] == spec.memory_bytes
    assert info["memory_total_bytes"] == pytest.approx(_memory_total(fields(VGPU)["0"]), rel=1e-3), \
        "NVML's frame buffer is the capture's FB used + free + reserved"
    board = spec_by_key(play_of(VGPU).model)
    assert info["spec"]["peak_flops"] == pytest.approx(board.peak_flops), "time-sliced: the board's FLOP/s"
    assert info["spec"]["memory_bytes"] == spec.memory_bytes < board.memory_bytes, "its share of the memory"
    assert sample["power_w"] is None and sample["temperature_c"] is None and sample["energy_j"] is None
