"""InfiniBand / RoCE counters from sysfs fixture trees: units, wrap and reset, NIC per GPU."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent.context.host.infiniband import (
    PortMonitor,
    counter_delta,
    gpu_pci_path,
    nearest_port,
    normalise_bus_id,
    read_ports,
)

# Two PCIe switches, each with a GPU and an HCA behind it (HGX-style), and a third GPU on the root.
TOPOLOGY = {
    "gpu0": "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
    "mlx5_0": "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0",
    "gpu1": "pci0000:00/0000:00:02.0/0000:11:00.0/0000:12:00.0/0000:13:00.0",
    "mlx5_1": "pci0000:00/0000:00:02.0/0000:11:00.0/0000:12:01.0/0000:14:00.0",
    "gpu2": "pci0000:00/0000:00:03.0/0000:21:00.0",
}
NVML_BUS_IDS = {"gpu0": "00000000:03:00.0", "gpu1": "00000000:13:00.0", "gpu2": "00000000:21:00.0"}


class Sysfs:
    """A /sys fixture tree: devices under /sys/devices, links from /sys/bus/pci and /sys/class/infiniband."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for name, path in TOPOLOGY.items():
            device = root / "devices" / path
            device.mkdir(parents=True)
            bus = root / "bus" / "pci" / "devices"
            bus.mkdir(parents=True, exist_ok=True)
            os.symlink(device, bus / Path(path).name)
            if name.startswith("mlx5"):
                ib = root / "class" / "infiniband" / name
                ib.mkdir(parents=True)
                os.symlink(device, ib / "device")
                self.port(name, 1, state="4: ACTIVE", link_layer="InfiniBand", rate="400 Gb/sec (4X NDR)")

    def port(self, device: str, port: int, **files: str) -> Path:
        path = self.root / "class" / "infiniband" / device / "ports" / str(port)
        (path / "counters").mkdir(parents=True, exist_ok=True)
        (path / "hw_counters").mkdir(exist_ok=True)
        for name, text in files.items():
            (path / name).write_text(text + "\n")
        return path

    def counters(self, device: str, port: int = 1, **values: int) -> None:
        path = self.port(device, port)
        for name, value in values.items():
            folder = "hw_counters" if name.startswith(("np_", "rp_", "out_of", "packet_", "local_ack", "roce_")) else "counters"
            (path / folder / name).write_text(f"{value}\n")


@pytest.fixture
def sysfs(tmp_path) -> Sysfs:
    return Sysfs(tmp_path)


def test_reads_every_port_with_its_counters_state_and_pci_path(sysfs):
    sysfs.counters("mlx5_0", port_xmit_data=100, port_rcv_data=50, port_xmit_wait=7, link_downed=1,
                   np_cnp_sent=3, roce_adp_retrans=2)
    sysfs.counters("mlx5_1", port_xmit_data=1)
    sysfs.port("mlx5_1", 2, state="1: DOWN", link_layer="Ethernet")
    ports = read_ports(sysfs.root)
    assert [(p.device, p.port) for p in ports] == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_1", 2)]
    first = ports[0]
    assert first.counters == {"port_xmit_data": 100, "port_rcv_data": 50, "port_xmit_wait": 7, "link_downed": 1,
                              "np_cnp_sent": 3, "roce_adp_retrans": 2}
    assert first.active and first.link_layer == "InfiniBand" and first.rate_gbps == 400.0
    assert first.pci_path[-1] == "0000:04:00.0" and first.pci_path[0] == "0000:00:01.0"
    assert not ports[2].active and ports[2].link_layer == "Ethernet"


def test_unknown_hw_counters_are_ignored_so_labels_stay_bounded(sysfs):
    path = sysfs.port("mlx5_0", 1)
    (path / "hw_counters" / "some_new_driver_counter").write_text("5\n")
    (path / "counters" / "port_xmit_data").write_text("garbage\n")
    assert read_ports(sysfs.root)[0].counters == {}


def test_no_infiniband_class_means_no_ports(tmp_path):
    assert read_ports(tmp_path) == []
    assert PortMonitor(tmp_path).refresh(now=0.0) == []


