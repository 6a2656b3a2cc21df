"""What needs a person's attention on a node: the one definition the status page and ``roofwatch top`` list by.

A GPU needs attention for any of these reasons, in this order:

- **waste** (agent.model.waste): held idle, input-starved or communication-jittered, named with the time
  it lost (the lost-time measure, the one its reasons give). A spare GPU (idle, nobody holds it) never
  needs attention: it is capacity.
- **serving**: the inference server it serves is in a state with a knob to turn (:data:`SERVING_ATTENTION`):
  KV cache saturated with a queue, under-batched, prefill-heavy, or far above its decode floor. Named with
  the server, the figure that decided the state and the advice docs/serving.md gives for it. ``at_floor``
  and ``near_floor`` servers are as fast as the hardware allows; ``unknown`` needs configuration, which
  ``roofwatch doctor`` names.
- **low MFU**: compute-bound below :data:`MFU_POOR` (the precision or the clocks).
- **throttled**: clocks held down while busy.

A GPU that does not answer is listed by every view too, but as a device state, not a verdict.

:func:`attention_of` reads a verdict; :func:`attention` takes the same figures one by one, for a view
that reads them from ``/metrics`` (``top``: the ``waste`` label, ``roofwatch_gpu_waste_lost_ratio``, the
``roofwatch_serving_*`` series), so every view decides from one rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.model.serving import ServingView
from agent.model.verdict import Verdict
from agent.model.waste import WASTE_KINDS, waste_of

AttentionKind = Literal["waste", "serving", "low_mfu", "throttled"]
ATTENTION_KINDS: tuple[AttentionKind, ...] = ("waste", "serving", "low_mfu", "throttled")
"""The reasons for attention, in the order views list them (most costly first)."""

MFU_POOR = 0.2
"""Below 20% MFU a compute-bound GPU is poor (docs/classification.md; 40% is the practical target)."""

SERVING_ATTENTION: dict[str, str] = {
    "kv_saturated": "add replicas (scale out), not GPUs to this replica; or shorten contexts",
    "under_batched": "raise max_num_seqs (SGLang max_running_requests), or quantise the weights so each step reads "
                     "fewer bytes",
    "prefill_heavy": "enable or shrink chunked prefill, or run prefill and decode on separate GPU pools "
                     "(disaggregation)",
    "above_floor": "time goes outside the weight read: CPU scheduling gaps, uncaptured CUDA graphs, small kernels, "
                   "slow sampling. Profile one step",
}
"""The serving states that need attention, each with its advice in the words of docs/serving.md's "What to do"
column (a test holds the two together)."""

WASTE_FIGURES: dict[str, str] = {
    "idle_held": "held but idle: all of its time lost",
    "input_starved": "lost {lost} of its time: no kernel ran",
    "communication_jittered": "lost {lost} of its time waiting on peers",
}
"""How a wasted GPU's headline says what it lost (the lost-time measure of agent.model.waste.MEASURES)."""
LOST_UNKNOWN = "time lost not measured (no wait counter, no rank spread)"


@dataclass(frozen=True, slots=True)
class Attention:
    """One reason a GPU (or the server it serves) needs a person."""

    kind: AttentionKind
    code: str
    """The waste kind, the serving state, ``compute_bound`` (low MFU) or the throttle label."""
    figure: str
    """The number that decided it, in words: ``lost 46% of its time: no kernel ran``,
    ``KV cache 93% full, 40 requests waiting``."""
    advice: str | None = None
    """What to do (serving states: docs/serving.md)."""
    server: str | None = None
    """The server a serving reason is about (one reason per server, whichever of its GPUs carries it)."""

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "code": self.code, "figure": self.figure, "advice": self.advice,
                "server": self.server}


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def waste_attention(label: str, lost: float | None) -> Attention | None:
    """The waste reason of a GPU whose waste label is ``label`` (agent.model.waste.WASTE_LABELS); None unless wasted."""
    if label not in WASTE_KINDS:
        return None
    template = WASTE_FIGURES[label]
    if "{lost}" in template:
        figure = template.format(lost=_pct(lost)) if lost is not None else LOST_UNKNOWN
    else:
        figure = template
    return Attention("waste", label, figure)


def serving_attention(state: str | None, *, server: str | None, floor_ratio: float | None = None,
                      waiting: float | None = None, kv_usage: float | None = None, batch: float | None = None,
                      possible_batch: float | None = None, prefill_share: float | None = None,
                      preemptions_per_s: float | None = None) -> Attention | None:
    """The serving reason of a server in ``state`` with these figures (ServingView's); None when its state needs none."""
    if state not in SERVING_ATTENTION:
        return None
    parts: list[str] = []
    if state == "kv_saturated":
        if kv_usage is not None:
            parts.append(f"KV cache {_pct(kv_usage)} full")
        if preemptions_per_s:
            parts.append(f"{preemptions_per_s:.2g} requests preempted a second")
        if waiting is not None:
            parts.append(f"{waiting:.0f} requests waiting")
    elif state == "under_batched":
        if batch is not None:
            parts.append(f"batch {batch:.3g}" + (f" of a possible ~{possible_batch:.0f}" if possible_batch else ""))
        if waiting:
            parts.append(f"{waiting:.0f} requests waiting")
    elif state == "prefill_heavy" and prefill_share is not None:
        parts.append(f"prefill takes {_pct(prefill_share)} of GPU time")
    if floor_ratio is not None and (state in ("above_floor", "prefill_heavy") or not parts):
        parts.append(f"{floor_ratio:.2g}x its decode floor")
    return Attention("serving", state, ", ".join(parts) or state.replace("_", " "), SERVING_ATTENTION[state],
                     server=server)


def attention(*, waste: str, lost: float | None, cls: str | None, mfu: float | None, throttled: bool | None,
              throttle: str | None = None, throttle_figure: str | None = None,
              serving: Attention | None = None) -> tuple[Attention, ...]:
    """Every reason one GPU needs attention, in :data:`ATTENTION_KINDS` order, from its figures: its waste label and
    lost share, class, MFU, throttled flag (its label, and the reason that says so), and the serving reason of the
    server it serves."""
    out = [a for a in (waste_attention(waste, lost), serving) if a is not None]
    if cls == "compute_bound" and mfu is not None and mfu < MFU_POOR:
        out.append(Attention("low_mfu", "compute_bound", f"compute-bound at {_pct(mfu)} MFU"))
    if throttled:
        out.append(Attention("throttled", throttle or "throttled", throttle_figure or "clocks held down while busy"))
    return tuple(out)


def serving_attention_of(view: ServingView | None) -> Attention | None:
    """:func:`serving_attention` of a verdict's serving view."""
    if view is None:
        return None
    return serving_attention(view.state, server=view.server, floor_ratio=view.floor_ratio, waiting=view.waiting,
                             kv_usage=view.kv_usage, batch=view.batch, possible_batch=view.possible_batch,
                             prefill_share=view.prefill_share, preemptions_per_s=view.preemptions_per_s)


def attention_of(verdict: Verdict) -> tuple[Attention, ...]:
    """Every reason the verdict's GPU needs attention (empty: it does its own work, or it is spare)."""
    w = waste_of(verdict)
    return attention(waste=w.label, lost=w.lost_fraction, cls=verdict.cls, mfu=verdict.roofline.mfu,
                     throttled=verdict.throttled, throttle=verdict.throttle,
                     throttle_figure=next((r for r in verdict.reasons if "clock" in r), None),
                     serving=serving_attention_of(verdict.serving))
