"""The steady numbers of one serving phase: its floor, step time, latencies, rates and GPU activity.

One formula set feeds the GPU counters (agent.virtual.serving.plan), the fake servers' counters
(agent.virtual.serving.job) and the workload report the engine gives directly, so they cannot
disagree. Figures are for the whole replica (its GPUs read their shards at once, so bandwidth and
peak add up over ``gpus``), per second unless the name says otherwise.

The model, per request: a prefill, then ``output_tokens - 1`` decode steps (the first token comes
out of prefill). Prefill shares the GPUs with decode, so a request's tokens come
``step / (1 - prefill_share)`` apart. The running batch counts requests in either phase, and
Little's law turns it into a request rate. The floor is the classifier's own formula
(agent.classifier.serving): ``max((weights + KV bytes in use) / (gpus x bandwidth),
running x FLOPs per token / (gpus x dense peak))``, with the KV bytes in use being what the batch's
contexts (prompt plus half the output, on average) occupy.

Counts are fluid: a counter grows by the expected number of events, fractions included, so any two
scrapes, however close, give the phase's rates exactly (a real server's counts are whole numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.model import GpuSpec
from agent.virtual.devices import GIB, MIB, driver_view
from agent.virtual.physics import DRAM_MAX
from agent.virtual.workloads import ServingPhase

GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default ``gpu_memory_utilization``: the share of each GPU's memory a server takes."""
WORKSPACE_BYTES = GIB
"""Per GPU: activations, CUDA graphs and the sampler's buffers, held besides weights and KV cache."""
PREFILL_MFU_MAX = 0.85
"""Prefill at more than this share of the dense peak is not credible (large GEMMs reach 0.75-0.85)."""


class ServingError(ValueError):
    """A serving phase the GPUs cannot run; ``field`` names the parameter to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class ServingFigures:
    """The steady state of one serving phase on its replica."""

    gpus: int
    bandwidth: float
    """HBM bandwidth of one GPU (bytes/s), from the spec catalogue."""
    peak_flops: float
    weight_bytes: float
    flops_per_token: float
    kv_pool_bytes: float
    kv_usage: float
    kv_read_bytes: float
    """KV-cache bytes the batch's contexts occupy, read by every decode step."""
    floor_memory_s: float
    floor_compute_s: float
    floor_s: float
    step_s: float
    """One decode step: ``floor_multiple`` x the floor."""
    itl_s: float
    """Time between two tokens of one request: the step, stretched by the prefills in between."""
    prefill_s: float
    """Wall time of one request's prefill (scheduled to first token)."""
    decode_s: float
    """Wall time of one request's decode (first token to last)."""
    queue_s: float
    ttft_s: float
    requests_per_s: float
    prompt_tokens_per_s: float
    generated_tokens_per_s: float
    decode_steps_per_s: float
    prefill_gpu_s: float
    """GPU seconds of one request's prefill forward."""
    prefill_mfu: float
    decode_dram: float
    decode_tensor: float
    held_bytes_per_gpu: float
    running: float
    waiting: float
    prefill_share: float
    preemptions_per_s: float
    prompt_tokens: float
    output_tokens: float

    @property
    def ratio(self) -> float:
        """Inter-token latency / the floor: what vLLM's and SGLang's latency histograms imply."""
        return self.itl_s / self.floor_s

    @property
    def request_tpot_s(self) -> float:
        """TGI's per-request time per token: the request's prefill and decode over its tokens."""
        return (self.prefill_s + self.decode_s) / self.output_tokens

    @property
    def tensor_mean(self) -> float:
        return self.prefill_share * self.prefill_mfu + (1.0 - self.prefill_share) * self.decode_tensor

    def true_class(self, prefill_dram: float) -> str:
        """The label a perfect counter classifier would give: bandwidth-bound decode, compute-heavy
        prefill, or neither roof near (a server far above its floor is launch- or CPU-bound)."""
        dram = self.prefill_share * prefill_dram + (1.0 - self.prefill_share) * self.decode_dram
        if dram >= 0.4:
            return "memory_bound"
        return "compute_bound" if self.tensor_mean >= 0.3 else "latency_bound"


def default_kv_pool(phase: ServingPhase, gpus: int, memory_bytes: float) -> float:
    """What vLLM allocates: ``gpu_memory_utilization`` of each GPU, less its weight shard and workspace."""
    return gpus * (GPU_MEMORY_UTILIZATION * memory_bytes - phase.weight_bytes / gpus - WORKSPACE_BYTES)


