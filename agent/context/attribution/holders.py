"""Every holder of one GPU: the pods the kubelet gave it to, and its processes grouped by pod, job or PID.

The kubelet names pods but knows no PIDs; a process's cgroup names its pod (by UID, and by name and
namespace where the agent may read the process's environment and root) and its Slurm job; the driver
lists the PIDs. This module joins the three into :class:`agent.model.holders.Holder` values, so a
time-sliced GPU given to three pods, or an MPS GPU with four client processes, has a holder each.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Collection, Iterable, Mapping, Sequence

from agent.model import Attribution
from agent.model.holders import Holder, HolderReport


def _pod_key(ref: object) -> tuple[str | None, str | None]:
    return getattr(ref, "namespace", None), getattr(ref, "pod", None)


def gpu_holders(refs: Iterable[object], pids: Sequence[int], *, pod_of: Callable[[int], object | None],
                job_of: Callable[[int], object | None]) -> tuple[Holder, ...]:
    """Holders of a GPU from the kubelet's ``refs`` (PodRef-like, in the kubelet cache's order) and its ``pids``.

    A process joins the kubelet holder of its pod (same namespace and pod name from its cgroup), or the one
    pod the kubelet gave the GPU to when its own pod's name is unknown; one the kubelet does not name becomes
    a holder of its own pod (from the cgroup), else of its job, else of its PID. Kubelet holders without a process stay: allocated, no context (the idle-allocated case).

    ``job_of(pid)`` gives the process's job id, or a ProcessJob-like value (agent.context.attribution.slurm) whose
    ``user`` and ``account`` a job holder carries and whose ``owner`` a process holder carries as its ``user``, so
    the fleet report can bill users and Slurm accounts for their share. Pods carry neither: Kubernetes has no user
    per pod, and a pod's processes may run as any uid.
    """
    by_pod: dict[tuple[str | None, str | None], int] = {}
    rows: list[dict] = []
    for ref in refs:
        key = _pod_key(ref)
        if key in by_pod:  # a second container (or claim) of one pod: its processes go to the first
            continue
        by_pod[key] = len(rows)
        rows.append({"kind": "pod", "via": getattr(ref, "via", None) or "device-plugin", "namespace": key[0],
                     "pod": key[1], "container": getattr(ref, "container", None),
                     "claim": getattr(ref, "claim", None), "pids": []})
    jobs: dict[str, int] = {}
    only = rows[0] if len(rows) == 1 else None  # a whole GPU the kubelet gave to one pod
    for pid in pids:
        pod = pod_of(pid)
        key = _pod_key(pod) if pod is not None else (None, None)
        if key[1] is not None and key in by_pod:
            rows[by_pod[key]]["pids"].append(pid)
            continue
        if only is not None and key[1] is None:
            # Its pod has no name here (the cgroup gives the UID; the name needs ptrace): on a GPU the kubelet
            # gave to one pod, it is that pod's, so a whole GPU is never taken for a shared one.
            only["pids"].append(pid)
            continue
        if key[1] is not None or getattr(pod, "pod_uid", None):
            name = key[1] or f"uid:{getattr(pod, 'pod_uid', '')}"
            by_pod[(key[0], name)] = len(rows)
            rows.append({"kind": "pod", "via": "cgroup", "namespace": key[0], "pod": name,
                         "container": getattr(pod, "container", None), "pids": [pid]})
            continue
        found = job_of(pid)
        job = found if isinstance(found, str) else getattr(found, "job_id", None)
        owner = getattr(found, "owner", None)
        if job:
            if job not in jobs:
                jobs[job] = len(rows)
                rows.append({"kind": "job", "via": "slurm", "job_id": job, "pids": [],
                             "user": getattr(found, "user", None) or owner, "account": getattr(found, "account", None)})
            rows[jobs[job]]["pids"].append(pid)
            continue
        rows.append({"kind": "process", "via": "process", "pids": [pid], "user": owner})
    return tuple(Holder(**{**row, "pids": tuple(row["pids"])}) for row in rows)


def with_kubelet_holders(attribution: Attribution | None, refs: Sequence[object]) -> Attribution | None:
    """``attribution`` whose holders the kubelet's ``refs`` complete: a holder the kubelet names takes its
    ``via`` and ``claim`` from it (the kubelet is the authority on how a pod got the device) and keeps its
    PIDs; a pod the kubelet names that has none here joins without PIDs (allocated, no context). For a host
    that knows its holders' PIDs some other way (the simulated node) but is asked about a real kubelet."""
    if not refs:
        return attribution
    base = attribution or Attribution()
    own = {(h.namespace, h.pod): h for h in base.holders or () if h.kind == "pod"}
    merged = [h for h in base.holders or () if h.kind != "pod"]
    seen: set[tuple[str | None, str | None]] = set()
    for ref in refs:
        key = _pod_key(ref)
        if key in seen:
            continue
        seen.add(key)
        mine = own.pop(key, None)
        merged.append(Holder(kind="pod", via=getattr(ref, "via", None) or "device-plugin", namespace=key[0],
                             pod=key[1], container=getattr(ref, "container", None), claim=getattr(ref, "claim", None),
                             pids=mine.pids if mine is not None else ()))
    merged.extend(own.values())
    first = next((h for h in merged if h.kind == "pod"), None)
    return dataclasses.replace(base, holders=tuple(merged), namespace=base.namespace or getattr(first, "namespace", None),
                               pod=base.pod or getattr(first, "pod", None),
                               container=base.container or getattr(first, "container", None))


