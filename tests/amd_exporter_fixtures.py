"""Writes tests/fixtures/amd-exporter/*.prom: Device Metrics Exporter expositions assembled line by line
in DME's own names, label sets, label order and HELP/TYPE lines, with chosen (not captured) values.
tests/fixtures/amd-exporter/README.md says where each line's format comes from.

``python -m tests.amd_exporter_fixtures`` rewrites the files; test_amd_exporter_units checks that they
are what this module writes, so a hand edit cannot drift from the numbers the tests compute from.
"""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "amd-exporter"
PART = "102-G30211-0C"
"""An MI300X's card_model as DME prints it (ROCm/device-metrics-exporter PR #329)."""
HOST = "mi300x-node-07"
PEAK_BF16 = 1307.4e12
BANDWIDTH = 5.3e12
WINDOW_US = 1000.0

HELP = {
    "gpu_nodes_total": "Number of GPUs in the node",
    "gpu_package_power": "Current socket power in Watts",
    "gpu_average_package_power": "Average socket power in Watts",
    "gpu_power_usage": "GPU Power usage in Watts",
    "gpu_edge_temperature": "Current edge temperature in Celsius",
    "gpu_junction_temperature": "Current junction/hotspot temperature in Celsius",
    "gpu_memory_temperature": "Current memory temperature in Celsius",
    "gpu_gfx_activity": "Graphics engine usage in Percentage (0-100)",
    "gpu_umc_activity": "Memory engine usage in Percentage (0-100)",
    "gpu_energy_consumed": "Accumulated energy consumed by the GPU in uJ",
    "gpu_clock": "List of current GPU clock frequencies in MHz",
    "gpu_total_vram": "Total VRAM memory of the GPU (in MB)",
    "gpu_used_vram": "Used VRAM memory of the GPU (in MB)",
    "gpu_ecc_uncorrect_total": "Total Uncorrectable error count",
    "gpu_xgmi_link_rx": "Accumulated XGMI Link Data Read in KB",
    "gpu_xgmi_link_tx": "Accumulated XGMI Link Data Write in KB",
    "gpu_gfx_busy_instantaneous": "Gfx busy instantaneous per accelerated compute processor(xcp) per compute core "
                                  "(xcc), as per partitioning of the system",
    "gpu_prof_gui_util_percent": "Percentage of the time that GUI is active",
    "gpu_prof_fetch_size": "The total kilobytes fetched from the video memory. This is measured with all extra "
                           "fetches and any cache or memory effects taken into account",
    "gpu_prof_write_size": "The total kilobytes written to the video memory. This is measured with all extra fetches "
                           "and any cache or memory effects taken into account",
    "gpu_prof_total_16_ops": "The number of 16 bits OPS executed",
    "gpu_prof_total_32_ops": "The number of 32 bits OPS executed",
    "gpu_prof_total_64_ops": "The number of 64 bits OPS executed",
    "gpu_prof_occupancy_percent": "GPU Occupancy as % of maximum",
    "gpu_prof_tensor_active_percent": "MFMA Utililization Unit: percent",
    "gpu_prof_sm_active": "The percentage of GPUTime vector ALU instructions are processed. Value range: 0% (bad) "
                          "to 100% (optimal)",
}

# (MFMA %, VALU %, GUI %, HBM bytes/s, write share, gfx %, umc %, W) per workload
GEMM = (62.0, 18.0, 96.0, 1.6e12, 0.25, 97, 34, 721)
DECODE = (5.0, 31.0, 97.0, 4.3e12, 0.08, 96, 79, 515)
WORKLOADS = [GEMM, GEMM, GEMM, GEMM, DECODE, DECODE, DECODE, DECODE]


def expected_mfu(workload: tuple, peak: float = PEAK_BF16) -> float:
    """The fixture's own answer: 16-bit ops in the window / window / the BF16 dense peak."""
    return ops16(workload, peak) / (WINDOW_US * 1e-6) / peak


