"""The counter signature of each workload kind, and how its time splits between states.

Each phase of a GPU is compiled once into a :class:`PhasePlan`: a few steady operating points
(:class:`~agent.virtual.physics.State`, physics already applied) plus a rule saying how many
seconds of any interval each state occupies. Sampling an interval is then a weighted average of
precomputed states, which is both exact for periodic patterns and cheap.

Signatures follow classification.md §5 (hypotheses there, since few rows are measured):
large GEMM GR~1, SM~1, tensor up to 0.93; decode DRAM 0.45-0.6 with tensor <= 0.1; training at
40% MFU tensor ~0.4-0.6 and DRAM 0.2-0.4; NCCL wait GR~1, SM 0.1-0.2, tensor ~0; loader-starved
GR 0.4-0.7 in bursts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agent.model import WorkloadReport
from agent.model.specs import clock_factor
from agent.virtual.devices import GIB
from agent.virtual.physics import (
    DRAM_MAX,
    IDLE_ACTIVITY,
    TENSOR_MAX,
    Activity,
    DeviceModel,
    State,
    clamp,
    make_state,
)
from agent.virtual.timeline import JobClock, Occurrence, periodic_on_time
from agent.virtual.workloads import (
    KIND_CLASS,
    CommJitterPhase,
    ComputePhase,
    IdlePhase,
    InputStarvedPhase,
    LatencyPhase,
    MemoryPhase,
)

# Default device-memory share each kind holds when the phase does not say (vLLM preallocates 90%).
_MEM_SHARE = {"compute": 0.70, "memory": 0.90, "input_starved": 0.55, "comm_jitter": 0.75,
              "latency": 0.35, "idle_held": 0.30}
_BURST_SHARE = 0.12
"""Share of each loader period spent copying the next batch over PCIe, at its start."""
_BURST_PCIE = 0.35


# ----------------------------------------------------------------------------- signatures


def compute_activity(mfu: float, dev: DeviceModel, *, multi_gpu: bool) -> Activity:
    """GEMM / training: tensor set so that achieved FLOP/s = mfu x peak at the unthrottled clock."""
    return Activity(
        gr=0.99, sm=0.96 + 0.03 * min(1.0, mfu), occ=0.30 + 0.2 * (1.0 - mfu),
        tensor=min(TENSOR_MAX, mfu * dev.tensor_scale),
        fp32=0.06 + 0.10 * (1.0 - mfu), fp16=0.03,
        dram=clamp(0.34 - 0.25 * mfu, 0.12, 0.30),
        pcie_tx=0.002, pcie_rx=0.004, link=0.08 if multi_gpu else 0.0,
    )


def memory_activity(mbu: float, *, multi_gpu: bool) -> Activity:
    """Bandwidth-bound decode: DRAM at mbu, tensor pipes at most 0.1, SM moderately filled."""
    return Activity(
        gr=0.99, sm=0.5 + 0.25 * mbu, occ=0.55 + 0.2 * mbu, tensor=0.02 + 0.08 * mbu,
        fp32=0.12, fp16=0.05, dram=min(DRAM_MAX, mbu),
        pcie_tx=0.003, pcie_rx=0.003, link=0.05 if multi_gpu else 0.0,
    )


LATENCY_ACTIVITY = Activity(gr=0.9, sm=0.28, occ=0.12, tensor=0.1, fp32=0.06, fp16=0.03, dram=0.15,
                            pcie_tx=0.01, pcie_rx=0.01)
"""Small kernels and launch gaps: resident most of the time, neither roof near."""


def latency_activity(phase: LatencyPhase) -> Activity:
    """:data:`LATENCY_ACTIVITY` with the phase's SM / tensor / DRAM overrides (GR stays 0.9).

    Occupancy and the FP pipes cannot exceed SM activity (they are measured on active SMs), so
    they are held at or below it; with the defaults the signature is exactly the constant.
    """
    base = LATENCY_ACTIVITY
    return base._replace(sm=phase.sm, tensor=phase.tensor, dram=phase.dram, occ=min(base.occ, phase.sm),
                         fp32=min(base.fp32, phase.sm), fp16=min(base.fp16, phase.sm))


def comm_wait_activity(*, multi_node: bool) -> Activity:
    """NCCL kernels spinning while peers catch up: GR~1, SM low, tensor 0, links nearly idle."""
    return Activity(gr=0.99, sm=0.12, occ=0.05, fp32=0.01, dram=0.04, link=0.02,
                    net=0.01 if multi_node else 0.0)


def comm_transfer_activity(link_util: float, *, multi_node: bool) -> Activity:
    """The collective moving data: links busy, reduction kernels on few SMs."""
    return Activity(gr=1.0, sm=0.18, occ=0.08, fp32=0.03, dram=0.12, link=link_util,
                    net=min(0.9, link_util) if multi_node else 0.0)


# ----------------------------------------------------------------------------- plans


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a GPU sits in its job, and what it computes against."""

    rank: int
    world: int
    multi_node: bool
    peak_flops: float
    clock: JobClock | None


