"""Compiling a scenario into per-device sampling plans, once, when the engine is built.

Everything here is static: which devices each node exposes (whole GPUs, MIG instances, AMD
compute partitions), where each device sits in its job (rank, world size, nodes), its phase plans,
process identity and noise key. It is kept apart from :mod:`agent.virtual.sampling` so that the
per-sample hot path only reads finished plans and never re-derives layout from the scenario.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.model import Attribution, DeviceInfo, GpuSpec, ProcessSample
from agent.model.holders import Holder, HolderReport
from agent.model.specs import spec_by_key
from agent.virtual.devices import (
    HIDDEN_FIELDS,
    MEM_BUSY_PRESETS,
    MIG_HIDDEN_FIELDS,
    VGPU_HIDDEN_FIELDS,
    NET_BYTES_PER_S,
    DriverView,
    default_counters,
    device_info,
    driver_view,
    mig_instance_info,
    mig_slices,
    parse_mig_profile,
    partition_info,
)
from agent.virtual.kinds import PhasePlan, Placement, compile_phase
from agent.virtual.nodes import Node
from agent.virtual.physics import DeviceModel, hash_prefix, unit_hash
from agent.virtual.scenario import Scenario
from agent.virtual.serving.figures import phase_figures
from agent.virtual.serving.job import ServingJob
from agent.virtual.serving.plan import ServingPlan
from agent.virtual.timeline import JobClock, Schedule
from agent.virtual.workloads import IdlePhase, InputStarvedPhase, ServingPhase, Workload

_IDLE_PHASE = IdlePhase(kind="idle", duration_s=3600.0)
_DEFAULT_PROCESS = {"memory": "vllm", "latency": "vllm", "comm_jitter": "torchrun"}
_SERVER_PROCESS = {"vllm": "vllm", "sglang": "sglang", "tgi": "text-generation-launcher"}

IowaitSource = tuple[Schedule, tuple[float, ...]]
"""A job that drives host iowait: its schedule and the iowait each of its phases causes."""


@dataclass(slots=True)
class GpuPlan:
    """Everything needed to sample one GPU (or MIG instance), compiled once from the scenario."""

    node: str
    gpu: str
    """The trace's GPU id: ``"3"``, or ``"3/1"`` for a MIG instance."""
    info: DeviceInfo
    dev: DeviceModel
    schedule: Schedule
    plans: tuple[PhasePlan, ...]
    before_start: PhasePlan
    dtype: str | None
    pid: int
    process_name: str
    noise_key: bytes
    energy_offset_j: float
    attribution: Attribution | None = None
    """The scenario job that holds this GPU for the whole run (its allocation), if any."""
    hidden: tuple[str, ...] = ()
    """Sample fields a real backend could not read here (counter preset, MIG instance)."""
    mem_busy: bool = False
    """The memory signal is NVML utilization.memory (``mem_busy``), not a bandwidth share."""
    blind: bool = False
    """No utilisation counters at all: even a perfect classifier can only say ``unknown``."""
    processes: dict[int, tuple[ProcessSample, ...]] = field(default_factory=dict)
    holders: tuple[tuple[Holder, float, int], ...] = ()
    """A shared GPU's holders, each with its share of the SM time and the bytes its process holds."""


@dataclass(slots=True)
class CompiledFleet:
    """The engine's static view of a scenario: plans by (node, GPU id), devices and host sources by node."""

    plans: dict[tuple[str, str], GpuPlan] = field(default_factory=dict)
    devices: dict[str, list[DeviceInfo]] = field(default_factory=dict)
    host_sources: dict[str, list[IowaitSource]] = field(default_factory=dict)
    serving: dict[str, list[ServingJob]] = field(default_factory=dict)
    """The serving jobs of each node, in workload order (their fake servers' state)."""


def compile_scenario(scenario: Scenario) -> CompiledFleet:
    """Plans for every device of every node, in node order and device index order."""
    fleet = CompiledFleet()
    seed = scenario.seed
    ranks, world, nodes_of, first = _job_layout(scenario)
    clocks = {job: JobClock(Schedule([p.duration_s for p in w.phases], w.repeat), w.phases,
                            hash_prefix(seed, "job", job)) for job, w in first.items()}
    for node in scenario.nodes:
        spec = spec_by_key(node.model)
        view = driver_view(node.model, spec)
        dme = getattr(getattr(node, "amd", None), "device_metrics_exporter", False)  # its profiler sees the pipes
        counters = node.counters or ("full" if dme else default_counters(node.model, spec.vendor))
        targets = _node_devices(seed, node, spec, view, counters)
        fleet.devices[node.name] = [info for info, _ in targets]
        servers = _serving_jobs(node, spec, clocks)
        fleet.serving[node.name] = list(servers.values())
        owner = {str(g): w for w in node.workloads for g in w.gpus}
        for info, dev in targets:
            workload = owner.get(info.gpu)
            job = workload.job if workload else None
            assert info.spec is not None
            where = Placement(
                rank=ranks.get((node.name, info.gpu), 0), world=world.get(job, 1) if job else 1,
                multi_node=len(nodes_of.get(job, ())) > 1 if job else False,
                peak_flops=info.spec.peak_flops.get(workload.dtype if workload else "bf16", 0.0),
                clock=clocks.get(job) if job else None)
            plan = _gpu_plan(seed, node, info, dev, workload, where, clocks, servers.get(job) if job else None)
            # A MIG instance has no power or bus readings of its own. An AMD partition keeps
            # its share here: the fake libamd_smi sums the shares into partition 0's socket power.
            mig_instance = "/" in info.gpu and node.partitions == 1
            plan.hidden = (HIDDEN_FIELDS[counters] + (MIG_HIDDEN_FIELDS if mig_instance else ())
                           + (VGPU_HIDDEN_FIELDS if node.vgpu else ()))
            plan.blind = counters == "minimal"
            plan.mem_busy = counters in MEM_BUSY_PRESETS
            fleet.plans[(node.name, info.gpu)] = plan
        fleet.host_sources[node.name] = _host_sources(node, clocks)
    return fleet


