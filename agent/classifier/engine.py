"""The classifier as a stream: samples in, one verdict per GPU per evaluation out.

Used three ways with the same code: the daemon feeds it each cycle's samples, ``roofwatch
classify`` replays a trace through it, and tests drive it with virtual traces. It does no I/O
and keeps only the long window of samples per GPU, so memory is bounded by
``long_window_s / interval`` samples per GPU.

Evaluations run on a fixed grid (multiples of ``evaluate_every_s``) for all GPUs at once,
because the straggler rules compare ranks of one job against each other at the same moment.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from agent.classifier.decision import AT_ONCE, Decision, decide
from agent.classifier.evidence import Evidence, gather
from agent.classifier.explain import Explanation, explain
from agent.classifier.hysteresis import Hysteresis
from agent.classifier.peaks import spec_for_sample
from agent.classifier.rules import score
from agent.classifier.serving import serving_mbu, serving_view
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, Thresholds
from agent.model import GpuSample, GpuSpec, Verdict
from agent.model.verdict import Reason

SpecResolver = Callable[[GpuSample], "GpuSpec | None"]


@dataclass
class _Track:
    """One GPU's recent samples and its hysteresis state."""

    node: str
    gpu: str
    spec: GpuSpec | None
    samples: collections.deque[GpuSample] = field(default_factory=collections.deque)
    classes: Hysteresis = field(default_factory=Hysteresis)
    """The published class."""
    details: Hysteresis = field(default_factory=Hysteresis)
    """The published detail, within the published class (started afresh when the class changes)."""


class Classifier:
    """Streaming classifier for any number of GPUs (and nodes).

    One evaluation is one pass per GPU: its evidence (agent.classifier.evidence), the rules' scores
    (.rules), the class by precedence (.decision), hysteresis on the class, the explanation of the
    published class (.explain), hysteresis on its detail, and the verdict.
    """

    def __init__(self, thresholds: Thresholds = DEFAULT_THRESHOLDS, *, dtype: str | None = None,
                 spec_resolver: SpecResolver = spec_for_sample) -> None:
        self.thresholds = thresholds
        self.dtype = dtype
        self._resolve = spec_resolver
        self._tracks: dict[tuple[str, str], _Track] = {}

    def observe(self, sample: GpuSample, spec: GpuSpec | None = None) -> None:
        """Add one sample; ``spec`` overrides the catalogue lookup (the daemon knows it already)."""
        key = (sample.node, sample.gpu)
        track = self._tracks.get(key)
        if track is None:
            track = self._tracks[key] = _Track(sample.node, sample.gpu, spec if spec is not None else self._resolve(sample))
        elif spec is not None:
            track.spec = spec
        if track.samples and sample.ts <= track.samples[-1].ts:
            return  # a repeated or out-of-order sample would double-count its interval
        track.samples.append(sample)

    @property
    def tracking(self) -> bool:
        """Whether any GPU has samples left in its long window."""
        return bool(self._tracks)

    def evaluate(self, now: float) -> list[Verdict]:
        """A verdict for every GPU seen within the long window before ``now``."""
        t = self.thresholds
        live = []
        for key, track in list(self._tracks.items()):
            while track.samples and track.samples[0].ts <= now - t.long_window_s:
                track.samples.popleft()
            if not track.samples:
                del self._tracks[key]
                continue
            live.append(track)
        gathered = gather(live, now, t, self.dtype)
        return [self._judge(track, window.samples, e, now, window.start) for track, window, e in gathered]  # type: ignore[arg-type]

    def _judge(self, track: _Track, window: list[GpuSample], e: Evidence, now: float, start: float) -> Verdict:
        """Score, decide, stabilise and explain one GPU's evidence into its verdict."""
        t = self.thresholds
        before = track.classes.published
        rules = score(e, t, before)
        decision = decide(e, rules, t)
        published = track.classes.update(decision.cls, now, t, at_once=before == "unknown" or decision.cls in AT_ONCE)
        held = published != decision.cls
        hold = track.classes.hold_phrase(decision.cls, t) if held else None
        explanation = explain(published, decision, e, rules, t, hold)
        if published != before:
            track.details = Hysteresis()  # a new class starts its detail afresh (and its dwell from now)
        detail = track.details.update(explanation.detail, now, t, at_once=published == "unknown")
        notes: list[Reason] = []
        if held:
            notes.append(track.classes.holding(decision.cls, "", now, t))
        if detail != explanation.detail:
            notes.append(track.details.holding(explanation.detail, "detail ", now, t))
        return self._verdict(track, window, e, decision, explanation, published, detail, tuple(notes), start, now)

    def _verdict(self, track: _Track, window: list[GpuSample], e: Evidence, decision: Decision,
                 explanation: Explanation, published: str, detail: str, notes: tuple[Reason, ...],
                 start: float, now: float) -> Verdict:
        t, f = self.thresholds, e.features
        supporting = (*notes, *explanation.supporting, *decision.throttle.reasons, *e.notes)
        last = window[-1] if window else None
        serving = serving_view(f.workload, track.spec, window, t, self.dtype)
        return Verdict(
            node=track.node, gpu=track.gpu, uuid=last.uuid if last else None,
            window_start=round(start, 3), window_end=round(now, 3),
            cls=published, detail=detail, confidence=explanation.confidence, throttled=decision.throttle.throttled,
            throttle_severe=decision.throttle.severe, reasons=tuple(r.text for r in supporting), scores=decision.scores,
            raw_class=decision.cls, roofline=serving_mbu(e.roofline, serving), features=f,
            job=e.job.job or (f.workload.job if f.workload else None), rank_skew=e.job.rank_skew,
            truth=last.label if last else None, serving=serving, throttle_likely=decision.throttle.likely,
            counters_suspect=decision.rule == "counters_disagree", supporting=supporting,
            opposing=explanation.opposing, precedence=explanation.precedence,
        )


