"""The virtual runner: the simulated GPU of ``nvml-virtual`` plays each phase, read through the real NVML code.

The selftest writes its own workload into the scenario: on the GPU under test, one job whose
phases are the selftest's, each as the virtual fleet's nearest phase kind
(:mod:`agent.virtual.workloads`), laid out in time with an idle gap before each. The runner then
simply lets each phase's scheduled span pass; the backend samples it like any other GPU: the real
``pynvml`` over the fake ``libnvidia-ml`` (:mod:`agent.virtual.fake_nvml`), through the real
:class:`~agent.backends.nvml.NvmlBackend`, GPM two-sample reads and call counting included.

The rest of the node comes from ``--scenario`` (model, driver profile, other GPUs' jobs), so a
scenario with ``nvml: {gpm: false}`` shows how the selftest reports a node whose GPM is refused.
What a virtual phase "measured" is the simulation's configured truth (MFU x peak, MBU x bandwidth):
it checks the plumbing end to end, not the counters' physics.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from agent.backends.nvml_virtual import SimulatedHost, VirtualNvmlBackend
from agent.diagnostics.selftest.phases import STARVED_BURST_S, STARVED_LOADER_S, STREAM_WAIT_COMPUTE_S, Phase, lateness
from agent.diagnostics.selftest.runner import UsageError, Measured, PhaseWindow, RunnerUnavailable
from agent.diagnostics.selftest.sampler import PhaseReports, ReportingHost
from agent.model import GpuSpec
from agent.model.specs import spec_by_key
from agent.virtual.backend import VirtualBackend
from agent.virtual.clock import ManualClock
from agent.virtual.scenario import Scenario, ScenarioError, parse_scenario

DEFAULT_MODEL = "h100-sxm"
DEFAULT_GPUS = 8
"""Without ``--scenario``: one HGX H100 node, as ``roofwatch demo`` simulates."""
LEAD_S = 1.0
"""Idle before each phase's slot: the backend's probe, and a gap so no sample straddles two phases."""
HELD_GIB = 0.5
"""Device memory the selftest's process holds throughout (a CUDA context and its buffers)."""

_STARVED_DUTY = STARVED_BURST_S / STARVED_LOADER_S
_KINDS: dict[str, dict[str, Any]] = {
    "idle": {"kind": "idle_held", "mem_used_gib": HELD_GIB},
    "gemm_bf16": {"kind": "compute", "mfu": 0.9},
    "gemm_fp8": {"kind": "compute", "mfu": 0.9},
    "copy": {"kind": "memory", "mbu": 0.85},
    "tiny_kernels": {"kind": "latency", "sm": 0.25, "tensor": 0.0, "dram": 0.05},
    "starved": {"kind": "input_starved", "duty": _STARVED_DUTY, "busy_mfu": 0.6, "period_s": STARVED_LOADER_S,
                "dataloader_cpu_cores": 0.0, "loader_workers": 0},
    # A collective's wait as the fleet models it (agent.virtual.kinds.comm_wait_activity): resident, few
    # SMs, no tensor work; the step reports come from the runner, as on a GPU.
    "stream_wait": {"kind": "latency", "sm": 0.12, "tensor": 0.0, "dram": 0.04},
}
"""Each selftest phase as the virtual fleet's phase kind with the parameters it plays at."""


class VirtualRunner:
    """:class:`~agent.diagnostics.selftest.runner.PhaseRunner` that lets the simulated GPU play each phase."""

    name = "virtual"

    def __init__(self, virtual: VirtualBackend, spec: GpuSpec, starts: dict[str, float], real_time: bool) -> None:
        self.virtual = virtual
        self.spec = spec
        self.starts = starts
        """Virtual time each phase's slot starts at."""
        self.real_time = real_time

    def describe(self) -> str:
        scenario = self.virtual.engine.scenario
        pace = "in wall-clock time" if self.real_time else "in virtual time (no waiting)"
        return (f"virtual runner: the simulated {self.spec.key} of scenario {scenario.name!r} plays each phase {pace}; "
                "measured values are the simulation's configured truth")

    def skip_reason(self, phase: Phase) -> str | None:
        return virtual_skip_reason(phase, self.spec)

    def run(self, phase: Phase, seconds: float, window: PhaseWindow) -> Measured:
        start = self.virtual.start_time + self.starts[phase.name]
        window.wait(start - window.now())
        window.begin()
        end = start + seconds
        steps: list[float] = []
        if phase.name == "stream_wait":
            while window.now() + STREAM_WAIT_COMPUTE_S + lateness(len(steps)) <= end:
                took = STREAM_WAIT_COMPUTE_S + lateness(len(steps))
                window.wait(took)
                window.report(step=len(steps), step_time_s=took)
                steps.append(took)
        window.wait(end - window.now())
        window.end()
        return self._truth(phase, seconds, tuple(steps))

    def close(self) -> None:
        pass

    def _truth(self, phase: Phase, seconds: float, steps: tuple[float, ...]) -> Measured:
        kind = _KINDS[phase.name]
        source = "simulation: the virtual GPU's configured truth"
        if kind["kind"] == "compute":
            dtype = phase.dtype or "bf16"
            return Measured(seconds=seconds, flops=kind["mfu"] * self.spec.peak_flops[dtype] * seconds, dtype=dtype,
                            detail=f"simulated GEMM at MFU {kind['mfu']}", source=source)
        if kind["kind"] == "memory":
            bandwidth = self.spec.mem_bandwidth_bytes_per_s or 0.0
            return Measured(seconds=seconds, bytes=kind["mbu"] * bandwidth * seconds,
                            detail=f"simulated copy at MBU {kind['mbu']}", source=source)
        if phase.name == "starved":
            flops = kind["duty"] * kind["busy_mfu"] * self.spec.peak_flops.get("bf16", 0.0) * seconds
            return Measured(seconds=seconds, flops=flops, duty=kind["duty"], dtype="bf16", source=source,
                            detail=f"simulated loader-gated bursts, duty {kind['duty']:g}")
        what = "nothing running" if phase.name == "idle" else f"simulated {kind['kind']} phase"
        return Measured(seconds=seconds, steps=steps, source=source, detail=what)


