"""Which series of one inference server's body the parser keeps: a bound on the distinct values of each label.

Why: every series the parser keeps costs memory twice (this scrape's totals and the last one's, for the
rates) and CPU in every sum, so a body under the 4 MiB cap that names 10,000 ``model_name`` values (a
label bomb, or a misdirected URL) took the agent from 66 to 131 MiB and 13 s of CPU in 15 s; four such
endpoints passed the unit's 256 MiB. A server serves a handful of models and engines, so the bounds sit
far above any real one and far below a bomb. A sample that would pass them is refused *before* it is
stored (never built, then cut) and counted; the series already admitted keep their figures.

The bounds apply to the samples the parser keeps (agent.context.workload.inference.parse ``_WANTED``);
families it only recognises a server by cost nothing per label. docs/serving.md lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from agent.model.text import printable

LABEL_VALUE_BOUNDS: Mapping[str, int] = {
    "model_name": 16,
    "name": 16,
    "model": 64,
    "engine": 64,
    "dp_rank": 64,
}
"""Distinct values one endpoint may give a label: the model (``model_name``, SGLang 0.3's ``name``), Triton's
model (``model``), the vLLM data-parallel engine and the SGLang data-parallel rank. A server serves one model
(16 leaves room for aliases and re-exporters); a Triton model repository holds several (a TensorRT-LLM
ensemble is five: ensemble, pre- and post-processing, BLS and the engine), and 64 is past any repository one
LLM server loads; 64 engines is past any data-parallel deployment behind one port. llama.cpp labels nothing."""
OTHER_LABEL_VALUES = 256
"""Distinct values of any other label (tensor, pipeline and expert ranks, ``method``, ``stage``, the
``cache_config_info`` labels, vLLM's ``reason``, Triton's ``version``, ``request_type`` and
``kv_cache_block_type``): 256 expert-parallel ranks is past the largest deployment published."""
MAX_LABEL_NAMES = 64
"""Distinct label names over the kept samples of one body (vLLM's ``cache_config_info`` has about 20)."""
MAX_SERIES = 4096
"""Kept series of one body in all (vLLM with 16 engines keeps about 500)."""
SKIM_AFTER = 1024
"""Refusals after which a body is a label bomb and is only skimmed: a sample of a series not kept yet is then
refused without its labels being taken apart (no real server comes near: it would need 1,024 series past
the bounds), so a bomb costs about what any body of its size costs to read, not twice that."""
NOTE_CHARS = 60
"""A refused label value as a note quotes it (printable, cut): the body is untrusted text."""


def _bound(label: str) -> int:
    return LABEL_VALUE_BOUNDS.get(label, OTHER_LABEL_VALUES)


@dataclass(slots=True)
class Admission:
    """The label values and series admitted from one body so far, and what was refused."""

    values: dict[str, set[str]] = field(default_factory=dict)
    series: int = 0
    refused: int = 0
    """Samples refused: each would have added a label value, a label name or a series past its bound."""
    reasons: dict[str, int] = field(default_factory=dict)
    """Refused samples by the bound they would pass (``model_name > 16 values``), in the order first met."""
    first: str | None = None
    """The first refused sample's reason and value, printable."""

    def admit(self, name: str, labels: Mapping[str, str], new_series: bool) -> bool:
        """Whether a sample of ``name`` with ``labels`` may be kept; ``new_series`` when its series is not kept
        yet. Nothing is recorded for a refused sample but the refusal, so it uses up no bound."""
        if not new_series:
            return True  # its label values were admitted with the series
        fresh: list[tuple[str, str]] = []
        names = len(self.values)
        for label, value in labels.items():
            seen = self.values.get(label)
            if seen is None:
                names += 1
                if names > MAX_LABEL_NAMES:
                    return self._refuse(f"> {MAX_LABEL_NAMES} label names", f"label {label}")
            elif value in seen:
                continue
            elif len(seen) >= _bound(label):
                return self._refuse(f"{label} > {_bound(label)} values", f"{label}={value!r}")
            fresh.append((label, value))
        if self.series >= MAX_SERIES:
            return self._refuse(f"> {MAX_SERIES} series", f"a series of {name}")
        for label, value in fresh:
            self.values.setdefault(label, set()).add(value)
        self.series += 1
        return True

    @property
    def skimming(self) -> bool:
        """Whether so much was refused that new series are refused unread (:data:`SKIM_AFTER`)."""
        return self.refused >= SKIM_AFTER

    def skip(self, name: str) -> None:
        """Refuse a sample of ``name`` of a series not kept, unread, while :attr:`skimming`."""
        self._refuse(f"any new series after {SKIM_AFTER} refusals", f"a series of {name}")

    def _refuse(self, reason: str, what: str) -> bool:
        self.refused += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if self.first is None:
            self.first = printable(what, NOTE_CHARS)
        return False

    def note(self) -> str | None:
        """``9984 samples refused past the label bounds (model_name > 16 values); first model_name='m00016-…'``,
        or None when nothing was refused."""
        if not self.refused:
            return None
        samples = "sample" if self.refused == 1 else "samples"
        return (f"{self.refused} {samples} refused past the label bounds ({', '.join(self.reasons)}); "
                f"first {self.first}")
