"""What a physical reading can be: one table of bounds per quantity, for every source.

Why one table: a source the agent reads (a driver, dcgm-exporter, AMD's Device Metrics Exporter, an
inference server) can hand it any finite float, and a value no GPU can produce (1e308 W, a 1e308 MHz
clock, -1e308 °C, a time per token of 1e306 s) is not a measurement but a fault in the source: a unit
switched, a counter garbled, a hostile exporter. Kept, it reaches /metrics as ``+Inf`` after a unit
conversion, skews every aggregate and alert it enters, and can overflow arithmetic downstream. So every
backend's samples and every server's figures pass through the same bounds, in one place, before anything
else reads them; a value outside is dropped (unknown, never 0) and counted by source and field.

The bounds are wide on purpose: they reject what is impossible, not what is unusual. A throttled GPU, a
board past its power limit for a moment, a cold start at -20 °C all pass.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping

from agent.model.device import GpuSpec
from agent.model.sample import GpuSample
from agent.model.snapshot import RejectedValues


@dataclass(frozen=True, slots=True)
class Bound:
    """A closed interval a quantity must lie in, with the unit it is in and why those ends."""

    low: float
    high: float
    unit: str
    why: str

    def admits(self, value: float | None) -> bool:
        """True for a finite value within the bounds; ``None`` (unknown) is not judged here."""
        if value is None:
            return True
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            return False
        return math.isfinite(number) and self.low <= number <= self.high


HOUR_S = 3600.0

SERVING_BOUNDS: Mapping[str, Bound] = {
    "latency_s": Bound(0.0, 6 * HOUR_S, "s",
                       "a time to first token or per output token past hours is a broken histogram, not a wait"),
    "per_second": Bound(0.0, 1e9, "1/s",
                        "tokens, requests or preemptions per second of one server: 1e9/s is far past any GPU"),
    "count": Bound(0.0, 1e7, "requests",
                   "requests running or waiting in one server: ten million is far past any queue"),
    "ratio": Bound(0.0, 1.05, "ratio", "a share of a pool or of busy time; 5% over for rounding in the server"),
    "bytes": Bound(0.0, 1e15, "bytes", "weights or KV cache of one replica: a petabyte is past any node"),
    "total": Bound(0.0, 1e30, "", "a counter or histogram sum since the server started (tokens, FLOPs, seconds, "
                   "observations): a century of the fastest GPU's FLOPs is 1e26, and thousands summed stay finite"),
}
"""Bounds for an inference server's own figures (agent.model.serving.ServingReport and what it is
computed from)."""


# -- GPU samples ---------------------------------------------------------------------------------------

POWER_CEILING_W = 5000.0
"""No GPU board draws more: the largest shipping ones are rated 1,400 W (MI355X, GB300), announced
packages 3,600 W. Also the ceiling of a reported power limit."""
POWER_OVER_REFERENCE = 3.0
"""A reading may reach this many times the board's power limit (its TDP where the limit is unknown):
transients pass a limit for milliseconds, an average over an interval never by 3x. 350,000 W on a
700 W board is milliwatts read as watts."""
MEMORY_CEILING_BYTES = float(2**42)
"""4 TiB of device memory: past every GPU (288 GB today) and every announced one (1 TB)."""
MEMORY_OVER_BOARD = 1.25
"""Memory readings may pass the catalogue's size by this much: sizes there are nominal (an H100 NVL's
94 GB reads 95,830 MiB), a reading 25% over is no rounding."""
ENERGY_STEP_MARGIN = 2.0
"""An energy-counter step may hold up to this many times what the board's power reference can deliver
over the time the step covers (power averaged over a second or more stays near its limit)."""
ENERGY_FIRST_READ_AGE_S = 120.0
"""How old a counter value may be when first read: an exporter refreshes its counters every 15-30 s
(gpuagent's cache, dcgm-exporter's collection interval), so the first step after a first reading may
cover that much more time than the agent has watched."""
EPISODE_QUIET_S = 300.0
"""A (source, field) with no refused reading for this long ends its episode: the next refusal is logged
again. A source flapping between units every scrape stays one episode, one log line."""

RATIO = Bound(0.0, 1.05, "ratio", "a share of the interval or of a peak; up to 5% over is rounding in the "
                                  "source and is clamped to 1, more is a unit error (percent read as a ratio)")
PCIE_RATE = Bound(0.0, 1e12, "bytes/s", "PCIe 7.0 x16 moves 128 GB/s a direction: 1 TB/s is four times both together")
FABRIC_RATE = Bound(0.0, 1e13, "bytes/s", "NVLink 5 moves 900 GB/s a direction, NVLink 6 1.8 TB/s, XGMI less: "
                                          "10 TB/s is past any GPU's fabric")
NETWORK_RATE = Bound(0.0, 1e12, "bytes/s", "a GPU's nearest NIC ports: 800 Gb/s is 100 GB/s a port, 1 TB/s is ten")
PACKET_RATE = Bound(0.0, 1e10, "1/s", "packets a second on a port: 800 Gb/s of 64-byte packets is 1.6e9")
TEMPERATURE = Bound(-40.0, 150.0, "°C", "a chip below -40 °C is outside every datacenter; above 150 °C it has "
                                         "shut down, GPUs throttle near 90-110 °C")
CLOCK = Bound(0.0, 10_000.0, "MHz", "GPU clocks run near 1-3 GHz: 10 GHz is a unit error, kHz or Hz")
EVENTS = Bound(0.0, 1e12, "events", "errors or replays since the driver loaded: 1e12 is 1,000 a second for 30 years")
TIME_SINCE_LOAD = Bound(0.0, 1e10, "s", "seconds since the driver loaded: 1e10 s is 300 years")
LINK_BYTES = Bound(0.0, 1e23, "bytes", "bytes a link moved since the driver loaded: a 64-bit counter of KiB "
                                       "tops at 1.9e22")
CORES = Bound(0.0, 65_536.0, "cores", "CPU cores of one host: distribution kernels allow 8,192")
PIDS = Bound(0.0, float(2**22), "", "Linux PIDs stop at PID_MAX_LIMIT, 4,194,304")
HOST_MEMORY = Bound(0.0, float(2**50), "bytes", "a host's memory: 1 PiB is past any single host")
STORAGE_RATE = Bound(0.0, 1e12, "bytes/s", "one process's storage reads or writes: 1 TB/s is past any node's disks")

GPU_SAMPLE_BOUNDS: Mapping[str, Bound] = {
    **{name: RATIO for name in (
        "gr_active", "sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active", "fp16_active",
        "dram_active", "mem_busy", "util_gpu", "tensor_hmma_active", "tensor_imma_active", "tensor_dmma_active",
        "tensor_dfma_active")},
    "pcie_tx_bytes_per_s": PCIE_RATE, "pcie_rx_bytes_per_s": PCIE_RATE, "pcie_bytes_per_s": PCIE_RATE,
    "link_tx_bytes_per_s": FABRIC_RATE, "link_rx_bytes_per_s": FABRIC_RATE,
    "net_tx_bytes_per_s": NETWORK_RATE, "net_rx_bytes_per_s": NETWORK_RATE,
    "net_congestion_per_s": PACKET_RATE, "net_retransmits_per_s": PACKET_RATE,
    "net_link_downs": Bound(0.0, 1e6, "events", "a port cannot go down a million times in one interval"),
    "power_w": Bound(0.0, POWER_CEILING_W, "W", f"{POWER_OVER_REFERENCE:g} x the board's power limit, else its TDP, "
                                                f"at most {POWER_CEILING_W:g} W: no board draws more"),
    "power_limit_w": Bound(0.0, POWER_CEILING_W, "W", "a board's power limit: no board is rated above "
                                                      f"{POWER_CEILING_W:g} W"),
    "energy_j": Bound(0.0, 1e15, "J", f"energy since the driver loaded: {POWER_CEILING_W:g} W for 6,000 years"),
    "parent_energy_j": Bound(0.0, 1e15, "J", "a MIG instance's parent board's energy since the driver loaded: "
                                             f"{POWER_CEILING_W:g} W for 6,000 years"),
    "temperature_c": TEMPERATURE, "memory_temperature_c": TEMPERATURE,
    "sm_clock_mhz": CLOCK, "sm_clock_max_mhz": CLOCK,
    "mem_used_bytes": Bound(0.0, MEMORY_CEILING_BYTES, "bytes", f"within {MEMORY_OVER_BOARD:g} x the board's "
                                                                "memory where the catalogue knows it, else 4 TiB"),
    "mem_total_bytes": Bound(0.0, MEMORY_CEILING_BYTES, "bytes", f"within {MEMORY_OVER_BOARD:g} x the board's "
                                                                 "memory where the catalogue knows it, else 4 TiB"),
    "clock_event_reasons": Bound(0.0, float(2**32), "bitmask", "NVML's clock-event reasons are 9 bits of a 64-bit "
                                                               "mask; past 2^32 the field is garbled"),
    "clock_event_time_s": TIME_SINCE_LOAD,
    "ecc_corrected_errors": EVENTS, "ecc_uncorrected_errors": EVENTS, "pcie_replays": EVENTS,
    "remapped_rows.correctable": Bound(0.0, 1e6, "rows", "an HBM stack has thousands of spare rows, not millions"),
    "remapped_rows.uncorrectable": Bound(0.0, 1e6, "rows", "an HBM stack has thousands of spare rows, not millions"),
    "xid_errors.xid": Bound(0.0, 65_535.0, "", "XID codes are small integers (the documented ones are below 200)"),
    "xid_errors.count": EVENTS,
    "links.link": Bound(0.0, 255.0, "", "a GPU has at most 18 NVLink or 8 XGMI links"),
    "links.read_bytes": LINK_BYTES, "links.write_bytes": LINK_BYTES,
    "host.cpu_iowait_ratio": RATIO, "host.io_pressure_ratio": RATIO, "host.cpu_pressure_ratio": RATIO,
    "host.cpu_utilization_ratio": RATIO,
    "processes.pid": PIDS, "processes.workers": PIDS,
    "processes.used_memory_bytes": Bound(0.0, MEMORY_CEILING_BYTES, "bytes", "a process holds at most the board's "
                                                                             "memory (as mem_used_bytes)"),
    "processes.cpu_cores": CORES, "processes.cpu_main_cores": CORES, "processes.cpu_workers_cores": CORES,
    "processes.cpu_limit_cores": CORES, "processes.sm_util": RATIO, "processes.rss_bytes": HOST_MEMORY,
    "processes.io_read_bytes_per_s": STORAGE_RATE, "processes.io_write_bytes_per_s": STORAGE_RATE,
    "processes.compute_units": Bound(0.0, 65_536.0, "compute units", "an MI300X has 304 compute units, an H100 132 SMs"),
}
"""The bound of every numeric field of :class:`agent.model.GpuSample` and its nested records (nested
ones as ``record.field``), the absolute one where it depends on the board (power, memory: see
:func:`power_bound`, :func:`memory_bound`). A field or record left out is in :data:`NOT_BOUNDED`."""

NOT_BOUNDED: Mapping[str, str] = {
    "ts": "the agent's own clock when live; a trace's is checked by agent/trace/reader.py (1970..2100)",
    "interval_s": "measured by the agent between its own reads; a trace's by agent/trace/reader.py (1 ms..1 day)",
    "driver_calls": "counted by the agent around its own library calls, not read from a source",
    "xid_errors.last_ts": "the agent's clock when it saw the event",
    "workload": "the job's own report, bounded where it is taken in: agent/context/workload/report_schema.py for "
                "reports, SERVING_BOUNDS for an inference server's figures; MFU and MBU by "
                "agent/classifier/roofline.py (MAX_UTILISATION)",
}
"""Numeric fields this table does not bound, and why (a test checks that every numeric field is in one
of the two tables)."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """One reading dropped: the field (``record.field`` when nested), the value seen and the bound it broke."""

    field: str
    value: float
    bound: str
    """The interval with its unit and why: ``0..2100 W (3 x the board's 700 W power limit, ...)``."""


def bound_text(bound: Bound) -> str:
    """``low..high unit: why``, as doctor and the log name a bound."""
    return f"{bound.low:g}..{bound.high:g}{' ' + bound.unit if bound.unit else ''}: {bound.why}"


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.inf if not isinstance(value, int) or value > 0 else -math.inf


def power_reference(limit_w: float | None, tdp_w: float | None) -> float | None:
    """What the board may draw: the larger of its power limit and its TDP, whichever are known."""
    return max((w for w in (limit_w, tdp_w) if w and w > 0), default=None)


@functools.lru_cache(maxsize=256)
def power_bound(limit_w: float | None, tdp_w: float | None) -> Bound:
    """``power_w``'s bound on this board: :data:`POWER_OVER_REFERENCE` x its :func:`power_reference`, never
    past :data:`POWER_CEILING_W`; the ceiling alone where neither limit nor TDP is known."""
    reference = power_reference(limit_w, tdp_w)
    if reference is None:
        return Bound(0.0, POWER_CEILING_W, "W", f"no board draws more than {POWER_CEILING_W:g} W "
                                                "(neither its power limit nor its TDP is known)")
    what = "power limit" if reference == limit_w else "TDP"
    return Bound(0.0, min(POWER_CEILING_W, POWER_OVER_REFERENCE * reference), "W",
                 f"{POWER_OVER_REFERENCE:g} x the board's {reference:g} W {what}, at most {POWER_CEILING_W:g} W")


@functools.lru_cache(maxsize=64)
def memory_bound(board_bytes: int | None) -> Bound:
    """Memory readings' bound on this board: :data:`MEMORY_OVER_BOARD` x the catalogue's size, never past
    :data:`MEMORY_CEILING_BYTES`; the ceiling alone where the size is unknown."""
    if not board_bytes or board_bytes <= 0:
        return Bound(0.0, MEMORY_CEILING_BYTES, "bytes", "no GPU has more than 4 TiB (the board's size is not "
                                                         "in the catalogue)")
    return Bound(0.0, min(MEMORY_CEILING_BYTES, MEMORY_OVER_BOARD * board_bytes), "bytes",
                 f"{MEMORY_OVER_BOARD:g} x the board's {board_bytes / 2**30:g} GiB")


def energy_step_bound(reference_w: float | None, elapsed_s: float) -> Bound:
    """How many joules an energy counter may gain over ``elapsed_s``: what the board's power reference
    (:data:`POWER_CEILING_W` where unknown) delivers in that time, x :data:`ENERGY_STEP_MARGIN`. A larger
    step is a reset or a unit change in the source, not energy."""
    watts = reference_w or POWER_CEILING_W
    elapsed = max(0.0, elapsed_s)
    return Bound(0.0, watts * elapsed * ENERGY_STEP_MARGIN, "J",
                 f"{ENERGY_STEP_MARGIN:g} x {watts:g} W over the {elapsed:.1f} s the step covers")


def energy_step_bound_for(sample: GpuSample, since: float | None, spec: GpuSpec | None) -> Bound | None:
    """The bound on ``sample``'s energy-counter step (None without an energy reading): the board's power
    reference over the time from ``since`` (see :func:`energy_since`) to the sample. A wall clock that went
    back (``since`` later than the sample) cannot say how long the step took: it gets a first reading's
    :data:`ENERGY_FIRST_READ_AGE_S`, never a bound of 0 that would refuse every honest step."""
    if sample.energy_j is None:
        return None
    elapsed = sample.ts - since if since is not None else ENERGY_FIRST_READ_AGE_S
    return energy_step_bound(power_reference(sample.power_limit_w, spec.tdp_w if spec is not None else None),
                             elapsed if elapsed > 0 else ENERGY_FIRST_READ_AGE_S)


def energy_step_rejection(previous: GpuSample | None, sample: GpuSample, bound: Bound | None) -> Rejection:
    """The record of an energy-counter step ``bound`` refused (field ``energy_j_step``: the step in J)."""
    step = (sample.energy_j or 0.0) - (previous.energy_j or 0.0 if previous is not None else 0.0)
    return Rejection("energy_j_step", step, bound_text(bound) if bound is not None else "")


def energy_since(previous: GpuSample | None, sample: GpuSample, since: float | None) -> float | None:
    """From when the counter's next step can have accrued, after ``sample``: the previous sample's time when
    the counter moved between the two (it moved after that read), ``since`` when it did not, and
    :data:`ENERGY_FIRST_READ_AGE_S` before ``sample`` for a first reading (its value may be that old)."""
    if sample.energy_j is None or (previous is not None and previous.energy_j == sample.energy_j):
        return since
    if previous is None or previous.energy_j is None:
        return sample.ts - ENERGY_FIRST_READ_AGE_S
    return previous.ts


def bound_records(records: tuple[Any, ...] | None, prefix: str) -> tuple[tuple[Any, ...] | None, tuple[Rejection, ...]]:
    """Nested records of a kind (``xid_errors``, ``links``, ...) with their bad values dropped, and what was."""
    rejected: list[Rejection] = []
    return _records(records, prefix, rejected, memory_bound(None)), tuple(rejected)


def _judge(name: str, value: Any, bound: Bound, rejected: list[Rejection]) -> Any:
    """``value`` when ``bound`` admits it (a ratio a little over 1 clamped to 1), else None, noted in ``rejected``."""
    if type(value) in _PLAIN and bound.low <= value <= bound.high:  # nearly every value: no conversion needed
        return 1.0 if value > 1.0 and bound is RATIO else value
    if not bound.admits(value):
        rejected.append(Rejection(name, _number(value), bound_text(bound)))
        return None
    return 1.0 if bound is RATIO and value > 1.0 else value


_PLAIN = (int, float)


def _nested(prefix: str) -> tuple[tuple[str, str, Bound | None, float, float], ...]:
    """(attribute, ``prefix.attribute``, bound, low, high) of each bounded field of a nested record kind; the
    bound None where it is the board's memory (decided per sample)."""
    return tuple((key.split(".", 1)[1], key, None if key.endswith("used_memory_bytes") else bound, bound.low,
                  bound.high) for key, bound in GPU_SAMPLE_BOUNDS.items() if key.startswith(prefix + "."))


_NESTED = {prefix: _nested(prefix) for prefix in ("host", "processes", "links", "xid_errors", "remapped_rows")}
_TOP = tuple((name, bound) for name, bound in GPU_SAMPLE_BOUNDS.items()
             if "." not in name and name not in ("power_w", "mem_used_bytes", "mem_total_bytes", "clock_event_time_s"))


def _record(record: Any, prefix: str, rejected: list[Rejection], memory: Bound) -> Any:
    """A nested record with its bad values dropped; None when a required one (a PID, a link index) is bad."""
    changes: dict[str, Any] = {}
    for attr, name, bound, low, high in _NESTED[prefix]:
        value = getattr(record, attr)
        if value is None or (bound is not None and type(value) in _PLAIN and low <= value <= high
                             and (value <= 1.0 or bound is not RATIO)):
            continue  # the common case, decided without a call
        kept = _judge(name, value, memory if bound is None else bound, rejected)
        if kept is not value:
            if kept is None and _required(type(record), attr):
                return None
            changes[attr] = kept
    return dataclasses.replace(record, **changes) if changes else record


@functools.cache
def _required(cls: type, attr: str) -> bool:
    field = next(f for f in dataclasses.fields(cls) if f.name == attr)
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _records(records: tuple[Any, ...] | None, prefix: str, rejected: list[Rejection],
             memory: Bound) -> tuple[Any, ...] | None:
    if not records:
        return records
    kept = tuple(r for r in (_record(x, prefix, rejected, memory) for x in records) if r is not None)
    return records if len(kept) == len(records) and all(a is b for a, b in zip(kept, records)) else kept


def bound_sample(sample: GpuSample, spec: GpuSpec | None = None) -> tuple[GpuSample, tuple[Rejection, ...]]:
    """``sample`` with every value outside its bound dropped (None: unknown, never 0), and what was dropped.

    ``spec`` is the device's catalogue entry: its TDP and memory size narrow the power and memory bounds
    (see :func:`power_bound`, :func:`memory_bound`). A ratio up to 5% over 1 is clamped to 1 and not
    counted. A nested record whose identity is bad (a process's PID, a link's index, an XID code) is
    dropped whole. The sample comes back unchanged (the same object) when everything is within bounds.
    """
    rejected: list[Rejection] = []
    changes: dict[str, Any] = {}
    for name, bound in _TOP:
        value = getattr(sample, name)
        if value is not None and (kept := _judge(name, value, bound, rejected)) is not value:
            changes[name] = kept
    if sample.power_w is not None:
        limit = changes.get("power_limit_w", sample.power_limit_w)
        bound = power_bound(limit, spec.tdp_w if spec is not None else None)
        if (kept := _judge("power_w", sample.power_w, bound, rejected)) is not sample.power_w:
            changes["power_w"] = kept
    memory = memory_bound(spec.memory_bytes if spec is not None else None)
    for name in ("mem_used_bytes", "mem_total_bytes"):
        value = getattr(sample, name)
        if value is not None and (kept := _judge(name, value, memory, rejected)) is not value:
            changes[name] = kept
    if sample.clock_event_time_s:
        times = {k: v for k, v in sample.clock_event_time_s.items()
                 if _judge("clock_event_time_s", v, TIME_SINCE_LOAD, rejected) is not None}
        if len(times) != len(sample.clock_event_time_s):
            changes["clock_event_time_s"] = times or None
    for name in ("processes", "links", "xid_errors"):
        records = getattr(sample, name)
        if (kept := _records(records, name, rejected, memory)) is not records:
            changes[name] = kept
    for name in ("host", "remapped_rows"):
        record = getattr(sample, name)
        if record is not None and (kept := _record(record, name, rejected, memory)) is not record:
            changes[name] = kept
    return (dataclasses.replace(sample, **changes) if changes else sample), tuple(rejected)


@dataclass(slots=True)
class RejectionTally:
    """Readings refused since the agent started, by (source, field), with the latest of each; says when a
    refusal starts an episode (none of that source and field for :data:`EPISODE_QUIET_S`), the one to log."""

    quiet_s: float = EPISODE_QUIET_S
    _entries: dict[tuple[str, str], RejectedValues] = dataclasses.field(default_factory=dict)

    def note(self, source: str, gpu: str, rejection: Rejection, ts: float) -> bool:
        """Count ``rejection``; True when it starts an episode."""
        key = (source, rejection.field)
        old = self._entries.get(key)
        self._entries[key] = RejectedValues(source=source, field=rejection.field, count=(old.count if old else 0) + 1,
                                            gpu=gpu, value=rejection.value, bound=rejection.bound, ts=ts)
        return old is None or not 0.0 <= ts - old.ts < self.quiet_s

    def entries(self) -> tuple[RejectedValues, ...]:
        return tuple(self._entries[key] for key in sorted(self._entries))
