"""One serving job on the virtual clock: its gauges now, its counters since the server started, its report.

A :class:`ServingJob` is compiled once per serving workload (agent.virtual.plans) and shared, read
only, by the GPU plans of its replica and by its fake server's HTTP thread. Every counter is the
phase's steady rate (agent.virtual.serving.figures) times the seconds that phase has run, summed
over the phases so far, so counters only grow, any virtual time can be asked in any order, and the
rates between two scrapes are the phase's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

from agent.model import ServingReport, WorkloadReport
from agent.virtual.serving.figures import ServingFigures, tgi_token_budget
from agent.virtual.timeline import Schedule
from agent.virtual.workloads import ServingPhase

ServerKind = Literal["vllm", "sglang", "tgi"]

REQUEST_PROCESS_S = 0.002
"""SGLang's ``request_process`` stage (tokenizer to scheduler), per request."""
COUNTERS = ("prompt_tokens", "generated_tokens", "requests", "preemptions", "decode_steps", "prefill_busy_s",
            "decode_busy_s")
OBSERVED = ("ttft", "itl", "queue", "prefill", "decode", "inference", "e2e", "prefill_forward", "request_process",
            "decode_forward", "step_decode_tokens", "step_prefill_tokens", "request_tpot", "prompt_len", "output_len")
"""Histograms a server keeps (each server exports some of them, under its own names)."""


@dataclass(frozen=True, slots=True)
class Observed:
    """A histogram's observations so far: ``(value, count)`` per phase that observed any (fluid counts)."""

    points: tuple[tuple[float, float], ...]

    @property
    def count(self) -> float:
        return math.fsum(n for _, n in self.points)

    @property
    def sum(self) -> float:
        return math.fsum(v * n for v, n in self.points)

    def cumulative(self, bounds: Sequence[float]) -> list[float]:
        """Counts at or below each bound, then the total (the ``+Inf`` bucket)."""
        return [math.fsum(n for v, n in self.points if v <= b) for b in bounds] + [self.count]


@dataclass(frozen=True, slots=True)
class Totals:
    """What a server has counted since it started, at one virtual time."""

    counters: dict[str, float]
    observed: dict[str, Observed]


def _flows(f: ServingFigures) -> dict[str, float]:
    """Counter rates of one steady phase (per second)."""
    return {
        "prompt_tokens": f.prompt_tokens_per_s, "generated_tokens": f.generated_tokens_per_s,
        "requests": f.requests_per_s, "preemptions": f.preemptions_per_s, "decode_steps": f.decode_steps_per_s,
        "prefill_busy_s": f.prefill_share, "decode_busy_s": 1.0 - f.prefill_share,
    }


def _observations(f: ServingFigures) -> dict[str, tuple[float, float]]:
    """(value, observations per second) of each histogram in one steady phase."""
    rate = f.requests_per_s
    return {
        "ttft": (f.ttft_s, rate), "itl": (f.itl_s, rate * (f.output_tokens - 1.0)),
        "queue": (f.queue_s, rate), "prefill": (f.prefill_s, rate), "decode": (f.decode_s, rate),
        "inference": (f.prefill_s + f.decode_s, rate), "e2e": (f.queue_s + f.prefill_s + f.decode_s, rate),
        "prefill_forward": (f.prefill_gpu_s, rate), "request_process": (REQUEST_PROCESS_S, rate),
        "decode_forward": (f.step_s, f.decode_steps_per_s),
        "step_decode_tokens": (rate * f.decode_s, f.decode_steps_per_s), "step_prefill_tokens": (f.prompt_tokens, rate),
        "request_tpot": (f.request_tpot_s, rate), "prompt_len": (f.prompt_tokens, rate),
        "output_len": (f.output_tokens, rate),
    }


