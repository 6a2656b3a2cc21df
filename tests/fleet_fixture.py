"""A small synthetic fleet with known answers, as stored series, for the fleet-report tests.

Three nodes in two clusters, 24 GPUs, 60 s resolution over two 2-hour periods (plus 10 minutes of
lead-in), ending at ``end``. The raw roofwatch series are what the agents export
(docs/metrics.md); the recording-rule outputs the report reads (``roofwatch:gpu_straggler_lead:ratio``,
``roofwatch_job:gpu_class:ratio``) and the ``ALERTS`` series are written directly as Prometheus
would have recorded them, rather than evaluated with ``promtool tsdb create-blocks-from rules``:
the test then states the incident it planted instead of depending on the rules' arithmetic.

A sample at time t stands for the step (t - 60, t]; the current period is (end - 2h, end], the
previous one (end - 4h, end - 2h]. The jobs, current period:

* east/e1 GPUs 0-7, ``train-a`` (alice, ns ml): compute-bound at MFU 0.45 throughout.
* east/e2 GPUs 0-3, ``notebook-b`` (bob, ns research): idle all period: 8 idle-allocated GPU-hours
  (previous period: memory-bound at MFU 0.05).
* east/e2 GPUs 4-7, ``loader-c`` (carol, ns ml): input-starved (MFU 0.10) the first hour, then
  compute-bound (MFU 0.30): 4 wasted GPU-hours (previous period: compute-bound at 0.30).
* west/w1 GPUs 0-3, ``ddp-d`` (alice, ns ml): communication-jittered (MFU 0.20) the first 30 min,
  then compute-bound (MFU 0.50): 2 wasted GPU-hours; GPU 2 leads the job's median tensor
  activity by 0.30 in the last 40 minutes (straggler), GpuJobStraggler fires the last 30 minutes.
* west/w1 GPUs 4-7: no job, idle, held by nobody (reason detail ``idle_free``): spare capacity, not waste.
* west/w1 GPU 8 is in MIG mode with no instance the fleet lists: only its board's remainder series
  (``roofwatch_gpu_mig_unattributed_energy_joules_total``, the energy no instance was given) at a steady
  ``MIG_REMAINDER_W``, which the fleet's energy counts like any device's.

Series that change labels (the reason info) end without a staleness marker in a backfill, so
Prometheus still sees them up to 5 minutes after they end; the tests allow for it there only.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.model import WORKLOAD_CLASSES

STEP = 60
PERIOD = 7200
LEAD_IN = 600
H100 = ("NVIDIA H100 80GB HBM3", "h100-sxm")
A100 = ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb")
POWER_W = {"compute_bound": 600.0, "memory_bound": 450.0, "idle": 100.0, "input_starved": 250.0,
           "communication_jittered": 300.0}
MIG_REMAINDER_W = 25.0
"""The steady power of a MIG GPU's remainder (its unconfigured slices' idle draw), west/w1 GPU 8."""
MIG_BOARD = 'cluster="west",gpu="8",node="w1",uuid="GPU-west-w1-0008"'
REASONS = {"compute_bound": "leaning", "memory_bound": "at_roof", "idle": "idle_held", "input_starved": "dataloader",
           "communication_jittered": "straggler_victim"}


@dataclass(frozen=True)
class Gpu:
    cluster: str
    node: str
    gpu: int
    model: tuple[str, str]
    job: str | None = None
    user: str | None = None
    namespace: str | None = None

    @property
    def uuid(self) -> str:
        return f"GPU-{self.cluster}-{self.node}-{self.gpu:04d}"

    def labels(self) -> str:
        return f'cluster="{self.cluster}",gpu="{self.gpu}",node="{self.node}",uuid="{self.uuid}"'


def fleet() -> list[Gpu]:
    gpus = [Gpu("east", "e1", i, H100, "train-a", "alice", "ml") for i in range(8)]
    gpus += [Gpu("east", "e2", i, H100, "notebook-b", "bob", "research") for i in range(4)]
    gpus += [Gpu("east", "e2", i, H100, "loader-c", "carol", "ml") for i in range(4, 8)]
    gpus += [Gpu("west", "w1", i, A100, "ddp-d", "alice", "ml") for i in range(4)]
    gpus += [Gpu("west", "w1", i, A100) for i in range(4, 8)]
    return gpus


def state(g: Gpu, t: float, end: float) -> tuple[str, float | None]:
    """(class, MFU or None) of GPU ``g`` for the step ending at ``t``."""
    current = t > end - PERIOD
    since = t - (end - PERIOD)  # seconds into the current period
    if g.job == "train-a":
        return "compute_bound", 0.45
    if g.job == "notebook-b":
        return ("idle", 0.0) if current else ("memory_bound", 0.05)
    if g.job == "loader-c":
        return ("input_starved", 0.10) if current and since <= 3600 else ("compute_bound", 0.30)
    if g.job == "ddp-d":
        return ("communication_jittered", 0.20) if current and since <= 1800 else ("compute_bound", 0.50)
    return "idle", None


def times(end: float) -> list[int]:
    start = int(end) - 2 * PERIOD - LEAD_IN
    return list(range(start, int(end) + 1, STEP))


def samples(end: float) -> list[tuple[str, float, int]]:
    """Every (series, value, unix seconds), time-major (each series in time order)."""
    out: list[tuple[str, float, int]] = []
    gpus = fleet()
    energy = dict.fromkeys((g.uuid for g in gpus), 0.0)
    remainder = 0.0
    for t in times(end):
        remainder += MIG_REMAINDER_W * STEP
        out.append((f"roofwatch_gpu_mig_unattributed_energy_joules_total{{{MIG_BOARD}}}", remainder, t))
        for g in gpus:
            lab = g.labels()
            cls, mfu = state(g, t, end)
            energy[g.uuid] += POWER_W[cls] * STEP
            out.append((f'roofwatch_gpu_info{{{lab},model="{g.model[0]}",spec="{g.model[1]}",vendor="nvidia"}}', 1, t))
            for c in WORKLOAD_CLASSES:
                out.append((f'roofwatch_gpu_workload_class{{{lab},class="{c}"}}', 1 if c == cls else 0, t))
            detail = REASONS[cls] if g.job or cls != "idle" else "idle_free"  # nobody holds it: spare, not waste
            out.append((f'roofwatch_gpu_workload_reason_info{{{lab},class="{cls}",detail="{detail}",throttle="none"}}', 1, t))
            out.append((f'roofwatch_gpu_energy_joules_total{{{lab}}}', energy[g.uuid], t))
            if mfu is not None:
                source = "workload" if g.job == "train-a" else "counters"
                out.append((f'roofwatch_gpu_mfu_ratio{{{lab},dtype="bf16",source="{source}"}}', mfu, t))
            if g.job:
                out.append((f'roofwatch_gpu_job_info{{{lab},job_id="{g.job}",partition="gpu",user="{g.user}"}}', 1, t))
                out.append((f'roofwatch_gpu_pod_info{{{lab},container="main",namespace="{g.namespace}",'
                            f'pod="{g.job}-{g.node}"}}', 1, t))
            if g.job == "ddp-d":
                lead = 0.30 if g.gpu == 2 and t > end - 2400 else 0.01
                out.append((f'roofwatch:gpu_straggler_lead:ratio{{{lab},job_id="ddp-d"}}', lead, t))
        jittered = 1.0 if end - PERIOD < t <= end - PERIOD + 1800 else 0.0
        out.append(('roofwatch_job:gpu_class:ratio{class="communication_jittered",cluster="west",job_id="ddp-d"}', jittered, t))
        if t > end - 1800:
            out.append(('ALERTS{alertname="GpuJobStraggler",alertstate="firing",cluster="west",gpu="2",job_id="ddp-d",'
                        'node="w1",severity="warning",uuid="GPU-west-w1-0002"}', 1, t))
    return out


def energy_kwh(end: float, start: float, stop: float) -> float:
    """The energy of the fleet ending at ``end`` over (start, stop], from the same power table
    (what increase() over that range must give)."""
    total = 0.0
    for t in times(end):
        if start < t <= stop:
            total += MIG_REMAINDER_W * STEP + sum(POWER_W[state(g, t, end)[0]] * STEP for g in fleet())
    return total / 3.6e6


def openmetrics(end: float) -> str:
    """For ``promtool tsdb create-blocks-from openmetrics`` (timestamps in seconds)."""
    return "".join(f"{s} {v} {t}\n" for s, v, t in samples(end)) + "# EOF\n"


def prometheus_text(end: float) -> str:
    """For VictoriaMetrics' ``/api/v1/import/prometheus`` (timestamps in milliseconds)."""
    return "".join(f"{s} {v} {t * 1000}\n" for s, v, t in samples(end))


