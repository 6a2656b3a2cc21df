"""The virtual GPU fleet: seeded, deterministic samples that respect each model's roofline.

:class:`VirtualEngine` turns a :class:`~agent.virtual.scenario.Scenario` into per-GPU samples
over any interval of *virtual* time (seconds since the scenario started). It is the agent's demo
(``roofwatch demo``), the source of labelled traces (``roofwatch record --simulate``) and the
test bed for the collector, classifier and exporters, so it has to be:

* **deterministic**: a sample is a function of (scenario, seed, node, GPU, interval) plus two
  small per-GPU accumulators (the energy counter and the lagging temperature);
* **consistent**: interval averages are computed in closed form from the phase pattern, so any
  sampling interval sees the same averages (ten 0.1 s samples agree with one 1 s sample);
* **physical**: achieved FLOP/s never exceeds the peak, power stays between idle and the
  enforced limit, a power cap lowers the clock and raises the ``sw_power_cap`` reason;
* **cheap**: a few tens of microseconds per sample, since it runs inside the agent loop.

A node's ``counters`` preset decides which fields a real backend could read (the others are
``None``, i.e. unknown); GPUs listed under ``mig`` are replaced by their MIG instances, each
simulated as a small GPU of its own (peaks scaled to its slice) without power or bus readings.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from agent.model import Attribution, DeviceInfo, GpuSample, GpuSpec, HostSample, ProcessSample
from agent.model.specs import spec_by_key
from agent.virtual.devices import (
    HIDDEN_FIELDS,
    MIG_HIDDEN_FIELDS,
    MIG_SLICES,
    NET_BYTES_PER_S,
    DriverView,
    default_counters,
    device_info,
    driver_view,
    mig_instance_info,
    parse_mig_profile,
    partition_info,
)
from agent.virtual.kinds import PhasePlan, Placement, compile_phase
from agent.virtual.physics import (
    DRAM_MAX,
    TENSOR_MAX,
    DeviceModel,
    State,
    clamp,
    hash_prefix,
    lagged_temperature_c,
    noise16,
    steady_temperature_c,
    unit_hash,
)
from agent.virtual.scenario import Fault, IdlePhase, InputStarvedPhase, Node, Scenario, Workload
from agent.virtual.timeline import JobClock, Occurrence, Schedule

_DRIVER_RESERVE = 512 * 1024**2
"""Device memory the driver and CUDA context take once any process is attached."""
_IDLE_PHASE = IdlePhase(kind="idle", duration_s=3600.0)
_DEFAULT_PROCESS = {"memory": "vllm", "latency": "vllm", "comm_jitter": "torchrun"}


@dataclass(slots=True)
class _GpuState:
    """The only history a GPU keeps: its energy counter and its (lagging) temperature."""

    energy_j: float
    temp_c: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(slots=True)
class _GpuPlan:
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
    blind: bool = False
    """No utilisation counters at all: even a perfect classifier can only say ``unknown``."""
    processes: dict[int, tuple[ProcessSample, ...]] = field(default_factory=dict)


class VirtualEngine:
    """Samples for every GPU of every node of a scenario, in virtual time."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._plans: dict[tuple[str, str], _GpuPlan] = {}
        self._devices: dict[str, list[DeviceInfo]] = {}
        self._host_sources: dict[str, list[tuple[Schedule, tuple[float, ...]]]] = {}
        self._host_keys = {n.name: hash_prefix(scenario.seed, n.name, "host") for n in scenario.nodes}
        self._host_cache: dict[str, tuple[int, HostSample]] = {}
        self._compile()
        self._state = self._fresh_state()

    # ------------------------------------------------------------------ public API

    @property
    def nodes(self) -> list[str]:
        return [n.name for n in self.scenario.nodes]

    def devices(self, node: str) -> list[DeviceInfo]:
        """Static identities of ``node``'s devices in index order (a MIG GPU by its instances)."""
        return list(self._devices[self._check_node(node)])

    def device(self, node: str, gpu: int | str) -> DeviceInfo:
        """The identity of one device: a GPU index or id (``3``, ``"3"``) or an instance (``"3/1"``)."""
        return self._plan(node, gpu).info

    def sample(self, node: str, gpu: int | str, t0: float, t1: float, *, ts: float | None = None,
               labelled: bool = False) -> GpuSample:
        """The interval-average sample of one GPU or MIG instance over virtual time [t0, t1).

        ``gpu`` is an index or a GPU id (``3``, ``"3"``, ``"3/1"``). Advances that device's energy
        counter and temperature, so call it with consecutive intervals as a collector would.
        ``labelled`` adds the true class (see :meth:`true_class`).
        """
        plan = self._plan(node, gpu)
        return self._sample(plan, self._state[(plan.node, plan.gpu)], t0, t1, t1 if ts is None else ts, labelled)

    def true_class(self, node: str, gpu: int | str, t: float) -> str:
        """Class label of the phase active at virtual time ``t`` (``idle`` before time 0).

        ``unknown`` on a node whose counter preset is ``minimal``: without utilisation counters
        no classifier can tell the classes apart, so that is the right answer there.
        """
        return _label(self._plan(node, gpu), t)

    def iter_trace(self, duration_s: float, interval_s: float = 1.0, *, start_ts: float = 0.0,
                   nodes: Sequence[str] | None = None) -> Iterator[GpuSample]:
        """Labelled samples for ``duration_s`` of virtual time, without sleeping.

        Ordered by time, then node, then GPU. Labels are the true class at the middle of each
        interval. Uses its own energy/temperature state, so it never disturbs live sampling.
        """
        if interval_s <= 0.0:
            raise ValueError("interval_s must be positive")
        names = [self._check_node(n) for n in (nodes if nodes is not None else self.nodes)]
        plans = [self._plans[(name, d.gpu)] for name in names for d in self._devices[name]]
        state = self._fresh_state()
        steps = int(math.floor(duration_s / interval_s + 1e-9))
        for k in range(1, steps + 1):
            t0, t1 = (k - 1) * interval_s, k * interval_s
            for plan in plans:
                yield self._sample(plan, state[(plan.node, plan.gpu)], t0, t1, start_ts + t1, True)

    def faults(self, node: str) -> list[Fault]:
        """The scenario's fault windows for ``node`` (used by the virtual backend)."""
        return list(self.scenario.node(self._check_node(node)).faults)

    # ------------------------------------------------------------------ compilation

    def _check_node(self, node: str) -> str:
        if node not in self._devices:
            raise KeyError(f"unknown node {node!r}; nodes: {', '.join(self.nodes)}")
        return node

    def _plan(self, node: str, gpu: int | str) -> _GpuPlan:
        gpu_id = str(gpu).strip()
        plan = self._plans.get((node, gpu_id))
        if plan is None:
            self._check_node(node)
            instances = [d.gpu for d in self._devices[node] if d.gpu.startswith(f"{gpu_id}/")]
            if instances:
                raise KeyError(f"GPU {gpu_id} of node {node!r} is in MIG mode; its instances: {', '.join(instances)}")
            raise KeyError(f"node {node!r} has no GPU {gpu!r}")
        return plan

    def _fresh_state(self) -> dict[tuple[str, str], _GpuState]:
        return {key: _GpuState(energy_j=plan.energy_offset_j) for key, plan in self._plans.items()}

    def _compile(self) -> None:
        seed = self.scenario.seed
        ranks, world, nodes_of, first = _job_layout(self.scenario)
        clocks = {job: JobClock(Schedule([p.duration_s for p in w.phases], w.repeat), w.phases,
                                hash_prefix(seed, "job", job)) for job, w in first.items()}
        for node in self.scenario.nodes:
            spec = spec_by_key(node.model)
            view = driver_view(node.model, spec)
            counters = node.counters or default_counters(node.model, spec.vendor)
            targets = _node_devices(seed, node, spec, view, counters)
            self._devices[node.name] = [info for info, _ in targets]
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
                plan = self._gpu_plan(node, info, dev, workload, where, clocks)
                # A MIG instance has no power or bus readings of its own. An AMD partition keeps
                # its share here: the fake libamd_smi sums the shares into partition 0's socket power.
                mig_instance = "/" in info.gpu and node.partitions == 1
                plan.hidden = HIDDEN_FIELDS[counters] + (MIG_HIDDEN_FIELDS if mig_instance else ())
                plan.blind = counters == "minimal"
                self._plans[(node.name, info.gpu)] = plan
            self._host_sources[node.name] = _host_sources(node, clocks)

    def _gpu_plan(self, node: Node, info: DeviceInfo, dev: DeviceModel, workload: Workload | None,
                  where: Placement, clocks: dict[str, JobClock]) -> _GpuPlan:
        seed = self.scenario.seed
        idle_where = Placement(rank=0, world=1, multi_node=False, peak_flops=0.0, clock=None)
        before = compile_phase(_IDLE_PHASE, dev, idle_where, None)
        if workload is None:
            schedule, plans = Schedule([_IDLE_PHASE.duration_s], True), (before,)
            dtype, name, job = None, "python", "-"
        else:
            schedule = clocks[workload.job].schedule
            plans = tuple(compile_phase(p, dev, where, workload.job) for p in workload.phases)
            dtype, job = workload.dtype, workload.job
            busy = [p.kind for p in workload.phases if not isinstance(p, IdlePhase)]
            name = workload.process or _DEFAULT_PROCESS.get(busy[0] if busy else "", "python")
        key = hash_prefix(seed, node.name, info.gpu)  # "3" hashes as 3 did: whole-GPU noise unchanged
        pid = 2000 + int(unit_hash(hash_prefix(seed, "pid", job, where.rank), node.name) * 4_000_000)
        if workload is not None and workload.pid is not None:
            pid = workload.pid
        return _GpuPlan(node=node.name, gpu=info.gpu, info=info, dev=dev, schedule=schedule, plans=plans,
                        before_start=before, dtype=dtype, pid=pid, process_name=name, noise_key=key,
                        energy_offset_j=1e6 + unit_hash(key, "energy") * 4e8,
                        attribution=Attribution(job_id=workload.job) if workload is not None else None)

    # ------------------------------------------------------------------ sampling

    def _sample(self, plan: _GpuPlan, state: _GpuState, t0: float, t1: float, ts: float,
                labelled: bool) -> GpuSample:
        dt = t1 - t0
        if not dt > 0.0:
            raise ValueError(f"empty interval [{t0}, {t1})")
        mix, end_plan, end_occ = _integrate(plan, t0, t1)
        act, clock, power, limit, reasons, temp_offset = mix
        dev = plan.dev
        n = noise16(plan.noise_key, t1)
        power = clamp(power + n[13] * (0.015 * (power - dev.idle_w) + 1.5), dev.idle_w, limit)
        if dev.idle_clock_mhz < clock < dev.max_clock_mhz:  # boost and idle clocks are exact bins
            clock *= 1.0 - 0.003 * abs(n[15])  # DVFS wobble, only ever downwards from where it was
        with state.lock:
            state.energy_j += power * dt
            state.temp_c = lagged_temperature_c(state.temp_c, steady_temperature_c(power, dev, temp_offset), dt)
            energy, temp = state.energy_j, state.temp_c
        processes = self._processes(plan, end_plan)
        used = sum(p.used_memory_bytes or 0 for p in processes)
        mem_used = min(dev.mem_total_bytes, used + _DRIVER_RESERVE) if processes else 0
        busy = end_plan.kind != "idle" and end_plan.kind != "idle_held"
        report = end_plan.report(end_occ, t1) if end_occ is not None else None
        values = dict(
            ts=ts, gpu=plan.info.gpu, node=plan.node, uuid=plan.info.uuid, vendor=plan.info.vendor,
            model=plan.info.model, interval_s=dt,
            gr_active=_ratio(act[0], 0.01 * n[0]),
            sm_active=_ratio(act[1], 0.02 * n[1]),
            sm_occupancy=_ratio(act[2], 0.03 * n[2]),
            tensor_active=_ratio(act[3], 0.015 * n[3], TENSOR_MAX),
            fp64_active=_ratio(act[4], 0.03 * n[4]),
            fp32_active=_ratio(act[5], 0.03 * n[5]),
            fp16_active=_ratio(act[6], 0.03 * n[6]),
            dram_active=_ratio(act[7], 0.02 * n[7], DRAM_MAX),
            pcie_tx_bytes_per_s=_rate(act[8], n[8], dev.pcie_bytes_per_s),
            pcie_rx_bytes_per_s=_rate(act[9], n[9], dev.pcie_bytes_per_s),
            link_tx_bytes_per_s=_rate(act[10], n[10], dev.link_bytes_per_s),
            link_rx_bytes_per_s=_rate(act[10], n[11], dev.link_bytes_per_s),
            net_tx_bytes_per_s=_rate(act[11], n[12], dev.net_bytes_per_s),
            net_rx_bytes_per_s=_rate(act[11], -n[12], dev.net_bytes_per_s),
            power_w=power, temperature_c=round(temp + 0.3 * n[14], 2),
            sm_clock_mhz=round(clock, 1), sm_clock_max_mhz=dev.max_clock_mhz,
            mem_used_bytes=mem_used, mem_total_bytes=dev.mem_total_bytes,
            clock_event_reasons=reasons, dtype=plan.dtype if busy else None,  # type: ignore[arg-type]
            processes=processes, host=self._host(plan.node, t1), workload=report,
            label=_label(plan, t0 + dt / 2) if labelled else None,
            energy_j=energy, power_limit_w=limit,
            attribution=plan.attribution,
        )
        values.update(_tensor_split(values["tensor_active"], plan.dtype))
        for name in plan.hidden:
            values[name] = None
        return GpuSample(**values)  # type: ignore[arg-type]

    def _processes(self, plan: _GpuPlan, phase: PhasePlan) -> tuple[ProcessSample, ...]:
        """The (cached, immutable) process list while ``phase`` runs: one process or none."""
        key = id(phase)
        cached = plan.processes.get(key)
        if cached is None:
            cached = ()
            if phase.holds_process:
                cached = (ProcessSample(pid=plan.pid, name=plan.process_name, used_memory_bytes=phase.process_bytes,
                                        cpu_cores=phase.cpu_cores, cpu_main_cores=phase.cpu_cores - phase.cpu_workers_cores,
                                        cpu_workers_cores=phase.cpu_workers_cores, workers=phase.workers),)
            plan.processes[key] = cached
        return cached

    def _host(self, node: str, t1: float) -> HostSample:
        """Node-wide iowait and I/O pressure: a quiet baseline plus what fetch-bound loaders cause."""
        tick = round(t1 * 1000.0)
        cached = self._host_cache.get(node)
        if cached is not None and cached[0] == tick:
            return cached[1]
        iowait = 0.004
        if t1 > 0.0:
            for schedule, levels in self._host_sources[node]:
                iowait += levels[schedule.locate(t1).index]
        n = noise16(self._host_keys[node], t1)
        iowait = clamp(iowait * (1.0 + 0.1 * n[0]))
        host = HostSample(cpu_iowait_ratio=round(iowait, 4), io_pressure_ratio=round(clamp(1.3 * iowait), 4))
        self._host_cache[node] = (tick, host)
        return host


