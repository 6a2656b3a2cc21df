"""Labelled traces drawn from PUBLISHED counter values (sources.yaml), for GPUs without tensor counters.

The labelled traces under traces/labelled/ come from our own simulator, so they only show that the
classifier and the simulator agree. These come from a table of ranges that each cite a public
measurement (or say plainly that none was found and why a value was chosen): every sample field is
drawn inside its phase's range with a fixed seed. Nothing here imports agent/virtual or looks at
the classifier's thresholds; only the trace writer and the model types are used.

    python traces/published/build.py --write    # regenerate the *.jsonl.gz files
    python traces/published/build.py --check    # exit 1 when a shipped file differs

Traces of `kind: step_cycles` (synchronous training on one step clock per job, each second mixing a
compute and a communication level) are drawn by cycles.py next to this file, with the same table rules.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import math
import random
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Callable

import yaml

from agent.model import GpuSample, HostSample, ProcessSample, WorkloadReport
from agent.trace.writer import TraceWriter

HERE = Path(__file__).resolve().parent
TABLE = HERE / "sources.yaml"
T0 = 1_810_000_000.0
"""Start of every trace (Unix seconds); fixed so the files are byte-for-byte reproducible."""
_NOT_PUBLISHED = "not published"


def _load_cycles() -> ModuleType:
    spec = importlib.util.spec_from_file_location("published_cycles", HERE / "cycles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cycles = _load_cycles()


class TableError(ValueError):
    """The source table breaks its own rules; the message names the entry."""


def load_table(path: Path = TABLE) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        table = yaml.safe_load(fh)
    for gpu, phases in table["phases"].items():
        for phase, spec in phases.items():
            for key, field in spec["fields"].items():
                parse_field(table, f"{gpu}/{phase}/{key}", field)
            cycles.check_phase(_helpers(), table, f"{gpu}/{phase}", spec)
    return table


def parse_field(table: dict[str, Any], where: str, field: list[Any]) -> tuple[float, float, str, bool]:
    """(low, high, source, uniform) of one range, checked: a known source key or an honest note."""
    if not isinstance(field, list) or len(field) not in (3, 4):
        raise TableError(f"{where}: expected [low, high, source(, uniform)], got {field!r}")
    lo, hi, source = float(field[0]), float(field[1]), str(field[2])
    if not lo <= hi:
        raise TableError(f"{where}: low {lo} above high {hi}")
    if source not in table["sources"] and not source.startswith(_NOT_PUBLISHED):
        raise TableError(f"{where}: source {source!r} is neither in sources: nor a 'not published' note")
    uniform = len(field) == 4
    if uniform and field[3] != "uniform":
        raise TableError(f"{where}: fourth element must be 'uniform', got {field[3]!r}")
    return lo, hi, source, uniform


def _draw(rng: random.Random, lo: float, hi: float, uniform: bool) -> float:
    if lo == hi:
        return lo
    if uniform:
        return rng.uniform(lo, hi)
    return min(hi, max(lo, rng.gauss((lo + hi) / 2.0, (hi - lo) / 6.0)))


_ROUND = {"power_w": 1, "temperature_c": 1, "sm_clock_mhz": 0, "net_tx_bytes_per_s": 0,
          "net_rx_bytes_per_s": 0, "net_congestion_per_s": 1, "net_retransmits_per_s": 1,
          "link_tx_bytes_per_s": 0, "link_rx_bytes_per_s": 0}


def _round(key: str, value: float) -> float:
    return round(value, _ROUND.get(key, 4))


def _uuid(node: str, gpu: str) -> str:
    h = hashlib.sha256(f"{node}/{gpu}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _helpers() -> SimpleNamespace:
    """What cycles.py draws and checks with, so that its traces follow this table's rules."""
    return SimpleNamespace(parse_field=parse_field, draw=_draw, round=_round, uuid=_uuid, T0=T0, TableError=TableError)


class _StepClock:
    """A synchronous job's step boundaries: every rank sees the same steps (they wait on each other),
    each step's length drawn with the job's coefficient of variation (lognormal), clipped to the range."""

    def __init__(self, rng: random.Random, mean_s: float, cv: float, lo: float, hi: float, horizon_s: float) -> None:
        sigma = math.sqrt(math.log(1.0 + cv * cv))
        mu = math.log(mean_s) - sigma * sigma / 2.0
        self.ends: list[float] = []
        self.lengths: list[float] = []
        t = 0.0
        while t < horizon_s:
            length = min(hi, max(lo, rng.lognormvariate(mu, sigma)))
            t += length
            self.ends.append(t)
            self.lengths.append(length)

    def last(self, elapsed: float) -> tuple[int, float] | None:
        done = [i for i, end in enumerate(self.ends) if end <= elapsed]
        return (done[-1], self.lengths[done[-1]]) if done else None


