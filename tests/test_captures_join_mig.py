"""The published dcgm-exporter captures of MIG layouts in join mode (the whole-GPU ones, and how every
capture is started, are tests/test_captures_join.py's): the real pynvml over the fake NVML driver playing
the capture's node with the MIG layout its lines show, joined to the capture served as its exporter.

How each is played (``capture_replays.play_of``, from the capture's ``GPU_I_PROFILE``/``GPU_I_ID`` labels):

- ``issue272-lowercase-mig-oldns-excerpt``: two A100 80GB PCIe, GPU 0 with 3g.40gb as GPU instance 1 and
  4g.40gb as 2, GPU 1 with 3g.40gb as 1; the UUID label is ``uuid`` (``--use-old-namespace``), swapped as
  ``UUID`` is.
- ``issue317-a30-mig-excerpt``: two A30 (four compute slices), 1g.6gb instances 3-6 on GPU 0 and 3-4 on
  GPU 1, the ids the driver gives 1g.6gb placements on an A30.
- ``issue68-a30-mig-tfbench-excerpt``: one A30 with 2g.12gb as GPU instance 1 (the engine line is
  ``> ``-quoted, so no sample: only the tensor ratio is the capture's).
- ``nvdocs-a100-mig-busy``: no ``modelName``; its 1g.5gb profile names a 40 GB A100 and its 409.7 W an
  SXM4 (the PCIe board's limit is 250 W). One GPU in MIG mode: the capture lists it whole (its UUID, no
  GPU_I_ID) beside its instance 13, and NVML lists a GPU in MIG mode only as its instances, so the agent
  has 0/13 and no GPU 0, and the whole GPU's lines join to nothing.

The join matches an instance by its parent's UUID and its GPU instance id. NVML reads no utilisation,
power or temperature per MIG device and no GPM before Hopper, so a profiling ratio or engine activity an
instance has is the capture's, and one the capture lacks stays unknown; what NVML reads per instance
(memory used, SM clock) stays NVML's. Device ids are ``<GPU>/<GPU instance id>``, as the capture's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.capture_replays import MIB, REPLAY_OF, UNNAMED, Joined, fields, start_joined, stop_all
from tests.test_captures_join import JOINED_MIG, PROFILING

pytestmark = pytest.mark.slow

NVML_PER_INSTANCE = {"DCGM_FI_DEV_FB_USED": ("mem_used_bytes", MIB), "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0)}
"""Capture field -> (the sample field NVML reads per MIG device, factor to its unit): NVML's value wins."""
WHOLE_GPU_ONLY = ("power_w", "temperature_c", "energy_j", "power_limit_w")
"""What NVML does not read per MIG device (and no instance line of a capture has): unknown."""


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Joined]]:
    tmp = tmp_path_factory.mktemp("joins-mig")
    procs: list[subprocess.Popen] = []
    exporters: list = []
    try:
        yield {file: start_joined(file, tmp, procs, exporters) for file in JOINED_MIG}
    finally:
        stop_all(procs, exporters)


def _joined(file: str):
    """A sample is ready once every profiling field the capture gives its instance has arrived."""
    got = fields(file)

    def ready(sample: dict) -> bool:
        theirs = got.get(sample["gpu"], {})
        return sample["mem_used_bytes"] is not None and all(
            sample[name] is not None for metric, name in PROFILING.items() if metric in theirs) and (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in theirs or sample["gr_active"] is not None)
    return ready


@pytest.mark.parametrize("file", JOINED_MIG, ids=[Path(f).stem for f in JOINED_MIG])
def test_a_mig_capture_joined_to_nvml_gives_each_instance_its_own_lines(agents, file):
    agent = agents[file]
    got, replay = fields(file), REPLAY_OF[file]
    devices = agent.devices(_joined(file))
    instances = {key for key in got if "/" in key}
    assert set(devices) == instances, "NVML's MIG devices are the capture's instances, by GPU instance id"
    assert not set(devices) & {key for key in got if "/" not in key}, "a GPU in MIG mode is its instances"

    for gpu, entry in devices.items():
        info, sample, theirs = entry["info"], entry["sample"], got[gpu]
        model, spec = replay.info[gpu]
        index, instance = (int(x) for x in gpu.split("/"))
        profile = dict(agent.play.mig[index])[instance]
        assert info["uuid"].startswith("MIG-") and info["spec"]["key"] == f"{agent.play.model}-mig-{profile}"
        if not model.startswith(UNNAMED):  # named: NVML's name and spec are the ones the exporter's labels give
            assert info["model"] == model and info["spec"]["key"] == spec
        for metric, name in PROFILING.items():
            if metric in theirs:
                assert sample[name] == pytest.approx(theirs[metric], abs=1e-9), f"{gpu} {name}: the capture's"
            else:
                assert sample[name] is None, f"{gpu} {name}: neither NVML (no GPM, MIG) nor the capture has it"
        if "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in theirs:
            assert sample["gr_active"] == pytest.approx(theirs["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], abs=1e-9)
        else:
            assert sample["gr_active"] is None, f"{gpu}: NVML reads no utilisation of a MIG device"
        for metric, (name, factor) in NVML_PER_INSTANCE.items():
            assert sample[name] is not None, f"{gpu} {name}: NVML reads it per MIG device"
            if metric in theirs:
                assert sample[name] != pytest.approx(theirs[metric] * factor, rel=1e-6), f"{gpu} {name}: NVML's"
        for name in WHOLE_GPU_ONLY:
            assert sample[name] is None, f"{gpu} {name}: a whole-GPU reading, neither NVML's nor the instance's"

    metrics = agent.get("metrics").decode()
    assert any(line.startswith("roofwatch_source_up{") and 'source="dcgm-exporter"' in line
               and line.rsplit(" ", 1)[1] == "1.0" for line in metrics.splitlines()), "the exporter is an up source"