# ---------------------------------------------------------------------- helpers


def _label(plan: _GpuPlan, t: float) -> str:
    """The true class at virtual time ``t``; ``unknown`` where no utilisation can be read."""
    if plan.blind:
        return "unknown"
    if t < 0.0:
        return plan.before_start.label
    return plan.plans[plan.schedule.locate(t).index].label


def _node_devices(seed: int, node: Node, spec: GpuSpec, view: DriverView, counters: str
                  ) -> list[tuple[DeviceInfo, DeviceModel]]:
    """Every device the node exposes, in index order: whole GPUs, a MIG GPU's instances, or an AMD
    GPU's compute partitions (each 1/N of the GPU: peaks, memory, host link, fabric and power budget).

    An instance is simulated as a small GPU: its own peaks (scaled spec), memory and a
    g/7 share of the power budget so that clocks and caps behave as on the whole GPU.
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
            info = device_info(seed, node.name, index, node.model, spec, counters)
            out.append((info, DeviceModel.from_spec(
                spec, pcie_bytes_per_s=view.pcie_bytes_per_s, link_bytes_per_s=link,
                net_bytes_per_s=NET_BYTES_PER_S, mem_total_bytes=info.memory_total_bytes or 0)))
            continue
        for j, profile in enumerate(profiles, start=1):
            info = mig_instance_info(seed, node.name, index, j, profile, node.model, spec, counters)
            parsed = parse_mig_profile(profile)
            assert parsed is not None and info.spec is not None
            dev = DeviceModel.from_spec(
                info.spec, pcie_bytes_per_s=view.pcie_bytes_per_s, link_bytes_per_s=0.0,
                net_bytes_per_s=NET_BYTES_PER_S, mem_total_bytes=info.memory_total_bytes or 0)
            out.append((info, dev.share(parsed[0] / MIG_SLICES)))
    return out


def _tensor_split(tensor: float | None, dtype: str | None) -> dict[str, float | None]:
    """GPM's per-pipe tensor activity: FP64 matrix math runs on DMMA, FP8/16/BF16/TF32 on HMMA."""
    if tensor is None:
        return {}
    fp64 = dtype == "fp64"
    return {"tensor_hmma_active": 0.0 if fp64 else tensor, "tensor_dmma_active": tensor if fp64 else 0.0,
            "tensor_imma_active": 0.0, "tensor_dfma_active": 0.0}