class ServingJob:
    """A serving workload's server: what it reports at any virtual time ``t`` (seconds since the scenario began)."""

    def __init__(self, name: str, gpus: Sequence[str], dtype: str, schedule: Schedule, phases: Sequence[object],
                 figures: Sequence[ServingFigures | None]) -> None:
        config = next(p for p in phases if isinstance(p, ServingPhase))
        self.name = name
        self.gpus = tuple(gpus)
        self.dtype = dtype
        self.schedule = schedule
        self.server: ServerKind = config.server
        self.model = config.model
        self.max_running = config.max_running
        self.device_timer = config.device_timer
        self.kv_bytes_per_token = config.kv_bytes_per_token
        self.figures = tuple(figures)
        steady = next(f for f in self.figures if f is not None)
        self.weight_bytes = steady.weight_bytes
        self.kv_pool_bytes = steady.kv_pool_bytes
        self.params = steady.flops_per_token / 2.0
        self._flows = [_flows(f) if f is not None else {} for f in self.figures]
        self._observations = [_observations(f) if f is not None else {} for f in self.figures]

    # ------------------------------------------------------------------ time

    def seconds_per_phase(self, t: float) -> list[float]:
        """Seconds each phase has run in [0, t): whole cycles plus the part of the current one."""
        s = self.schedule
        if t <= 0.0:
            return [0.0] * s.count
        if not s.repeat:
            out = [min(max(t - start, 0.0), d) for start, d in zip(s.starts, s.durations)]
            out[-1] = max(0.0, t - s.starts[-1])  # the last phase holds forever
            return out
        cycles = math.floor(t / s.cycle_s)
        within = t - cycles * s.cycle_s
        return [cycles * d + min(max(within - start, 0.0), d) for start, d in zip(s.starts, s.durations)]

    def figures_at(self, t: float) -> ServingFigures | None:
        """The steady state at ``t``; None before the start and while the server idles."""
        if t < 0.0:
            return None
        return self.figures[self.schedule.locate(t).index]

    def totals(self, t: float) -> Totals:
        seconds = self.seconds_per_phase(t)
        counters = dict.fromkeys(COUNTERS, 0.0)
        points: dict[str, list[tuple[float, float]]] = {}
        for a, flows, observations in zip(seconds, self._flows, self._observations):
            if a <= 0.0:
                continue
            for name, rate in flows.items():
                counters[name] += rate * a
            for name, (value, rate) in observations.items():
                points.setdefault(name, []).append((value, rate * a))
        return Totals(counters, {name: Observed(tuple(points.get(name, ()))) for name in OBSERVED})

    # ------------------------------------------------------------------ what each server implies

    def steps_per_s(self, f: ServingFigures) -> float:
        """The server's step counter rate: SGLang counts decode passes; vLLM engine steps and TGI forward
        calls count each request's prefill too."""
        return f.decode_steps_per_s + (0.0 if self.server == "sglang" else f.requests_per_s)

    def steps_total(self, totals: Totals) -> float:
        c = totals.counters
        return c["decode_steps"] + (0.0 if self.server == "sglang" else c["requests"])

    def kv_usage(self, f: ServingFigures) -> float:
        """KV-cache usage as the server exports it (TGI: its token counts, whole numbers)."""
        if self.server != "tgi":
            return f.kv_usage
        used, total = tgi_token_budget(f, self.kv_bytes_per_token)
        return min(1.0, used / total)

    def report(self, t: float) -> WorkloadReport | None:
        """The workload report the agent's inference scraper derives from this server's metrics at ``t``
        (the same figures, without HTTP: what ``record --simulate`` carries)."""
        f = self.figures_at(t)
        if f is None:
            return None
        tgi = self.server == "tgi"
        serving = ServingReport(
            server=self.name, model=self.model, weight_bytes=f.weight_bytes,
            kv_cache_bytes=f.kv_pool_bytes, kv_usage=self.kv_usage(f), running=f.running, waiting=f.waiting,
            max_running=self.max_running, preemptions_per_s=None if tgi else f.preemptions_per_s,
            tpot_s=f.request_tpot_s if tgi else f.itl_s, ttft_s=None if tgi else f.ttft_s,
            prefill_share=f.prefill_share, generated_tokens_per_s=f.generated_tokens_per_s, gpus=len(self.gpus))
        return WorkloadReport(
            job=self.name, world_size=len(self.gpus), step=int(self.steps_total(self.totals(t))),
            step_time_s=1.0 / self.steps_per_s(f), tokens_per_s=f.prompt_tokens_per_s + f.generated_tokens_per_s,
            flops_per_token=f.flops_per_token, model_bytes=f.weight_bytes, dtype=self.dtype,  # type: ignore[arg-type]
            source=self.server, serving=serving)