def ops16(workload: tuple, peak: float = PEAK_BF16) -> float:
    mfma, _, gui = workload[:3]
    return float(f"{mfma / 100 * gui / 100 * peak * WINDOW_US * 1e-6:.6g}")


def _g(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.10g}"


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


class Body:
    def __init__(self) -> None:
        self.families: dict[str, list[str]] = {}

    def add(self, name: str, labels: dict[str, str], value: float | str) -> None:
        text = value if isinstance(value, str) else _g(value)
        self.families.setdefault(name, []).append(f"{name}{{{_labels(labels)}}} {text}")

    def text(self) -> str:
        out = []
        for name in sorted(self.families):
            out += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge", *sorted(self.families[name])]
        return "\n".join(out) + "\n"


def base_labels(gpu_id: int, partition: str, ptype: str, serial: str, release: str, *, card: str = PART,
                memory: str = "nps1", host: str = HOST) -> dict[str, str]:
    labels = {"card_model": card, "container": "", "gpu_compute_partition_type": ptype, "gpu_id": str(gpu_id),
              "gpu_memory_partition_type": memory, "gpu_partition_id": partition, "hostname": host, "job_id": "",
              "job_partition": "", "job_user": "", "namespace": "", "pod": "", "serial_number": serial}
    if release == "1.5":
        labels["deployment_mode"] = "baremetal"
    else:
        labels["cluster_name"] = "amdgpu-k8s-metrics-exporter"  # a CustomLabel, as in PR #329's line
    return labels


def profiler(body: Body, labels: dict[str, str], w: tuple, scale: float = 1.0, peak: float = PEAK_BF16) -> None:
    mfma, valu, gui, hbm, write_share = w[:5]
    kib = hbm * scale * WINDOW_US * 1e-6 / 1024
    body.add("gpu_prof_gui_util_percent", labels, f"{gui:.6g}")
    body.add("gpu_prof_tensor_active_percent", labels, f"{mfma:.6g}")
    body.add("gpu_prof_sm_active", labels, f"{valu:.6g}")
    body.add("gpu_prof_occupancy_percent", labels, f"{valu * 1.4:.6g}")
    body.add("gpu_prof_total_16_ops", labels, f"{ops16(w, peak) * scale:.6g}")
    body.add("gpu_prof_total_32_ops", labels, f"{valu / 100 * 81.7e12 * peak / PEAK_BF16 * scale * WINDOW_US * 1e-6:.6g}")
    body.add("gpu_prof_total_64_ops", labels, "0")
    body.add("gpu_prof_fetch_size", labels, f"{kib * (1 - write_share):.6g}")
    body.add("gpu_prof_write_size", labels, f"{kib * write_share:.6g}")


def spx(*, with_profiler: bool, release: str = "1.5") -> str:
    body = Body()
    body.add("gpu_nodes_total", {"hostname": HOST}, 8)
    for g, w in enumerate(WORKLOADS):
        labels = base_labels(g, "0", "spx", f"69240700{4230 + g}", release)
        _, _, _, _, _, gfx, umc, watts = w
        body.add("gpu_gfx_activity", labels, gfx)
        body.add("gpu_umc_activity", labels, umc)
        body.add("gpu_package_power", labels, watts)
        body.add("gpu_energy_consumed", labels, 4.1e12 + g * 1.37e10)
        body.add("gpu_junction_temperature", labels, 71 + g % 3)
        body.add("gpu_memory_temperature", labels, 58 + g % 2)
        body.add("gpu_total_vram", labels, 196592)
        body.add("gpu_used_vram", labels, 181544 if w is DECODE else 142210)
        body.add("gpu_ecc_uncorrect_total", labels, 0)
        clock = "system" if release == "1.5" else "GPU_CLOCK_TYPE_SYSTEM"
        for xcc in range(8):
            body.add("gpu_clock", {**labels, "clock_index": str(xcc), "clock_type": clock}, 2100 - 10 * (w is GEMM))
            body.add("gpu_gfx_busy_instantaneous", {**labels, "xcc_index": str(xcc)}, gfx)
        for link in range(8):
            if link != g:
                body.add("gpu_xgmi_link_rx", {**labels, "link_index": str(link)}, 2.776148269e9 + 1e6 * link)
                body.add("gpu_xgmi_link_tx", {**labels, "link_index": str(link)}, 3.539423344e9 + 1e6 * link)
        if with_profiler:
            profiler(body, labels, w)
    return body.text()


