"""The node dashboard's wide per-GPU tables: the jitter evidence and the holders of shared GPUs.

Kept apart from dashboards/node.py (the layout) so each file stays small; SEL, the dashboard's selector, lives here.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import table
from grafana_foundation_sdk.models import dashboard as model

from dashboards.common import DATASOURCE, merged, organize, prom, unit_override

SEL = 'cluster=~"$cluster", node=~"$node", gpu=~"$gpu"'
"""The node dashboard's selector of GPUs, by its variables (dashboards/node.py imports it)."""


def jitter_evidence_panel() -> table.Panel:
    """Per GPU, what a communication-jittered verdict rests on and the figures behind it."""
    return (
        table.Panel().title("Jitter evidence").datasource(DATASOURCE).span(12).height(8)
        .description(
            "Per GPU, what a communication_jittered verdict rests on (Evidence: step_reports = the job's step "
            "times, with or without step ids; comm_counters = SM and tensor counters; fabric_and_power = power "
            "and memory activity falling as fabric bytes rise, on a GPU without SM or tensor counters such as "
            "A100 or L40S through NVML alone or MI300X; rank_spread = a straggler among the job's ranks; "
            "network_counters = the NIC's congestion or link-down counters) and the figures behind it: the "
            "share of samples spent waiting, the correlation of power with NVLink/XGMI plus NIC bytes (near -1 "
            "when compute and communication take turns), the step-time CV and the mean step time. A CV above "
            "~10% or a wait above ~30% means the job is paced by its slowest rank or the network. Blank: "
            "the GPU lacks that signal (no fabric counter, no step reports).")
        .with_target(prom(f"roofwatch_gpu_workload_reason_info{{{SEL}}}", instant=True, table=True, ref="A"))
        .with_target(prom(f"roofwatch_gpu_comm_wait_ratio{{{SEL}}}", instant=True, table=True, ref="B"))
        .with_target(prom(f"roofwatch_gpu_power_fabric_correlation{{{SEL}}}", instant=True, table=True, ref="C"))
        .with_target(prom(f"roofwatch_gpu_step_time_cv{{{SEL}}}", instant=True, table=True, ref="D"))
        .with_target(prom(f"roofwatch_gpu_step_time_seconds{{{SEL}}}", instant=True, table=True, ref="E"))
        .transformations(merged())
        .with_transformation(organize(
            {"gpu": "GPU", "class": "Class", "detail": "Reason", "basis": "Evidence", "basis_source": "Counters from",
             "Value #B": "Comm wait", "Value #C": "Power-fabric r", "Value #D": "Step-time CV", "Value #E": "Step time"},
            hide=("Time", "Value #A", "throttle", "waste", "uuid", "node", "cluster", "job", "instance", "__name__")))
        .override_by_name("Comm wait", [unit_override("percentunit")])
        .override_by_name("Power-fabric r", [unit_override("none"), model.DynamicConfigValue(id_val="decimals", value=2)])
        .override_by_name("Step-time CV", [unit_override("percentunit")])
        .override_by_name("Step time", [unit_override("s")])
    )


HOLDERS = "Holders of shared GPUs"


def holders_panel() -> table.Panel:
    """One row per holder of each shared GPU (roofwatch_gpu_holder_*: only shared GPUs have them)."""
    key = "cluster, node, gpu, uuid, holder"
    return (
        table.Panel().title(HOLDERS).datasource(DATASOURCE).span(24).height(8)
        .description("Every pod, job or process holding a GPU that is shared (time-slicing, a shared DRA claim, "
                     "MPS), with its estimated share of SM time, the memory it holds, its estimated power and its "
                     "energy over the dashboard range (busy energy by SM share, the idle floor evenly; "
                     "'unattributed' is what no holder explains), its own verdict where it has one, and the share "
                     "of the GPU it is billed for (an equal share per holder). A holder with memory, no SM time and "
                     "class idle_held wastes its slot even while the others keep the GPU busy. Empty: no GPU of "
                     "this node is shared.")
        .with_target(prom(f"max by ({key}, namespace, pod, via) (roofwatch_gpu_holder_info{{{SEL}}})",
                          instant=True, table=True, ref="A"))
        .with_target(prom(f"max by ({key}) (roofwatch_gpu_holder_sm_share_ratio{{{SEL}}})",
                          instant=True, table=True, ref="B"))
        .with_target(prom(f"max by ({key}) (roofwatch_gpu_holder_memory_used_bytes{{{SEL}}})",
                          instant=True, table=True, ref="C"))
        .with_target(prom(f"max by ({key}) (roofwatch_gpu_holder_power_watts{{{SEL}}})",
                          instant=True, table=True, ref="D"))
        .with_target(prom(f"sum by ({key}) (increase(roofwatch_gpu_holder_energy_joules_total{{{SEL}}}[$__range]))"
                          " / 3.6e6", instant=True, table=True, ref="E"))
        .with_target(prom(f"max by ({key}, class) (roofwatch_gpu_holder_class{{{SEL}}})",
                          instant=True, table=True, ref="F"))
        .with_target(prom(f"max by ({key}) (roofwatch:gpu_holder_share:ratio{{{SEL}}})",
                          instant=True, table=True, ref="G"))
        .transformations(merged())
        .with_transformation(organize(
            {"gpu": "GPU", "holder": "Holder", "namespace": "Namespace", "pod": "Pod", "via": "Via",
             "class": "Own verdict", "Value #B": "SM share", "Value #C": "Memory", "Value #D": "Power",
             "Value #E": "Energy (range)", "Value #G": "Billed share"},
            hide=("Time", "uuid", "node", "cluster", "__name__", "Value #A", "Value #F")))
        .override_by_name("SM share", [unit_override("percentunit")])
        .override_by_name("Memory", [unit_override("bytes")])
        .override_by_name("Power", [unit_override("watt")])
        .override_by_name("Energy (range)", [unit_override("kwatth")])
        .override_by_name("Billed share", [unit_override("percentunit")]))
