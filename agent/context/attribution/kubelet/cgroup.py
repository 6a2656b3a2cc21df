"""Pod of a process from ``/proc``: the fallback when the kubelet socket is not mounted.

The kubelet puts every container in a cgroup whose path carries the pod UID and the container
id, and ``/proc/<pid>/cgroup`` is world-readable, so with ``hostPID: true`` the agent can tell
which pod a GPU process belongs to without any API. Both cgroup drivers are understood, on
cgroup v1 (one line per hierarchy) and v2 (the single ``0::`` line):

* cgroupfs: ``/kubepods/burstable/pod<uid>/<container-id>`` (``/kubepods/pod<uid>/...`` for
  Guaranteed pods; CRI-O writes ``crio-<id>`` as the last component);
* systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/
  cri-containerd-<id>.scope`` (also ``crio-<id>.scope``, ``docker-<id>.scope``).

The cgroup names neither the pod nor its namespace. Two best-effort sources fill them in, each
None on any OSError (both need privileges for other users' processes):

* pod name: ``HOSTNAME=`` in ``/proc/<pid>/environ``. The runtime sets it to the pod's hostname,
  which is the pod name unless the pod sets ``spec.hostname``; a ``hostNetwork`` pod gets the
  node's name instead, so treat it as a hint.
* namespace: ``/proc/<pid>/root/var/run/secrets/kubernetes.io/serviceaccount/namespace``
  (absent when the pod does not mount a service-account token).

The container *name* is not recoverable from ``/proc``; it stays None.
"""

from __future__ import annotations

import re
from pathlib import Path

from agent.context.attribution.kubelet.model import PodRef

# A pod UID: a UUID (dashes, or underscores in systemd slice names), or the 32-hex config hash
# that static pods use.
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?$"
)
_CONTAINER_ID = re.compile(r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{12,64})(?:\.scope)?$")
_ENV_HOSTNAME = b"HOSTNAME="
_NAMESPACE_FILE = Path("var/run/secrets/kubernetes.io/serviceaccount/namespace")


def parse_cgroup(text: str) -> tuple[str, str | None] | None:
    """``(pod_uid, container_id)`` from a ``/proc/<pid>/cgroup`` text, or None outside a pod.

    The first line whose path has a ``kubepods`` component and a pod UID wins; the container id
    is the component right after the pod's (None for the pod-level cgroup itself).
    """
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or "kubepods" not in parts[2]:
            continue
        components = [c for c in parts[2].split("/") if c]
        for index, component in enumerate(components):
            match = _POD_UID.search(component)
            if match is None or "kubepods" not in "/".join(components[: index + 1]):
                continue
            pod_uid = match.group(1).replace("_", "-").lower()
            container_id = None
            if index + 1 < len(components):
                container = _CONTAINER_ID.match(components[index + 1].lower())
                container_id = container.group(1) if container else None
            return pod_uid, container_id
    return None


def hostname_from_environ(raw: bytes) -> str | None:
    """``HOSTNAME`` from a NUL-separated ``/proc/<pid>/environ``."""
    for entry in raw.split(b"\0"):
        if entry.startswith(_ENV_HOSTNAME):
            value = entry[len(_ENV_HOSTNAME):].decode("utf-8", "replace").strip()
            return value or None
    return None


def pod_from_cgroup(pid: int, proc_root: Path = Path("/proc")) -> PodRef | None:
    """The pod of process ``pid`` from its cgroup, or None when it is not in a pod or is gone.

    Never raises: a process may exit between being listed and being read.
    """
    base = proc_root / str(pid)
    try:
        parsed = parse_cgroup((base / "cgroup").read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    if parsed is None:
        return None
    pod_uid, container_id = parsed
    try:
        pod = hostname_from_environ((base / "environ").read_bytes())
    except (OSError, ValueError):
        pod = None
    try:
        namespace = (base / "root" / _NAMESPACE_FILE).read_text(errors="replace").strip() or None
    except (OSError, ValueError):
        namespace = None
    return PodRef(namespace=namespace, pod=pod, container=None, pod_uid=pod_uid, container_id=container_id)
