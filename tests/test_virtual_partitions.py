"""AMD compute partitions in the virtual fleet: each partition is a device with its share of the GPU."""

from __future__ import annotations

import pytest

from agent.backends.virtual import VirtualBackend
from agent.model.specs import spec_by_key
from agent.virtual.devices import DRIVER_VIEWS, MIB
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import ScenarioError, parse_scenario


def scenario(amd: dict | None = None, workloads: list | None = None, model: str = "mi300x", gpus: int = 2):
    node = {"name": "n", "model": model, "gpus": gpus, "workloads": workloads or []}
    if amd is not None:
        node["amd"] = amd
    return parse_scenario({"name": "p", "seed": 3, "nodes": [node]})


def compute(**extra):
    return {"kind": "compute", "duration_s": 600, "mfu": 0.4, **extra}


@pytest.mark.parametrize("mode, count", [("SPX", 1), ("DPX", 2), ("QPX", 4), ("CPX", 8)])
def test_each_partition_is_a_device_with_its_share_of_the_gpu(mode, count):
    devices = VirtualEngine(scenario({"compute_partition": mode})).devices("n")
    full = spec_by_key("mi300x")
    assert len(devices) == 2 * count
    expected_ids = ["0", "1"] if count == 1 else [f"{g}/{p}" for g in range(2) for p in range(count)]
    assert [d.gpu for d in devices] == expected_ids
    assert len({d.uuid for d in devices}) == len(devices)
    for d in devices:
        assert d.spec is not None
        assert d.spec.peak_flops["bf16"] == pytest.approx(full.peak_flops["bf16"] / count)
        assert d.spec.mem_bandwidth_bytes_per_s == pytest.approx(full.mem_bandwidth_bytes_per_s / count)
        assert d.sm_count == full.sm_count // count
        assert d.memory_total_bytes == DRIVER_VIEWS["mi300x"].memory_mib * MIB // count
    if count > 1:
        assert {d.spec.key for d in devices} == {f"mi300x-{mode.lower()}"}
        first = [d for d in devices if d.gpu.startswith("0/")]
        assert {d.pci_bus_id.rsplit(".", 1)[0] for d in first} == {first[0].pci_bus_id.rsplit(".", 1)[0]}
        assert [d.pci_bus_id.rsplit(".", 1)[1] for d in first] == [str(p) for p in range(count)]


def test_a_workload_on_one_partition_leaves_its_neighbours_idle():
    backend = VirtualBackend(scenario({"compute_partition": "CPX"}, [{"job": "a", "gpus": ["0/3"], "phases": [compute()]}]),
                             start_time=0.0, clock=lambda: 100.0)
    busy = backend.sample("0/3", 100.0)
    idle = backend.sample("0/2", 100.0)
    assert busy.gr_active > 0.9 and idle.gr_active < 0.05
    assert busy.power_w > idle.power_w  # each partition keeps its own share of the GPU's power


@pytest.mark.parametrize("amd, workloads, model, path, message", [
    ({"compute_partition": "CPX"}, [], "h100-sxm", "nodes.0", "h100-sxm has no compute partitions"),
    ({"compute_partition": "CPX"}, [], "mi250x", "nodes.0", "mi250x has no compute partitions"),
    ({"compute_partition": "DPX", "memory_partition": "NPS4"}, [], "mi300x", "nodes.0.amd", "NPS4 needs at least"),
    ({"compute_partition": "XPX"}, [], "mi300x", "nodes.0.amd.compute_partition", "SPX"),
    ({"compute_partition": "CPX"}, [{"job": "a", "gpus": [0], "phases": [compute()]}], "mi300x",
     "nodes.0.workloads.0.gpus", "use its partitions (0/0 .. 0/7)"),
    ({"compute_partition": "QPX"}, [{"job": "a", "gpus": ["1/4"], "phases": [compute()]}], "mi300x",
     "nodes.0.workloads.0.gpus", "partition 1/4 does not exist (GPU 1 has 4"),
    ({"missing_symbols": ["nvmlInit"]}, [], "mi300x", "nodes.0.amd.missing_symbols.0", "amdsmi_"),
])
def test_partition_mistakes_name_the_field(amd, workloads, model, path, message):
    with pytest.raises(ScenarioError) as info:
        scenario(amd, workloads, model=model)
    text = str(info.value)
    assert path in text and message in text, text


def test_a_fault_on_the_gpu_index_reaches_every_partition():
    s = scenario({"compute_partition": "DPX"})
    data = s.model_dump()
    data["nodes"][0]["faults"] = [{"gpu": 1, "kind": "error", "start_s": 0, "duration_s": 1000}]
    backend = VirtualBackend(parse_scenario(data), start_time=0.0, clock=lambda: 10.0)
    for gpu in ("1/0", "1/1"):
        with pytest.raises(Exception):
            backend.sample(gpu, 10.0)
    assert backend.sample("0/1", 10.0).gpu == "0/1"