class Grid:
    """Replays time-ordered samples, evaluating at every multiple of ``evaluate_every_s`` passed.

    Shared by ``roofwatch classify`` and the demo's head start, so a replay evaluates exactly
    when a live agent would have. A gap in the samples costs at most ``long_window_s /
    evaluate_every_s`` evaluations (the time old samples still count); then the grid restarts at
    the next sample, exactly as for the first one.
    """

    def __init__(self, classifier: Classifier) -> None:
        self.classifier = classifier
        self.step = classifier.thresholds.evaluate_every_s
        self.next_eval: float | None = None

    def first_after(self, ts: float) -> float:
        """The first grid time strictly after ``ts``."""
        return (math.floor(ts / self.step) + 1) * self.step

    def feed(self, sample: GpuSample, spec: GpuSpec | None = None) -> list[list[Verdict]]:
        """Observe one sample; returns the evaluations that fell due before it (oldest first)."""
        if self.next_eval is None or (not self.classifier.tracking and sample.ts > self.next_eval):
            self.next_eval = self.first_after(sample.ts)  # first sample, or an empty gap skipped in one jump
        due = []
        while sample.ts > self.next_eval + 1e-9:
            due.append(self.classifier.evaluate(self.next_eval))
            self.next_eval += self.step
            if not self.classifier.tracking:
                # Every sample has left the long window: the rest of the gap would evaluate nothing.
                # Restart the grid at the new sample, so a gap of years costs one long window of
                # evaluations, not one per step (ts 0 then ts 1.7e9 was 3.4e8 of them).
                self.next_eval = max(self.next_eval, self.first_after(sample.ts))
                break
        self.classifier.observe(sample, spec)
        return due

    def flush(self) -> list[Verdict]:
        """The evaluation at the next grid time (after the last sample fed)."""
        if self.next_eval is None:
            return []
        verdicts = self.classifier.evaluate(self.next_eval)
        self.next_eval += self.step
        return verdicts


def classify_samples(samples: Iterable[GpuSample], thresholds: Thresholds = DEFAULT_THRESHOLDS, *,
                     dtype: str | None = None, spec_resolver: SpecResolver = spec_for_sample) -> Iterator[Verdict]:
    """Replay samples (any GPU order) and yield the verdicts the daemon would have published."""
    grid = Grid(Classifier(thresholds, dtype=dtype, spec_resolver=spec_resolver))
    for sample in sorted(samples, key=lambda s: s.ts):
        for verdicts in grid.feed(sample):
            yield from verdicts
    yield from grid.flush()