def _workload(spec: dict[str, Any], values: dict[str, float], gpu_spec: dict[str, Any], rank: int,
              elapsed: float, clock: _StepClock | None, rng: random.Random) -> WorkloadReport | None:
    """The report the job itself sends, made consistent with the drawn MFU, MBU or step time."""
    w = spec.get("workload")
    if w is None:
        return None
    world, fpt = int(w["world_size"]), float(w["flops_per_token"])
    common = {"job": w["job"], "rank": rank, "world_size": world, "flops_per_token": fpt,
              "model_bytes": float(w["model_bytes"]) if "model_bytes" in w else None, "dtype": w.get("dtype")}
    if "workload.mfu" in values:
        tokens_per_s = values["workload.mfu"] * world * gpu_spec["peak_bf16_tflops"] * 1e12 / fpt
        step = float(w["step_s"])
        return WorkloadReport(**common, step=int(elapsed // step), step_time_s=round(step * (1 + rng.gauss(0, 0.005)), 4),
                              tokens_per_s=round(tokens_per_s, 1))
    if "workload.mbu" in values:
        tpot = float(w["model_bytes"]) / (values["workload.mbu"] * gpu_spec["bandwidth_tbs"] * 1e12)
        return WorkloadReport(**common, step=int(elapsed / tpot), step_time_s=round(tpot, 6),
                              tokens_per_s=round(float(w["batch"]) / tpot, 1))
    if clock is not None:
        last = clock.last(elapsed)
        if last is None:
            return None
        step, length = last
        return WorkloadReport(**common, step=step, step_time_s=round(length, 4),
                              tokens_per_s=round(float(w["tokens_per_step"]) / length, 1))
    step_time = values["workload.step_time_s"]
    return WorkloadReport(**common, step=int(elapsed / step_time), step_time_s=round(step_time, 5),
                          tokens_per_s=round(1.0 / step_time, 2))


def _sample(table: dict[str, Any], gpu_key: str, phase_spec: dict[str, Any], rng: random.Random, *, node: str,
            index: int, ts: float, elapsed: float, power_limit: bool, clock: _StepClock | None) -> GpuSample:
    g = table["gpus"][gpu_key]
    values: dict[str, float] = {}
    for key, field in phase_spec["fields"].items():
        lo, hi, _source, uniform = parse_field(table, key, field)
        values[key] = _round(key, _draw(rng, lo, hi, uniform))
    total = int(g["mem_total_bytes"])
    used = int(values.get("mem_used_frac", 0.0) * total)
    processes = None
    if phase_spec.get("process"):
        workers_cores = values.get("process.cpu_workers_cores")
        cores = values.get("process.cpu_cores")
        processes = (ProcessSample(
            pid=20000 + 97 * index + sum(map(ord, node)), name=phase_spec["process"], used_memory_bytes=used,
            cpu_cores=cores, cpu_workers_cores=workers_cores,
            cpu_main_cores=None if workers_cores is None or cores is None else round(max(0.0, cores - workers_cores), 4),
            workers=8 if workers_cores is not None else None),)
    host = None
    if any(k.startswith("host.") for k in values):
        host = HostSample(**{k[5:]: v for k, v in values.items() if k.startswith("host.")})
    plain = {k: v for k, v in values.items() if "." not in k and k != "mem_used_frac"}
    nvidia = g["vendor"] == "nvidia"
    return GpuSample(
        ts=ts, gpu=str(index), node=node, uuid=_uuid(node, str(index)), vendor=g["vendor"], model=g["model"],
        interval_s=1.0, **plain, sm_clock_max_mhz=float(g["sm_clock_max_mhz"]), mem_used_bytes=used,
        mem_total_bytes=total, clock_event_reasons=int(phase_spec.get("clock_event_reasons", 0)) if nvidia else None,
        dtype=(phase_spec.get("workload") or {}).get("dtype"), processes=processes, host=host,
        workload=_workload(phase_spec, values, g, index + (8 if node.endswith("-1") else 0), elapsed, clock, rng),
        label=phase_spec["label"], power_limit_w=float(g["power_limit_w"]) if power_limit else None)


def _gpu_runs(trace: dict[str, Any]) -> list[tuple[str, str, str, int, list[str]]]:
    """(gpu model key, phase group, node, index, phase order) for every GPU of a trace."""
    if "jobs" in trace:
        return [(job["gpu"], job["phases"], node, i, list(job.get("order", ["moe_jitter"])))
                for job in trace["jobs"] for node in job["nodes"] for i in range(job["gpus"])]
    order = trace["phases"]
    return [(trace["gpu"], trace["gpu"], trace["node"], i, order[i % len(order):] + order[:i % len(order)])
            for i in range(trace["gpus"])]


def generate(table: dict[str, Any], name: str) -> list[tuple[str, GpuSample]]:
    """Every sample of trace ``name`` with the ``group/phase`` it was drawn from, in (ts, node, gpu) order.
    Samples a gappy collector missed are left out; fields it lost are None."""
    trace = table["traces"][name]
    if trace.get("kind") == "step_cycles":
        return cycles.generate(_helpers(), table, name)
    seed, phase_s = int(trace["seed"]), int(trace["phase_s"])
    drop = float(trace.get("drop_fraction", 0.0))
    nulls = trace.get("null_fields", {})
    out: list[tuple[str, GpuSample]] = []
    clocks: dict[str, _StepClock] = {}
    for gpu_key, group, node, index, order in _gpu_runs(trace):
        rng = random.Random(f"{seed}/{node}/{index}")
        for p, phase in enumerate(order):
            spec = table["phases"][group][phase]
            clock = None
            w = spec.get("workload") or {}
            if "step_cv" in w:
                key = w["job"]
                if key not in clocks:
                    lo, hi, _, _ = parse_field(table, key, spec["fields"]["workload.step_time_s"])
                    clocks[key] = _StepClock(random.Random(f"{seed}/{key}"), float(w["step_s"]), float(w["step_cv"]),
                                             lo, hi, phase_s * len(order))
                clock = clocks[key]
            for second in range(phase_s):
                elapsed = p * phase_s + second + 1.0
                sample = _sample(table, gpu_key, spec, rng, node=node, index=index, ts=T0 + elapsed, elapsed=elapsed,
                                 power_limit=index not in trace.get("no_power_limit", []), clock=clock)
                if drop and rng.random() < drop:
                    continue
                lost = {f: None for f, share in nulls.items() if rng.random() < float(share)}
                out.append((f"{group}/{phase}", replace(sample, **lost) if lost else sample))
    out.sort(key=lambda item: (item[1].ts, item[1].node, int(item[1].gpu)))
    return out


def measured(sample: GpuSample, key: str, table: dict[str, Any], gpu_key: str) -> float | None:
    """The value a sample shows for a table key (the inverse of how _sample set it); None when absent."""
    g = table["gpus"][gpu_key]
    if key == "mem_used_frac":
        return None if sample.mem_used_bytes is None else sample.mem_used_bytes / int(g["mem_total_bytes"])
    if key.startswith("process."):
        return getattr(sample.processes[0], key[8:]) if sample.processes else None
    if key.startswith("host."):
        return getattr(sample.host, key[5:]) if sample.host else None
    if key.startswith("workload."):
        w = sample.workload
        if w is None:
            return None
        if key == "workload.mfu":
            return w.tokens_per_s * w.flops_per_token / (w.world_size * g["peak_bf16_tflops"] * 1e12)
        if key == "workload.mbu":
            return w.model_bytes / w.step_time_s / (g["bandwidth_tbs"] * 1e12)
        return w.step_time_s
    return getattr(sample, key)


def gpu_key_of(table: dict[str, Any], group: str) -> str:
    """The GPU model a phase group runs on."""
    for trace in table["traces"].values():
        for job in trace.get("jobs", [trace]):
            if job.get("phases") == group or job.get("gpu") == group:
                return job["gpu"]
    raise TableError(f"no trace uses phase group {group!r}")


def trace_path(name: str) -> Path:
    return HERE / f"{name}.jsonl.gz"


def write_trace(table: dict[str, Any], name: str, path: Path) -> int:
    trace = table["traces"][name]
    note = (f"published-source trace {name}: {trace['description']} Every value is drawn (seed {trace['seed']}) "
            f"inside a range cited in traces/published/sources.yaml by traces/published/build.py; not from agent/virtual.")
    samples = generate(table, name)
    with TraceWriter(path, note=note, started_at=T0) as writer:
        writer.write_many(s for _, s in samples)
    return len(samples)


def regenerate(names: list[str], write: Callable[[str, Path], int], path_of: Callable[[str], Path], *,
               check_only: bool) -> int:
    """Write each named trace, or (``check_only``) compare a fresh one with the shipped file; 1 when one is stale.
    Shared by this builder and traces/published/families/build.py."""
    stale = []
    for name in names:
        if not check_only:
            print(f"{path_of(name).name}: {write(name, path_of(name))} samples")
            continue
        fresh = path_of(name).with_name(f".{name}.check.jsonl.gz")
        if not path_of(name).exists():
            stale.append(name)
            continue
        try:
            write(name, fresh)
            with gzip.open(fresh, "rt") as a, gzip.open(path_of(name), "rt") as b:
                if a.read() != b.read():
                    stale.append(name)
        finally:
            fresh.unlink(missing_ok=True)
    if stale:
        print("stale, run with --write: " + ", ".join(stale), file=sys.stderr)
    return 1 if stale else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="regenerate the shipped traces")
    parser.add_argument("--check", action="store_true", help="fail when a shipped trace differs")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        return 0
    table = load_table()
    return regenerate(list(table["traces"]), lambda name, path: write_trace(table, name, path), trace_path,
                      check_only=not args.write)


if __name__ == "__main__":
    sys.exit(main())