DCGM_STEP = 15
DCGM_GPUS = {
    # A GEMM-heavy training rank: tensor pipes ~0.9 busy (NVIDIA's DCGM docs call 0.9+ a saturated
    # tensor pipe), DRAM moderate, near-TDP power.
    0: {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.97, "DCGM_FI_PROF_SM_ACTIVE": 0.93, "DCGM_FI_PROF_SM_OCCUPANCY": 0.45,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.90, "DCGM_FI_PROF_DRAM_ACTIVE": 0.30, "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.05,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.08, "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.0, "DCGM_FI_PROF_PCIE_TX_BYTES": 2e9,
        "DCGM_FI_PROF_PCIE_RX_BYTES": 3e9, "DCGM_FI_PROF_NVLINK_TX_BYTES": 5e10, "DCGM_FI_PROF_NVLINK_RX_BYTES": 5e10,
        "DCGM_FI_DEV_POWER_USAGE": 640.0, "DCGM_FI_DEV_SM_CLOCK": 1755.0, "DCGM_FI_DEV_GPU_UTIL": 100.0,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 35.0},
    # A bandwidth-bound kernel mix (decode, embeddings): DRAM ~0.85 of peak, tensor pipes nearly idle.
    1: {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.95, "DCGM_FI_PROF_SM_ACTIVE": 0.85, "DCGM_FI_PROF_SM_OCCUPANCY": 0.60,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.03, "DCGM_FI_PROF_DRAM_ACTIVE": 0.85, "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.02,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.25, "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.0, "DCGM_FI_PROF_PCIE_TX_BYTES": 1e9,
        "DCGM_FI_PROF_PCIE_RX_BYTES": 1e9, "DCGM_FI_PROF_NVLINK_TX_BYTES": 0.0, "DCGM_FI_PROF_NVLINK_RX_BYTES": 0.0,
        "DCGM_FI_DEV_POWER_USAGE": 480.0, "DCGM_FI_DEV_SM_CLOCK": 1980.0, "DCGM_FI_DEV_GPU_UTIL": 100.0,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 90.0},
}


