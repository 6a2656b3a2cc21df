"""The explanation of a window's stretches without a kernel: a quiet tail that makes a GPU idle, what feeds a
starved one, and the stall (a checkpoint) a working job takes (agent.classifier.pauses measures them).

Each reason carries the comparisons its rule made (agent.classifier.rules: ``quiet_after_burst``,
``feeding``, the stall's recognition), so a reason quotes the threshold that decided and the property test
can hold its figures against them (agent.classifier.explain has the rest).
"""

from __future__ import annotations

from agent.classifier.evidence import Evidence
from agent.classifier.scoring import Rule, Term
from agent.classifier.thresholds import Thresholds
from agent.classifier.wording import pct
from agent.model.verdict import Check, Reason

STALL_DETAILS: tuple[str, ...] = ("checkpoint", "periodic_stall")
"""The details a roofline verdict takes when its job stops on a schedule (or for a checkpoint)."""


def _gbps(x: float) -> str:
    return f"{x / 1e9:.1f} GB/s" if x >= 1e8 else f"{x / 1e6:.0f} MB/s"


def _term_checks(rule: Rule | None) -> tuple[Check, ...]:
    if rule is None:
        return ()
    return tuple(c for term in rule.terms() if (c := term.check()) is not None)


def quiet_reason(e: Evidence, rule: Rule) -> Reason | None:
    """Why a window with a burst in it is idle: the quiet stretch that ends it, and the host asking nothing
    (None when the idle rule decided on no kernel at all)."""
    after = rule.find("quiet_after_burst")
    if after is None or rule.chosen() is not after:
        return None
    q, f = e.quiet, e.features
    found = tuple(c for c in _term_checks(after) if c.quantity != "no_periodic_stall")
    host = []
    if q.cpu_cores is not None:
        host.append(f"its process uses {q.cpu_cores:.1f} cores")
    if q.iowait is not None:
        host.append(f"host iowait {pct(q.iowait)}")
    if q.io_pressure is not None:
        host.append(f"I/O pressure {pct(q.io_pressure)}")
    if q.pcie_bytes is not None:
        host.append(f"PCIe {_gbps(q.pcie_bytes)}")
    idle_clock = "; the driver reports the GPU idle, clocks dropping" if q.gpu_idle_reason else ""
    said = (f"no kernel has run for the last {q.seconds:.0f} s after a burst ({pct(f.duty)} duty over the window) and "
            f"nothing on the host asks for work ({', '.join(host) or 'no host signal read'}){idle_clock}")
    return Reason(said, found)


def feeding_reason(e: Evidence, rule: Rule, t: Thresholds) -> Reason | None:
    """What shows a pipeline feeding a starved GPU when its host signals do not (kernels still arriving, gaps
    on a schedule): the starvation rule's ``feeding`` part, where it decided on those."""
    feeding = rule.find("feeding")
    chosen = feeding.chosen() if feeding is not None else None
    if not isinstance(chosen, Term) or chosen.value is None:
        return None
    if chosen.quantity == "quiet_tail_s":
        return Reason(f"kernels keep arriving: the window ends {e.quiet.seconds:.0f} s after the last one, under the "
                      f"{t.quiet_tail_s:g} s after which a GPU nothing feeds counts as idle", (chosen.check(),))  # type: ignore[arg-type]
    if chosen.quantity == "periodic_stall":
        return Reason(f"the GPU's gaps recur every {e.stalls.period_s or 0.0:.0f} s: a loop is feeding it")
    return None  # a host signal: the starvation detail names it


def stall_detail(e: Evidence, t: Thresholds) -> tuple[str, Reason] | None:
    """The detail and reason of a roofline verdict whose job stops on a schedule, or for a checkpoint, in this
    window (None when it does not)."""
    s = e.stalls
    if not s.recognised:
        return None
    kind = "checkpoint" if s.checkpoint else "periodic_stall"
    copy = (f"a copy off the GPU at {_gbps(s.copy_bytes)} over PCIe" if s.copy_bytes is not None
            and s.copy_bytes >= t.pcie_active_bytes else "")
    writes = f"host iowait up to {pct(s.iowait)}" if s.iowait is not None and s.iowait >= t.io_wait else ""
    signature = " then ".join(x for x in (copy, writes) if x)
    what = "a checkpoint" if s.checkpoint else "a pause the job makes on a schedule"
    runs = f"; it runs {pct(s.working_duty)} of the rest of this window" if s.working_duty is not None else ""
    if s.periodic and s.period_s is not None and s.length_s is not None and s.regularity is not None:
        said = (f"the job stops every {s.period_s:.0f} s for {s.length_s:.1f} s with no kernel running"
                f"{' (' + signature + ')' if signature else ''}: {what}, {pct(s.share)} of its time over the long window, "
                f"not a starved input{runs}")
        checks = (Check("stall_share", s.share, t.stall_max_share, "below", "stall_max_share"),
                  Check("stall_regularity", s.regularity, t.stall_period_cv, "below", "stall_period_cv"))
        return kind, Reason(said, checks)
    said = (f"no kernel ran for {pct(s.window_share)} of this window while {signature or 'the job paused'}: "
            f"{what}, not a starved input{runs}")
    found = [Check("stall_copy_bytes", s.copy_bytes, t.pcie_active_bytes, "above", "pcie_active_bytes")] \
        if s.copy_bytes is not None else []
    if s.iowait is not None:
        found.append(Check("stall_iowait", s.iowait, t.io_wait, "above", "io_wait"))
    return kind, Reason(said, tuple(found))
