"""Roofline coordinates, MFU and MBU of one GPU over one window.

Two MFUs are kept apart on purpose (classification.md §2):

* **counters** — a hardware FLOPs-utilisation estimate ("OFU"): clock-scaled tensor activity,
  i.e. achieved tensor FLOP/s over the dense peak of the dtype. Needs a tensor counter; a GPU
  without one (AMD via amdsmi, NVIDIA before Hopper without DCGM) has no counter MFU at all.
* **workload** — what the job reported: tokens/s x FLOPs/token / (world size x per-GPU peak).

MBU likewise: from the reported model bytes and step time or token rate, else DRAM activity.
A workload figure past ``MAX_UTILISATION`` is a unit error in the report: unknown, with a reason.
"""

from __future__ import annotations

import dataclasses

from agent.model import GpuSpec, Roofline, WindowFeatures
from agent.model.verdict import Check, Reason

DEFAULT_DTYPE = "bf16"

MAX_UTILISATION = 2.0
"""Largest workload MFU or MBU shown as a number. No GPU runs past its dense peak; 2:4 structured
sparsity doubles the tensor peak, and FLOPs-per-token rules of thumb (6N) are approximate, so
figures up to twice the peak are kept. Past it the report's units are wrong (tokens per step given
as per second, FLOPs for the whole job given per token, a batch's tokens against one model read):
the figure is shown as unknown with a reason, never as a number. Each report field is bounded
on its own (agent.context.workload.report_schema); their product is bounded here."""


def pipe_flops(f: WindowFeatures, peaks: dict[str, float]) -> float:
    """FLOP/s of the non-tensor pipes: FP32 and FP64 at their catalogue peaks, FP16 at twice FP32.

    Approximate by construction (NVIDIA: pipe activity does not convert to FLOPs exactly
    [DCGM#164]); the catalogue's FP64 figure is the tensor FP64 peak, so this is an upper bound.
    """
    fp32 = peaks.get("fp32")
    pipe_peaks = {"fp32": fp32, "fp64": peaks.get("fp64"), "fp16": 2.0 * fp32 if fp32 else None}
    return sum(f.pipe_means[p] * peak for p, peak in pipe_peaks.items() if peak and p in f.pipe_means)


def _ratio(value: float | None, peak: float | None) -> float | None:
    if value is None or not peak:
        return None
    return value / peak


def workload_utilisation(f: WindowFeatures, peak: float | None, bandwidth: float | None,
                         dtype: str) -> tuple[float | None, float | None, tuple[Reason, ...]]:
    """(MFU, MBU, reasons) from the job's own report; a figure past ``MAX_UTILISATION`` (infinite
    included) is ``None``, and a reason says which numbers made it, so a person can fix the units."""
    w = f.workload
    if w is None:
        return None, None, ()
    world = w.world_size or 1
    mfu = mbu = None
    mfu_from = mbu_from = ""
    if w.tokens_per_s is not None and w.flops_per_token is not None and peak:
        mfu = w.tokens_per_s * w.flops_per_token / (world * peak)
        mfu_from = f"tokens_per_s {w.tokens_per_s:.3g} x flops_per_token {w.flops_per_token:.3g}"
    if w.model_bytes is not None and bandwidth:
        if w.step_time_s:
            mbu = w.model_bytes / w.step_time_s / (world * bandwidth)
            mbu_from = f"model_bytes {w.model_bytes:.3g} / step_time_s {w.step_time_s:.3g}"
        elif w.tokens_per_s is not None:  # batch-1 decode: every token reads the whole model
            mbu = w.model_bytes * w.tokens_per_s / (world * bandwidth)
            mbu_from = f"model_bytes {w.model_bytes:.3g} x tokens_per_s {w.tokens_per_s:.3g}"
    reasons = []
    for name, value, made_of, roof in (("MFU", mfu, mfu_from, f"the dense {dtype} peak"),
                                       ("MBU", mbu, mbu_from, "the memory bandwidth")):
        if value is not None and not _plausible(value):
            outside = (Check(f"workload_{name.lower()}", value, 0.0, "below") if value < 0.0
                       else Check(f"workload_{name.lower()}", value, MAX_UTILISATION, "above"))
            reasons.append(Reason(f"workload {name} unknown: {made_of} over world_size {world} is {value:.3g} x "
                                  f"{roof}, outside 0 to {MAX_UTILISATION:g}: a unit error in the job's report",
                                  (outside,)))
    return (mfu if mfu is not None and _plausible(mfu) else None,
            mbu if mbu is not None and _plausible(mbu) else None, tuple(reasons))


