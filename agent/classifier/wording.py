"""How the classifier words a figure in a reason: one format per kind of number, so a reason's text and the
figure its check carries read the same."""

from __future__ import annotations

from typing import Callable

from agent.classifier.thresholds import Thresholds
from agent.model.verdict import Check, WindowFeatures

Reading = tuple[str, "float | None", float, str, Callable[[float], str]]
"""One reading a detail rule holds against its threshold: quantity, value, threshold, setting, and how the
value is worded."""


def pct(x: float | None) -> str:
    """A share as a whole percentage (``n/a`` when unknown)."""
    return "n/a" if x is None else f"{100.0 * x:.0f}%"


PEAKS = {"memory": "peak bandwidth", "tensor": "the tensor pipes' peak", "fp": "the FP pipes' peak"}
"""What each practical roof is a share of."""


def practical_roof(roof: str, share_of_peak: float) -> str:
    """A roof as a reason names it: the practical one, with the share of the peak it stands at (``roof``: a key of
    :data:`PEAKS`).

    Why: the classifier's roofs are practical maxima (DRAM reaches about 80% of peak bandwidth, tensor pipes
    about 93% of theirs), so a GPU at its memory roof reads "103% of the practical memory roof (80% of peak
    bandwidth)" beside an MBU of 82% of peak; a bare "103% of the memory roof" beside MBU 81% read as a
    contradiction."""
    kind = "memory" if roof == "memory" else "compute"
    return f"practical {kind} roof ({pct(share_of_peak)} of {PEAKS[roof]})"


def compute_pipes(f: WindowFeatures, t: Thresholds) -> tuple[str, float]:
    """Which pipes set this window's ``u_compute`` (the larger of tensor / ``tensor_saturation`` and FP /
    ``fp_pipe_saturation``, agent.classifier.features), and the share of their peak that is the practical roof."""
    tensor = f.tensor_busy / t.tensor_saturation if f.tensor_busy is not None else None
    fp = f.fp_busy / t.fp_pipe_saturation if f.fp_busy is not None else None
    if tensor is None or (fp is not None and fp > tensor):
        return "fp", t.fp_pipe_saturation
    return "tensor", t.tensor_saturation


def compute_roof_share(u: float | None, f: WindowFeatures, t: Thresholds) -> str:
    """``u`` (busy-normalised compute utilisation, ``u_compute``) with the roof it is a share of named."""
    return f"{pct(u)} of the {practical_roof(*compute_pipes(f, t))}"


def memory_roof_share(u: float | None, t: Thresholds) -> str:
    """``u`` (busy-normalised DRAM utilisation, ``u_memory``) with the roof it is a share of named."""
    return f"{pct(u)} of the {practical_roof('memory', t.dram_saturation)}"


def score(x: float) -> str:
    """A class score as the snapshot's ``scores`` show it."""
    return f"{x:.3f}"


def at_or_above(*readings: Reading) -> tuple[list[str], tuple[Check, ...]]:
    """The readings at or above their thresholds (either is enough for the rule), each worded, with the
    comparisons that make them evidence; a reading below its threshold is not said."""
    said, found = [], []
    for quantity, value, threshold, setting, words in readings:
        if value is not None and value >= threshold:
            said.append(words(value))
            found.append(Check(quantity, value, threshold, "above", setting))
    return said, tuple(found)
