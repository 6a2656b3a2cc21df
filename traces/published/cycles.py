"""Step-cycle traces (traces/published/sources.yaml `kind: step_cycles`): synchronous multi-GPU training
drawn from PUBLISHED counter values, second by second, on one step clock per job.

Synchronous data-parallel or MoE training alternates, every step, a compute part and an exposed
communication part (the part of the collective not hidden behind compute), and all ranks of a job run
in lockstep: they share the step boundaries and the compute/communication split. A phase's `cycle`
gives the clock: each step's compute part is drawn around mean_s x (1 - comm_share) with a small CV
(compute_cv), its communication part around mean_s x comm_share with the rest of the step-time CV (cv),
the step clipped to bounds_s. A 1 s sample covers one second of that clock; with f the share of the
second spent communicating, every counter of the sample is f x (a draw from `fields_comm`) +
(1 - f) x (a draw from `fields_compute`): counters average over their interval. `tail` puts a step's
communication in one block at its end (the exposed all-reduce after backward); `interleaved` spreads it
evenly over the step (an MoE layer's all-to-alls, milliseconds each, many per step). `fields` are drawn
plainly: temperature, memory held and CPU do not follow a one-second split.

Every rank draws its own values (its own random stream) on the job's shared clock. build.py calls
:func:`check_phase` from load_table and :func:`generate` for these traces, passing its own helpers
(parse_field, the draw, the rounding, the uuid, TableError) so that the table rules are the same.
"""

from __future__ import annotations

import bisect
import math
import random
from types import SimpleNamespace
from typing import Any

from agent.model import GpuSample, ProcessSample, WorkloadReport

LAYOUTS = ("tail", "interleaved")
SCALARS = ("mean_s", "cv", "compute_cv", "comm_share")
REPORTS = ("steps", "nostep", "none")
_CYCLE_KEYS = {"layout", "bounds_s", *SCALARS}


def check_phase(h: SimpleNamespace, table: dict[str, Any], where: str, spec: dict[str, Any]) -> None:
    """The step-cycle parts of one phase, checked by the rules of plain fields (build.parse_field)."""
    compute, comm = spec.get("fields_compute", {}), spec.get("fields_comm", {})
    for part, fields in (("fields_compute", compute), ("fields_comm", comm)):
        for key, field in fields.items():
            h.parse_field(table, f"{where}/{part}/{key}", field)
    if set(compute) != set(comm):
        raise h.TableError(f"{where}: fields_compute and fields_comm must name the same fields, "
                           f"differ in {sorted(set(compute) ^ set(comm))}")
    both = set(compute) & set(spec.get("fields", {}))
    if both:
        raise h.TableError(f"{where}: {sorted(both)} drawn both plainly (fields) and mixed (fields_compute)")
    if (compute or "cycle" in spec) and not (compute and "cycle" in spec):
        raise h.TableError(f"{where}: a mixed phase needs both cycle and fields_compute/fields_comm")
    if "cycle" in spec:
        parse_cycle(h, table, f"{where}/cycle", spec["cycle"])


def parse_cycle(h: SimpleNamespace, table: dict[str, Any], where: str, cycle: dict[str, Any]) -> dict[str, Any]:
    """{layout, mean_s, cv, compute_cv, comm_share, lo, hi} of one cycle, each number with its source."""
    if not isinstance(cycle, dict) or set(cycle) != _CYCLE_KEYS:
        got = sorted(cycle) if isinstance(cycle, dict) else cycle
        raise h.TableError(f"{where}: expected the keys {sorted(_CYCLE_KEYS)}, got {got!r}")
    if cycle["layout"] not in LAYOUTS:
        raise h.TableError(f"{where}/layout: expected one of {LAYOUTS}, got {cycle['layout']!r}")
    out: dict[str, Any] = {"layout": cycle["layout"]}
    for name in SCALARS:
        entry = cycle[name]
        if not isinstance(entry, list) or len(entry) != 2:
            raise h.TableError(f"{where}/{name}: expected [value, source], got {entry!r}")
        out[name] = h.parse_field(table, f"{where}/{name}", [entry[0], entry[0], entry[1]])[0]
    out["lo"], out["hi"] = h.parse_field(table, f"{where}/bounds_s", cycle["bounds_s"])[:2]
    if not 0.0 < out["comm_share"] < 1.0:
        raise h.TableError(f"{where}/comm_share: {out['comm_share']} is not a share between 0 and 1")
    if not 0.0 <= out["compute_cv"] < out["cv"]:
        raise h.TableError(f"{where}/compute_cv: {out['compute_cv']} must lie in [0, cv={out['cv']})")
    if not out["lo"] <= out["mean_s"] <= out["hi"]:
        raise h.TableError(f"{where}/mean_s: {out['mean_s']} outside bounds_s [{out['lo']}, {out['hi']}]")
    return out