def _plausible(utilisation: float) -> bool:
    return 0.0 <= utilisation <= MAX_UTILISATION  # False for NaN and infinities too


def measure(f: WindowFeatures, spec: GpuSpec | None,
            configured_dtype: str | None = None) -> tuple[WindowFeatures, Roofline, tuple[Reason, ...]]:
    """The window's roofline figures and the job's own, computed once: the features with the job's MFU
    filled in (the stand-in for a missing compute counter), the :class:`Roofline`, and why a figure the job
    reported is unknown (a unit error: said once, with the verdict's reasons)."""
    dtype = f.dtype or configured_dtype or DEFAULT_DTYPE
    peak = spec.peak_flops.get(dtype) if spec else None
    mfu, mbu, notes = workload_utilisation(f, peak, spec.mem_bandwidth_bytes_per_s if spec else None, dtype)
    return (f if mfu is None else dataclasses.replace(f, mfu_reported=mfu)), _roofline(f, spec, configured_dtype, mfu, mbu), notes


def roofline(f: WindowFeatures, spec: GpuSpec | None, configured_dtype: str | None = None) -> Roofline:
    """Roofline coordinates from window features and the GPU's peaks (``None`` where unknown).

    The dtype comes from the samples (the workload said so), then the configuration, then the
    bf16 default, which is flagged as assumed. A dtype the GPU has no peak for gives no FLOP
    numbers rather than a peak borrowed from another precision.
    """
    return measure(f, spec, configured_dtype)[1]


def _roofline(f: WindowFeatures, spec: GpuSpec | None, configured_dtype: str | None,
              mfu_workload: float | None, mbu_workload: float | None) -> Roofline:
    dtype = f.dtype or configured_dtype or DEFAULT_DTYPE
    assumed = f.dtype is None and configured_dtype is None
    peaks = spec.peak_flops if spec else {}
    peak = peaks.get(dtype)
    bandwidth = spec.mem_bandwidth_bytes_per_s if spec else None

    tensor_flops = f.tensor_mean * peak if f.tensor_mean is not None and peak else None
    achieved = tensor_flops
    if achieved is not None:
        achieved += pipe_flops(f, peaks)
    achieved_bytes = f.dram_mean * bandwidth if f.dram_mean is not None and bandwidth else None
    intensity = achieved / achieved_bytes if achieved is not None and achieved_bytes else None
    ridge = spec.ridge_point(dtype) if spec else None
    return Roofline(
        dtype=dtype,
        dtype_assumed=assumed,
        peak_flops=peak,
        peak_bytes_per_s=bandwidth,
        achieved_flops=achieved,
        achieved_bytes_per_s=achieved_bytes,
        intensity=intensity,
        ridge_point=ridge,
        compute_headroom=None if (r := _ratio(achieved, peak)) is None else max(0.0, 1.0 - r),
        memory_headroom=None if (r := _ratio(achieved_bytes, bandwidth)) is None else max(0.0, 1.0 - r),
        mfu_counters=min(1.0, tensor_flops / peak) if tensor_flops is not None and peak else None,
        mfu_workload=mfu_workload,
        mbu_counters=f.dram_mean,
        mbu_workload=mbu_workload,
    )
