"""The selftest's phases: what each one runs, the class it should produce, and its timing constants.

The real runners (:mod:`.cuda_phases`) and the virtual one (:mod:`.virtual_runner`) both read the
constants here, so a simulated phase has the same shape in time as the workload it stands in for
(the loader's period, the peer's lateness per step), and a trace from either can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Phase:
    """One calibrated workload; ``label`` is the class roofwatch should give it (the trace's label)."""

    name: str
    label: str
    what: str
    """What a real runner launches, in one line (printed and written to the summary)."""
    dtype: str | None = None
    """Precision of its matrix math, when it has any (selects the peak its MFU is measured against)."""


STARVED_LOADER_S = 0.25
"""The starved phase's loader sleeps this long per batch (a slow host-side producer)."""
STARVED_BURST_S = 0.10
"""GPU work per batch in the starved phase: duty about STARVED_BURST_S / STARVED_LOADER_S = 0.4."""

STREAM_WAIT_COMPUTE_S = 0.05
"""The compute stream's work per step before it waits on the other stream."""
STREAM_WAIT_LATENESS_S = (0.4, 1.2, 0.6, 1.6, 0.5, 1.0)
"""How long the other stream (the stand-in peer) keeps the step waiting, step after step.

Varied on purpose: a collective whose wait changes from step to step is what communication
jitter is, and the step-time variation (CV about 0.4) is the evidence the classifier needs.
Steps of about a second leave most 0.25 s samples wholly inside a wait."""

STREAM_WAIT_WORLD = 2
"""The stream-wait phase reports itself as rank 0 of this many (stream A plays the late peer)."""

SELFTEST_JOB = "roofwatch-selftest"


PHASES: tuple[Phase, ...] = (
    Phase("idle", "idle", "nothing launched; the CUDA context stays open"),
    Phase("gemm_bf16", "compute_bound", "back-to-back large matmuls (8192^3, bf16; fp16 under cupy)", "bf16"),
    Phase("gemm_fp8", "compute_bound", "back-to-back large fp8 matmuls (torch._scaled_mm, Hopper and newer)", "fp8"),
    Phase("copy", "memory_bound", "device-to-device copies of a 1 GiB buffer"),
    Phase("tiny_kernels", "latency_bound", "a stream of tiny elementwise kernels (CUDA graph replays)"),
    Phase("starved", "input_starved",
          f"a matmul burst per batch from a loader thread that sleeps {STARVED_LOADER_S:g} s per batch"),
    Phase("stream_wait", "communication_jittered",
          "stream B waits on an event after stream A's spin kernel (a late peer), lateness varying per step; "
          f"reported as rank 0 of {STREAM_WAIT_WORLD}"),
)
PHASE_NAMES: tuple[str, ...] = tuple(p.name for p in PHASES)


def phase(name: str) -> Phase:
    """The phase called ``name``; KeyError naming the known ones otherwise."""
    for p in PHASES:
        if p.name == name:
            return p
    raise KeyError(f"unknown phase {name!r}; phases: {', '.join(PHASE_NAMES)}")


def parse_phases(text: str | None) -> tuple[Phase, ...]:
    """``--phases idle,copy`` as phases in the catalogue's order; all of them for None.

    ValueError names an unknown phase. The order is the catalogue's whatever the text says,
    because idle must come first (before any kernel warmed the clocks up).
    """
    if text is None:
        return PHASES
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    if not wanted:
        raise ValueError("--phases: name at least one phase")
    unknown = [w for w in wanted if w not in PHASE_NAMES]
    if unknown:
        raise ValueError(f"--phases: unknown phase {', '.join(unknown)}; phases: {', '.join(PHASE_NAMES)}")
    return tuple(p for p in PHASES if p.name in wanted)


def lateness(step: int) -> float:
    """How late the stand-in peer is at ``step`` of the stream-wait phase."""
    return STREAM_WAIT_LATENESS_S[step % len(STREAM_WAIT_LATENESS_S)]