def with_mps_clients(attribution: Attribution | None, pids: Mapping[int, object] | Collection[int],
                     clients: Collection[int]) -> Attribution | None:
    """``attribution`` with the driver's MPS clients marked: a process holder all of whose PIDs the driver
    lists as MPS clients is ``via="mps"``. Without holders from the host and with no one job or pod owning
    the GPU, every process on it becomes a holder of its own (``mps`` for a client), as the collector would
    make them; pods and jobs keep how they were found (the kubelet or Slurm is the authority on them)."""
    if not clients:
        return attribution
    marked = set(clients)

    def via(holder: Holder) -> Holder:
        if holder.kind == "process" and holder.pids and marked.issuperset(holder.pids):
            return dataclasses.replace(holder, via="mps")
        return holder

    if attribution is not None and attribution.holders:
        return dataclasses.replace(attribution, holders=tuple(via(h) for h in attribution.holders))
    if attribution is not None and (attribution.job_id or attribution.pod):
        return attribution
    holders = tuple(Holder(kind="process", via="mps" if pid in marked else "process", pids=(pid,))
                    for pid in sorted(pids))
    return dataclasses.replace(attribution or Attribution(), holders=holders)


def with_holder_reports(attribution: Attribution | None, report_for: Callable[[Sequence[int]], object | None]
                        ) -> Attribution | None:
    """``attribution`` whose holders carry their own workload report, on a shared GPU (two holders or more).

    ``report_for(pids)`` is the workload sources' lookup for this GPU (agent.context.workload). A report it
    gives for a holder's PIDs that it does not give for no PIDs at all was matched by PID (the reporter's
    socket peer or claimed PID is one of the holder's): the holder's own. A report matched by the GPU's UUID
    or index (every holder of a time-sliced GPU sees the same UUID) belongs to no holder in particular."""
    holders = attribution.holders if attribution is not None else None
    if attribution is None or not holders or len(holders) < 2:
        return attribution
    anyone = report_for(())
    out = []
    for holder in holders:
        own = report_for(holder.pids) if holder.pids else None
        report = None
        if own is not None and own != anyone:
            report = HolderReport(**{name: getattr(own, name, None) for name in HolderReport.__dataclass_fields__})
        out.append(dataclasses.replace(holder, report=report) if report != holder.report else holder)
    return dataclasses.replace(attribution, holders=tuple(out))
