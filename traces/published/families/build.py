"""Labelled traces of roofwatch issue 44's four situations, drawn from PUBLISHED counter semantics.

A situation (a family: quiet after a burst, a periodic checkpoint, a straggler seen through NVML alone, an
MoE job's waits seen through amdsmi alone) is played as a timeline of states per GPU, and each 1 s sample
reads the timeline the way the GPU's library reads its counters (families.yaml, `readers` and `traces`):

* NVML's utilization.gpu and utilization.memory cover the last sample period, 1 s or 1/6 s depending on the
  product (nvmlUtilization_t), so at 1/6 s a read that lands in a wait reads the wait alone;
* NVML power is a snapshot of the last ~25 ms on GA100 (A100) and H100, a 1 s average on newer parts;
* GPM metrics, byte counters (PCIe, NVLink, XGMI) and host figures cover the whole interval;
* clocks and clock-event reasons are read at the sample's instant.

Each state's levels are drawn per segment inside the ranges families.yaml cites, so every step, cell and
expert block differs a little, as real ones do. Nothing here imports agent/virtual or agent/classifier: only
the model types and the trace writer, with ../build.py's range rules (a source or a "not published" reason).

    python traces/published/families/build.py --write    # regenerate the *.jsonl.gz files
    python traces/published/families/build.py --check    # exit 1 when a shipped file differs
"""

from __future__ import annotations

import argparse
import bisect
import importlib.util
import math
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import yaml

from agent.model import Attribution, GpuSample, HostSample, ProcessSample, WorkloadReport
from agent.trace.writer import TraceWriter