def _lognormal(rng: random.Random, mean: float, cv: float) -> float:
    if cv <= 0.0:
        return mean
    sigma = math.sqrt(math.log(1.0 + cv * cv))
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2.0, sigma)


class CycleClock:
    """One job's steps in one phase (phase-relative seconds): (start, compute_s, comm_s), in order.
    Steps that end inside the phase get consecutive ids from ``first_id``; the one the phase change cuts
    off gets none. With ``lead_in`` the first step ends at 0, so a report exists from the first second."""

    def __init__(self, rng: random.Random, cyc: dict[str, Any], horizon: float, first_id: int,
                 lead_in: bool = False) -> None:
        mean, share = cyc["mean_s"], cyc["comm_share"]
        compute_mean, comm_mean = mean * (1.0 - share), mean * share
        # The communication part carries the step-time variance the compute part leaves over.
        comm_sd = math.sqrt(max((cyc["cv"] * mean) ** 2 - (cyc["compute_cv"] * compute_mean) ** 2, 0.0))
        self.layout = cyc["layout"]
        self.starts: list[float] = []
        self.compute: list[float] = []
        self.comm: list[float] = []
        t = 0.0
        while t < horizon:
            c = _lognormal(rng, compute_mean, cyc["compute_cv"])
            m = _lognormal(rng, comm_mean, comm_sd / comm_mean)
            m = min(max(m, cyc["lo"] - c, 0.0), max(cyc["hi"] - c, 0.0))
            if lead_in and not self.starts:
                t = -(c + m)
            self.starts.append(t)
            self.compute.append(c)
            self.comm.append(m)
            t += c + m
        self.ends = [s + c + m for s, c, m in zip(self.starts, self.compute, self.comm)]
        done = bisect.bisect_right(self.ends, horizon)
        self.ids = [first_id + i for i in range(done)]
        self.next_id = first_id + done

    def comm_fraction(self, a: float, b: float) -> float:
        """The share of [a, b) this job spends in its communication parts."""
        total = 0.0
        for i in range(max(0, bisect.bisect_right(self.ends, a)), len(self.starts)):
            start, end = self.starts[i], self.ends[i]
            if start >= b:
                break
            if self.layout == "tail":
                total += max(0.0, min(b, end) - max(a, start + self.compute[i]))
            elif end > start:
                total += max(0.0, min(b, end) - max(a, start)) * self.comm[i] / (end - start)
        return min(1.0, total / (b - a))

    def last(self, t: float) -> tuple[int, float] | None:
        """(id, length) of the last step completed by phase time ``t``; None before the first."""
        i = bisect.bisect_right(self.ends, t, hi=len(self.ids)) - 1
        return (self.ids[i], self.ends[i] - self.starts[i]) if i >= 0 else None


def _parsed(h: SimpleNamespace, table: dict[str, Any], spec: dict[str, Any]) -> tuple[list, list]:
    plain = [(key, h.parse_field(table, key, field)) for key, field in spec["fields"].items()]
    mixed = [(key, h.parse_field(table, key, field), h.parse_field(table, key, spec["fields_comm"][key]))
             for key, field in spec["fields_compute"].items()]
    return plain, mixed


