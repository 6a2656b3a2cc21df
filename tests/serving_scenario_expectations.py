"""What each server of the built-in ``serving`` scenario must show, computed here from published figures.

Independent of the code under test: the scenario's traffic (batch, queue, prompt and output
lengths, floor multiple, prefill share) is read from its YAML with plain ``yaml``, and everything
about the hardware and the models is written out below from the vendors' publications. The
formulas are the ones docs/virtual-fleet.md states. Shared by tests/test_virtual_serving.py,
tests/test_virtual_serving_servers.py and tests/test_serving_scenario_e2e.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

H100_SXM_BANDWIDTH = 3.35e12
"""NVIDIA H100 SXM5 datasheet: 3.35 TB/s of HBM3."""
H100_SXM_BF16_DENSE = 989.4e12
"""NVIDIA H100 SXM5 datasheet: 1979 TFLOPS BF16 with sparsity, half of it dense."""
H100_DRIVER_MEMORY = 81559 * 2**20
"""What nvidia-smi reports for an H100 80GB HBM3 (81559 MiB)."""

MODELS: dict[str, tuple[float, int, int, int]] = {
    # model: (parameters, layers, KV heads, head dim), from each model card / config.json
    "meta-llama/Llama-3.1-8B-Instruct": (8.03e9, 32, 8, 128),
    "mistralai/Mistral-7B-Instruct-v0.3": (7.248e9, 32, 8, 128),
    "meta-llama/Llama-3.1-70B-Instruct": (70.55e9, 80, 8, 128),
    "meta-llama/Llama-3.2-1B-Instruct": (1.236e9, 16, 8, 64),
}
STATES: dict[str, tuple[str, str]] = {
    "chat-8b": ("at_floor", "faster_memory_or_fewer_bytes"),
    "batch-capped-8b": ("under_batched", "raise_batch"),
    "rag-7b": ("prefill_heavy", "chunk_or_disaggregate_prefill"),
    "chat-70b": ("kv_saturated", "scale_out"),
    "tiny-1b": ("above_floor", "find_overhead"),
}
"""The state (and advice code) the scenario's comments promise for each server."""


@dataclass(frozen=True)
class Expected:
    job: str
    server: str
    model: str
    gpus: tuple[str, ...]
    state: str
    advice: str
    weight_bytes: float
    kv_bytes_per_token: float
    kv_pool_bytes: float
    kv_usage: float
    floor_s: float
    step_s: float
    ratio: float
    """Time per output token as the server measures it, over the floor."""
    prefill_share: float
    prefill_share_exact: bool
    """False for SGLang without its device timer: prefill forward time over wall time between two scrapes."""
    phase: dict[str, Any]


def scenario_yaml() -> dict[str, Any]:
    text = resources.files("agent.virtual").joinpath("scenarios", "serving.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _expected(workload: dict[str, Any]) -> Expected:
    p = workload["phases"][0]
    params, layers, kv_heads, head_dim = MODELS[p["model"]]
    gpus = len(workload["gpus"])
    weights = 2.0 * params  # bf16
    kv_per_token = 2.0 * layers * kv_heads * head_dim * 2.0  # K and V, 2 bytes each
    # YAML 1.1 reads 60e9 as a string (it wants 60.0e+9); pydantic converts it, so do the same here.
    pool = float(p["kv_cache_bytes"]) if "kv_cache_bytes" in p else gpus * (0.9 * H100_DRIVER_MEMORY - weights / gpus - 2**30)
    batch, share, multiple = p["running"], p["prefill_share"], p["floor_multiple"]
    prompt, output = p["prompt_tokens"], p["output_tokens"]
    kv_in_use = batch * (prompt + output / 2.0) * kv_per_token
    floor = max((weights + kv_in_use) / (gpus * H100_SXM_BANDWIDTH), batch * 2.0 * params / (gpus * H100_SXM_BF16_DENSE))
    ratio = multiple / (1.0 - share)  # tokens of a request come one step apart, stretched by the prefills between
    if p["server"] == "tgi":  # TGI: per request (prefill + decode time) / tokens
        ratio *= (output - 1) / output * (1.0 + share / ((1.0 - share) * batch))
    state, advice = STATES[workload["job"]]
    return Expected(
        job=workload["job"], server=p["server"], model=p["model"], gpus=tuple(str(g) for g in workload["gpus"]),
        state=state, advice=advice, weight_bytes=weights, kv_bytes_per_token=kv_per_token, kv_pool_bytes=pool,
        kv_usage=kv_in_use / pool, floor_s=floor, step_s=multiple * floor, ratio=ratio, prefill_share=share,
        prefill_share_exact=p["server"] != "sglang" or bool(p.get("device_timer")), phase=p)


def expected_servers() -> dict[str, Expected]:
    """Every server of the scenario by job name."""
    return {w["job"]: _expected(w) for w in scenario_yaml()["nodes"][0]["workloads"]}


REQUIRED = ("chat-8b", "batch-capped-8b", "rag-7b", "chat-70b")
"""The four servers the serving issue asks for: at the floor, under-batched, prefill-heavy, KV-saturated."""
