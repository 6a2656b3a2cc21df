"""GPM's cumulative metrics (ids 248-260): activity as Δactive / Δelapsed over the same two samples as the ratios.

nvidia-ml-py 13.615 and newer define ``NVML_GPM_METRIC_SM_CYCLES_ELAPSED`` (248) ... ``FP16_CYCLES_ACTIVE`` (260),
whose nvml.h comments say "since reboot". NVML's own documentation does not say what ``nvmlGpmMetricsGet`` returns
for them, but the vendor's own consumer does: DCGM 4.6.0 (``dcgmlib/src/DcgmGpmManager.cpp`` and
``DcgmCacheManager.cpp``) calls ``nvmlGpmMetricsGet`` with a baseline and a latest sample and these ids, and stores
the value unchanged as its "raw monotonic counter" fields 1084-1096 (int64; PCIe in bytes, not MiB). So they are
read here as running totals (cycles), turned into activity by :class:`agent.backends.cumulative.CounterWindows`
(restarts handled, never negative), and preferred to the sampled ratio of the same field.

Why this is guarded, and how:

* the ids are asked for in a call of their own, over the pair of samples the ratios were just computed from (no
  extra sample), so a driver that refuses them (the whole call fails, or the elapsed counter's own return code is
  not SUCCESS) never costs a ratio; that switches them off for this GPU for good, so it costs one failed call;
* the semantics are the vendor's consumer's, not documented: each window, the totals' activity must agree with
  GPM's own ratio of every field both give, over the same two samples, within :data:`TOLERANCE`. A window that
  disagrees (or whose counters went back) is not used (the ratios are), and after :data:`STRIKES` such windows
  among the last :data:`RECENT` the totals are switched off for good with :data:`DISAGREE`. So a driver that
  returns per-interval differences can never decide a verdict: under steady load Δ/Δ of such differences happens
  to equal the activity (and agrees), and as soon as the load changes it does not;
* the PCIe totals (255/256) and the integer pipe (257) are not read: GPM's PCIe rates over the same samples give
  the same bytes, and the sample has no integer-pipe field.

Cost: one more ``nvmlGpmMetricsGet`` per GPU per interval where the binding defines the ids and the driver answers
them; nothing on older releases (no id is defined) and nothing after a refusal.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from agent.backends.cumulative import CounterWindows, Totals
from agent.backends.nvml.errors import Meaning, describe, describe_code, meaning
from agent.backends.nvml.structs import plain

log = logging.getLogger("roofwatch.nvml")

SOURCE = "gpm-totals"
"""The counter source of a field the totals gave (agent.model.counter_source)."""
ELAPSED = "NVML_GPM_METRIC_SM_CYCLES_ELAPSED"
ACTIVE: dict[str, str] = {
    "NVML_GPM_METRIC_SM_CYCLES_ACTIVE": "sm_active",
    "NVML_GPM_METRIC_MMA_CYCLES_ACTIVE": "tensor_active",
    "NVML_GPM_METRIC_DMMA_CYCLES_ACTIVE": "tensor_dmma_active",
    "NVML_GPM_METRIC_HMMA_CYCLES_ACTIVE": "tensor_hmma_active",
    "NVML_GPM_METRIC_IMMA_CYCLES_ACTIVE": "tensor_imma_active",
    "NVML_GPM_METRIC_DFMA_CYCLES_ACTIVE": "tensor_dfma_active",
    "NVML_GPM_METRIC_FP64_CYCLES_ACTIVE": "fp64_active",
    "NVML_GPM_METRIC_FP32_CYCLES_ACTIVE": "fp32_active",
    "NVML_GPM_METRIC_FP16_CYCLES_ACTIVE": "fp16_active",
}
"""pynvml's name of each active-cycles metric -> the sample field Δ(it) / Δ(elapsed) fills."""
TOLERANCE = 0.05
"""Most the totals' activity may differ from GPM's ratio of the same field over the same samples (absolute, 0..1).
Both are computed from the same two snapshots, so an honest driver agrees to rounding; a driver that returns the
change between the samples instead of a total gives a window of garbage or a restart."""
STRIKES = 3
RECENT = 10
"""The totals are off for good after :data:`STRIKES` windows among the last :data:`RECENT` that disagreed or whose
counters went back: one GPU reset gives one such window; a driver with other semantics gives one whenever the load
changes (its agreeing windows in between are within :data:`TOLERANCE` of the ratios on every field, so harmless)."""
KEY = "gpm"
"""The one device's key in its :class:`CounterWindows`."""
DISAGREE = ("GPM totals disagree with GPM's ratios over the same samples: not used (what nvmlGpmMetricsGet returns "
            "for ids 248-260 is undocumented)")


def metric_ids(module: Any) -> dict[int, str | None]:
    """The cumulative metric ids this pynvml defines -> the sample field each gives (None: the elapsed cycles);
    {} when it lacks the elapsed counter (every release before 13.615), so nothing is asked for."""
    elapsed = getattr(module, ELAPSED, None)
    if not isinstance(elapsed, int):
        return {}
    ids: dict[int, str | None] = {elapsed: None}
    for name, sample_field in ACTIVE.items():
        metric_id = getattr(module, name, None)
        if isinstance(metric_id, int):
            ids[metric_id] = sample_field
    return ids


@dataclass(frozen=True, slots=True)
class TotalsState:
    """How one GPU's GPM totals went, for ``doctor`` and ``counter_sources``."""

    off: str | None
    """Why they are not read for good (refused by the driver, or :data:`DISAGREE`); None while they are."""
    used: tuple[str, ...]
    """Sample fields the latest sample took from them."""
    window_cycles: float | None
    restarts: int
    strikes: int
    dropped: Mapping[str, str] = field(default_factory=dict)
    """Fields whose own metric the driver refused (the others are still read)."""