@pytest.mark.parametrize(("previous", "current", "expected"), [
    (10, 25, 15),
    (2**32 - 100, 50, 150),            # 32-bit wrap
    (2**64 - 10, 5, 15),               # 64-bit wrap
    (5_000_000, 1_000, 1_000),         # reset (driver reload, perfquery -R): what counted since
    (2**40, 7, 7),                     # a 64-bit counter far from its top going back is a reset
])
def test_counter_delta_handles_wrap_and_reset(previous, current, expected):
    assert counter_delta(previous, current) == expected


def test_nearest_port_follows_the_pcie_tree(sysfs):
    ports = read_ports(sysfs.root)
    for gpu, nic in (("gpu0", "mlx5_0"), ("gpu1", "mlx5_1")):
        port = nearest_port(gpu_pci_path(sysfs.root, NVML_BUS_IDS[gpu]), ports)
        assert port is not None and port.device == nic
    # On its own root port: nothing shared beyond the root complex; the first active port serves it.
    assert nearest_port(gpu_pci_path(sysfs.root, NVML_BUS_IDS["gpu2"]), ports).device == "mlx5_0"
    assert nearest_port((), ports) is None


def test_an_active_port_beats_a_nearer_port_that_is_down(sysfs):
    sysfs.port("mlx5_0", 1, state="1: DOWN")
    port = nearest_port(gpu_pci_path(sysfs.root, NVML_BUS_IDS["gpu0"]), read_ports(sysfs.root))
    assert port.device == "mlx5_1"


def test_bus_ids_are_compared_in_sysfs_form():
    assert normalise_bus_id("00000000:3A:00.0") == "0000:3a:00.0"
    assert normalise_bus_id("0000:3a:00.0") == "0000:3a:00.0"


def test_monitor_turns_words_into_bytes_and_rates_across_a_wrap(sysfs):
    monitor = PortMonitor(sysfs.root, min_refresh_s=0.0)
    sysfs.counters("mlx5_0", port_xmit_data=2**32 - 1000, port_rcv_data=0, port_xmit_wait=10, np_cnp_sent=0)
    first = monitor.refresh(now=100.0)[0]
    assert (first.tx_bytes, first.rx_bytes, first.tx_bytes_per_s) == (0.0, 0.0, None), "no rate from one read"
    sysfs.counters("mlx5_0", port_xmit_data=1000, port_rcv_data=500, port_xmit_wait=25, np_cnp_sent=4)
    second = next(p for p in monitor.refresh(now=102.0) if p.device == "mlx5_0")
    assert second.tx_bytes == 2000 * 4, "4-octet words, across the 32-bit wrap"
    assert second.rx_bytes == 500 * 4
    assert second.tx_bytes_per_s == pytest.approx(4000.0) and second.rx_bytes_per_s == pytest.approx(1000.0)
    assert second.events == {"port_xmit_wait": 15.0, "np_cnp_sent": 4.0}


def test_monitor_reads_at_most_once_per_refresh_interval(sysfs):
    monitor = PortMonitor(sysfs.root, min_refresh_s=1.0)
    sysfs.counters("mlx5_0", port_xmit_data=0)
    monitor.refresh(now=10.0)
    sysfs.counters("mlx5_0", port_xmit_data=100)
    assert monitor.refresh(now=10.5)[0].tx_bytes == 0.0, "served from the last read"
    assert monitor.refresh(now=11.0)[0].tx_bytes == 400.0


def test_monitor_maps_gpus_to_their_port_and_forgets_removed_ports(sysfs):
    monitor = PortMonitor(sysfs.root, min_refresh_s=0.0)
    sysfs.counters("mlx5_0", port_xmit_data=0)
    sysfs.counters("mlx5_1", port_xmit_data=0)
    monitor.refresh(now=1.0)
    sysfs.counters("mlx5_1", port_xmit_data=250)
    monitor.refresh(now=2.0)
    assert monitor.port_for_gpu(NVML_BUS_IDS["gpu1"]).tx_bytes == 1000.0
    assert monitor.port_for_gpu(NVML_BUS_IDS["gpu0"]).tx_bytes == 0.0
    assert monitor.port_for_gpu(None) is None
    shutil.rmtree(sysfs.root / "class" / "infiniband" / "mlx5_1")
    assert {p.device for p in monitor.refresh(now=3.0)} == {"mlx5_0"}
    assert monitor.port_for_gpu(NVML_BUS_IDS["gpu1"]).device == "mlx5_0", "the next nearest port now"