CPX_BUSY = [[9, 95, 96, 94, 97, 0, 0, 12], [96, 0, 95, 97, 3, 96, 94, 95]]
"""Per GPU and partition: each partition's own XCC busy, %; partition 0 of GPU 0 is nearly idle."""


def cpx() -> str:
    body = Body()
    body.add("gpu_nodes_total", {"hostname": HOST}, 16)
    for g in range(2):
        serial = f"69240700{4230 + g}"
        for p in range(8):
            labels = base_labels(g * 8 + p, str(p), "cpx", serial, "1.5")
            busy = CPX_BUSY[g][p]
            if p == 0:  # v1.5.1 metricslist.md:77-95: partition 0 only
                body.add("gpu_gfx_activity", labels, 71)
                body.add("gpu_umc_activity", labels, 52)
                body.add("gpu_package_power", labels, 688)
                body.add("gpu_energy_consumed", labels, 3.9e12 + g * 1e10)
                body.add("gpu_junction_temperature", labels, 74)
                body.add("gpu_clock", {**labels, "clock_index": "0", "clock_type": "system"}, 2100)
            body.add("gpu_total_vram", labels, 24574)
            body.add("gpu_used_vram", labels, 20111 if busy else 310)
            body.add("gpu_gfx_busy_instantaneous", {**labels, "xcc_index": "0"}, busy)
            work = GEMM if busy > 50 else (0.5, 1.0, float(busy), 1.0e10, 0.1)
            profiler(body, labels, work, scale=1 / 8)
    return body.text()


MI250X_PART = "102-D65201"
"""An MI250X's board number as its owners read it (ROCm/ROCm issue #2852); amdsmi's revision suffix is unknown."""
MI250X_PEAK_BF16 = 191.5e12
MI250X_BANDWIDTH = 1.6e12
"""Per GCD: half the package's 383 TFLOP/s and 3.2 TB/s (the catalogue's mi250x entry)."""
MI250X_GEMM = (58.0, 15.0, 95.0, 0.45e12, 0.25, 96, 31, 465)
MI250X_DECODE = (4.0, 28.0, 97.0, 1.3e12, 0.08, 95, 80, 410)
MI250X_WORKLOADS = [MI250X_GEMM, MI250X_GEMM, MI250X_GEMM, MI250X_GEMM,
                    MI250X_DECODE, MI250X_DECODE, MI250X_DECODE, MI250X_DECODE]
MI250X_HOST = "mi250x-node-02"


def mi250x() -> str:
    """4 MI250X packages = 8 GCDs, each its own gpu_id (amdsmi and gpuagent list a GCD as a GPU). MI2xx has
    gpu_average_package_power and gpu_edge_temperature, not gpu_package_power, gpu_junction_temperature or
    gpu_gfx_busy_instantaneous (v1.5.1 metricslist.md:7-10, :12-30). The two GCDs of one package share the board
    serial here (one FRU per OAM: chosen, not documented), the harder case for the amdsmi join."""
    body = Body()
    body.add("gpu_nodes_total", {"hostname": MI250X_HOST}, 8)
    for g, w in enumerate(MI250X_WORKLOADS):
        labels = base_labels(g, "0", "none", f"PCB0{46982 + g // 2}-0071", "1.5", card=MI250X_PART, memory="none",
                             host=MI250X_HOST)
        _, _, _, _, _, gfx, umc, watts = w
        body.add("gpu_gfx_activity", labels, gfx)
        body.add("gpu_umc_activity", labels, umc)
        body.add("gpu_average_package_power", labels, watts)
        body.add("gpu_power_usage", labels, watts)
        body.add("gpu_energy_consumed", labels, 2.2e12 + g * 1.1e10)
        body.add("gpu_edge_temperature", labels, 44 + g % 3)
        body.add("gpu_memory_temperature", labels, 61 + g % 2)
        body.add("gpu_total_vram", labels, 65520)
        body.add("gpu_used_vram", labels, 60110 if w is MI250X_DECODE else 48333)
        body.add("gpu_ecc_uncorrect_total", labels, 0)
        body.add("gpu_clock", {**labels, "clock_index": "0", "clock_type": "system"}, 1700)
        profiler(body, labels, w, peak=MI250X_PEAK_BF16)
    return body.text()