HERE = Path(__file__).resolve().parent
TABLE = HERE / "families.yaml"
PARENT = HERE.parent / "sources.yaml"
T0 = 1_820_000_000.0
"""Start of every trace (Unix seconds); fixed so the files are byte-for-byte reproducible."""
INTERVAL_S = 1.0
SNAPSHOT_S = 0.01
"""What a read "at the instant" covers: clocks and clock-event reasons."""
GPUS_PER_NODE = 8
REPORTS = ("steps", "nostep", "job", "slurm", "none")
LIBRARY_FIELDS: dict[str, frozenset[str]] = {
    # What each library gives: NVML alone has no SM, tensor or DRAM-bandwidth counter (utilization.memory is
    # mem_busy); GPM adds them and no utilization.memory; amdsmi reads gfx and UMC activity, PCIe in both
    # directions together and no NVML clock-event bitmask.
    "nvml": frozenset({"gr_active", "mem_busy", "power_w", "sm_clock_mhz", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
                       "link_tx_bytes_per_s", "link_rx_bytes_per_s"}),
    "gpm": frozenset({"gr_active", "sm_active", "tensor_active", "dram_active", "power_w", "sm_clock_mhz",
                      "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "link_tx_bytes_per_s", "link_rx_bytes_per_s"}),
    "amdsmi": frozenset({"gr_active", "dram_active", "power_w", "sm_clock_mhz", "pcie_bytes_per_s",
                         "link_tx_bytes_per_s", "link_rx_bytes_per_s"}),
}
UTIL_FIELDS = frozenset({"gr_active", "mem_busy"})
"""Read over the utilization sample period (NVML utilization.*, amdsmi's averaged activity)."""
INTERVAL_FIELDS = frozenset({"sm_active", "tensor_active", "dram_active", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
                             "pcie_bytes_per_s", "link_tx_bytes_per_s", "link_rx_bytes_per_s"})
"""Read over the whole interval: GPM metrics between two GPM samples, cumulative byte counters."""


def _load_parent() -> ModuleType:
    spec = importlib.util.spec_from_file_location("published_build_for_families", HERE.parent / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


parent = _load_parent()
TableError = parent.TableError


def load_table(path: Path = TABLE) -> dict[str, Any]:
    """The families table, every range checked against the sources of both tables (ours and ../sources.yaml)."""
    with open(path, encoding="utf-8") as fh:
        table = yaml.safe_load(fh)
    with open(PARENT, encoding="utf-8") as fh:
        outer = yaml.safe_load(fh)
    table["gpus"] = outer["gpus"]
    table["all_sources"] = {**outer["sources"], **table["sources"]}
    check = {"sources": table["all_sources"]}
    for name, state in table["states"].items():
        for key, rng in state["fields"].items():
            parent.parse_field(check, f"states/{name}/{key}", rng)
    for name, reader in table["readers"].items():
        for key, rng in reader.items():
            if key != "library":
                parent.parse_field(check, f"readers/{name}/{key}", rng)
        if reader["library"] not in LIBRARY_FIELDS:
            raise TableError(f"readers/{name}: unknown library {reader['library']!r}")
    for name, sig in table["signatures"].items():
        if sig["program"] not in PROGRAMS:
            raise TableError(f"signatures/{name}: unknown program {sig['program']!r}")
        for role, state in sig["roles"].items():
            if state not in table["states"]:
                raise TableError(f"signatures/{name}/roles/{role}: no state {state!r}")
        for key, rng in sig["params"].items():
            parent.parse_field(check, f"signatures/{name}/params/{key}", rng)
    for name, trace in table["traces"].items():
        for i, run in enumerate(trace["runs"]):
            if run["signature"] not in table["signatures"]:
                raise TableError(f"traces/{name}/runs/{i}: no signature {run['signature']!r}")
            if run.get("report", "none") not in REPORTS:
                raise TableError(f"traces/{name}/runs/{i}: report must be one of {REPORTS}")
    return table


# ------------------------------------------------------------------------------------------ timelines


@dataclass
class Segment:
    start: float
    end: float
    state: str
    levels: dict[str, float]


@dataclass
class Timeline:
    """One GPU's states over time, its true class over time, and what its job reported when."""

    segments: list[Segment] = field(default_factory=list)
    labels: list[tuple[float, str]] = field(default_factory=list)
    """(from time, label), in order."""
    steps: list[tuple[float, float]] = field(default_factory=list)
    """(end time, length) of each completed training step, in order."""
    starts: list[float] = field(default_factory=list)

    def add(self, start: float, end: float, state: str, levels: dict[str, float]) -> None:
        if end > start:
            self.segments.append(Segment(start, end, state, levels))
            self.starts.append(start)

    def label_at(self, t: float) -> str:
        label = self.labels[0][1]
        for since, name in self.labels:
            if since <= t:
                label = name
        return label


SPREAD = 0.06
"""How far one segment's level strays from the run's operating point (standard deviation), as a share of the
range's width: the ranks of one job run the same kernels, so they sit at one point of the published range, not
all over it, and steady training drifts by 1-2% (llama3); 6% of a range's width is 1-3% of its level."""


class Drawer:
    """Draws a state's levels from the table's ranges, with ../build.py's draw: an operating point per run and
    state (one job's level inside the published range), then each segment's level around it."""

    def __init__(self, table: dict[str, Any], rng: random.Random) -> None:
        self.table, self.rng = table, rng
        self._points: dict[str, list[tuple[str, float, float, float, bool]]] = {}

    def levels(self, state: str) -> dict[str, float]:
        points = self._points.get(state)
        if points is None:
            check = {"sources": self.table["all_sources"]}
            points = self._points[state] = []
            for k, v in self.table["states"][state]["fields"].items():
                lo, hi, _, uniform = parent.parse_field(check, k, v)
                points.append((k, lo, hi, parent._draw(self.rng, lo, hi, uniform), uniform))
        out = {}
        for k, lo, hi, point, uniform in points:
            # bursty signals (uniform ranges) move over their whole range; the others stay near the point
            out[k] = parent._draw(self.rng, lo, hi, True) if uniform else \
                min(hi, max(lo, self.rng.gauss(point, SPREAD * (hi - lo))))
        return out

    def param(self, sig: dict[str, Any], name: str) -> float:
        lo, hi, _, uniform = parent.parse_field({"sources": self.table["all_sources"]}, name, sig["params"][name])
        return parent._draw(self.rng, lo, hi, uniform)


Program = Callable[[Drawer, dict[str, Any], int, float, random.Random], list[Timeline]]


def notebook(d: Drawer, sig: dict[str, Any], gpus: int, horizon: float, rng: random.Random) -> list[Timeline]:
    """Independent notebooks: a cell of a few seconds, then minutes of silence holding memory; idle throughout
    (a blip of a few seconds is not a workload)."""
    roles, out = sig["roles"], []
    for _ in range(gpus):
        tl = Timeline(labels=[(0.0, "idle")])
        t = -rng.uniform(0.0, 90.0)
        while t < horizon:
            gap, cell = d.param(sig, "gap_s"), d.param(sig, "cell_s")
            tl.add(t, t + gap, roles["silent"], d.levels(roles["silent"]))
            tl.add(t + gap, t + gap + cell, roles["busy"], d.levels(roles["busy"]))
            t += gap + cell
        out.append(tl)
    return out


def drain(d: Drawer, sig: dict[str, Any], gpus: int, horizon: float, rng: random.Random) -> list[Timeline]:
    """Inference servers whose queue drains: busy decode (memory-bound), then the last requests trickle in and
    the server idles holding its KV pool (idle from the drain on)."""
    roles, out = sig["roles"], []
    for _ in range(gpus):
        serve, trickle = d.param(sig, "serve_s"), d.param(sig, "trickle_s")
        tl = Timeline(labels=[(0.0, "memory_bound"), (serve, "idle")])
        t = -5.0
        while t < serve:  # the batch changes every second or so: draw its levels per second
            tl.add(t, min(t + 1.0, serve), roles["busy"], d.levels(roles["busy"]))
            t += 1.0
        while t < serve + trickle:
            gap = d.param(sig, "request_gap_s")
            tl.add(t, t + gap, roles["silent"], d.levels(roles["silent"]))
            length = d.param(sig, "request_s")
            tl.add(t + gap, t + gap + length, roles["request"], d.levels(roles["request"]))
            t += gap + length
        tl.add(t, horizon + 5.0, roles["silent"], d.levels(roles["silent"]))
        out.append(tl)
    return out


def checkpoint(d: Drawer, sig: dict[str, Any], gpus: int, horizon: float, rng: random.Random) -> list[Timeline]:
    """Synchronous training whose ranks all stop every period: a copy of the state to the host, then the host
    writes it (no kernels either way); the job's class throughout."""
    roles, label = sig["roles"], sig["label"]
    step, period = d.param(sig, "step_s"), d.param(sig, "period_s")
    out = [Timeline(labels=[(0.0, label)]) for _ in range(gpus)]
    t, next_ckpt = -20.0, rng.uniform(5.0, period)
    while t < horizon:
        length = step * math.exp(rng.gauss(0.0, 0.015))
        for tl in out:
            tl.add(t, t + length, roles["compute"], d.levels(roles["compute"]))
            tl.steps.append((t + length, length))
        t += length
        if t >= next_ckpt:
            copy, write = d.param(sig, "copy_s"), d.param(sig, "write_s")
            for tl in out:
                tl.add(t, t + copy, roles["copy"], d.levels(roles["copy"]))
                tl.add(t + copy, t + copy + write, roles["write"], d.levels(roles["write"]))
            t += copy + write
            next_ckpt = t + period * math.exp(rng.gauss(0.0, 0.03))
    return out


def straggler(d: Drawer, sig: dict[str, Any], gpus: int, horizon: float, rng: random.Random) -> list[Timeline]:
    """Data-parallel ranks: compute, wait in the all-reduce for the slowest rank, transfer. From 40% of the run
    one rank is thermally throttled and slower: the job is jittered from then on (every rank: the straggler
    and the ranks waiting for it)."""
    roles = sig["roles"]
    onset = 0.4 * horizon
    step, slowdown = d.param(sig, "step_s"), d.param(sig, "slowdown")
    exposed, cv = d.param(sig, "exposed_share"), d.param(sig, "step_cv")
    slow_rank = rng.randrange(gpus)
    out = [Timeline(labels=[(0.0, "compute_bound"), (onset, "communication_jittered")]) for _ in range(gpus)]
    t = -20.0
    while t < horizon:
        base = step * math.exp(rng.gauss(0.0, cv))
        computes = [base * math.exp(rng.gauss(0.0, 0.005)) * (slowdown if r == slow_rank and t >= onset else 1.0)
                    for r in range(gpus)]
        done = t + max(computes)
        transfer = step * exposed * math.exp(rng.gauss(0.0, 0.1))
        for r, tl in enumerate(out):
            state = roles["slow"] if r == slow_rank and t >= onset else roles["compute"]
            tl.add(t, t + computes[r], state, d.levels(state))
            tl.add(t + computes[r], done, roles["wait"], d.levels(roles["wait"]))
            tl.add(done, done + transfer, roles["transfer"], d.levels(roles["transfer"]))
            tl.steps.append((done + transfer, done + transfer - t))
        t = done + transfer
    return out


def moe(d: Drawer, sig: dict[str, Any], gpus: int, horizon: float, rng: random.Random) -> list[Timeline]:
    """Expert parallelism: expert blocks and short all-to-alls (compute-bound); from half-way routing
    imbalance makes every rank but the hot expert's wait after many blocks, for up to seconds (jittered)."""
    roles = sig["roles"]
    onset = 0.5 * horizon
    long_share = d.param(sig, "long_wait_share")
    out = [Timeline(labels=[(0.0, "compute_bound"), (onset, "communication_jittered")]) for _ in range(gpus)]
    t, step_start = -20.0, -20.0
    blocks = 0
    while t < horizon:
        block, a2a = d.param(sig, "block_s"), d.param(sig, "a2a_s")
        wait = 0.0
        if t >= onset:
            wait = d.param(sig, "long_wait_s") if rng.random() < long_share else d.param(sig, "short_wait_s")
        hot = rng.randrange(gpus)
        for r, tl in enumerate(out):
            tl.add(t, t + block, roles["compute"], d.levels(roles["compute"]))
            if wait > 0.0:  # the hot expert's rank keeps computing while the others wait for its tokens
                state = roles["compute"] if r == hot else roles["wait"]
                tl.add(t + block, t + block + wait, state, d.levels(state))
            tl.add(t + block + wait, t + block + wait + a2a, roles["transfer"], d.levels(roles["transfer"]))
        t += block + wait + a2a
        blocks += 1
        if blocks % 8 == 0:  # a training step: 8 MoE layers' blocks
            for tl in out:
                tl.steps.append((t, t - step_start))
            step_start = t
    return out


PROGRAMS: dict[str, Program] = {"notebook": notebook, "drain": drain, "checkpoint": checkpoint,
                                "straggler": straggler, "moe": moe}


# ------------------------------------------------------------------------------------------ reading


def _average(tl: Timeline, a: float, b: float, name: str) -> float | None:
    """Time-weighted mean of a level over [a, b] (None when no segment there carries it)."""
    i = max(0, bisect.bisect_right(tl.starts, a) - 1)
    total = weight = 0.0
    segs = tl.segments
    while i < len(segs) and segs[i].start < b:
        s = segs[i]
        overlap = min(b, s.end) - max(a, s.start)
        if overlap > 0.0 and name in s.levels:
            total += s.levels[name] * overlap
            weight += overlap
        i += 1
    return total / weight if weight > 0.0 else None


def _reasons(tl: Timeline, table: dict[str, Any], a: float, b: float) -> int:
    bits = 0
    i = max(0, bisect.bisect_right(tl.starts, a) - 1)
    while i < len(tl.segments) and tl.segments[i].start < b:
        s = tl.segments[i]
        if s.end > a:
            bits |= int(table["states"][s.state].get("reasons", 0))
        i += 1
    return bits


_ROUND = {"power_w": 1, "sm_clock_mhz": 0, "pcie_tx_bytes_per_s": 0, "pcie_rx_bytes_per_s": 0, "pcie_bytes_per_s": 0,
          "link_tx_bytes_per_s": 0, "link_rx_bytes_per_s": 0}


def _read(tl: Timeline, table: dict[str, Any], library: str, ts: float, util_s: float, power_s: float) -> dict[str, Any]:
    """What the library reads at ``ts`` for the fields it has."""
    out: dict[str, Any] = {}
    for name in sorted(LIBRARY_FIELDS[library]):
        span = util_s if name in UTIL_FIELDS else power_s if name == "power_w" else \
            SNAPSHOT_S if name == "sm_clock_mhz" else INTERVAL_S
        value = _average(tl, ts - span, ts, name)
        if value is None and name in ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "pcie_bytes_per_s",
                                      "link_tx_bytes_per_s", "link_rx_bytes_per_s"):
            continue  # a state without traffic of that kind: the counter reads 0 only where the state says so
        if value is not None:
            # NVML and amdsmi report utilisation in whole percent
            out[name] = round(value, 2) if name in ("gr_active", "mem_busy") else round(value, _ROUND.get(name, 4))
    return out


def _fill_zero_traffic(values: dict[str, Any], library: str) -> None:
    """A byte counter the library reads is 0 where no state moved bytes of that kind (not unknown)."""
    for name in ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "pcie_bytes_per_s", "link_tx_bytes_per_s",
                 "link_rx_bytes_per_s"):
        if name in LIBRARY_FIELDS[library] and name not in values:
            values[name] = 0.0


@dataclass(frozen=True)
class Run:
    """One run of a signature in a trace file, with its reading semantics and what its job reports."""

    index: int
    signature: str
    gpus: int
    duration_s: float
    util_period_s: float
    power_period_s: float | None
    report: str
    drop: float
    nulls: dict[str, float]
    links: bool
    """Whether NVLink byte counters are read (NVML field values); amdsmi always reads XGMI."""


def _runs(trace: dict[str, Any]) -> list[Run]:
    return [Run(i, r["signature"], int(r["gpus"]), float(r["duration_s"]), float(r["util_period_s"]),
                None if r.get("power_period_s") is None else float(r["power_period_s"]), r.get("report", "none"),
                float(r.get("drop", 0.0)), dict(r.get("nulls", {})), bool(r.get("links", True)))
            for i, r in enumerate(trace["runs"])]


def _workload(run: Run, tl: Timeline, job: str, rank: int, ts: float) -> WorkloadReport | None:
    if run.report in ("none", "slurm"):
        return None
    common = {"job": job, "rank": rank, "world_size": run.gpus}
    if run.report == "job" or not tl.steps:
        return WorkloadReport(**common)
    i = bisect.bisect_right([end for end, _ in tl.steps], ts) - 1
    if i < 0:
        return WorkloadReport(**common)
    return WorkloadReport(**common, step=i if run.report == "steps" else None, step_time_s=round(tl.steps[i][1], 4))


def generate(table: dict[str, Any], name: str) -> list[GpuSample]:
    """Every sample of trace ``name`` in (ts, node, gpu) order; reads a gappy collector missed are left out."""
    trace = table["traces"][name]
    seed = int(trace["seed"])
    out: list[GpuSample] = []
    for run in _runs(trace):
        sig = table["signatures"][run.signature]
        gpu_key, reader = sig["gpu"], table["readers"][sig["gpu"]]
        g = table["gpus"][gpu_key]
        library = reader["library"]
        power_s = run.power_period_s if run.power_period_s is not None else float(reader["power_period_s"][0])
        rng = random.Random(f"{seed}/{run.index}/{run.signature}")
        drawer = Drawer(table, rng)
        held = drawer.param(sig, "held_gib") * 2**30
        timelines = PROGRAMS[sig["program"]](drawer, sig, run.gpus, run.duration_s, rng)
        job = f"{name}-{run.signature}-{run.index}"
        training = sig["family"] in ("checkpoint", "straggler", "moe")
        for rank, tl in enumerate(timelines):
            own = job if training else f"{job}-{rank}"  # a notebook or a server is its own job
            node = f"{job}-n{rank // GPUS_PER_NODE}"
            gpu = str(rank % GPUS_PER_NODE)
            reads = random.Random(f"{seed}/{run.index}/{rank}/reads")
            for second in range(int(run.duration_s)):
                ts = T0 + second + 1.0
                rel = second + 1.0
                values = _read(tl, table, library, rel, run.util_period_s, power_s)
                _fill_zero_traffic(values, library)
                if not run.links and library != "amdsmi":
                    values.pop("link_tx_bytes_per_s", None)
                    values.pop("link_rx_bytes_per_s", None)
                cpu = _average(tl, rel - INTERVAL_S, rel, "process.cpu_cores")
                iowait = _average(tl, rel - INTERVAL_S, rel, "host.cpu_iowait_ratio")
                sample = GpuSample(
                    ts=ts, gpu=gpu, node=node, uuid=parent._uuid(node, gpu), vendor=g["vendor"], model=g["model"],
                    interval_s=INTERVAL_S, **values, sm_clock_max_mhz=float(g["sm_clock_max_mhz"]),
                    mem_used_bytes=int(held), mem_total_bytes=int(g["mem_total_bytes"]),
                    clock_event_reasons=_reasons(tl, table, rel - SNAPSHOT_S, rel) if library != "amdsmi" else None,
                    power_limit_w=float(g["power_limit_w"]),
                    processes=(ProcessSample(pid=30000 + 131 * rank + run.index, name="python", used_memory_bytes=int(held),
                                             cpu_cores=None if cpu is None else round(cpu, 3)),),
                    host=None if iowait is None else HostSample(cpu_iowait_ratio=round(iowait, 4)),
                    workload=_workload(run if training else replace(run, gpus=1), tl, own, rank if training else 0, rel)
                    if training or run.report == "job" else None,
                    attribution=Attribution(job_id=own) if run.report == "slurm" else None,
                    label=tl.label_at(rel))  # type: ignore[arg-type]
                if run.drop and reads.random() < run.drop:
                    continue
                lost = {f: None for f, share in run.nulls.items() if reads.random() < float(share)}
                out.append(replace(sample, **lost) if lost else sample)
    out.sort(key=lambda s: (s.ts, s.node, int(s.gpu)))
    return out


def trace_path(name: str) -> Path:
    return HERE / f"{name}.jsonl.gz"


def write_trace(table: dict[str, Any], name: str, path: Path) -> int:
    trace = table["traces"][name]
    note = (f"published-semantics trace {name} (roofwatch issue 44): runs "
            f"{', '.join(r['signature'] for r in trace['runs'])}; every level drawn (seed {trace['seed']}) inside a "
            "range cited in traces/published/families/families.yaml and read as each library reads its counters; "
            "not from agent/virtual.")
    samples = generate(table, name)
    with TraceWriter(path, note=note, started_at=T0) as writer:
        writer.write_many(samples)
    return len(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="regenerate the shipped traces")
    parser.add_argument("--check", action="store_true", help="fail when a shipped trace differs")
    parser.add_argument("names", nargs="*", help="only these traces (default: all)")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        return 0
    table = load_table()
    return parent.regenerate(args.names or list(table["traces"]), lambda name, path: write_trace(table, name, path),
                             trace_path, check_only=not args.write)


if __name__ == "__main__":
    sys.exit(main())