def test_local_host_reports_the_nearest_ports_traffic_for_each_gpu(sysfs):
    """The NVML backend passes each GPU's bus id; the host answers with that GPU's port rates."""
    from agent.context.local_host import LocalHost

    host = LocalHost(proc_root=sysfs.root / "proc", min_refresh_s=0.0, sysfs_root=sysfs.root)
    sysfs.counters("mlx5_0", port_xmit_data=0, port_rcv_data=0)
    sysfs.counters("mlx5_1", port_xmit_data=0, port_rcv_data=0)
    first = host.facts("1", [], 0.0, bus_id=NVML_BUS_IDS["gpu1"])
    assert first.net_tx_bytes_per_s is None, "a rate needs two reads"
    sysfs.counters("mlx5_1", port_xmit_data=3000, port_rcv_data=1000)
    gpu1 = host.facts("1", [], 0.0, bus_id=NVML_BUS_IDS["gpu1"])
    gpu0 = host.facts("0", [], 0.0, bus_id=NVML_BUS_IDS["gpu0"])
    assert gpu1.net_tx_bytes_per_s > 0 and gpu1.net_tx_bytes_per_s == pytest.approx(3 * gpu1.net_rx_bytes_per_s)
    assert gpu0.net_tx_bytes_per_s == 0.0, "GPU 0's own port moved nothing"
    assert host.facts("9", [], 0.0).net_tx_bytes_per_s is None, "no bus id, no port"


def test_flaps_congestion_and_retransmits_reach_the_gpu_and_the_port_series(sysfs):
    """What the jitter rule and the roofwatch_nic_* series read, from one fixture tree."""
    from prometheus_client.core import Metric

    from agent.context.local_host import LocalHost
    from exporters.nic_families import nic_families

    host = LocalHost(proc_root=sysfs.root / "proc", min_refresh_s=0.0, sysfs_root=sysfs.root)
    base = dict(port_xmit_data=0, port_rcv_data=0, link_downed=2, port_xmit_wait=10, symbol_error=0,
                np_ecn_marked_roce_packets=100, rp_cnp_handled=100, out_of_sequence=5, local_ack_timeout_err=0)
    sysfs.counters("mlx5_0", **base)
    first = host.facts("0", [], 0.0, bus_id=NVML_BUS_IDS["gpu0"])
    assert first.net_link_downs is None and first.net_congestion_per_s is None, "deltas need two reads"
    sysfs.counters("mlx5_0", **{**base, "link_downed": 3, "np_ecn_marked_roce_packets": 700, "rp_cnp_handled": 500,
                                "out_of_sequence": 25, "local_ack_timeout_err": 5, "port_xmit_wait": 1010,
                                "symbol_error": 4})
    gpu0 = host.facts("0", [], 0.0, bus_id=NVML_BUS_IDS["gpu0"])
    assert gpu0.net_link_downs == 1
    assert gpu0.net_congestion_per_s > 0 and gpu0.net_retransmits_per_s > 0
    assert gpu0.net_congestion_per_s / gpu0.net_retransmits_per_s == pytest.approx((600 + 400) / (20 + 5))
    gpu1 = host.facts("1", [], 0.0, bus_id=NVML_BUS_IDS["gpu1"])
    assert gpu1.net_link_downs is None, "GPU 1's port has no link_downed counter"

    ports = {p.device: p for p in host.nic_ports()}
    assert ports["mlx5_0"].events["link_downed"] == 1 and ports["mlx5_0"].events["symbol_error"] == 4
    assert ports["mlx5_0"].rate_bytes_per_s == 400e9 / 8 and ports["mlx5_0"].active
    families: dict[str, Metric] = {f.name: f for f in nic_families("n1", tuple(ports.values()))}
    downed = {s.labels["device"]: s.value for s in families["roofwatch_nic_link_downed"].samples}
    assert downed == {"mlx5_0": 1.0}
    wait = {s.labels["device"]: s.value for s in families["roofwatch_nic_transmit_wait_ticks"].samples}
    assert wait == {"mlx5_0": 1000.0}
    roce = {(s.labels["device"], s.labels["counter"]): s.value for s in families["roofwatch_nic_roce_events"].samples}
    assert roce[("mlx5_0", "rp_cnp_handled")] == 400.0 and roce[("mlx5_0", "local_ack_timeout_err")] == 5.0
    errors = {s.labels["counter"] for s in families["roofwatch_nic_errors"].samples}
    assert errors == {"symbol_error"}, "xmit_wait and link_downed have their own families"
