"""Fleet history from the agent's real exposition, written as OpenMetrics for promtool's backfill.

The node template is what the agent itself serves: the built-in virtual 8-GPU node is collected
twice in process and rendered by the exporter's own families, so the series names and labels are
exactly the agent's. That node is replicated as N nodes (``node``, ``uuid`` and a ``cluster``
label rewritten; every GPU in a job of ``job_nodes`` nodes, as a Slurm or Kubernetes fleet
attributes it), and given a history: workload classes and MFU change per job every
``SEGMENT_S``, ratios and gauges move, counters only grow.

Generating billions of samples in Python is only feasible with few Python operations per sample:
each value sequence (one per pattern, shared by many series) is formatted once as a block of
``" value timestamp"`` lines, and a series is its label prefix spliced in front of every line of
that block by one ``str.replace`` (C speed). promtool maps its input file (no stdin), so the
history is written as one file per block window and each is backfilled, then deleted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from pathlib import Path
from typing import Callable, Iterator, TextIO


CLASSES = ("idle", "compute_bound", "memory_bound", "latency_bound", "input_starved",
           "communication_jittered", "unknown")
"""The one-hot classes of ``roofwatch_gpu_workload_class``, as the agent exports them."""
MFU_BY_CLASS = {"idle": 0.0, "compute_bound": 0.52, "memory_bound": 0.18, "latency_bound": 0.12,
                "input_starved": 0.21, "communication_jittered": 0.3, "unknown": 0.05}
"""A job's typical MFU in each class (the level the history moves around)."""
SEGMENT_S = 20 * 60
"""How long a job stays in one class before its schedule moves on."""
SCHEDULES = 16
"""Distinct class schedules; job j follows schedule j % SCHEDULES."""
STRAGGLER_JOBS = 8
"""One job in this many has a slow rank (GPU 3 of each of its nodes)."""
PATTERNS = 8
"""Distinct value sequences per moving gauge (series pick one by their GPU)."""

SCRAPE_SERIES = ("up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
                 "scrape_series_added")
"""The series Prometheus itself records per scraped target."""

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclasses.dataclass(frozen=True)
class Series:
    """One series of the node template: its family, type, sample name, labels and value."""

    family: str
    kind: str  # gauge, counter, info (written as gauge), untyped
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return next((v for k, v in self.labels if k == key), None)


