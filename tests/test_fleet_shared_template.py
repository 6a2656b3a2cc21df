"""The fleet benchmark's shared-GPU fleet (``--scenario shared``): every node copies one node of the built-in ``shared``
scenario, so the holder and pod joins of the rules read real series (docs/performance.md, "at 8,000 GPUs")."""

from __future__ import annotations

import json

from benchmarks import fleet_data


def test_the_shared_template_is_one_node_with_holders_pods_and_mig_instances() -> None:
    template = fleet_data.node_template("shared")
    nodes = {s.label("node") for s in template if s.label("node")}
    assert nodes == {fleet_data.TEMPLATE_NODES["shared"]}, "one node's series, never two nodes' under one name"
    names = {s.name for s in template}
    assert {"roofwatch_gpu_holder_energy_joules_total", "roofwatch_gpu_holder_info", "roofwatch_gpu_pod_info"} <= names
    gpus = {s.label("gpu") for s in template if s.label("gpu")}
    assert {"3/1", "3/2", "3/3"} <= gpus
    assert {fleet_data.gpu_index(s) for s in template if s.label("gpu") in ("3/1", "3/3")} == {3}
    assert len(template) > len(fleet_data.node_template("demo")), "the shared node has more series than a whole-GPU one"


def test_a_shared_fleet_window_has_one_series_per_label_set() -> None:
    shape = fleet_data.FleetShape(nodes=3, hours=0.05, clusters=1, job_nodes=2, end=1_800_000_000, scenario="shared")
    template = fleet_data.node_template(shape.scenario)
    ts = shape.timestamps()
    seen = [json.dumps(json.loads(line)["metric"], sort_keys=True)
            for line in fleet_data.json_window(template, shape, ts, ts[0])]
    assert len(seen) == len(set(seen)), "two series of the fleet under one label set"
    holders = [m for m in map(json.loads, seen) if m["__name__"] == "roofwatch_gpu_holder_energy_joules_total"]
    assert len({m["node"] for m in holders}) == 3 and all(m["gpu"] in ("0", "1", "2") for m in holders)