class PhasePlan:
    """A compiled phase on one GPU: its states and how an interval divides among them."""

    def __init__(self, phase: Any, dev: DeviceModel, where: Placement) -> None:
        self.phase = phase
        self.kind: str = phase.kind
        self.label: str = KIND_CLASS[phase.kind]
        self.dev = dev
        self.where = where
        self.holds_process = not (isinstance(phase, IdlePhase) and not phase.holds_memory)
        share_key = "idle_held" if isinstance(phase, IdlePhase) else phase.kind
        gib = phase.mem_used_gib
        self.process_bytes = int(gib * GIB) if gib is not None else int(_MEM_SHARE.get(share_key, 0.0) * dev.mem_total_bytes)
        self.cpu_cores = 0.02 if isinstance(phase, IdlePhase) else 1.0
        self.cpu_workers_cores = 0.0
        """Part of ``cpu_cores`` burnt by loader workers (child processes); the rest is the main process."""
        self.workers = 0

    def state_kw(self) -> dict[str, Any]:
        return {"power_cap_w": self.phase.power_cap_w, "thermal": self.phase.thermal}

    def weights(self, occ: Occurrence, a: float, b: float) -> list[tuple[State, float]]:
        raise NotImplementedError

    def report(self, occ: Occurrence, t: float) -> WorkloadReport | None:
        return None

    def _report(self, step: int, step_time_s: float, tokens_per_s: float, flops_per_token: float,
                job: str) -> WorkloadReport:
        w = self.where
        return WorkloadReport(job=job, rank=w.rank, world_size=w.world, step=step, step_time_s=step_time_s,
                              tokens_per_s=tokens_per_s, flops_per_token=flops_per_token)

    def clock_factor(self, state: State) -> float:
        """Achieved FLOP/s falls with the clock once it is below the peak's reference clock."""
        return clock_factor(state.clock_mhz, self.dev.ref_clock_mhz)


class SteadyPlan(PhasePlan):
    """One state for the whole phase: compute, memory, latency, idle."""

    def __init__(self, phase: Any, dev: DeviceModel, where: Placement, job: str | None) -> None:
        super().__init__(phase, dev, where)
        self.job = job
        multi = where.world > 1
        if isinstance(phase, ComputePhase):
            self.state = make_state(compute_activity(phase.mfu, dev, multi_gpu=multi), dev, **self.state_kw())
        elif isinstance(phase, MemoryPhase):
            self.state = make_state(memory_activity(phase.mbu, multi_gpu=multi), dev, **self.state_kw())
            self.cpu_cores = 1.1
        elif isinstance(phase, IdlePhase):
            self.state = make_state(IDLE_ACTIVITY, dev, mode="idle", **self.state_kw())
        else:
            self.state = make_state(latency_activity(phase), dev, **self.state_kw())

    def weights(self, occ: Occurrence, a: float, b: float) -> list[tuple[State, float]]:
        return [(self.state, b - a)]

    def report(self, occ: Occurrence, t: float) -> WorkloadReport | None:
        p = self.phase
        if not isinstance(p, ComputePhase) or self.job is None or self.where.clock is None:
            return None
        if p.tokens_per_s is None and p.flops_per_token is None:
            return None
        job_flops = self.where.world * p.mfu * self.where.peak_flops * self.clock_factor(self.state)
        if p.flops_per_token is not None:
            fpt = p.flops_per_token
            tokens = p.tokens_per_s if p.tokens_per_s is not None else job_flops / fpt
        else:
            tokens = p.tokens_per_s or 1.0
            fpt = job_flops / tokens
        step = self._step(occ, t, p.step_s)
        return self._report(step, p.step_s, tokens, fpt, self.job)

    def _step(self, occ: Occurrence, t: float, period: float) -> int:
        clock = self.where.clock
        assert clock is not None
        with clock.lock:
            before = clock.steps_before(occ.occ_id)
        return before + max(0, math.floor((t - occ.start) / period))


