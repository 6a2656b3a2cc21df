"""Which GPUs a reporter can see, from the visible-device variables it sent (resolved once, at receipt).

A containerised job's PID means nothing to us, but its ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES``
(or the ROCm equivalents) name its GPUs by UUID or index, composed the way the runtime composes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.model.indexes import is_index
from agent.context.workload.report_schema import ReportHints


@dataclass(frozen=True, slots=True)
class ReportDevices:
    """Where the reporter's environment says it runs, resolved once at receipt."""

    uuids: tuple[str, ...] = ()
    """Lower-cased UUIDs (or UUID prefixes, as CUDA accepts) the process can see."""
    indices: tuple[str, ...] = ()
    """Host indices, when the hints name devices by index only."""


def resolve_devices(hints: ReportHints | None) -> ReportDevices:
    """The devices a reporter's environment lets it see, as host UUIDs or host indices.

    ``NVIDIA_VISIBLE_DEVICES`` is set by the container runtime in host terms; the CUDA/ROCm
    variables index into whatever is visible (so ``CUDA_VISIBLE_DEVICES=1`` under
    ``NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b`` is ``GPU-b``). ``LOCAL_RANK`` then picks one of
    several, the torchrun convention (``torch.cuda.set_device(local_rank)``).
    """
    if hints is None:
        return ReportDevices()
    visible: list[str] | None = None
    for value in (hints.NVIDIA_VISIBLE_DEVICES, hints.CUDA_VISIBLE_DEVICES, hints.ROCR_VISIBLE_DEVICES,
                  hints.HIP_VISIBLE_DEVICES):
        visible = _compose(visible, _parse_visible(value))
    if visible is None:
        return ReportDevices()
    local_rank = hints.LOCAL_RANK.strip() if hints.LOCAL_RANK else ""
    if len(visible) > 1 and _is_index(local_rank) and int(local_rank) < len(visible):
        visible = [visible[int(local_rank)]]
    uuids = tuple(v.lower() for v in visible if not _is_index(v))
    indices = tuple(v for v in visible if _is_index(v))
    return ReportDevices(uuids=uuids, indices=indices)


def _parse_visible(value: str | None) -> list[str] | None:
    """None: no restriction (unset, ``all``); a list (maybe empty) otherwise. Like CUDA, stop at a bad index."""
    if value is None:
        return None
    text = value.strip()
    if text.lower() in ("all", ""):
        return None if text else []
    if text.lower() in ("none", "void"):
        return []
    out: list[str] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if _is_index(token.lstrip("-")):
            if token.startswith("-"):
                break
            out.append(str(int(token)))
        else:
            out.append(token)
    return out[:64]


def _compose(outer: list[str] | None, inner: list[str] | None) -> list[str] | None:
    if inner is None:
        return outer
    if outer is None:
        return inner
    out = []
    for token in inner:
        if _is_index(token):
            if int(token) >= len(outer):
                break
            out.append(outer[int(token)])
        else:
            out.append(token)
    return out


def _is_index(token: str) -> bool:
    """A device index as CUDA reads one (``01`` is 1): :func:`agent.model.indexes.is_index`, leading zeros allowed.
    ``str.isdigit`` alone accepts "²", which ``int()`` refuses (a 500 for one report)."""
    return is_index(token, leading_zeros=True)