def virtual_skip_reason(phase: Phase, spec: GpuSpec) -> str | None:
    if phase.dtype and not spec.peak_flops.get(phase.dtype):
        return f"the simulated {spec.key} has no {phase.dtype} peak in the catalogue (as the real GPU has no {phase.dtype} math)"
    return None


def scenario_node(base: Scenario, node: str | None) -> Any:
    """The scenario node to simulate: the one named, else the first."""
    names = [n.name for n in base.nodes]
    if node is not None and node not in names:
        raise UsageError(f"--virtual-node {node}: scenario {base.name!r} has node(s) {', '.join(names)}")
    return base.node(node) if node else base.nodes[0]


def selftest_scenario(base: Scenario | None, node: str | None, gpu: int, phases: Sequence[Phase],
                      seconds: float) -> tuple[Scenario, dict[str, float]]:
    """The node to simulate, with the selftest's job on ``gpu``; and each phase's start in virtual time.

    Without ``base``, an 8-GPU H100 SXM node with nothing else running. Otherwise the named (or first) node of ``base``, its
    other GPUs keeping their jobs when they still validate without the one under test.
    """
    if base is None:
        found: dict[str, Any] = {"name": "selftest-node", "model": DEFAULT_MODEL, "gpus": DEFAULT_GPUS}
        name, seed = "selftest", 0
    else:
        chosen = scenario_node(base, node)
        found = chosen.model_dump()
        name, seed = base.name, base.seed
        if gpu in chosen.mig:
            raise RunnerUnavailable(f"GPU {gpu} of scenario node {chosen.name!r} is in MIG mode; "
                                    "the selftest needs a whole GPU")
    if gpu >= found["gpus"]:
        raise UsageError(f"--gpu {gpu}: no such GPU; simulated node {found['name']!r} has GPUs 0-{found['gpus'] - 1}")
    gap = {"kind": "idle_held", "duration_s": LEAD_S, "mem_used_gib": HELD_GIB}
    timeline: list[dict[str, Any]] = []
    starts: dict[str, float] = {}
    t = 0.0
    for p in phases:
        timeline += [gap, {**_KINDS[p.name], "duration_s": seconds}]
        starts[p.name] = t + LEAD_S
        t += LEAD_S + seconds
    timeline.append({**gap, "duration_s": 3600.0})
    job = {"job": "roofwatch-selftest", "gpus": [gpu], "repeat": False, "process": "roofwatch", "phases": timeline}
    others = [w for w in found.get("workloads", []) if gpu not in w["gpus"] and str(gpu) not in map(str, w["gpus"])]
    for kept in (others, []):
        try:
            scenario = parse_scenario({"name": name, "seed": seed,
                                       "nodes": [{**found, "workloads": [*kept, job], "faults": found.get("faults", [])}]})
            return scenario, starts
        except ScenarioError:
            if not kept:
                raise
    raise AssertionError("unreachable")


def open_virtual_rig(base: Scenario | None, node: str | None, gpu: int, phases: Sequence[Phase], seconds: float,
                     interval_s: float, reports: PhaseReports, *, real_time: bool
                     ) -> tuple[VirtualNvmlBackend, VirtualRunner, Callable[[], float], Callable[[float], None] | None]:
    """(backend, runner, clock, advance): the real NVML backend over the fake driver playing the phases.

    ``advance`` is None in wall-clock mode (sample from a thread); otherwise it moves the manual clock.
    """
    model = scenario_node(base, node).model if base is not None else DEFAULT_MODEL
    spec = spec_by_key(model)
    runnable = [p for p in phases if virtual_skip_reason(p, spec) is None]
    scenario, starts = selftest_scenario(base, node, gpu, runnable, seconds)
    host = ReportingHost(reports)
    if real_time:
        virtual = VirtualBackend(scenario, interval_s=interval_s)
        backend = VirtualNvmlBackend(virtual, host=host, events=False)
        clock, advance = time.time, None
    else:
        manual = ManualClock(time.time())
        virtual = VirtualBackend(scenario, clock=manual, start_time=manual(), interval_s=interval_s)
        backend = VirtualNvmlBackend(virtual, host=host, events=False, clock=manual, wall=manual, sleep=manual.advance)
        clock, advance = manual, manual.advance
    host.inner = SimulatedHost(backend.library)  # the fake driver exists only now; discover() has not run yet
    return backend, VirtualRunner(virtual, spec, starts, real_time), clock, advance