class InputStarvedPlan(SteadyPlan):
    """Busy bursts of ``duty x period`` (PCIe copy at their start), then an idle gap."""

    def __init__(self, phase: InputStarvedPhase, dev: DeviceModel, where: Placement, job: str) -> None:
        PhasePlan.__init__(self, phase, dev, where)
        self.job = job
        busy = compute_activity(phase.busy_mfu, dev, multi_gpu=where.world > 1)
        self.busy = make_state(busy, dev, **self.state_kw())
        burst_act = busy._replace(pcie_rx=_BURST_PCIE)
        self.burst = self.busy._replace(act=burst_act)
        self.gap = make_state(IDLE_ACTIVITY, dev, mode="gap", clock_of=self.busy, **self.state_kw())
        self.state = self.busy
        self.cpu_cores = 1.0 + phase.dataloader_cpu_cores
        self.cpu_workers_cores = phase.dataloader_cpu_cores
        self.workers = phase.loader_workers if phase.loader_workers is not None else max(1, round(phase.dataloader_cpu_cores))
        self.busy_len = phase.duty * phase.period_s
        self.burst_len = min(_BURST_SHARE, phase.duty) * phase.period_s

    def weights(self, occ: Occurrence, a: float, b: float) -> list[tuple[State, float]]:
        p = self.phase
        la, lb = a - occ.start, b - occ.start
        busy = periodic_on_time(la, lb, p.period_s, 0.0, self.busy_len)
        burst = periodic_on_time(la, lb, p.period_s, 0.0, self.burst_len)
        return [(self.burst, burst), (self.busy, busy - burst), (self.gap, (b - a) - busy)]

    def report(self, occ: Occurrence, t: float) -> WorkloadReport | None:
        p = self.phase
        flops = self.where.world * p.duty * p.busy_mfu * self.where.peak_flops * self.clock_factor(self.busy)
        step = self._step(occ, t, p.period_s)
        assert self.job is not None
        return self._report(step, p.period_s, flops / p.flops_per_token, p.flops_per_token, self.job)


class CommJitterPlan(PhasePlan):
    """Compute, wait for the slowest rank (and any stall), then transfer; shared step clock."""

    def __init__(self, phase: CommJitterPhase, dev: DeviceModel, where: Placement, job: str) -> None:
        super().__init__(phase, dev, where)
        self.job = job
        kw = self.state_kw()
        self.compute = make_state(compute_activity(phase.mfu, dev, multi_gpu=True), dev, **kw)
        self.wait = make_state(comm_wait_activity(multi_node=where.multi_node), dev, **kw)
        self.transfer = make_state(comm_transfer_activity(phase.link_util, multi_node=where.multi_node), dev, **kw)

    def weights(self, occ: Occurrence, a: float, b: float) -> list[tuple[State, float]]:
        clock = self.where.clock
        assert clock is not None
        with clock.lock:
            c, w, x = clock.table(occ.occ_id).weights(a - occ.start, b - occ.start, self.where.rank)
        return [(self.compute, c), (self.wait, w), (self.transfer, x)]

    def report(self, occ: Occurrence, t: float) -> WorkloadReport | None:
        p = self.phase
        clock = self.where.clock
        assert clock is not None
        with clock.lock:
            table = clock.table(occ.occ_id)
            k = table.step_at(t - occ.start)
            step_time = table.duration(max(0, k - 1))
            before = clock.steps_before(occ.occ_id)
        flops_per_step = self.where.world * p.mfu * self.where.peak_flops * p.compute_s * self.clock_factor(self.compute)
        tokens = flops_per_step / p.flops_per_token / step_time
        return self._report(before + k, step_time, tokens, p.flops_per_token, self.job)


def compile_phase(phase: Any, dev: DeviceModel, where: Placement, job: str | None) -> PhasePlan:
    """The plan for one phase of one GPU."""
    if isinstance(phase, InputStarvedPhase):
        assert job is not None
        return InputStarvedPlan(phase, dev, where, job)
    if isinstance(phase, CommJitterPhase):
        assert job is not None
        return CommJitterPlan(phase, dev, where, job)
    return SteadyPlan(phase, dev, where, job)
