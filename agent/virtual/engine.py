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

This module is the engine's public face and its mutable state (per-device accumulators, the
host-facts cache); compiling a scenario into plans lives in :mod:`agent.virtual.plans` and the
per-sample arithmetic in :mod:`agent.virtual.sampling`.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

from agent.model import DeviceInfo, GpuSample, HostSample
from agent.virtual.nodes import Fault
from agent.virtual.physics import clamp, hash_prefix, noise16
from agent.virtual.plans import GpuPlan, compile_scenario, true_label
from agent.virtual.sampling import GpuState, sample_device
from agent.virtual.scenario import Scenario
from agent.virtual.serving.job import ServingJob


class VirtualEngine:
    """Samples for every GPU of every node of a scenario, in virtual time."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        fleet = compile_scenario(scenario)
        self._plans: dict[tuple[str, str], GpuPlan] = fleet.plans
        self._devices: dict[str, list[DeviceInfo]] = fleet.devices
        self._host_sources = fleet.host_sources
        self._serving = fleet.serving
        self._host_keys = {n.name: hash_prefix(scenario.seed, n.name, "host") for n in scenario.nodes}
        self._host_cache: dict[str, tuple[int, HostSample]] = {}
        self._state = self._fresh_state()
        self._boards: dict[tuple[str, str], list[GpuPlan]] = {}
        """A MIG GPU's instances' plans by (node, GPU index), found on first use (board_energy_j)."""

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
        return sample_device(plan, self._state[(plan.node, plan.gpu)], t0, t1, t1 if ts is None else ts, labelled,
                             self._host)

    def board_energy_j(self, node: str, index: int | str, t: float) -> float:
        """The board counter of GPU ``index`` in MIG mode at virtual time ``t``, as the hardware keeps it whatever
        the partitioning: what its instances drew (each up to its last sample) plus the idle draw of the compute
        slices no instance holds, each slice its share of the board's idle power as DeviceModel.share gives an
        instance its g/7 (A30: g/4). The fake driver's parent handle answers it; the virtual backend hands it
        with each instance's sample (``parent_energy_j``)."""
        plans = self._boards.get((node, str(index)))
        if plans is None:
            plans = self._boards.setdefault((node, str(index)), [
                p for (n, gpu), p in self._plans.items() if n == node and "/" in gpu and gpu.split("/")[0] == str(index)])
        if not plans:
            raise KeyError(f"node {node!r} has no GPU {index!r} in MIG mode")
        drawn = 0.0
        for plan in plans:
            state = self._state[(plan.node, plan.gpu)]
            with state.lock:
                drawn += state.energy_j
        held = sum(p.dev.power_share for p in plans)
        board_idle_w = plans[0].dev.idle_w / plans[0].dev.power_share
        return drawn + board_idle_w * max(0.0, 1.0 - held) * max(0.0, t)

    def true_class(self, node: str, gpu: int | str, t: float) -> str:
        """Class label of the phase active at virtual time ``t`` (``idle`` before time 0).

        ``unknown`` on a node whose counter preset is ``minimal``: without utilisation counters
        no classifier can tell the classes apart, so that is the right answer there.
        """
        return true_label(self._plan(node, gpu), t)

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
                yield sample_device(plan, state[(plan.node, plan.gpu)], t0, t1, start_ts + t1, True, self._host)

    def serving_jobs(self, node: str) -> list[ServingJob]:
        """The serving jobs of ``node`` (what its fake inference servers export; agent.virtual.serving)."""
        return list(self._serving[self._check_node(node)])

    def faults(self, node: str) -> list[Fault]:
        """The scenario's fault windows for ``node`` (used by the virtual backend)."""
        return list(self.scenario.node(self._check_node(node)).faults)

    # ------------------------------------------------------------------ lookup and state

    def _check_node(self, node: str) -> str:
        if node not in self._devices:
            raise KeyError(f"unknown node {node!r}; nodes: {', '.join(self.nodes)}")
        return node

    def _plan(self, node: str, gpu: int | str) -> GpuPlan:
        gpu_id = str(gpu).strip()
        plan = self._plans.get((node, gpu_id))
        if plan is None:
            self._check_node(node)
            instances = [d.gpu for d in self._devices[node] if d.gpu.startswith(f"{gpu_id}/")]
            if instances:
                raise KeyError(f"GPU {gpu_id} of node {node!r} is in MIG mode; its instances: {', '.join(instances)}")
            raise KeyError(f"node {node!r} has no GPU {gpu!r}")
        return plan

    def _fresh_state(self) -> dict[tuple[str, str], GpuState]:
        return {key: GpuState(energy_j=plan.energy_offset_j) for key, plan in self._plans.items()}

    # ------------------------------------------------------------------ host facts

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