def _sample(h: SimpleNamespace, table: dict[str, Any], job: dict[str, Any], spec: dict[str, Any],
            parsed: tuple[list, list], rng: random.Random, *, node: str, index: int, rank: int, world: int,
            ts: float, f: float, last: tuple[int, float] | None) -> GpuSample:
    g = table["gpus"][job["gpu"]]
    values: dict[str, float] = {}
    plain, mixed = parsed
    for key, (lo, hi, _, uniform) in plain:
        values[key] = h.round(key, h.draw(rng, lo, hi, uniform))
    for key, (lo_c, hi_c, _, uni_c), (lo_m, hi_m, _, uni_m) in mixed:
        compute, comm = h.draw(rng, lo_c, hi_c, uni_c), h.draw(rng, lo_m, hi_m, uni_m)
        values[key] = h.round(key, f * comm + (1.0 - f) * compute)
    total = int(g["mem_total_bytes"])
    used = int(values.get("mem_used_frac", 0.0) * total)
    process = ProcessSample(pid=20000 + 97 * index + sum(map(ord, node)), name=spec["process"],
                            used_memory_bytes=used, cpu_cores=values.get("process.cpu_cores"))
    w, report = spec["workload"], job["report"]
    workload = None
    if report != "none" and last is not None:
        step, length = last
        workload = WorkloadReport(job=job["job"], rank=rank, world_size=world, step=step if report == "steps" else None,
                                  step_time_s=round(length, 4), tokens_per_s=round(float(w["tokens_per_step"]) / length, 1),
                                  flops_per_token=float(w["flops_per_token"]), dtype=w["dtype"])
    plain_fields = {k: v for k, v in values.items() if "." not in k and k != "mem_used_frac"}
    return GpuSample(
        ts=ts, gpu=str(index), node=node, uuid=h.uuid(node, str(index)), vendor=g["vendor"], model=g["model"],
        interval_s=1.0, **plain_fields, sm_clock_max_mhz=float(g["sm_clock_max_mhz"]), mem_used_bytes=used,
        mem_total_bytes=total, clock_event_reasons=0 if g["vendor"] == "nvidia" else None,
        dtype=w["dtype"] if report != "none" else None, processes=(process,), workload=workload,
        label=spec["label"], power_limit_w=float(g["power_limit_w"]))


def generate(h: SimpleNamespace, table: dict[str, Any], name: str) -> list[tuple[str, GpuSample]]:
    """Every sample of step-cycle trace ``name`` with its ``group/phase``, in (ts, node, gpu) order."""
    trace = table["traces"][name]
    seed, phase_s, order = int(trace["seed"]), int(trace["phase_s"]), list(trace["order"])
    out: list[tuple[str, GpuSample]] = []
    for job in trace["jobs"]:
        if job["report"] not in REPORTS:
            raise h.TableError(f"{name}/{job['job']}: report must be one of {REPORTS}, got {job['report']!r}")
        group, world = job["phases"], len(job["nodes"]) * int(job["gpus"])
        phases, next_id, carry = [], 0, None
        for p, phase in enumerate(order):
            spec = table["phases"][group][phase]
            cyc = parse_cycle(h, table, f"{group}/{phase}/cycle", spec["cycle"])
            clock = CycleClock(random.Random(f"{seed}/{job['job']}/{phase}"), cyc, phase_s, next_id, lead_in=p == 0)
            phases.append((phase, spec, _parsed(h, table, spec), clock, carry))
            next_id, carry = clock.next_id, clock.last(phase_s) or carry
        for n, node in enumerate(job["nodes"]):
            for index in range(int(job["gpus"])):
                rng = random.Random(f"{seed}/{node}/{index}")
                for p, (phase, spec, parsed, clock, carry) in enumerate(phases):
                    for second in range(phase_s):
                        sample = _sample(h, table, job, spec, parsed, rng, node=node, index=index,
                                         rank=n * int(job["gpus"]) + index, world=world,
                                         ts=h.T0 + p * phase_s + second + 1.0, f=clock.comm_fraction(second, second + 1.0),
                                         last=clock.last(second + 1.0) or carry)
                        out.append((f"{group}/{phase}", sample))
    out.sort(key=lambda item: (item[1].ts, item[1].node, int(item[1].gpu)))
    return out