def dcgm_samples(end: float, span: int = PERIOD + LEAD_IN) -> list[tuple[str, float, int]]:
    """dcgm-exporter's series of two H100s on one host every 15 s, as its exposition labels them
    (gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION, pod mapping)."""
    out = []
    for t in range(int(end) - span, int(end) + 1, DCGM_STEP):
        wiggle = ((t // DCGM_STEP) % 5 - 2) * 0.004  # a little movement, as real counters show
        for gpu, fields in DCGM_GPUS.items():
            labels = (f'DCGM_FI_DRIVER_VERSION="550.90.07",Hostname="dgx-01",UUID="GPU-dcgm-000{gpu}",device="nvidia{gpu}",'
                      f'gpu="{gpu}",modelName="NVIDIA H100 80GB HBM3",namespace="{("ml", "inference")[gpu]}",'
                      f'pci_bus_id="00000000:{gpu + 0x18:02X}:00.0",pod="pod-{gpu}",container="main"')
            for name, value in fields.items():
                moved = value + wiggle if name.startswith("DCGM_FI_PROF_") and 0.05 < value < 0.95 else value
                out.append((f"{name}{{{labels}}}", round(moved, 6), t))
    return out


def dcgm_openmetrics(end: float) -> str:
    return "".join(f"{s} {v} {t}\n" for s, v, t in dcgm_samples(end)) + "# EOF\n"


def dcgm_prometheus_text(end: float) -> str:
    return "".join(f"{s} {v} {t * 1000}\n" for s, v, t in dcgm_samples(end))
