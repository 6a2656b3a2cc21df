"""Which figure judges a verdict, and how good it is: the one rule every view colours MFU and MBU by.

A GPU's MFU and MBU are both shares of a peak, but only one of them says how well a GPU of a given class
does. A memory-bound decode at its memory roof reads MFU 7%: that is the physics of decode, not a fault,
and painting it red (as every view did, by MFU alone) told a reader to fix a GPU that is at its limit. So:

- **compute-bound**: compute is the roof, MFU judges it (poor below 20%, the practical target 40%);
- **memory-bound**: memory bandwidth is the roof, MBU judges it (poor below 40%, good from 55%);
- **latency-bound**, **idle**, **input-starved**, **communication-jittered**, **unknown**: neither figure
  judges it; :attr:`Judgement.matters` says what does (kernel size and launch gaps; whether someone holds
  it; the time lost waiting), and a view shows MFU and MBU uncoloured.

The status page, ``top``, ``roofwatch report`` and the roofline chart's hover texts all take the judging
figure and its band from here (docs/views.md, "What colours mean"). Which GPUs need attention for a low
figure stays agent.model.attention's to say (:data:`MFU_POOR` is its threshold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.model.attention import MFU_POOR

Figure = Literal["mfu", "mbu"]
Band = Literal["good", "fair", "poor"]

MFU_TARGET = 0.4
"""The practical MFU target for training (docs/classification.md): at or above it a compute-bound GPU is good."""
MBU_TARGET = 0.55
"""Well-tuned decode reaches 55-60% MBU [Databricks] (docs/classification.md §9): from 55% a memory-bound GPU is
as good as good servers get."""
MBU_POOR = 0.4
"""Below 40% MBU a memory-bound GPU is poor: the level under which a server is far above its decode floor
(``serving_far_ratio`` 2.5, docs/classification.md §9)."""

BANDS: dict[Figure, tuple[float, float]] = {"mfu": (MFU_POOR, MFU_TARGET), "mbu": (MBU_POOR, MBU_TARGET)}
"""(poor below, good from) per figure."""

NAMES: dict[Figure, str] = {"mfu": "MFU", "mbu": "MBU"}
PEAKS: dict[Figure, str] = {"mfu": "peak FLOP/s", "mbu": "peak memory bandwidth"}
"""What each figure is a share of: the datasheet peak, never a practical roof."""


@dataclass(frozen=True, slots=True)
class Judgement:
    """How a verdict's class is judged: by one figure (``figure``), or by none, with what matters instead."""

    figure: Figure | None
    matters: str
    """One line for a reader: which figure judges this class and against what, or what matters instead."""


_JUDGEMENTS: dict[str, Judgement] = {
    "compute_bound": Judgement("mfu", f"compute is the roof: MFU judges it (poor below {MFU_POOR:.0%}, target "
                                      f"{MFU_TARGET:.0%})"),
    "memory_bound": Judgement("mbu", f"memory bandwidth is the roof: MBU judges it (poor below {MBU_POOR:.0%}, good "
                                     f"from {MBU_TARGET:.0%}); a low MFU is what memory-bound work looks like"),
    "latency_bound": Judgement(None, "neither roof is near: kernel size and launch gaps matter (larger batches, CUDA "
                                     "graphs, fused kernels), not MFU or MBU"),
    "idle": Judgement(None, "nothing runs: whether someone holds it matters, not MFU or MBU"),
    "input_starved": Judgement(None, "the time it waits for input matters (time lost), not MFU or MBU"),
    "communication_jittered": Judgement(None, "the time it waits on its peers matters (time lost), not MFU or MBU"),
}
_UNKNOWN = Judgement(None, "no verdict to judge by: MFU and MBU are shown, not judged")


def judgement(cls: str | None) -> Judgement:
    """The judging figure of a class (``None``: unknown, no verdict yet, a GPU down)."""
    return _JUDGEMENTS.get(cls or "unknown", _UNKNOWN)


def band(figure: Figure, value: float | None) -> Band | None:
    """``good``, ``fair`` or ``poor`` for ``value`` of ``figure`` by :data:`BANDS`; None when unknown."""
    if value is None:
        return None
    poor, good = BANDS[figure]
    return "good" if value >= good else "fair" if value >= poor else "poor"


def judged_band(cls: str | None, figure: Figure, value: float | None) -> Band | None:
    """The band of ``figure`` when it judges a GPU of class ``cls``; None when it does not (or is unknown): such a
    figure is shown without a verdict on it."""
    return band(figure, value) if judgement(cls).figure == figure else None
