"""What a workload report may say: the body's schema, its bounds, and its translation into the model.

Strict on purpose: a string where a number belongs is an error, not a guess, and every string,
number and list is bounded, because anyone who can reach the socket or the port can send one.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.model import ServingReport, WorkloadReport

MAX_BODY_BYTES = 16 * 1024


MAX_STR_LEN = 128


MAX_HINT_LEN = 1024
"""Visible-device lists hold up to a few dozen UUIDs (40 characters each), hence longer than other strings."""


Str = Annotated[str, Field(min_length=1, max_length=MAX_STR_LEN)]


Hint = Annotated[str, Field(max_length=MAX_HINT_LEN)]


Seconds = Annotated[float, Field(ge=0.0, le=1e6)]


Count = Annotated[float, Field(ge=0.0, le=1e18)]


class ReportHints(BaseModel):
    """The reporter's environment, for finding its GPU when its PID means nothing to us."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    CUDA_VISIBLE_DEVICES: Hint | None = None
    NVIDIA_VISIBLE_DEVICES: Hint | None = None
    ROCR_VISIBLE_DEVICES: Hint | None = None
    HIP_VISIBLE_DEVICES: Hint | None = None
    LOCAL_RANK: Annotated[str, Field(max_length=16)] | None = None


Ratio = Annotated[float, Field(ge=0.0, le=1.0)]


class ServingFields(BaseModel):
    """What an inference job says about its serving (agent.model.serving.ServingReport)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    running: Count | None = None
    waiting: Count | None = None
    max_running: Count | None = None
    kv_usage: Ratio | None = None
    kv_cache_bytes: Count | None = None
    preemptions_per_s: Count | None = None
    tpot_s: Seconds | None = None
    ttft_s: Seconds | None = None
    prefill_share: Ratio | None = None
    generated_tokens_per_s: Count | None = None


class ReportRequest(BaseModel):
    """One ``POST /api/v1/report`` body. Strict: a string where a number belongs is an error, not a guess."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    step_time_s: Seconds | None = None
    tokens: Count | None = None
    """Tokens the whole job processed in this step."""
    tokens_per_s: Count | None = None
    """Whole-job throughput; derived from tokens / step_time_s when absent."""
    flops_per_token: Count | None = None
    model_bytes: Count | None = None
    dtype: Literal["fp8", "bf16", "fp16", "tf32", "fp32", "fp64"] | None = None
    rank: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    world_size: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    step: Annotated[int, Field(ge=0, le=10**15)] | None = None
    job: Str | None = None
    gpu: Str | None = None
    """GPU UUID or host index the reporter says it drives; trumps every other way of matching."""
    pid: Annotated[int, Field(ge=1, le=2**22)] | None = None
    """The reporter's PID in its own namespace (may be a container's)."""
    hints: ReportHints | None = None
    serving: ServingFields | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "ReportRequest":
        if all(getattr(self, name) is None for name in MEANINGFUL_FIELDS):
            raise ValueError("a report needs at least one of " + ", ".join(MEANINGFUL_FIELDS))
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(f"rank ({self.rank}) must be less than world_size ({self.world_size})")
        return self


MEANINGFUL_FIELDS = ("step_time_s", "tokens", "tokens_per_s", "flops_per_token", "model_bytes", "dtype", "step",
                     "serving")


def to_workload_report(request: ReportRequest) -> WorkloadReport:
    tokens_per_s = request.tokens_per_s
    if tokens_per_s is None and request.tokens is not None and request.step_time_s:
        tokens_per_s = request.tokens / request.step_time_s
    return WorkloadReport(job=request.job, rank=request.rank, world_size=request.world_size, step=request.step,
                          step_time_s=request.step_time_s, tokens_per_s=tokens_per_s,
                          flops_per_token=request.flops_per_token, model_bytes=request.model_bytes,
                          dtype=request.dtype, source="client", serving=_serving(request))


def _serving(request: ReportRequest) -> ServingReport | None:
    """The serving figures of a client report: the job names the server, its model_bytes are the weights."""
    s = request.serving
    if s is None:
        return None
    return ServingReport(server=request.job, weight_bytes=request.model_bytes, kv_cache_bytes=s.kv_cache_bytes,
                         kv_usage=s.kv_usage, running=s.running, waiting=s.waiting, max_running=s.max_running,
                         preemptions_per_s=s.preemptions_per_s, tpot_s=s.tpot_s, ttft_s=s.ttft_s,
                         prefill_share=s.prefill_share, generated_tokens_per_s=s.generated_tokens_per_s,
                         gpus=request.world_size)


def describe_validation_error(exc: ValidationError) -> str:
    """Name the fields and what is wrong, without echoing the (untrusted) values."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False)[:5]:
        loc = ".".join(str(part)[:64] for part in error["loc"]) or "body"
        parts.append(f"{loc}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