def true_label(plan: GpuPlan, t: float) -> str:
    """The true class at virtual time ``t``; ``unknown`` where no utilisation can be read."""
    if plan.blind:
        return "unknown"
    if t < 0.0:
        return plan.before_start.label
    return plan.plans[plan.schedule.locate(t).index].label


def _serving_jobs(node: Node, spec: GpuSpec, clocks: dict[str, JobClock]) -> dict[str, ServingJob]:
    """The server state of each serving workload of ``node`` (validation already ran these figures)."""
    out = {}
    for w in node.workloads:
        if w.serving is None:
            continue
        figures = [phase_figures(p, gpus=len(w.gpus), model=node.model, spec=spec, dtype=w.dtype)
                   if isinstance(p, ServingPhase) else None for p in w.phases]
        out[w.job] = ServingJob(w.job, [str(g) for g in w.gpus], w.dtype, clocks[w.job].schedule, w.phases, figures)
    return out


def _phase_plan(phase: object, index: int, dev: DeviceModel, where: Placement, job: str,
                server: ServingJob | None) -> PhasePlan:
    if isinstance(phase, ServingPhase):
        assert server is not None
        return ServingPlan(phase, dev, where, server, index)
    return compile_phase(phase, dev, where, job)


def _gpu_plan(seed: int, node: Node, info: DeviceInfo, dev: DeviceModel, workload: Workload | None,
              where: Placement, clocks: dict[str, JobClock], server: ServingJob | None) -> GpuPlan:
    idle_where = Placement(rank=0, world=1, multi_node=False, peak_flops=0.0, clock=None)
    before = compile_phase(_IDLE_PHASE, dev, idle_where, None)
    if workload is None:
        schedule, plans = Schedule([_IDLE_PHASE.duration_s], True), (before,)
        dtype, name, job = None, "python", "-"
    else:
        schedule = clocks[workload.job].schedule
        plans = tuple(_phase_plan(p, i, dev, where, workload.job, server) for i, p in enumerate(workload.phases))
        dtype, job = workload.dtype, workload.job
        busy = [p.kind for p in workload.phases if not isinstance(p, IdlePhase)]
        default = _SERVER_PROCESS[server.server] if server else _DEFAULT_PROCESS.get(busy[0] if busy else "", "python")
        name = workload.process or default
    key = hash_prefix(seed, node.name, info.gpu)  # "3" hashes as 3 did: whole-GPU noise unchanged
    pid = 2000 + int(unit_hash(hash_prefix(seed, "pid", job, where.rank), node.name) * 4_000_000)
    if workload is not None and workload.pid is not None:
        pid = workload.pid
    holders = _holders(workload, pid, where.peak_flops) if workload is not None else ()
    attribution = (Attribution(job_id=workload.job, user=workload.user, account=workload.account)
                   if workload is not None else None)
    if holders:
        first = holders[0][0]
        attribution = Attribution(job_id=workload.job if workload else None, namespace=first.namespace,
                                  pod=first.pod, container=first.container, holders=tuple(h for h, _, _ in holders))
    return GpuPlan(node=node.name, gpu=info.gpu, info=info, dev=dev, schedule=schedule, plans=plans,
                   before_start=before, dtype=dtype, pid=pid, process_name=name, noise_key=key,
                   energy_offset_j=1e6 + unit_hash(key, "energy") * 4e8, attribution=attribution, holders=holders)


HOLDER_FLOPS_PER_TOKEN = 6 * 7e9
"""FLOPs per token of a holder's own report (a 7B model's training step): its tokens/s follows from its MFU."""


