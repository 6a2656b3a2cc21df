"""Communication evidence every GPU gives: power and memory activity against fabric bytes.

A collective's waiting kernel spins: ``utilization.gpu`` and AMD's gfx activity stay near 100% while
the rank waits on its peers, so on a GPU without SM or tensor counters the duty cycle reads a stall
as work. What the spin cannot hide is that the GPU stops drawing power and touching memory while
the fabric carries the collective: within a step, power and memory activity fall as NVLink/XGMI and
NIC bytes rise (Llama 3 saw power swing by tens of megawatts when all GPUs waited on collectives).
This module measures that, per window, from counters every backend has:

* ``power_r`` / ``memory_r``: the correlation of power and of memory activity with fabric bytes
  over the window: clearly negative (``fabric_anticorrelation``) when compute and communication
  take turns;
* ``wait_fraction``: when they do, the share of samples in which the GPU waits on the fabric: a
  kernel resident, power at least ``wait_power_drop`` below the GPU's working level in the window
  (its 90th percentile), and fabric bytes above the window's median (and above
  ``fabric_active_bytes``); 0 when they do not take turns;
* ``working_power_ratio``: power over the samples that are not waits, so a rank that waits half
  the time is still judged by the power its compute draws (the spin is never evidence of
  compute, nor of small kernels);
* ``power_cv``: the CV of 5 s block means of power over the last minute, the step-to-step
  variation a job that reports no step times still shows;
* ``spin_fraction``: the share of samples in which a kernel stays resident while power *and* memory
  activity sit at least ``wait_power_drop`` below their working levels and the fabric and PCIe are quiet
  (at most ``spin_fabric_share`` of the window's busiest rate, or unread): the collective is waiting, not
  transferring. This needs no fabric counter at all, so it is what an A100 read through NVML alone shows
  of a rank waiting for a straggler (utilization.gpu stays 100%, utilization.memory and power dip), and
  what an MI300X shows of ranks waiting on a hot expert (gfx at 100%, UMC and power collapsed, XGMI
  trickling). A regular rhythm of short transfers is not waiting: its fabric is busy.

Pure functions over samples, like the rest of the classifier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from agent.classifier.thresholds import Thresholds
from agent.model import GpuSample, GpuSpec

BLOCK_S = 5.0
POWER_CV_SPAN_S = 60.0
"""Span of the power-block CV: a dozen blocks, long enough for a few-second rhythm, short enough that a
phase change a minute ago no longer counts."""
_FABRIC_FIELDS = ("link_tx_bytes_per_s", "link_rx_bytes_per_s", "net_tx_bytes_per_s", "net_rx_bytes_per_s")


@dataclass(frozen=True, slots=True)
class FabricEvidence:
    """What power, memory activity and fabric bytes say about waiting on communication."""

    wait_fraction: float | None = None
    power_r: float | None = None
    memory_r: float | None = None
    working_power_ratio: float | None = None
    power_cv: float | None = None
    spin_fraction: float | None = None
    memory_gap: float | None = None


def fabric_bytes(sample: GpuSample) -> float | None:
    """Bytes per second the GPU moved over NVLink/XGMI and its NIC (None when no fabric counter)."""
    known = [v for name in _FABRIC_FIELDS if (v := getattr(sample, name)) is not None]
    return math.fsum(known) if known else None


def _moved(sample: GpuSample) -> float | None:
    """Bytes per second the GPU moved over any bus a collective may use: the fabric and PCIe (GPUs without
    NVLink reduce over PCIe)."""
    known = [v for v in (fabric_bytes(sample), sample.pcie_tx_bytes_per_s, sample.pcie_rx_bytes_per_s,
                         sample.pcie_bytes_per_s) if v is not None]
    return math.fsum(known) if known else None


def _limit(sample: GpuSample, spec: GpuSpec | None) -> float | None:
    if sample.power_limit_w:
        return sample.power_limit_w
    if spec is not None and spec.tdp_w and "/" not in sample.gpu:
        return spec.tdp_w
    return None


def _memory(sample: GpuSample) -> float | None:
    return sample.dram_active if sample.dram_active is not None else sample.mem_busy


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Correlation of two equally long series; None when either is flat or too short to say."""
    n = len(xs)
    if n < 6:
        return None
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    syy = math.fsum((y - my) ** 2 for y in ys)
    if sxx <= 1e-12 * n or syy <= 1e-12 * n * max(1.0, my * my):
        return None
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.sqrt(sxx * syy)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def power_block_cv(samples: Sequence[GpuSample], spec: GpuSpec | None) -> float | None:
    """CV of power (against its limit) over the consecutive 5 s blocks of the last ``POWER_CV_SPAN_S``."""
    if not samples:
        return None
    t0 = max(samples[0].ts, samples[-1].ts - POWER_CV_SPAN_S)
    samples = [s for s in samples if s.ts >= t0]
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for s in samples:
        if s.power_w is not None and (limit := _limit(s, spec)):
            block = int((s.ts - t0) // BLOCK_S)
            sums[block] = sums.get(block, 0.0) + s.power_w / limit
            counts[block] = counts.get(block, 0) + 1
    means = [total / counts[b] for b, total in sums.items() if counts[b] >= BLOCK_S / 2]
    if len(means) < 4:
        return None
    mean = math.fsum(means) / len(means)
    sd = math.sqrt(math.fsum((m - mean) ** 2 for m in means) / len(means))
    return sd / mean if mean > 0.02 else None


def spin_fraction(window: Sequence[GpuSample], spec: GpuSpec | None, t: Thresholds) -> float | None:
    """Share of the window's samples waiting with a kernel resident: power and memory activity well below
    their working levels (90th percentiles), the fabric quiet or unread. None without power and a memory
    counter in at least six samples."""
    rows = [(gr, p / limit, m, _moved(s)) for s in window
            if (gr := s.gr_active) is not None and (p := s.power_w) is not None and (limit := _limit(s, spec))
            and (m := _memory(s)) is not None]
    if len(rows) < 6:
        return None
    keep = 1.0 - t.wait_power_drop
    power_level = _quantile([p for _, p, _, _ in rows], 0.9) * keep
    memory_level = _quantile([m for _, _, m, _ in rows], 0.9) * keep
    moved = [b for _, _, _, b in rows if b is not None]
    quiet = max(t.fabric_active_bytes, t.spin_fabric_share * _quantile(moved, 0.9)) if moved else math.inf
    waits = sum(1 for gr, p, m, b in rows if gr >= t.comm_wait_gr and p <= power_level and m <= memory_level
                and (b is None or b <= quiet))
    return waits / len(rows)


def memory_gap(window: Sequence[GpuSample]) -> float | None:
    """How far below its working level memory activity sat over the window, as a time average: 1 - mean / 90th
    percentile of the reads with a kernel resident. A spinning collective touches no memory, so on a rank that
    waits a share w of the time this is about w, whatever the counter's sample period (the mean of
    utilization.memory over 1 s or 1/6 s reads is the time-average either way); on a rank that never waits
    (the straggler its peers wait for) it stays near 0 even when its clock, and so its level, is held down.
    None with fewer than six such reads."""
    values = [m for s in window if s.gr_active is not None and s.gr_active >= 0.5 and (m := _memory(s)) is not None]
    if len(values) < 6:
        return None
    level = _quantile(values, 0.9)
    return max(0.0, 1.0 - (math.fsum(values) / len(values)) / level) if level > 0.0 else None


def fabric_evidence(window: Sequence[GpuSample], long_window: Sequence[GpuSample], spec: GpuSpec | None,
                    t: Thresholds) -> FabricEvidence:
    """The window's communication evidence; the fabric part empty when the GPU has no fabric counter or no
    power."""
    spin = spin_fraction(window, spec, t)
    gap = memory_gap(window)
    rows = [(s, p / limit, b) for s in window
            if (p := s.power_w) is not None and (limit := _limit(s, spec)) and (b := fabric_bytes(s)) is not None]
    if len(rows) < 6 or max(b for _, _, b in rows) < t.fabric_active_bytes:
        return FabricEvidence(power_cv=power_block_cv(long_window, spec), spin_fraction=spin, memory_gap=gap)
    working_level = _quantile([p for _, p, _ in rows], 0.9)
    busy_fabric = max(t.fabric_active_bytes, _quantile([b for _, _, b in rows], 0.5))
    waiting = [s.gr_active is not None and s.gr_active >= t.comm_wait_gr
               and p <= working_level * (1.0 - t.wait_power_drop) and b >= busy_fabric
               for s, p, b in rows]
    working = [p for (_, p, _), w in zip(rows, waiting) if not w]
    memory_rows = [(m, b) for s, _, b in rows if (m := _memory(s)) is not None]
    power_r = pearson([p for _, p, _ in rows], [b for _, _, b in rows])
    taking_turns = power_r is not None and power_r <= -t.fabric_anticorrelation
    return FabricEvidence(
        wait_fraction=sum(waiting) / len(rows) if taking_turns else 0.0,
        power_r=power_r,
        memory_r=pearson([m for m, _ in memory_rows], [b for _, b in memory_rows]) if len(memory_rows) >= 6 else None,
        working_power_ratio=math.fsum(working) / len(working) if working else None,
        power_cv=power_block_cv(long_window, spec),
        spin_fraction=spin,
        memory_gap=gap,
    )