def serving_figures(phase: ServingPhase, *, gpus: int, bandwidth: float, peak_flops: float,
                    memory_bytes: float) -> ServingFigures:
    """The steady state of ``phase`` on ``gpus`` GPUs of ``bandwidth`` bytes/s, ``peak_flops`` (the
    workload's dtype) and ``memory_bytes`` each; raises :class:`ServingError` when they cannot run it."""
    if gpus < 1 or bandwidth <= 0.0 or peak_flops <= 0.0:
        raise ServingError("kind", "serving needs GPUs with a known memory bandwidth and a peak for the dtype")
    p = phase
    params = p.params if p.params is not None else p.weight_bytes / 2.0
    flops_per_token = 2.0 * params
    pool = p.kv_cache_bytes if p.kv_cache_bytes is not None else default_kv_pool(p, gpus, memory_bytes)
    if pool <= 0.0:
        raise ServingError("weight_bytes", f"{p.weight_bytes / 1e9:.3g} GB of weights leave no KV cache on "
                                           f"{gpus} GPU(s) of {memory_bytes / 1e9:.3g} GB; use more GPUs")
    kv_used = p.running * (p.prompt_tokens + p.output_tokens / 2.0) * p.kv_bytes_per_token
    if kv_used > pool:
        raise ServingError("running", f"{p.running} requests of ~{p.prompt_tokens + p.output_tokens / 2:.0f} "
                                      f"tokens need {kv_used / 1e9:.3g} GB of KV cache; the pool holds "
                                      f"{pool / 1e9:.3g} GB")
    shard = (p.weight_bytes + pool) / gpus
    held = p.mem_used_gib * GIB if p.mem_used_gib is not None else shard + WORKSPACE_BYTES
    if held < shard:
        raise ServingError("mem_used_gib", f"{p.mem_used_gib} GiB is less than the weights and KV cache each "
                                           f"GPU holds ({shard / GIB:.1f} GiB)")
    if held > memory_bytes:
        raise ServingError("kv_cache_bytes", f"weights, KV cache and workspace need {held / GIB:.1f} GiB per GPU; "
                                             f"the GPU has {memory_bytes / GIB:.1f} GiB")
    floor_memory = (p.weight_bytes + kv_used) / (gpus * bandwidth)
    floor_compute = p.running * flops_per_token / (gpus * peak_flops)
    floor = max(floor_memory, floor_compute)
    step = p.floor_multiple * floor
    share = p.prefill_share
    itl = step / (1.0 - share)
    decode = (p.output_tokens - 1) * itl
    prefill = share / (1.0 - share) * decode / p.running
    rate = p.running / (prefill + decode)
    prefill_mfu = rate * p.prompt_tokens * flops_per_token / (share * gpus * peak_flops)
    if prefill_mfu > PREFILL_MFU_MAX:
        raise ServingError("prefill_share", f"{rate:.3g} requests/s of {p.prompt_tokens} prompt tokens need "
                                            f"{prefill_mfu:.2f} x the dense peak while prefilling at this share; "
                                            f"raise it, or shorten prompts")
    queue = p.waiting / rate
    return ServingFigures(
        gpus=gpus, bandwidth=bandwidth, peak_flops=peak_flops, weight_bytes=p.weight_bytes,
        flops_per_token=flops_per_token, kv_pool_bytes=pool, kv_usage=kv_used / pool, kv_read_bytes=kv_used,
        floor_memory_s=floor_memory, floor_compute_s=floor_compute, floor_s=floor, step_s=step, itl_s=itl,
        prefill_s=prefill, decode_s=decode, queue_s=queue, ttft_s=queue + prefill, requests_per_s=rate,
        prompt_tokens_per_s=rate * p.prompt_tokens, generated_tokens_per_s=rate * p.output_tokens,
        decode_steps_per_s=(1.0 - share) / step, prefill_gpu_s=share / rate, prefill_mfu=prefill_mfu,
        decode_dram=min(DRAM_MAX, floor_memory / step), decode_tensor=floor_compute / step,
        held_bytes_per_gpu=held, running=float(p.running), waiting=float(p.waiting), prefill_share=share,
        preemptions_per_s=p.preemptions_per_s, prompt_tokens=float(p.prompt_tokens),
        output_tokens=float(p.output_tokens),
    )


def phase_figures(phase: ServingPhase, *, gpus: int, model: str, spec: GpuSpec, dtype: str) -> ServingFigures:
    """:func:`serving_figures` on ``gpus`` whole GPUs of catalogue model ``model`` (memory as the driver reports it)."""
    view = driver_view(model, spec)
    memory = view.memory_mib * MIB if view.memory_mib else float(spec.memory_bytes or 0)
    return serving_figures(phase, gpus=gpus, bandwidth=spec.mem_bandwidth_bytes_per_s or 0.0,
                           peak_flops=spec.peak_flops.get(dtype, 0.0), memory_bytes=memory)


def tgi_token_budget(f: ServingFigures, kv_bytes_per_token: float) -> tuple[int, int]:
    """TGI's (``tgi_batch_current_max_tokens``, ``tgi_batch_max_total_tokens``): the tokens the batch holds
    and the KV-cache budget in tokens, whole numbers as TGI exports them."""
    total = max(1, math.floor(f.kv_pool_bytes / kv_bytes_per_token))
    return round(f.kv_usage * total), total