def _holders(workload: Workload, pid: int, peak_flops: float) -> tuple[tuple[Holder, float, int], ...]:
    """The scenario's holders of a shared GPU, each with a PID of its own beside the job's (``pid + 1 + i``); a
    holder with an ``mfu`` carries its own report, as with_holder_reports matches one to its PIDs on a node."""
    out = []
    for i, spec in enumerate(workload.holders):
        pids = (pid + 1 + i,)
        report = None
        if spec.mfu is not None and peak_flops > 0:
            report = HolderReport(job=spec.job or workload.job, world_size=1, dtype=workload.dtype,
                                  flops_per_token=HOLDER_FLOPS_PER_TOKEN,
                                  tokens_per_s=spec.mfu * peak_flops / HOLDER_FLOPS_PER_TOKEN)
        if spec.via == "slurm":
            holder = Holder(kind="job", via="slurm", job_id=spec.job, user=spec.user, account=spec.account,
                            pids=pids, report=report)
        elif spec.via == "mps":  # what the node knows: /proc gives the process, the driver's MPS list the mark
            holder = Holder(kind="process", via="mps", pids=pids, report=report)
        else:
            holder = Holder(kind="pod", via=spec.via, namespace=spec.namespace, pod=spec.pod,
                            container=spec.container, claim=spec.claim, pids=pids, report=report)
        out.append((holder, spec.share, int(spec.mem_gib * 1024**3)))
    return tuple(out)


def _node_devices(seed: int, node: Node, spec: GpuSpec, view: DriverView, counters: str
                  ) -> list[tuple[DeviceInfo, DeviceModel]]:
    """Every device the node exposes, in index order: whole GPUs, a MIG GPU's instances, or an AMD
    GPU's compute partitions (each 1/N of the GPU: peaks, memory, host link, fabric and power budget).

    An instance is simulated as a small GPU: its own peaks (scaled spec), memory and a
    g/7 (A30: g/4) share of the power budget so that clocks and caps behave as on the whole GPU.
    """
    link = (spec.link_bandwidth_bytes_per_s or view.fabric_bytes_per_s) if view.link_count else 0.0
    out: list[tuple[DeviceInfo, DeviceModel]] = []
    parts = node.partitions
    for index in range(node.gpus):
        profiles = node.mig.get(index)
        if parts > 1:
            for p in range(parts):
                info = partition_info(seed, node.name, index, p, parts, node.amd.compute_partition, node.model, spec,
                                      counters)
                assert info.spec is not None
                dev = DeviceModel.from_spec(
                    info.spec, pcie_bytes_per_s=view.pcie_bytes_per_s / parts, link_bytes_per_s=link / parts,
                    net_bytes_per_s=NET_BYTES_PER_S / parts, mem_total_bytes=info.memory_total_bytes or 0)
                out.append((info, dev.share(1.0 / parts)))
            continue
        if not profiles:
            info = device_info(seed, node.name, index, node.model, spec, counters, vgpu=node.vgpu)
            out.append((info, DeviceModel.from_spec(
                spec, pcie_bytes_per_s=view.pcie_bytes_per_s, link_bytes_per_s=link,
                net_bytes_per_s=NET_BYTES_PER_S, mem_total_bytes=info.memory_total_bytes or 0)))
            continue
        for j, profile in node.mig_instances(index):
            info = mig_instance_info(seed, node.name, index, j, profile, node.model, spec, counters)
            parsed = parse_mig_profile(profile)
            assert parsed is not None and info.spec is not None
            dev = DeviceModel.from_spec(
                info.spec, pcie_bytes_per_s=view.pcie_bytes_per_s, link_bytes_per_s=0.0,
                net_bytes_per_s=NET_BYTES_PER_S, mem_total_bytes=info.memory_total_bytes or 0)
            out.append((info, dev.share(parsed[0] / mig_slices(node.model))))
    return out


def _job_layout(scenario: Scenario) -> tuple[dict[tuple[str, str], int], dict[str, int], dict[str, set[str]],
                                               dict[str, Workload]]:
    """Global ranks (node order, then the workload's GPU order), world sizes, nodes per job.

    A MIG instance is one rank, like a GPU; keys are GPU ids (``"3"``, ``"3/1"``).
    """
    ranks: dict[tuple[str, str], int] = {}
    world: dict[str, int] = {}
    nodes_of: dict[str, set[str]] = {}
    first: dict[str, Workload] = {}
    for node in scenario.nodes:
        for w in node.workloads:
            first.setdefault(w.job, w)
            nodes_of.setdefault(w.job, set()).add(node.name)
            for gpu in w.gpus:
                ranks[(node.name, str(gpu))] = world.get(w.job, 0)
                world[w.job] = world.get(w.job, 0) + 1
    return ranks, world, nodes_of, first


def _host_sources(node: Node, clocks: dict[str, JobClock]) -> list[IowaitSource]:
    """Per job on the node that has fetch-bound phases: its schedule and iowait per phase."""
    sources = []
    for w in node.workloads:
        levels = tuple(p.iowait if isinstance(p, InputStarvedPhase) else 0.0 for p in w.phases)
        if any(levels):
            sources.append((clocks[w.job].schedule, levels))
    return sources