def _ratio(value: float, relative_noise: float, hi: float = 1.0) -> float:
    """A 0..hi ratio with multiplicative noise (zero stays zero), rounded to keep traces short."""
    return round(clamp(value * (1.0 + relative_noise), 0.0, hi), 4)


def _rate(util: float, noise: float, peak: float) -> float:
    """Whole bytes/s from a utilisation, with a little noise, never negative nor above 95% of peak."""
    return float(math.floor(clamp(util * (1.0 + 0.05 * noise), 0.0, 0.95) * peak))


def _integrate(plan: _GpuPlan, t0: float, t1: float
               ) -> tuple[tuple[list[float], float, float, float, int, float], PhasePlan, Occurrence | None]:
    """Time-average the states a GPU passes through in [t0, t1), phase by phase.

    Returns (activity, clock, power, highest limit, reasons, temperature offset), the phase
    plan at the end of the interval and its occurrence (None before the scenario starts).
    """
    pieces: list[tuple[State, float]] = []
    end_plan, end_occ = plan.before_start, None
    if t0 < 0.0:
        pieces.append((plan.before_start.weights(Occurrence(0, 0, -math.inf, 0.0), t0, min(t1, 0.0))[0]))
    t = max(t0, 0.0)
    while t < t1:
        occ = plan.schedule.locate(t)
        end = min(t1, occ.end)
        if end <= t:
            end = t1
        end_plan, end_occ = plan.plans[occ.index], occ
        pieces.extend(end_plan.weights(occ, t, end))
        t = end
    return _mix(pieces, t1 - t0), end_plan, end_occ


def _mix(pieces: list[tuple[State, float]], dt: float) -> tuple[list[float], float, float, float, int, float]:
    act = [0.0] * 12
    clock = power = temp = 0.0
    limit, reasons, top, top_w = 0.0, 0, 0, -1.0
    for state, w in pieces:
        if w <= 0.0:
            continue
        f = w / dt
        for i, v in enumerate(state.act):
            act[i] += f * v
        clock += f * state.clock_mhz
        power += f * state.power_w
        temp += f * state.temp_offset_c
        limit = max(limit, state.limit_w)
        if f >= 0.25:
            reasons |= state.reasons
        if w > top_w:
            top, top_w = state.reasons, w
    return act, clock, power, limit, reasons | top, temp


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


def _host_sources(node: Node, clocks: dict[str, JobClock]) -> list[tuple[Schedule, tuple[float, ...]]]:
    """Per job on the node that has fetch-bound phases: its schedule and iowait per phase."""
    sources = []
    for w in node.workloads:
        levels = tuple(p.iowait if isinstance(p, InputStarvedPhase) else 0.0 for p in w.phases)
        if any(levels):
            sources.append((clocks[w.job].schedule, levels))
    return sources
