"""One clipping rule for every label value the agent exports, whichever source gave it.

Job, pod and process names were clipped to 128 characters where their families are built; node,
UUID, model, PCI bus id, backend and NIC names were not, and dcgm-exporter hands the agent whatever
its labels say (2,200-character ``Hostname``, ``UUID`` and ``modelName`` came out on every series).
Here a snapshot as any source could make it, rendered in both exposition formats and as JSON.
"""

from __future__ import annotations

from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from agent.model import Attribution, CollectorHealth, DeviceInfo, DeviceState, GpuSample, NicPort, NodeSnapshot
from agent.model import ProcessSample
from exporters.metrics import JOB_ID_MAX_LEN, clip_label
from exporters.prometheus import ExpositionCache
from exporters.snapshot_json import snapshot_to_dict

LONG = "n" * 2200
LONG_UUID = "GPU-" + "0123456789abcdef" * 140
LONG_MODEL = "NVIDIA H100 " + "x" * 2000 + "\udcff"  # and a lone surrogate, as an undecodable byte reads
LONG_COMMAND = "python train.py " + "--flag " * 100


def hostile_snapshot() -> NodeSnapshot:
    sample = GpuSample(ts=1.0, gpu="0", node=LONG, uuid=LONG_UUID, model=LONG_MODEL, power_w=300.0,
                       processes=(ProcessSample(pid=7, name="p" * 300, command=LONG_COMMAND, used_memory_bytes=1),),
                       attribution=Attribution(pod="q" * 300, namespace="ns"))
    device = DeviceState(info=DeviceInfo(gpu="0", uuid=LONG_UUID, vendor="nvidia", model=LONG_MODEL,
                                         pci_bus_id="0000:" * 500), up=True, sample=sample, last_success_ts=1.0)
    return NodeSnapshot(ts=1.0, node=LONG, devices=(device,), expected_devices=1,
                        health=CollectorHealth(backend="b" * 300, last_cycle_ts=1.0),
                        nics=(NicPort(device="mlx5_" + "9" * 300, port=1, link_layer="L" * 300),))


def label_values(body: bytes, parse) -> list[tuple[str, str, str]]:
    return [(s.name, name, value) for family in parse(body.decode()) for s in family.samples
            for name, value in s.labels.items()]


def test_every_label_value_in_both_formats_is_clipped_whatever_its_source():
    snapshot = hostile_snapshot()
    cache = ExpositionCache(lambda: snapshot, gpu_labels=("pod",))
    for accept, parse in (("", parse_text), ("application/openmetrics-text; version=1.0.0", parse_openmetrics)):
        encoder, content_type = choose_encoder(accept)
        values = label_values(cache.render(encoder, content_type), parse)
        too_long = {(name, label) for name, label, value in values if len(value) > JOB_ID_MAX_LEN}
        assert too_long == set(), f"{content_type}: unclipped labels {sorted(too_long)[:8]}"
        by = {(name, label): value for name, label, value in values}
        assert by[("roofwatch_gpu_up", "node")] == LONG[:128]
        assert by[("roofwatch_gpu_up", "uuid")] == LONG_UUID[:128]
        assert by[("roofwatch_gpu_info", "model")] == clip_label(LONG_MODEL)
        assert by[("roofwatch_collector_cycles_total", "backend")] == "b" * 128
        assert by[("roofwatch_nic_up", "device")] == ("mlx5_" + "9" * 300)[:128]


def test_the_json_snapshot_clips_the_same_label_fields_and_nothing_else():
    data = snapshot_to_dict(hostile_snapshot())
    device = data["devices"][0]
    assert data["node"] == LONG[:128] and device["sample"]["node"] == LONG[:128]
    assert device["info"]["uuid"] == LONG_UUID[:128] == device["sample"]["uuid"]
    assert device["info"]["model"] == clip_label(LONG_MODEL) and "\udcff" not in device["info"]["model"]
    assert device["info"]["pci_bus_id"] == ("0000:" * 500)[:128]
    assert device["sample"]["attribution"]["pod"] == "q" * 128
    process = device["sample"]["processes"][0]
    assert process["name"] == "p" * 128
    assert process["command"] == LONG_COMMAND, "not a label anywhere: the JSON keeps it whole"
