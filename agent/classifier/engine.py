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

from agent.classifier.features import split_at_change, window_features
from agent.classifier.peaks import spec_for_sample
from agent.classifier.roofline import roofline, roofline_notes, with_reported_mfu
from agent.classifier.jobs import job_contexts
from agent.classifier.rules import Decision, JobContext, decide
from agent.classifier.serving import serving_mbu, serving_view
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, Thresholds
from agent.model import GpuSample, GpuSpec, Verdict, WindowFeatures

SpecResolver = Callable[[GpuSample], "GpuSpec | None"]

MIN_INTERVAL_S = 1e-3
"""Shortest sampling interval the windows are sized by: a replayed trace may claim 5e-324 s, which
made the expected sample count infinite (the reader refuses such traces too; this keeps the engine
whole whatever it is fed)."""


@dataclass
class _Stabiliser:
    """Hysteresis on the published class: a challenger must win several evaluations in a row."""

    published: str | None = None
    since: float = -math.inf
    challenger: str | None = None
    wins: int = 0

    def update(self, raw: str, now: float, t: Thresholds) -> str:
        if self.published is None or self.published == "unknown" or raw == "unknown":
            # Nothing to defend, or nothing to judge with: report what this window says at once.
            if raw != self.published:
                self.published, self.since = raw, now
            self.challenger, self.wins = None, 0
            return raw
        if raw == self.published:
            self.challenger, self.wins = None, 0
            return raw
        self.wins = self.wins + 1 if raw == self.challenger else 1
        self.challenger = raw
        if self.wins >= t.confirm_evaluations and now - self.since >= t.min_dwell_s:
            self.published, self.since = raw, now
            self.challenger, self.wins = None, 0
        return self.published


@dataclass
class _Track:
    """One GPU's recent samples and its hysteresis state."""

    node: str
    gpu: str
    spec: GpuSpec | None
    samples: collections.deque[GpuSample] = field(default_factory=collections.deque)
    stabiliser: _Stabiliser = field(default_factory=_Stabiliser)


class Classifier:
    """Streaming classifier for any number of GPUs (and nodes)."""

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
        prepared = []
        for key, track in list(self._tracks.items()):
            while track.samples and track.samples[0].ts <= now - t.long_window_s:
                track.samples.popleft()
            if not track.samples:
                del self._tracks[key]
                continue
            long_window = [s for s in track.samples if s.ts <= now]
            interval = min(max(_interval(long_window), MIN_INTERVAL_S), t.long_window_s)
            span = max(t.window_s, 3.0 * interval)
            window = [s for s in long_window if s.ts > now - span]
            expected = max(1, round(span / interval))
            start = now - span
            recent = split_at_change(window, t.phase_change_jump)
            if len(recent) < len(window):
                window, expected = list(recent), max(1, expected - expected // 2)
                start = window[0].ts - interval
            features = with_reported_mfu(window_features(window, long_window, track.spec, t), track.spec, self.dtype)
            prepared.append((track, window, features, expected, start))

        contexts = job_contexts([(p[0], p[1], p[2]) for p in prepared])
        verdicts = []
        for track, window, features, expected, start in prepared:
            job = contexts.get((track.node, track.gpu), JobContext())
            decision = decide(features, job, t, track.stabiliser.published, expected)
            published = track.stabiliser.update(decision.cls, now, t)
            verdicts.append(self._verdict(track, window, features, job, decision, published, start, now))
        return verdicts

    def _verdict(self, track: _Track, window: list[GpuSample], features: WindowFeatures, job: JobContext,
                 decision: Decision, published: str, start: float, now: float) -> Verdict:
        t = self.thresholds
        if published != decision.cls:
            # Held by hysteresis: say so, and score the published class as this window sees it.
            reasons = (f"holding {published}: {decision.cls} must win {t.confirm_evaluations} evaluations in a row "
                       f"to replace it",) + decision.reasons
            confidence = round(decision.scores.get(published, 0.0) * features.valid_fraction * 0.5, 3)
            detail = "none"  # the detail codes describe this window's class, not the held one
        else:
            reasons, confidence, detail = decision.reasons, decision.confidence, decision.detail
        if features.workload is not None:
            reasons += roofline_notes(features, track.spec, self.dtype)  # a report's unit error, said once
        last = window[-1] if window else None
        serving = serving_view(features.workload, track.spec, window, t, self.dtype)
        return Verdict(
            node=track.node, gpu=track.gpu, uuid=last.uuid if last else None,
            window_start=round(start, 3), window_end=round(now, 3),
            cls=published, detail=detail, confidence=confidence, throttled=decision.throttled,
            throttle_severe=decision.throttle_severe, reasons=reasons, scores=decision.scores,
            raw_class=decision.cls, roofline=serving_mbu(roofline(features, track.spec, self.dtype), serving), features=features,
            job=job.job or (features.workload.job if features.workload else None), rank_skew=job.rank_skew, truth=last.label if last else None,
            serving=serving, throttle_likely=decision.throttle_likely,
            counters_suspect=decision.detail == "counters_disagree",
        )


def _interval(samples: list[GpuSample]) -> float:
    """The sampling interval: what the samples say, else the median gap between them."""
    stated = [s.interval_s for s in samples[-10:] if s.interval_s]
    if stated:
        return sorted(stated)[len(stated) // 2]
    gaps = [b.ts - a.ts for a, b in zip(samples[-11:], samples[-10:]) if b.ts > a.ts]
    return sorted(gaps)[len(gaps) // 2] if gaps else 1.0


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
