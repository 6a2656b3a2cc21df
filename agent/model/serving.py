"""An inference server's own numbers, and what the agent concludes from them.

:class:`ServingReport` is what a serving job says about itself over one scrape interval (read from
vLLM/SGLang/TGI metrics by agent.context.workload.inference, or sent through the client). It rides
on :class:`~agent.model.sample.WorkloadReport` as the optional ``serving`` object, so a trace line
carries it as ``workload.serving`` (an optional field: older readers ignore it).

:class:`ServingView` is the classifier's answer to "how far is this server from what the hardware
allows, and which knob moves it?" (agent.classifier.serving), attached to the GPU's verdict.
Figures are for the whole server (one model replica) unless the name says ``per_gpu``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from agent.model.terms import NonNegative, Ratio

ServingState = Literal["at_floor", "near_floor", "under_batched", "prefill_heavy", "kv_saturated",
                       "above_floor", "unknown"]
"""The serving verdict. Each comes with an advice code (:data:`SERVING_ADVICE`)."""

SERVING_STATES: tuple[ServingState, ...] = ("at_floor", "near_floor", "under_batched", "prefill_heavy",
                                            "kv_saturated", "above_floor", "unknown")

SERVING_ADVICE: dict[ServingState, str] = {
    "at_floor": "faster_memory_or_fewer_bytes",
    "near_floor": "none",
    "under_batched": "raise_batch",
    "prefill_heavy": "chunk_or_disaggregate_prefill",
    "kv_saturated": "scale_out",
    "above_floor": "find_overhead",
    "unknown": "report_model_bytes",
}
"""The advice code exported beside each state: one knob per state (docs/serving.md says what each means)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingReport:
    """One inference server (one model replica) over the last scrape interval. ``None`` = not exported."""

    server: Annotated[str, Field(max_length=256)] | None = None
    """Which server: ``<kind> <host:port>`` for a scraped endpoint, or the job name."""
    model: Annotated[str, Field(max_length=256)] | None = None
    weight_bytes: NonNegative | None = None
    """Bytes of weights the whole replica reads per decode step (all its GPUs together)."""
    kv_cache_bytes: NonNegative | None = None
    """Size of the replica's KV-cache pool, when the server or the configuration says it."""
    kv_usage: Ratio | None = None
    """Share of the KV-cache pool in use (vLLM ``kv_cache_usage_perc``, SGLang ``token_usage``)."""
    running: NonNegative | None = None
    """Requests in the running batch."""
    waiting: NonNegative | None = None
    """Requests queued for admission."""
    max_running: NonNegative | None = None
    """The configured cap on the running batch (vLLM ``max_num_seqs``, SGLang ``max_running_requests``)."""
    preemptions_per_s: NonNegative | None = None
    """Requests preempted (vLLM) or retracted (SGLang) per second for lack of KV-cache memory."""
    tpot_s: NonNegative | None = None
    """Mean time per output token (inter-token latency) over the interval."""
    ttft_s: NonNegative | None = None
    """Mean time to first token over the interval."""
    prefill_share: Ratio | None = None
    """Share of the GPU's busy time spent in prefill (the rest in decode)."""
    generated_tokens_per_s: NonNegative | None = None
    """Output tokens per second of the replica (decode throughput)."""
    gpus: Annotated[int, Field(ge=1, le=65536)] | None = None
    """GPUs of the replica that share each step's weight read (tensor x pipeline parallel)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingView:
    """How one server runs against the latency floor its GPUs allow, and the knob that moves it."""

    server: str | None
    model: str | None
    state: ServingState
    advice: str
    """The knob, in one sentence with the numbers that decided it."""
    reasons: tuple[str, ...]
    floor_s: float | None
    """Least time a decode step can take at this batch: max(bytes read / HBM bandwidth, FLOPs / peak)."""
    floor_memory_s: float | None
    """(Weight bytes + KV-cache bytes read) / the replica's HBM bandwidth."""
    floor_compute_s: float | None
    """Batch x FLOPs per token / the replica's dense peak: the roof batching runs into."""
    weight_bytes: float | None
    kv_bytes_read: float | None
    """KV-cache bytes a decode step reads at the current batch (whole replica)."""
    kv_bytes_estimated: bool
    """True when the KV pool size was estimated from the memory the server holds."""
    tpot_s: float | None
    floor_ratio: float | None
    """Achieved time per output token / the floor: 1 is as fast as the hardware allows."""
    tokens_per_s_per_gpu: float | None
    prefill_share: float | None
    batch: float | None
    possible_batch: float | None
    """The batch the KV-cache pool could hold at the current context lengths (capped by max_running)."""
    waiting: float | None
    kv_usage: float | None
    preemptions_per_s: float | None
    gpus: int

    @property
    def advice_code(self) -> str:
        return SERVING_ADVICE[self.state]

    def to_json(self) -> dict[str, object]:
        def r(value: float | None, digits: int = 4) -> float | None:
            return None if value is None else round(value, digits)
        return {
            "server": self.server, "model": self.model, "state": self.state, "advice_code": self.advice_code,
            "advice": self.advice, "reasons": list(self.reasons), "floor_s": r(self.floor_s, 6),
            "floor_memory_s": r(self.floor_memory_s, 6), "floor_compute_s": r(self.floor_compute_s, 6),
            "weight_bytes": r(self.weight_bytes, 0), "kv_bytes_read": r(self.kv_bytes_read, 0),
            "kv_bytes_estimated": self.kv_bytes_estimated, "tpot_s": r(self.tpot_s, 6),
            "floor_ratio": r(self.floor_ratio, 3), "tokens_per_s_per_gpu": r(self.tokens_per_s_per_gpu, 2),
            "prefill_share": r(self.prefill_share, 3), "batch": r(self.batch, 2),
            "possible_batch": r(self.possible_batch, 1), "waiting": r(self.waiting, 2),
            "kv_usage": r(self.kv_usage, 3), "preemptions_per_s": r(self.preemptions_per_s, 3), "gpus": self.gpus,
        }
