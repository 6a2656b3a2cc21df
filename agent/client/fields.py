"""What a report may carry, and how the caller's arguments become one.

This runs on the caller's thread, inside somebody else's training loop, so it is cheap and
trusts nothing: every value is checked for type, finiteness and range, and anything wrong
raises :class:`Invalid`, which the reporter turns into a dropped-and-counted report rather
than an exception in the job. Kept apart from the transport so the rules for *what* is sent
read in one place, independent of *how* it is sent.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Mapping, NamedTuple

__all__ = ["DTYPES", "HINT_ENV", "MAX_HINT_LEN", "MAX_STR_LEN", "Invalid", "JobDefaults", "build_report"]

DTYPES = ("fp8", "bf16", "fp16", "tf32", "fp32", "fp64")
HINT_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "LOCAL_RANK")
"""Environment the agent uses to find the GPU when PIDs do not match (containers have their own PID namespace)."""
MAX_HINT_LEN = 1024
MAX_STR_LEN = 128

_DTYPE_ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
    "float64": "fp64", "double": "fp64", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
}
"""torch / numpy names, so ``dtype=model.dtype`` works without the caller translating."""

_FLOAT_FIELDS = ("step_time_s", "tokens", "tokens_per_s", "flops_per_token", "model_bytes")
_INT_FIELDS = ("rank", "world_size", "step")
_MEANINGFUL = ("step_time_s", "tokens", "tokens_per_s", "flops_per_token", "model_bytes", "dtype", "step", "serving")
SERVING_FIELDS = ("running", "waiting", "max_running", "kv_usage", "kv_cache_bytes", "preemptions_per_s", "tpot_s",
                  "ttft_s", "prefill_share", "generated_tokens_per_s")
"""What an inference job may say about its serving (agent.model.serving.ServingReport, docs/serving.md)."""
_SERVING_RATIOS = ("kv_usage", "prefill_share")


class Invalid(Exception):
    """An argument that cannot be reported; the report is dropped and counted."""


class JobDefaults(NamedTuple):
    """What the environment says about this process, read once: launchers set it before the process starts."""

    rank: int | None
    world_size: int | None
    job: str | None
    hints: dict[str, str]

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> JobDefaults:
        job = env.get("ROOFWATCH_JOB") or env.get("SLURM_JOB_ID") or None
        return cls(rank=_env_int(env, "RANK"), world_size=_env_int(env, "WORLD_SIZE"),
                   job=job[:MAX_STR_LEN] if job else None,
                   hints={k: env[k] for k in HINT_ENV if k in env and len(env[k]) <= MAX_HINT_LEN})


def build_report(kw: Mapping[str, Any], defaults: JobDefaults) -> dict[str, Any]:
    """The JSON-ready report for the keyword arguments of ``report()``; raises :class:`Invalid`.

    Explicit arguments win over ``defaults``; the PID and the device hints are always added, so the
    agent can match the report to a GPU even when it does not see this process's PID.
    """
    item: dict[str, Any] = {}
    for name in _FLOAT_FIELDS:
        value = kw[name]
        if value is not None:
            item[name] = _number(name, value)
    for name in _INT_FIELDS:
        value = kw[name]
        if value is not None:
            item[name] = _integer(name, value)
    if kw["dtype"] is not None:
        item["dtype"] = _dtype(kw["dtype"])
    if kw.get("serving") is not None:
        item["serving"] = _serving(kw["serving"])
    if not any(name in item for name in _MEANINGFUL):
        raise Invalid("nothing to report: give step_time_s, tokens, tokens_per_s, flops_per_token, model_bytes, dtype, "
                      "step or serving")
    if "rank" not in item and defaults.rank is not None:
        item["rank"] = defaults.rank
    if "world_size" not in item and defaults.world_size is not None:
        item["world_size"] = defaults.world_size
    if item.get("world_size") == 0:
        raise Invalid("world_size must be at least 1")
    if "rank" in item and "world_size" in item and item["rank"] >= item["world_size"]:
        raise Invalid("rank must be less than world_size")
    job = kw["job"] if kw["job"] is not None else defaults.job
    if job is not None:
        if not isinstance(job, str) or len(job) > MAX_STR_LEN:
            raise Invalid(f"job must be a string of at most {MAX_STR_LEN} characters")
        item["job"] = job
    gpu = kw["gpu"]
    if gpu is not None:
        if isinstance(gpu, numbers.Integral) and not isinstance(gpu, bool) and gpu >= 0:
            gpu = str(int(gpu))
        if not isinstance(gpu, str) or not gpu or len(gpu) > MAX_STR_LEN:
            raise Invalid("gpu must be a GPU UUID or a non-negative index")
        item["gpu"] = gpu
    item["pid"] = os.getpid()
    if defaults.hints:
        item["hints"] = defaults.hints
    return item


def _serving(value: Any) -> dict[str, float]:
    """A serving dict: known keys only, each a finite non-negative number (ratios at most 1)."""
    if not isinstance(value, Mapping):
        raise Invalid("serving must be a dict of " + ", ".join(SERVING_FIELDS))
    out = {}
    for key, number in value.items():
        if key not in SERVING_FIELDS:
            raise Invalid(f"serving has no field {str(key)[:32]!r} (fields: {', '.join(SERVING_FIELDS)})")
        if number is None:
            continue
        out[key] = _number(f"serving.{key}", number)
        if key in _SERVING_RATIOS and out[key] > 1.0:
            raise Invalid(f"serving.{key} is a ratio: 0 to 1")
    if not out:
        raise Invalid("serving is empty")
    return out


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise Invalid(f"{name} must be a number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0.0:
        raise Invalid(f"{name} must be finite and non-negative")
    return number


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise Invalid(f"{name} must be an integer, not {type(value).__name__}")
    number = int(value)
    if number < 0:
        raise Invalid(f"{name} must be non-negative")
    return number


def _dtype(value: Any) -> str:
    if not isinstance(value, str):
        if not type(value).__name__.startswith("dtype"):  # torch.dtype, numpy's dtype[float16]; nothing else gets str()
            raise Invalid("dtype must be one of " + ", ".join(DTYPES))
        value = str(value)
    text = value.strip().lower().removeprefix("torch.")
    text = _DTYPE_ALIASES.get(text, text)
    if text not in DTYPES:
        raise Invalid("dtype must be one of " + ", ".join(DTYPES))
    return text


def _env_int(env: Mapping[str, str], key: str) -> int | None:
    text = env.get(key, "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else None  # "²" is a digit to isdigit()
