"""Hypothesis strategies and helpers for fuzzing the trace reader (docs/trace-format.md).

Any valid GpuSample (every field, unicode and undecodable-byte names included), any JSON value,
and a reader run that returns samples and errors instead of raising. Shared by the
tests/test_fuzz_trace*.py files.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from agent.model import (DTYPES, WORKLOAD_CLASSES, Attribution, GpuSample, HostSample, LinkTraffic,
                         ProcessSample, RemappedRows, WorkloadReport, XidCount)
from agent.trace import TraceFormatError, TraceReader
from agent.trace.reader import INTERVAL_MAX_S, INTERVAL_MIN_S, TS_MAX, TS_MIN

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite = st.floats(allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
ratio = st.floats(min_value=0.0, max_value=1.0)
nonneg_int = st.integers(min_value=0, max_value=2**64)
escaped_bytes = st.integers(0x80, 0xFF).map(lambda byte: chr(0xDC00 + byte))
"""Lone surrogates as Python and psutil decode undecodable bytes (``surrogateescape``) in process names."""
text = st.lists(st.characters(codec="utf-8") | escaped_bytes, max_size=12).map("".join)


def opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


RATIOS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active", "fp16_active",
          "dram_active", "mem_busy", "util_gpu", "tensor_hmma_active", "tensor_imma_active", "tensor_dmma_active", "tensor_dfma_active")
NONNEG = ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "link_tx_bytes_per_s", "link_rx_bytes_per_s",
          "net_tx_bytes_per_s", "net_rx_bytes_per_s", "power_w", "sm_clock_mhz", "sm_clock_max_mhz", "energy_j",
          "power_limit_w", "net_congestion_per_s", "net_retransmits_per_s", "pcie_bytes_per_s")
NONNEG_INTS = ("mem_used_bytes", "mem_total_bytes", "clock_event_reasons", "ecc_corrected_errors",
               "ecc_uncorrected_errors", "driver_calls", "net_link_downs", "pcie_replays")

processes = st.builds(
    ProcessSample, pid=nonneg_int, name=opt(text), command=opt(text), user=opt(text), sm_util=opt(ratio),
    **{f: opt(nonneg_int) for f in ("used_memory_bytes", "workers", "rss_bytes", "compute_units")},
    **{f: opt(nonneg) for f in ("cpu_cores", "cpu_main_cores", "cpu_workers_cores", "cpu_limit_cores",
                                "io_read_bytes_per_s", "io_write_bytes_per_s")},
)
SAMPLE_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "ts": st.floats(TS_MIN, TS_MAX), "gpu": text, "node": text, "uuid": opt(text), "vendor": opt(st.sampled_from(["nvidia", "amd"])),
    "model": opt(text), "interval_s": opt(st.floats(min_value=INTERVAL_MIN_S, max_value=INTERVAL_MAX_S)),
    "temperature_c": opt(finite), "memory_temperature_c": opt(finite), "dtype": opt(st.sampled_from(DTYPES)),
    "label": opt(st.sampled_from(WORKLOAD_CLASSES)),
    "processes": opt(st.lists(processes, max_size=3).map(tuple)),
    "host": opt(st.builds(HostSample, **{f: opt(ratio) for f in ("cpu_iowait_ratio", "io_pressure_ratio",
                                                                  "cpu_pressure_ratio", "cpu_utilization_ratio")})),
    "workload": opt(st.builds(
        WorkloadReport, job=opt(text), rank=opt(nonneg_int), world_size=opt(st.integers(1, 10**6)), step=opt(nonneg_int),
        step_time_s=opt(nonneg), tokens_per_s=opt(nonneg), flops_per_token=opt(nonneg), model_bytes=opt(nonneg),
        dtype=opt(st.sampled_from(DTYPES)), source=opt(st.sampled_from(["client", "vllm", "sglang", "tgi"])))),
    "clock_event_time_s": opt(st.dictionaries(text, nonneg, max_size=3)),
    "remapped_rows": opt(st.builds(RemappedRows, correctable=nonneg_int, uncorrectable=nonneg_int,
                                   pending=st.booleans(), failure=st.booleans())),
    "xid_errors": opt(st.lists(st.builds(XidCount, xid=nonneg_int, count=st.integers(1, 2**32), last_ts=finite),
                               max_size=2).map(tuple)),
    "attribution": opt(st.builds(Attribution, **{f: opt(text) for f in ("job_id", "user", "partition", "namespace",
                                                                        "pod", "container")})),
    "links": opt(st.lists(st.builds(LinkTraffic, link=nonneg_int, read_bytes=opt(nonneg), write_bytes=opt(nonneg),
                                    up=opt(st.booleans())), max_size=2).map(tuple)),
    **{f: opt(ratio) for f in RATIOS},
    **{f: opt(nonneg) for f in NONNEG},
    **{f: opt(nonneg_int) for f in NONNEG_INTS},
}
samples = st.builds(GpuSample, **SAMPLE_STRATEGIES)


def distinct_gpus(batch: list[GpuSample]) -> list[GpuSample]:
    """``ts`` must increase per GPU (contract), so each sample gets a GPU of its own."""
    return [dataclasses.replace(s, gpu=f"{i}/{s.gpu}") for i, s in enumerate(batch)]


json_scalars = st.none() | st.booleans() | st.integers() | finite | st.text(max_size=8)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


def read_all(source: Path | io.BytesIO, strict: bool) -> tuple[list[GpuSample], TraceFormatError | None, list[TraceFormatError]]:
    """Samples, the error raised (if any) and the errors kept; any other exception fails the test."""
    got: list[GpuSample] = []
    reader: TraceReader | None = None
    try:
        reader = TraceReader(source, strict=strict)
        for sample in reader:
            got.append(sample)
    except TraceFormatError as exc:
        return got, exc, reader.errors if reader is not None else []
    return got, None, reader.errors
