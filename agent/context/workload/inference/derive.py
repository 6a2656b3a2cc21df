"""Series the agent derives from a server's own: one label value of a family, a unit converted, two joined.

Why: vLLM, SGLang and TGI give each figure a family of its own, but Triton's TensorRT-LLM backend puts
five figures in one gauge told apart by a label (``nv_trt_llm_request_metrics{request_type="waiting"}``),
Triton counts microseconds and milliseconds, and llama.cpp's time per token is a ratio of two counters.
Each server module (agent.context.workload.inference.vllm, llamacpp, triton) turns what it exports into
series of the shape the serving and token arithmetic already reads (a gauge per replica, a counter, a
histogram's ``_sum`` and ``_count``), so one set of bounds, replica rules and rates serves every server.

A derived series is named ``family[what]``: a ``[`` is in no Prometheus name, so a body can never
spell one (it could never be kept as if derived), and a note that rejects a derived value still names
the family it came from. Its labels are the source series' own, so the note names the replica too.
"""

from __future__ import annotations

from typing import Callable, Mapping

from agent.context.workload.inference.figures import Series, SeriesKey

Derive = Callable[[Mapping[str, Series]], dict[str, Series]]
"""A server module's derivation: the kept samples in, the derived series (by derived name) out."""


def derived(family: str, what: str) -> str:
    """The name of the series derived from ``family``: ``family[what]``."""
    return f"{family}[{what}]"


def is_derived(name: str) -> bool:
    """Whether ``name`` is a derived series' (no body can spell one)."""
    return "[" in name


def select(series: Series | None, label: str, value: str) -> Series:
    """The series of ``series`` whose ``label`` is ``value`` (labels kept: they name the replica in a note)."""
    return {key: v for key, v in (series or {}).items() if (label, value) in key}


def scaled(series: Series | None, factor: float) -> Series:
    """``series`` times ``factor`` (a unit converted: microseconds to seconds is 1e-6)."""
    return {key: v * factor for key, v in (series or {}).items()}


def project(key: SeriesKey, labels: frozenset[str]) -> SeriesKey:
    """``key`` with only ``labels`` kept: what joins series of different families of one replica."""
    return frozenset((k, v) for k, v in key if k in labels)


def joined(series: Series | None, labels: frozenset[str]) -> dict[SeriesKey, float]:
    """``series`` keyed by ``labels`` only, the values of keys that meet there summed."""
    out: dict[SeriesKey, float] = {}
    for key, value in (series or {}).items():
        short = project(key, labels)
        out[short] = out.get(short, 0.0) + value
    return out


def put(out: dict[str, Series], name: str, series: Series | None) -> None:
    """Add ``series`` under ``name`` when it has any sample: an empty selection is a figure not exported."""
    if series:
        out[name] = series