MI355X_PART = "102-G36218-0C"
"""An MI355X OAM's card_model (ROCm/device-metrics-exporter issue #495, PCI device id 75a3)."""
MI355X_PEAK_BF16 = 2500e12
MI355X_BANDWIDTH = 8.0e12
MI355X_GEMM = (60.0, 14.0, 97.0, 2.4e12, 0.25, 98, 30, 1320)
MI355X_DECODE = (5.0, 30.0, 96.0, 6.5e12, 0.08, 96, 80, 990)
MI355X_WORKLOADS = [MI355X_GEMM, MI355X_GEMM, MI355X_GEMM, MI355X_GEMM,
                    MI355X_DECODE, MI355X_DECODE, MI355X_DECODE, MI355X_DECODE]
MI355X_HOST = "mi355x-node-11"
MI355X_VRAM_MB = 294896
"""288 GiB less 16 MiB, as the MI300X's 196592 is 192 GiB less 16 MiB (gpuagent's mock: 196592)."""


def mi355x_spx() -> str:
    """8 x MI355X in SPX/NPS1, profiler on: 8 XCCs per GPU, 7 XGMI peers, power on every GPU."""
    body = Body()
    body.add("gpu_nodes_total", {"hostname": MI355X_HOST}, 8)
    for g, w in enumerate(MI355X_WORKLOADS):
        labels = base_labels(g, "0", "spx", f"71250600{3310 + g}", "1.5", card=MI355X_PART, host=MI355X_HOST)
        _, _, _, _, _, gfx, umc, watts = w
        _whole_gpu(body, labels, gfx, umc, watts, g, xccs=8)
        body.add("gpu_total_vram", labels, MI355X_VRAM_MB)
        body.add("gpu_used_vram", labels, 270012 if w is MI355X_DECODE else 201555)
        for xcc in range(8):
            body.add("gpu_gfx_busy_instantaneous", {**labels, "xcc_index": str(xcc)}, gfx)
        for link in range(8):
            if link != g:
                body.add("gpu_xgmi_link_rx", {**labels, "link_index": str(link)}, 4.112e9 + 1e6 * link)
                body.add("gpu_xgmi_link_tx", {**labels, "link_index": str(link)}, 4.907e9 + 1e6 * link)
        profiler(body, labels, w, peak=MI355X_PEAK_BF16)
    return body.text()


def _whole_gpu(body: Body, labels: dict[str, str], gfx: float, umc: float, watts: float, g: int, xccs: int) -> None:
    """The whole GPU's readings (on partition 0 only when partitioned: v1.5.1 metricslist.md:77-95)."""
    body.add("gpu_gfx_activity", labels, gfx)
    body.add("gpu_umc_activity", labels, umc)
    body.add("gpu_package_power", labels, watts)
    body.add("gpu_energy_consumed", labels, 1.8e12 + g * 2.1e10)
    body.add("gpu_junction_temperature", labels, 78 + g % 3)
    body.add("gpu_memory_temperature", labels, 66 + g % 2)
    body.add("gpu_ecc_uncorrect_total", labels, 0)
    for xcc in range(xccs):
        body.add("gpu_clock", {**labels, "clock_index": str(xcc), "clock_type": "system"}, 2400 - 20 * (watts > 1200))


