"""The serving view: how far an inference server runs from the latency floor its GPUs allow.

Every decode step reads the model's weights, and the KV cache of the requests in the batch, from
HBM. So ``(weight bytes + KV bytes read) / HBM bandwidth`` is a time no decode step can beat, whatever
the batch size or software (docs/serving.md has the formula with a worked example). Batching spreads
that read over more tokens until the FLOPs of the batch, ``batch x FLOPs/token / peak``, become the
roof. The floor here is the larger of the two, for the whole replica (its GPUs read their shards
concurrently, so bandwidth and peak add up over ``gpus``).

Achieved time per output token over that floor says how much of the hardware the server leaves
unused; the batch, the queue, the KV cache and the prefill share say which knob moves it. Pure
functions of the latest report, the GPU's spec and the memory the window saw held; no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from agent.classifier.roofline import DEFAULT_DTYPE, MAX_UTILISATION
from agent.classifier.thresholds import Thresholds
from agent.model import GpuSample, GpuSpec, Roofline, ServingReport, ServingState, ServingView, WorkloadReport

MIN_KV_USAGE_FOR_CAPACITY = 0.01
"""Below this KV-cache usage the batch the pool could hold is not extrapolated (it would be huge and noisy)."""


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"


def _held_bytes(window: Sequence[GpuSample]) -> float | None:
    """Mean memory held on the GPU over the window (the server's weights, KV pool and workspace)."""
    held = [s.mem_used_bytes for s in window if s.mem_used_bytes is not None]
    return sum(held) / len(held) if held else None


def _kv_pool(serving: ServingReport, weight_bytes: float | None, gpus: int,
             window: Sequence[GpuSample]) -> tuple[float | None, bool]:
    """(KV-cache pool bytes of the replica, estimated?): as reported, else memory held less the weights.

    Servers preallocate the pool at start (vLLM: ``gpu_memory_utilization`` of the memory, less
    weights and activations), so memory held minus the weight shard is the pool plus a few GB of
    workspace: an over-estimate, which makes the floor higher and the ratio look better, never worse."""
    if serving.kv_cache_bytes is not None:
        return serving.kv_cache_bytes, False
    held = _held_bytes(window)
    if held is None or weight_bytes is None:
        return None, False
    return max(0.0, held - weight_bytes / gpus) * gpus, True


def _possible_batch(serving: ServingReport, batch: float | None) -> float | None:
    """The batch the KV pool could hold at the current context lengths: batch / KV usage.

    Deliberately not capped by the configured maximum: when the cap is what holds the batch down,
    this is the number that says how far it could go."""
    if batch and serving.kv_usage is not None and serving.kv_usage >= MIN_KV_USAGE_FOR_CAPACITY:
        return batch / serving.kv_usage
    return None


def serving_view(workload: WorkloadReport | None, spec: GpuSpec | None, window: Sequence[GpuSample],
                 t: Thresholds, configured_dtype: str | None = None) -> ServingView | None:
    """The serving view of a GPU whose workload report carries serving figures; None for any other GPU."""
    serving = workload.serving if workload is not None else None
    if serving is None:
        return None
    gpus = serving.gpus or (workload.world_size if workload and workload.world_size else 1)
    weight_bytes = serving.weight_bytes if serving.weight_bytes is not None else workload.model_bytes
    bandwidth = spec.mem_bandwidth_bytes_per_s if spec else None
    dtype = workload.dtype or configured_dtype or DEFAULT_DTYPE
    peak = spec.peak_flops.get(dtype) if spec else None
    batch = serving.running
    reasons: list[str] = []

    pool, estimated = _kv_pool(serving, weight_bytes, gpus, window)
    kv_read = pool * serving.kv_usage if pool is not None and serving.kv_usage is not None else None
    floor_memory = floor_compute = None
    if weight_bytes is not None and bandwidth:
        floor_memory = (weight_bytes + (kv_read or 0.0)) / (gpus * bandwidth)
        if kv_read is None:
            reasons.append("KV-cache bytes unknown: the floor counts the weights only (a lower bound)")
        elif estimated:
            reasons.append(f"KV-cache pool estimated from the memory held: {_gb(pool or 0.0)}")
    if batch and workload.flops_per_token and peak:
        floor_compute = batch * workload.flops_per_token / (gpus * peak)
    floor = max((f for f in (floor_memory, floor_compute) if f is not None), default=None)
    ratio = serving.tpot_s / floor if serving.tpot_s and floor else None

    generated = serving.generated_tokens_per_s
    per_gpu = generated / gpus if generated is not None else (
        workload.tokens_per_s / (workload.world_size or 1) if workload.tokens_per_s is not None else None)
    possible = _possible_batch(serving, batch)
    state, advice = _decide(serving, ratio, floor, floor_memory, floor_compute, batch, possible, weight_bytes, bandwidth,
                            t, reasons)
    return ServingView(
        server=serving.server, model=serving.model, state=state, advice=advice, reasons=tuple(reasons),
        floor_s=floor, floor_memory_s=floor_memory, floor_compute_s=floor_compute, weight_bytes=weight_bytes,
        kv_bytes_read=kv_read, kv_bytes_estimated=estimated and kv_read is not None, tpot_s=serving.tpot_s,
        floor_ratio=ratio, tokens_per_s_per_gpu=per_gpu, prefill_share=serving.prefill_share, batch=batch,
        possible_batch=possible, waiting=serving.waiting, kv_usage=serving.kv_usage,
        preemptions_per_s=serving.preemptions_per_s, gpus=gpus)


def serving_mbu(r: Roofline, view: ServingView | None) -> Roofline:
    """A serving GPU's workload MBU as Databricks defines it: (weights + KV cache) bytes per step / TPOT / bandwidth,
    i.e. the memory floor over the time per output token. The report's own MBU counts the weights only."""
    if view is None or view.floor_memory_s is None or not view.tpot_s:
        return r
    mbu = view.floor_memory_s / view.tpot_s
    return dataclasses.replace(r, mbu_workload=mbu) if 0.0 <= mbu <= MAX_UTILISATION else r


def _decide(s: ServingReport, ratio: float | None, floor: float | None, floor_memory: float | None,
            floor_compute: float | None, batch: float | None, possible: float | None, weight_bytes: float | None,
            bandwidth: float | None, t: Thresholds, reasons: list[str]) -> tuple[ServingState, str]:
    """The state and its advice, first rule that holds wins (docs/classification.md, "Serving")."""
    queued = s.waiting is not None and s.waiting >= t.serving_queue and s.waiting > 0
    kv_full = (s.kv_usage is not None and s.kv_usage >= t.serving_kv_full) or bool(s.preemptions_per_s)
    if queued and kv_full:
        full = s.kv_usage is not None and s.kv_usage >= t.serving_kv_full
        why = (f"KV cache {s.kv_usage:.0%} full" if full else f"{s.preemptions_per_s:.2g} requests preempted a second") + \
            f" with {s.waiting:.0f} requests waiting"
        reasons.append(why)
        return "kv_saturated", (f"{why}: the replica holds no more requests; add replicas (scale out), not GPUs "
                                f"to this replica, or shorten contexts")
    if floor is None or ratio is None:
        missing = [name for name, value in (("the model's weight bytes (model_bytes)", weight_bytes),
                                            ("the GPU's memory bandwidth", bandwidth),
                                            ("time per output token", s.tpot_s)) if not value]
        if not missing:
            missing = ["a positive floor"]
        reasons.append("no decode floor: missing " + ", ".join(missing))
        return "unknown", ("set model_bytes for this server (inference_endpoints[].model_bytes or the client's "
                           "model_bytes) so the floor can be computed" if weight_bytes is None else
                           "the floor needs " + ", ".join(missing))
    at = f"decode at {ratio:.2g}x the floor of {_ms(floor)} per token"
    if s.prefill_share is not None and s.prefill_share >= t.serving_prefill_share and ratio > t.serving_at_floor_ratio:
        reasons.append(f"prefill takes {s.prefill_share:.0%} of GPU time; {at}")
        return "prefill_heavy", (f"prefill takes {s.prefill_share:.0%} of GPU time and stalls decode ({at}): "
                                 f"chunk prefill (smaller chunks) or disaggregate prefill and decode onto separate GPUs")
    memory_bound = floor_compute is None or (floor_memory is not None and floor_memory >= floor_compute)
    small = batch is not None and possible is not None and batch < t.serving_under_batched * possible
    capped = batch is not None and s.max_running is not None and batch >= s.max_running - 0.5
    if memory_bound and small and (queued or capped):
        held = f"{s.waiting:.0f} requests waiting" if queued else f"the batch at its cap of {s.max_running:.0f}"
        reasons.append(f"batch {batch:.3g} of a possible ~{possible:.0f} by KV memory, {held}; {at}")
        return "under_batched", (f"{at}, batch {batch:.3g} of a possible ~{possible:.0f} by KV memory with {held}: "
                                 f"memory-bound and under-batched; raise max_num_seqs (SGLang: max_running_requests) "
                                 f"or quantise the weights")
    if memory_bound and small:
        reasons.append(f"batch {batch:.3g} of a possible ~{possible:.0f} with no queue: the traffic, not the server, "
                       f"sets the batch (fewer replicas would serve more tokens per GPU)")
    if ratio <= t.serving_at_floor_ratio:
        reasons.append(at)
        roof = "compute" if not memory_bound else "weight and KV-cache read"
        return "at_floor", (f"{at}: at the {roof} floor; only a faster GPU, fewer bytes (quantised weights or KV "
                            f"cache) or more tensor parallelism lowers latency")
    if ratio <= t.serving_far_ratio:
        reasons.append(at)
        return "near_floor", f"{at}: within reach of the floor; no single knob stands out"
    reasons.append(at)
    return "above_floor", (f"{at} with the batch in use: time goes outside the weight read; look for CPU "
                           f"scheduling gaps, uncaptured CUDA graphs, small kernels or slow sampling")
