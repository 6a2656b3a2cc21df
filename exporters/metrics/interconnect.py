"""Data moved off the GPU: host PCIe, GPU-to-GPU fabric (NVLink / XGMI) and the node's InfiniBand/RoCE ports.

A communication-bound verdict is only actionable next to these figures, so every link a byte can
take out of a GPU is in one place; the NIC families are per port (:data:`NIC_LABELS`), not per GPU.
"""

from __future__ import annotations

from exporters.metrics.definition import MetricDef
from exporters.metrics.labels import GPU_LABELS, NIC_LABELS

PCIE_BYTES = MetricDef(
    "roofwatch_gpu_pcie_bytes_total", "counter", "bytes", "Bytes over the host PCIe link since the agent started.",
    GPU_LABELS + ("direction",), nvidia="GPM PCIE_TX/RX_PER_SEC or PCIe byte fields",
    amd="— (no direction split: roofwatch_gpu_pcie_bandwidth_bytes_per_second)",
)
PCIE_REPLAYS = MetricDef(
    "roofwatch_gpu_pcie_replays_total", "counter", "events",
    "PCIe replays (link-level retransmissions) since the driver loaded; a rising count marks a marginal link.",
    GPU_LABELS, nvidia="—", amd="pcie_replay_count_acc (partition 0)", virtual="—",
)
FABRIC_LINK_BYTES = MetricDef(
    "roofwatch_gpu_fabric_link_bytes_total", "counter", "bytes",
    "Bytes over each GPU-to-GPU link since the driver loaded (rx = read by this GPU, tx = written).",
    GPU_LABELS + ("link", "direction"), nvidia="—", amd="xgmi_read_data_acc / xgmi_write_data_acc x 1024 (partition 0)",
    virtual="—", optional="fabric_links",
)
FABRIC_LINK_UP = MetricDef(
    "roofwatch_gpu_fabric_link_up", "gauge", "boolean", "1 while a GPU-to-GPU link is up, 0 when it is down.",
    GPU_LABELS + ("link",), nvidia="—", amd="xgmi_link_status (partition 0)", virtual="—",
)
LINK_BYTES = MetricDef(
    "roofwatch_gpu_link_bytes_total", "counter", "bytes",
    "Bytes over the GPU-to-GPU fabric (NVLink / XGMI, all links) since the agent started.",
    GPU_LABELS + ("direction",), nvidia="GPM NVLINK_TOTAL_TX/RX_PER_SEC or NVLink byte fields",
    amd="xgmi_read/write_data_acc",
)
NETWORK_BYTES = MetricDef(
    "roofwatch_gpu_network_bytes_total", "counter", "bytes",
    "Bytes through the InfiniBand/RoCE port nearest this GPU since the agent started.",
    GPU_LABELS + ("direction",), nvidia="sysfs infiniband counters", amd="sysfs infiniband counters",
)
_IB = "sysfs /class/infiniband/<device>/ports/<port>"
NIC_INFO = MetricDef(
    "roofwatch_nic_info", "info", "", "An InfiniBand/RoCE port on this node and its link layer.",
    NIC_LABELS + ("link_layer",), nvidia=_IB, amd=_IB, virtual="—",
)
NIC_UP = MetricDef(
    "roofwatch_nic_up", "gauge", "boolean", "1 while the port is ACTIVE, else 0.", NIC_LABELS,
    nvidia=_IB + "/state", amd=_IB + "/state", virtual="—",
)
NIC_RATE = MetricDef(
    "roofwatch_nic_link_rate_bytes_per_second", "gauge", "bytes per second", "Negotiated link rate of the port.",
    NIC_LABELS, nvidia=_IB + "/rate", amd=_IB + "/rate", virtual="—",
)
NIC_BYTES = MetricDef(
    "roofwatch_nic_bytes_total", "counter", "bytes", "Bytes through the port since the agent started.",
    NIC_LABELS + ("direction",), nvidia=_IB + "/counters/port_{xmit,rcv}_data x 4", amd=_IB + "/counters/port_{xmit,rcv}_data x 4",
    virtual="—",
)
NIC_XMIT_WAIT = MetricDef(
    "roofwatch_nic_transmit_wait_ticks_total", "counter", "ticks",
    "Ticks the port had data to send but could not (credit starvation: congestion downstream); tick length is HCA specific.",
    NIC_LABELS, nvidia=_IB + "/counters/port_xmit_wait", amd=_IB + "/counters/port_xmit_wait", virtual="—",
)
NIC_LINK_DOWNED = MetricDef(
    "roofwatch_nic_link_downed_total", "counter", "events",
    "Times the port's link went down since the agent started; each flap stalls the collectives using it.",
    NIC_LABELS, nvidia=_IB + "/counters/link_downed", amd=_IB + "/counters/link_downed", virtual="—",
)
NIC_ERRORS = MetricDef(
    "roofwatch_nic_errors_total", "counter", "events", "Port error counters since the agent started, per counter.",
    NIC_LABELS + ("counter",), nvidia=_IB + "/counters (fixed set)", amd=_IB + "/counters (fixed set)", virtual="—",
)
NIC_ROCE_EVENTS = MetricDef(
    "roofwatch_nic_roce_events_total", "counter", "events",
    "RoCE congestion (ECN marks, CNPs) and retransmit events since the agent started, per counter.",
    NIC_LABELS + ("counter",), nvidia=_IB + "/hw_counters (mlx5 names)", amd=_IB + "/hw_counters (mlx5 names)",
    virtual="—",
)
NIC_METRICS: tuple[MetricDef, ...] = (NIC_INFO, NIC_UP, NIC_RATE, NIC_BYTES, NIC_XMIT_WAIT, NIC_LINK_DOWNED, NIC_ERRORS,
                                      NIC_ROCE_EVENTS)