DPX_WORK = (MI355X_GEMM, MI355X_DECODE)
"""Per DPX partition: 0 runs a GEMM, 1 decodes."""


def mi355x_dpx(*, partition_1: bool) -> str:
    """8 x MI355X in DPX/NPS1 = 16 partitions (4 XCCs each: amdsmi's xcp_0/xcp_1 hold 4 XCC values each in DPX,
    ROCm/amdsmi issue #134). ``partition_1=False`` is the exposition of ROCm/device-metrics-exporter issue #495
    (v1.4.1 and v1.5.0 on MI355X DPX/NPS1): 8 series per metric, only ``gpu_partition_id="0"`` of each GPU; which
    ``gpu_id`` values it printed is not in the report, 0-7 are chosen."""
    body = Body()
    body.add("gpu_nodes_total", {"hostname": MI355X_HOST}, 16 if partition_1 else 8)
    gpu_id = 0
    for g in range(8):
        serial = f"71250600{3310 + g}"
        for p in range(2 if partition_1 else 1):
            labels = base_labels(gpu_id, str(p), "dpx", serial, "1.5", card=MI355X_PART, host=MI355X_HOST)
            gpu_id += 1
            w = DPX_WORK[p]
            if p == 0:
                _whole_gpu(body, labels, 97, 55, 1180, g, xccs=4)
            body.add("gpu_total_vram", labels, MI355X_VRAM_MB // 2)
            body.add("gpu_used_vram", labels, 120300 if p else 101400)
            for xcc in range(4):
                body.add("gpu_gfx_busy_instantaneous", {**labels, "xcc_index": str(xcc)}, w[5])
            profiler(body, labels, w, scale=1 / 2, peak=MI355X_PEAK_BF16)
    return body.text()


FILES = {"mi300x-spx-profiler.prom": lambda: spx(with_profiler=True),
         "mi300x-spx-no-profiler.prom": lambda: spx(with_profiler=False),
         "mi300x-spx-v1.4.1-profiler.prom": lambda: spx(with_profiler=True, release="1.4"),
         "mi300x-cpx-profiler.prom": cpx,
         "mi250x-profiler.prom": mi250x,
         "mi355x-spx-profiler.prom": mi355x_spx,
         "mi355x-dpx-profiler.prom": lambda: mi355x_dpx(partition_1=True),
         "mi355x-dpx-partition0-only.prom": lambda: mi355x_dpx(partition_1=False)}


def replace_serials(body: str, serials: dict[str, str]) -> str:
    """``gpu_id`` -> serial: the fixture's ``serial_number`` labels swapped for another node's (the fake
    amdsmi's board serials), as tests.dcgm_exporter_server.replace_uuids does for dcgm-exporter's UUIDs."""
    def swap(match: re.Match[str]) -> str:
        head, gpu, old = match.groups()
        return f'{head}{serials.get(gpu, old)}"'
    return re.sub(r'(gpu_id="(\d+)"[^}]*serial_number=")([^"]*)"', swap, body)


def set_value(body: str, name: str, gpu_id: int, value: str, **labels: str) -> str:
    """``body`` with the value of series ``name`` for ``gpu_id`` (and the given index labels, such as
    ``link_index="1"``) replaced by ``value``, as printed: one line, or the test is wrong."""
    wanted = [f'gpu_id="{gpu_id}"', *(f'{k}="{v}"' for k, v in labels.items())]
    lines = body.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.startswith(name + "{") and all(w in line for w in wanted)]
    assert len(hits) == 1, f"{name} {wanted}: {len(hits)} lines"
    lines[hits[0]] = lines[hits[0]].rsplit(" ", 1)[0] + f" {value}\n"
    return "".join(lines)


def write() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, make in FILES.items():
        (FIXTURES / name).write_text(make())


if __name__ == "__main__":
    write()
