"""Kubernetes attribution: which pod, namespace and container hold a GPU.

The primary source is the kubelet pod-resources gRPC API (``/var/lib/kubelet/pod-resources/
kubelet.sock``), read by :class:`PodResourcesCache` in a background thread so that the
collection loop only ever does a dict lookup. Without the socket, :func:`pod_from_cgroup`
reads a GPU process's pod UID (and, with privileges, pod name and namespace) from ``/proc``.
"""

from agent.context.attribution.kubelet.cache import CacheStatus, PodResourcesCache
from agent.context.attribution.kubelet.cgroup import parse_cgroup, pod_from_cgroup
from agent.context.attribution.kubelet.client import KubeletError, PodResourcesClient
from agent.context.attribution.kubelet.devices import DEFAULT_RESOURCE_PREFIXES, normalize_device_id
from agent.context.attribution.kubelet.model import ContainerDevices, ContainerResources, PodRef, PodResources

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

__all__ = [
    "DEFAULT_KUBELET_SOCKET",
    "DEFAULT_RESOURCE_PREFIXES",
    "CacheStatus",
    "ContainerDevices",
    "ContainerResources",
    "KubeletError",
    "PodRef",
    "PodResources",
    "PodResourcesCache",
    "PodResourcesClient",
    "normalize_device_id",
    "parse_cgroup",
    "pod_from_cgroup",
]