def node_exposition(scenario: str = "demo", node: str | None = None) -> str:
    """The agent's text exposition of one node of a built-in virtual scenario (default: the demo's 8-GPU
    node; ``shared``'s ``shared-node`` for a fleet of shared GPUs), second collection cycle."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from agent.app.assemble import make_collector, open_backend_or_fail
    from agent.app.config import Settings
    from exporters.prometheus import SnapshotCollector

    settings = Settings(backend="virtual", scenario=scenario, virtual_node=node)
    collector = make_collector(settings, open_backend_or_fail(settings))
    try:
        collector.collect_once()
        snapshot = collector.collect_once()
    finally:
        collector.stop()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot))
    return generate_latest(registry).decode()


def parse_template(text: str) -> list[Series]:
    """The series of a text exposition, in order, with each family's declared type.

    A node without job attribution (the demo's) gets ``roofwatch_gpu_job_info`` per GPU, labels as
    the agent's JOB_INFO family: a fleet's GPUs are attributed, and the job rules need it.
    """
    types: dict[str, str] = {}
    out: list[Series] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            raise ValueError(f"exposition line not understood: {line!r}")
        name, labels, value = match.groups()
        family = next((f for f in (name, name.removesuffix("_total"), name.removesuffix("_info")) if f in types), name)
        kind = types.get(family, "untyped")
        out.append(Series(family, kind, name, tuple(_LABEL.findall(labels or "")), float(value)))
    for name in SCRAPE_SERIES:  # what Prometheus adds to every target it scrapes
        out.append(Series(name, "gauge", name, (), 1.0 if name == "up" else float(len(out))))
    if not any(s.name == "roofwatch_gpu_job_info" for s in out):
        for info in [s for s in out if s.name == "roofwatch_gpu_info"]:
            keep = tuple((k, v) for k, v in info.labels if k in ("gpu", "node", "uuid"))
            out.append(Series("roofwatch_gpu_job", "info", "roofwatch_gpu_job_info",
                              keep + (("job_id", "JOB"), ("partition", "gpu"), ("user", "fleet")), 1.0))
    return out


def node_template(scenario: str = "demo") -> list[Series]:
    """The series every fleet node repeats: the scenario's first node (:data:`TEMPLATE_NODES`), parsed."""
    return parse_template(node_exposition(scenario, TEMPLATE_NODES.get(scenario)))


TEMPLATE_NODES = {"shared": "shared-node"}
"""The node of a multi-node scenario a fleet node copies (one node's series, never two nodes' under one name)."""


def gpu_index(s: Series) -> int:
    """The physical GPU a series is on: ``3`` for ``gpu="3"`` and for a MIG instance's ``gpu="3/1"``."""
    return int((s.label("gpu") or "0").split("/")[0])


@dataclasses.dataclass(frozen=True)
class FleetShape:
    """How big the fleet is and how long its history: the benchmark's parameters."""

    nodes: int
    hours: float
    step_s: int = 15
    clusters: int = 2
    job_nodes: int = 16
    end: int = 0  # unix seconds of the last sample; 0 = now, rounded to the step
    scenario: str = "demo"
    """The built-in scenario whose node every fleet node copies (:func:`node_template`)."""

    def timestamps(self) -> list[int]:
        end = self.end or int(time.time()) // self.step_s * self.step_s
        count = int(self.hours * 3600 // self.step_s)
        return [end - self.step_s * k for k in range(count - 1, -1, -1)]

    def node_name(self, i: int) -> str:
        return f"node-{i:05d}"

    def cluster(self, i: int) -> str:
        return f"c{i * self.clusters // self.nodes}"

    def job(self, i: int) -> int:
        return i // self.job_nodes


class Patterns:
    """The value sequences of one history window, each formatted once as ``" v ts"`` lines."""

    ts_suffix = ""
    """Appended to every timestamp's text: "" for OpenMetrics' seconds, "000" for the Prometheus
    text format's milliseconds (VictoriaMetrics' /api/v1/import/prometheus)."""

    def __init__(self, ts: list[int], start_ts: int) -> None:
        self.ts = ts
        self.t = [float(t - start_ts) for t in ts]  # seconds since the history began
        self.ts_text = [f" {t}{self.ts_suffix}" for t in ts]
        self.cache: dict[tuple, str] = {}

    def block(self, key: tuple, values: "Callable[[], list[float]]", digits: int = 4) -> str:
        """``values()`` as lines ``" v ts"`` joined by newlines (no trailing one), cached under key
        (``values`` is only called on a miss: series share a few sequences)."""
        text = self.cache.get(key)
        if text is None:
            vals = [round(v, digits) if digits else int(v) for v in values()]
            text = "\n".join([f"{v}{t}" for v, t in zip(vals, self.ts_text)])
            # a value line starts with a space after the prefix: " v ts"
            text = " " + text.replace("\n", "\n ")
            self.cache[key] = text
        return text

    def class_blocks(self, schedule: int) -> list[tuple[int, str]]:
        """(class index, block) for each class the schedule is in during this window: the one
        series of ``roofwatch_gpu_workload_class`` a GPU exports, labelled with its present class
        (the agent exports only the 1), so a class change ends one series and starts another."""
        key = ("class-series", schedule)
        if key not in self.cache:
            classes = self.schedule_class(schedule)
            parts = []
            for c in sorted(set(classes)):
                lines = [f"1{self.ts_text[i]}" for i, k in enumerate(classes) if k == c]
                parts.append((c, " " + "\n ".join(lines)))
            self.cache[key] = parts  # type: ignore[assignment]
        return self.cache[key]  # type: ignore[return-value]

    def schedule_class(self, schedule: int) -> list[int]:
        """Index into CLASSES of a schedule's class at each timestamp."""
        segments = [int(t // SEGMENT_S) for t in self.t]
        return [(g * 3 + schedule * 5 + (g * schedule) // 2) % len(CLASSES) for g in segments]

    def wave(self, pattern: int, period_s: float = 3000.0) -> list[float]:
        """A smooth movement in [-1, 1], phase-shifted per pattern."""
        w = 2 * math.pi / (period_s * (1 + pattern / 7))
        return [math.sin(t * w + pattern) for t in self.t]


def _clip(v: float) -> float:
    return 0.0 if v < 0 else 1.0 if v > 1 else v


def single_class(template: list[Series]) -> bool:
    """Whether the agent exports only the 1 of the class one-hot (else all seven, zeros included:
    ``optional_metrics: [one_hot_zeros]``, each series then following the schedule as 0 or 1)."""
    return sum(1 for s in template if s.name == "roofwatch_gpu_workload_class" and s.label("gpu") == "0") == 1


def expand(p: Patterns, s: Series, gpu: int, job: int, single: bool = True) -> list[tuple[Series, str]]:
    """The fleet series that template series ``s`` becomes on a GPU over the window, each with its
    block: itself, except the workload class exported as its 1 alone (``single``), which is one
    series per class the GPU passes through."""
    if single and s.name == "roofwatch_gpu_workload_class":
        return [(dataclasses.replace(s, labels=tuple((k, CLASSES[c] if k == "class" else v) for k, v in s.labels)), block)
                for c, block in p.class_blocks(job % SCHEDULES)]
    return [(s, series_block(p, s, gpu, job))]


def series_block(p: Patterns, s: Series, gpu: int, job: int) -> str:
    """The lines of one series over the window: which value sequence it follows, formatted."""
    schedule = job % SCHEDULES
    pattern = gpu % PATTERNS
    if s.name == "roofwatch_gpu_workload_class":
        idx = CLASSES.index(s.label("class") or "unknown")
        return p.block(("class", schedule, idx), lambda: [float(c == idx) for c in p.schedule_class(schedule)], 0)
    if s.name == "roofwatch_gpu_mfu_ratio":
        shift = 0.02 * (gpu % 3) + (0.0 if s.label("source") == "workload" else 0.04)
        return p.block(("mfu", schedule, gpu % 3, s.label("source")), lambda: [
            _clip(MFU_BY_CLASS[CLASSES[c]] + shift + 0.03 * w)
            for c, w in zip(p.schedule_class(schedule), p.wave(pattern))])
    if s.name == "roofwatch_gpu_tensor_active_ratio":
        # Ranks of a synchronous job run in lockstep (the straggler rule's premise): one level per
        # job, following its class like its MFU; in one job of STRAGGLER_JOBS every node's GPU 3
        # computes 25% longer per step, a slow rank for GpuJobStraggler to find.
        lead = 1.25 if job % STRAGGLER_JOBS == 0 and gpu == 3 else 1.0
        return p.block(("tensor", schedule, job % PATTERNS, lead), lambda: [
            _clip((MFU_BY_CLASS[CLASSES[c]] * 1.3 + 0.02 * w) * lead)
            for c, w in zip(p.schedule_class(schedule), p.wave(job % PATTERNS))])
    if s.kind == "counter":
        rate = max(s.value, 1.0) / 3600.0 * (1 + pattern / 10)
        return p.block(("counter", s.name, s.value, pattern), lambda: [s.value + rate * t for t in p.t], 3)
    if s.kind == "info" or s.name.endswith(("_info", "_up")) or s.value in (0.0, 1.0):
        return p.block(("const", s.value), lambda: [s.value] * len(p.ts), 0 if s.value.is_integer() else 4)
    if s.name.endswith("_timestamp_seconds"):
        return p.block(("now",), lambda: [float(t) for t in p.ts], 0)
    if s.name.endswith("_ratio") and 0 <= s.value <= 1:
        return p.block(("ratio", s.value, pattern), lambda: [_clip(s.value * (1 + 0.15 * w)) for w in p.wave(pattern)])
    return p.block(("gauge", s.value, pattern), lambda: [s.value * (1 + 0.05 * w) for w in p.wave(pattern, 1700.0)])


class MillisecondPatterns(Patterns):
    """The same lines with millisecond timestamps: the Prometheus text format, not OpenMetrics."""

    ts_suffix = "000"


class JsonPatterns(Patterns):
    """The same value sequences as the tail of a VictoriaMetrics JSON-line import record:
    ``"values":[...],"timestamps":[...]}``, formatted once per sequence. A series is then one
    line, its labels and a cached tail: far fewer bytes and Python operations than a text line
    per sample, which is what makes a 32,000-GPU history importable in minutes."""

    def __init__(self, ts: list[int], start_ts: int) -> None:
        super().__init__(ts, start_ts)
        self.ts_json = '],"timestamps":[' + ",".join(f"{t}000" for t in ts) + "]}"

    def block(self, key: tuple, values: "Callable[[], list[float]]", digits: int = 4) -> str:
        text = self.cache.get(key)
        if text is None:
            vals = [round(v, digits) if digits else int(v) for v in values()]
            text = '"values":[' + ",".join(map(str, vals)) + self.ts_json
            self.cache[key] = text
        return text

    def class_blocks(self, schedule: int) -> list[tuple[int, str]]:
        key = ("class-series", schedule)
        if key not in self.cache:
            classes = self.schedule_class(schedule)
            parts = []
            for c in sorted(set(classes)):
                stamps = [f"{t}000" for t, k in zip(self.ts, classes) if k == c]
                parts.append((c, '"values":[' + ",".join(["1"] * len(stamps)) + '],"timestamps":['
                              + ",".join(stamps) + "]}"))
            self.cache[key] = parts  # type: ignore[assignment]
        return self.cache[key]  # type: ignore[return-value]


def labels_of(s: Series, shape: FleetShape, node: int) -> list[tuple[str, str]]:
    """The label pairs (sorted, ``__name__`` not included) of template series ``s`` on fleet node
    ``node``: the target labels a scrape adds (``instance``, ``job``), the cluster's, the node's own."""
    out = [("cluster", shape.cluster(node)), ("instance", f"{shape.node_name(node)}:9477"), ("job", "roofwatch")]
    for key, value in s.labels:
        if key == "node":
            value = shape.node_name(node)
        elif key == "uuid":
            value = f"GPU-{node:08x}-{value[4:]}"[:40]
        elif key == "job_id":
            value = f"job-{shape.job(node):05d}"
        out.append((key, value))
    return sorted(out)


def _relabel(s: Series, shape: FleetShape, node: int) -> str:
    """The sample name and label set of ``s`` on fleet node ``node``, as an exposition line's prefix."""
    return s.name + "{" + ",".join(f'{k}="{v}"' for k, v in labels_of(s, shape, node)) + "}"


def write_window(out: TextIO, template: list[Series], shape: FleetShape, ts: list[int], start_ts: int,
                 patterns: type[Patterns] = Patterns, single: bool | None = None) -> int:
    """Write every series of the fleet over timestamps ``ts`` as OpenMetrics; returns the sample count.

    Families are written whole (OpenMetrics forbids interleaving), each series' samples in time
    order, then ``# EOF``. ``patterns=MillisecondPatterns`` gives the Prometheus text format instead
    (VictoriaMetrics reads the ``#`` lines as comments). ``single``: :func:`single_class` of the whole
    template, where ``template`` is a part of it.
    """
    p = patterns(ts, start_ts)
    single = single_class(template) if single is None else single
    samples = 0
    family = None
    for s in template:
        if s.family != family:
            family = s.family
            kind = "counter" if s.kind == "counter" else "gauge" if s.kind != "info" else "info"
            out.write(f"# TYPE {s.family} {kind}\n")
        gpu = gpu_index(s)
        for node in range(shape.nodes):
            for one, block in expand(p, s, gpu, shape.job(node), single):
                prefix = _relabel(one, shape, node)
                out.write(prefix)
                out.write(block.replace("\n ", "\n" + prefix + " "))
                out.write("\n")
            samples += len(ts)
    out.write("# EOF\n")
    return samples


def json_window(template: list[Series], shape: FleetShape, ts: list[int], start_ts: int) -> Iterator[str]:
    """Every series of the fleet over timestamps ``ts`` as VictoriaMetrics JSON-line import records
    (``/api/v1/import``), one line per series, the same values as :func:`write_window` writes."""
    p = JsonPatterns(ts, start_ts)
    single = single_class(template)
    dumps = json.dumps
    for s in template:
        gpu = gpu_index(s)
        for node in range(shape.nodes):
            for one, block in expand(p, s, gpu, shape.job(node), single):
                metric = dict(labels_of(one, shape, node))
                metric["__name__"] = s.name
                yield '{"metric":' + dumps(metric, separators=(",", ":")) + "," + block + "\n"


def windows(shape: FleetShape, window_s: int = 7200, ts: list[int] | None = None) -> Iterator[list[int]]:
    """The history's timestamps (or ``ts``) cut at multiples of ``window_s`` (promtool's 2 h block ranges)."""
    ts = shape.timestamps() if ts is None else ts
    for cut in sorted({t // window_s for t in ts}):
        yield [t for t in ts if t // window_s == cut]


def write_history(path_for: Callable[[int], Path], template: list[Series], shape: FleetShape) -> Iterator[tuple[Path, int]]:
    """Write each window to its own file and yield (file, samples) as it is done."""
    start = int(shape.timestamps()[0])
    for index, ts in enumerate(windows(shape)):
        path = path_for(index)
        with path.open("w", buffering=1 << 22) as out:
            count = write_window(out, template, shape, ts, start)
        yield path, count
