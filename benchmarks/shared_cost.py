"""What sharing GPUs costs the agent: 8 whole GPUs, 8 GPUs x 7 MIG instances, 8 GPUs x 4 time-sliced pods.

Issue 47, item 7: per-holder work (each holder's share, its energy, its verdict, its series) must not make
the collection cost grow faster than the holders. The three nodes run one after the other in one run, each
a real ``roofwatch demo --backend nvml-virtual`` process over the fake libnvidia-ml (the real NVML code
path), measured as :mod:`benchmarks.collector_cost` measures the agent: its own CPU over a steady window
net of the fake driver's, its RSS, its series. The whole-GPU node is the baseline of the same run, so each
figure is also a ratio, and "CPU growth per unit of growth" divides the CPU ratio by how many more devices
(MIG) or holders (time-slicing) the node has: at or below 1, the cost grows no faster than they do.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks.collector_cost import MIB, Measurement, _free_port, measure
from benchmarks.figures import Figure

GPUS = 8
MIG_INSTANCES = 7
PODS = 4
MODEL = "h100-sxm"
PHASE = {"kind": "compute", "duration_s": 36000, "mfu": 0.4}


def whole_node() -> dict:
    """Eight whole GPUs, one training job each: the baseline."""
    return _node("whole", mig=None, workloads=[{"job": f"train-{i}", "gpus": [i], "phases": [PHASE]}
                                               for i in range(GPUS)])


def mig_node() -> dict:
    """Eight GPUs each split into seven 1g.10gb instances, one job per instance (56 devices)."""
    workloads = [{"job": f"mig-{i}-{j}", "gpus": [f"{i}/{j}"], "phases": [{**PHASE, "mem_used_gib": 6}]}
                 for i in range(GPUS) for j in range(1, MIG_INSTANCES + 1)]
    return _node("mig", mig={i: ["1g.10gb"] * MIG_INSTANCES for i in range(GPUS)}, workloads=workloads)


def sliced_node() -> dict:
    """Eight GPUs each time-sliced between four pods (32 holders): per-holder shares, energy and verdicts."""
    workloads = [{"job": f"sliced-{i}", "gpus": [i], "phases": [PHASE],
                  "holders": [{"namespace": f"team-{p}", "pod": f"pod-{i}-{p}", "share": 0.2, "mem_gib": 10}
                              for p in range(PODS)]} for i in range(GPUS)]
    return _node("sliced", mig=None, workloads=workloads)


def _node(name: str, *, mig: dict | None, workloads: list[dict]) -> dict:
    node: dict = {"name": f"{name}-node", "model": MODEL, "gpus": GPUS, "workloads": workloads}
    if mig:
        node["mig"] = mig
    return {"name": f"shared-cost-{name}", "seed": 47, "nodes": [node]}


NODES = (("8 whole GPUs", whole_node, GPUS), ("8 GPUs x 7 MIG instances", mig_node, GPUS * MIG_INSTANCES),
         ("8 GPUs x 4 time-sliced pods", sliced_node, GPUS * PODS))
"""(label, scenario, what grows: devices for MIG, holders for time-slicing; the GPUs for the baseline)."""


def agent(label: str, scenario: dict, directory: Path, *, interval_s: float, warmup_s: float,
          window_s: float) -> Measurement:
    path = directory / f"{scenario['name']}.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False), encoding="utf-8")
    port = _free_port()
    args = ["demo", "--backend", "nvml-virtual", "--scenario", str(path), "--listen", f"127.0.0.1:{port}",
            "--interval", str(interval_s)]
    return measure(label, "roofwatch", args, f"http://127.0.0.1:{port}/metrics", interval_s=interval_s,
                   warmup_s=warmup_s, window_s=window_s)


def run(quick: bool = False, *, warmup_s: float | None = None,
        window_s: float | None = None) -> tuple[list[Figure], list[tuple[str, int, Measurement]]]:
    """The three nodes side by side: figures with the whole-GPU node as baseline, and the measurements."""
    warmup = warmup_s if warmup_s is not None else (5.0 if quick else 10.0)
    window = window_s if window_s is not None else (15.0 if quick else 40.0)
    with tempfile.TemporaryDirectory(prefix="roofwatch-shared-cost-") as tmp:
        runs = [(label, units, agent(label, build(), Path(tmp), interval_s=1.0, warmup_s=warmup, window_s=window))
                for label, build, units in NODES]
    base_label, base_units, base = runs[0]
    g = "shared GPUs @1 s"
    figures = [Figure(g, f"agent CPU per interval (net), {base_label}", base.ms_per_interval(net=True), "ms", 5.0),
               Figure(g, f"RSS, {base_label}", base.rss_bytes / MIB, "MiB", 60.0),
               Figure(g, f"series, {base_label}", base.series, "series")]
    for label, units, m in runs[1:]:
        cpu_ratio = m.ms_per_interval(net=True) / base.ms_per_interval(net=True)
        figures += [
            Figure(g, f"agent CPU per interval (net), {label}", m.ms_per_interval(net=True), "ms", None,
                   base.ms_per_interval(net=True), base_label),
            Figure(g, f"RSS, {label}", m.rss_bytes / MIB, "MiB", 60.0, base.rss_bytes / MIB, base_label),
            Figure(g, f"series, {label}", m.series, "series", None, base.series, base_label),
            Figure(g, f"CPU growth per unit of growth, {label}", cpu_ratio / (units / base_units), "x", 1.0,
                   note=f"{units} {'devices' if 'MIG' in label else 'holders'} against {base_units} GPUs"),
        ]
    return figures, runs


def side_by_side(runs: list[tuple[str, int, Measurement]]) -> str:
    """The table of docs/performance.md, "Shared GPUs"."""
    base = runs[0][2]
    lines = ["| node | devices or holders | CPU / interval, net | ratio | % core, net | RSS | ratio | series | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, units, m in runs:
        lines.append(f"| {label} | {units} | {m.ms_per_interval(net=True):.2f} ms | "
                     f"{m.ms_per_interval(net=True) / base.ms_per_interval(net=True):.2f}x | "
                     f"{m.core_percent(net=True):.2f}% | {m.rss_bytes / MIB:.1f} MiB | "
                     f"{m.rss_bytes / base.rss_bytes:.2f}x | {m.series} | {m.series / base.series:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    from benchmarks.figures import table

    figs, measured = run(quick="--quick" in sys.argv)
    print(table(figs))
    print()
    print(side_by_side(measured))