class GpmTotals:
    """The cumulative GPM metrics of one device, read over the GPM reader's latest pair of samples."""

    def __init__(self, nvml: Any, ids: Mapping[int, str | None], gpu: Callable[[], str]) -> None:
        """``ids``: metric id -> sample field, the elapsed cycles' id mapped to None (:func:`metric_ids`)."""
        self._nvml = nvml
        self._ids = dict(ids)
        self._elapsed = next(m for m, name in self._ids.items() if name is None)
        self._gpu = gpu
        self._request: Any = None
        self._windows = CounterWindows()
        self._last_t: float | None = None
        self.off: str | None = None
        self.used: tuple[str, ...] = ()
        self._recent: deque[bool] = deque(maxlen=RECENT)
        self.dropped: dict[str, str] = {}

    def _prepare(self) -> Any:
        request = self._request
        if request is None:
            request = self._request = self._nvml.c_nvmlGpmMetricsGet_t()
        request.version = self._nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._ids)
        for i, metric_id in enumerate(self._ids):
            request.metrics[i].metricId = metric_id
        return request

    def apply(self, pair: tuple[Any, Any, float, float] | None, ratios: dict[str, float],
              error: Callable[[str, BaseException], None]) -> dict[str, float]:
        """``ratios`` (GPM's, over ``pair``) with the fields the totals give over the same samples replacing them,
        once the self-check passes. ``pair``: (sample1, sample2, t1, t2) of the reader's latest metrics call;
        ``error``: the device's policy, called for a lost GPU or a broken library (it raises)."""
        if self.off is not None:
            self.used = ()
            return ratios
        if pair is None:  # no new window (a read too early for GPM, or a baseline): the latest window still stands
            return ratios
        self.used = ()
        sample1, sample2, t1, t2 = pair
        if self._last_t is None or t1 != self._last_t:  # not the continuation of the last pair: a new baseline
            self._windows.forget(KEY)
        self._last_t = t2
        totals = self._read(sample1, sample2, error)
        if totals is None:
            self._last_t = None
            return ratios
        before = self._windows.state(KEY)
        exact = self._windows.activity(KEY, totals)
        if before is None:
            return ratios  # the first reading since start, a reset or a skipped pair: a baseline only
        after = self._windows.state(KEY)
        went_back = after is not None and after.restarts > before.restarts
        both = [f for f in exact if ratios.get(f) is not None]
        if both and not went_back and all(abs(exact[f] - ratios[f]) <= TOLERANCE for f in both):
            self._recent.append(False)
            self.used = tuple(sorted(exact))
            return {**ratios, **exact}
        if both or (went_back and ratios):
            self._strike()
        return ratios

    @property
    def strikes(self) -> int:
        """Windows among the last :data:`RECENT` that disagreed with the ratios or whose counters went back."""
        return sum(self._recent)

    def _strike(self) -> None:
        self._recent.append(True)
        if self.strikes >= STRIKES:
            self.off = DISAGREE
            log.warning("GPU %s: %s; GPM's sampled ratios are used", self._gpu(), DISAGREE)

    def _read(self, sample1: Any, sample2: Any, error: Callable[[str, BaseException], None]) -> Totals | None:
        request = self._prepare()
        request.sample1, request.sample2 = sample1, sample2
        try:
            self._nvml.nvmlGpmMetricsGet(request)
        except self._nvml.NVMLError as exc:
            if meaning(exc) in (Meaning.DEVICE_LOST, Meaning.LIBRARY):
                error("gpm_totals", exc)  # raises, as for every reading
            self._switch_off(f"refused by the driver: {describe(exc)}")
            return None
        elapsed: float | None = None
        active: dict[str, float] = {}
        refused: dict[int, int] = {}
        metrics = plain(request, "metrics")
        for i in range(plain(request, "numMetrics")):
            metric = metrics[i]
            metric_id, code, value = plain(metric, "metricId"), plain(metric, "nvmlReturn"), plain(metric, "value")
            name = self._ids.get(metric_id)
            if code != 0:
                refused[metric_id] = code
            elif not math.isfinite(value):
                continue  # no reading of that counter this time (DCGM stores a NaN as blank)
            elif metric_id == self._elapsed:
                elapsed = float(value)
            elif name is not None:
                active[name] = float(value)
        for metric_id, code in refused.items():
            if metric_id == self._elapsed:
                self._switch_off(f"refused by the driver: SM_CYCLES_ELAPSED {describe_code(code)}")
                return None
            name = self._ids.pop(metric_id, None)
            if name is not None:
                self.dropped[name] = describe_code(code)
        if elapsed is None:
            return None
        return Totals(elapsed, active)

    def _switch_off(self, why: str) -> None:
        self.off = why
        # Debug, not info: every node whose driver predates the ids would print one line per GPU at each start
        # for what is no fault (the ratios are exact over the same samples); doctor's "GPM totals" line says it.
        log.debug("GPU %s: GPM totals (ids 248-260) %s; GPM's sampled ratios are used, not asking again",
                  self._gpu(), why)

    def state(self) -> TotalsState:
        window = self._windows.state(KEY)
        return TotalsState(self.off, self.used, window.window_cycles if window is not None else None,
                           window.restarts if window is not None else 0, self.strikes, dict(self.dropped))


def totals_for(nvml: Any, gpu: Callable[[], str]) -> GpmTotals | None:
    """The totals reader of one device where this pynvml defines the ids; None where it does not (nothing changes)."""
    ids = metric_ids(nvml)
    return GpmTotals(nvml, ids, gpu) if ids else None
