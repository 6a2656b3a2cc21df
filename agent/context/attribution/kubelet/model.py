"""Plain, immutable data for Kubernetes attribution.

The client converts protobuf messages into these dataclasses at the edge so that nothing past
:mod:`agent.context.attribution.kubelet.client` depends on generated code (or on the protobuf runtime's mutable
message objects, which are not safe to share between threads).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PodRef:
    """Who holds a GPU: the labels the exporter attaches to a GPU's series.

    Any field may be None when the source cannot tell: the kubelet API names pod, namespace and
    container but knows no UIDs; the cgroup fallback knows the pod UID and container id, and the
    pod name and namespace only when it may read the process's environment and root.
    """

    namespace: str | None
    pod: str | None
    container: str | None
    pod_uid: str | None = None
    container_id: str | None = None
    via: str | None = field(default=None, compare=False)
    """How the kubelet gave it the device: ``device-plugin``, ``time-slicing`` (a replica id) or ``dra``."""
    claim: str | None = field(default=None, compare=False)
    """``namespace/name`` of the DRA claim, for a device given through one. Neither this nor ``via`` is part
    of a holder's identity: one pod container is one holder however it got the device."""


@dataclass(frozen=True)
class ContainerDevices:
    """Devices of one extended resource (``nvidia.com/gpu``, ``amd.com/gpu``...) given to a container."""

    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ClaimDevice:
    """One device a DRA claim gave a container (the pod-resources ``ClaimResource``): the driver, pool and
    device name triplet identifies it; ``cdi_devices`` are the CDI names the runtime injected."""

    driver_name: str
    pool_name: str
    device_name: str
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class DynamicResources:
    """One DRA claim of a container (the pod-resources ``DynamicResource``)."""

    claim_name: str
    claim_namespace: str
    devices: tuple[ClaimDevice, ...]


@dataclass(frozen=True)
class ContainerResources:
    """One container of a pod with the device-plugin devices and the DRA claims assigned to it."""

    name: str
    devices: tuple[ContainerDevices, ...]
    dynamic: tuple[DynamicResources, ...] = ()


@dataclass(frozen=True)
class PodResources:
    """One pod as the kubelet pod-resources API reports it."""

    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]
