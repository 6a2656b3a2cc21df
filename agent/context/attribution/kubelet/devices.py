"""Device-id normalisation, so that the id a device plugin gave the kubelet and the id our GPU
backend reads from NVML or amdsmi compare equal.

Device plugins register devices under their own ids and the pod-resources API returns them
unchanged:

* NVIDIA device plugin: the GPU UUID (``GPU-<uuid>``) or, for MIG, the MIG device UUID
  (``MIG-<uuid>``). With time-slicing each GPU is advertised as several replicas named
  ``GPU-<uuid>::<n>``; GKE's sharing uses ``<id>/vgpu<n>``.
* AMD device plugin (ROCm/k8s-device-plugin): the PCI address (``0000:c1:00.0``); its
  time-slicing replicas are ``<pci>-slice-<n>``.

NVML writes PCI bus ids with an 8-digit upper-case domain (``00000000:1B:00.0``), sysfs and
amdsmi with a 4-digit lower-case one (``0000:1b:00.0``), so PCI ids are rewritten to the
short lower-case form. Everything is compared case-insensitively.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DEFAULT_RESOURCE_PREFIXES: tuple[str, ...] = ("nvidia.com/", "amd.com/")
"""Extended-resource prefixes whose devices are GPUs (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``,
``amd.com/gpu``, AMD partition resources like ``amd.com/cpx_nps4``)."""

# Replica suffixes of time-sliced (shared) devices: all replicas are the same physical device.
_REPLICA_SUFFIX = re.compile(r"(?:::\d+|-slice-\d+|/vgpu\d+)$")
# [domain:]bus:device.function, domain of any width up to 8 hex digits.
_PCI_BUS_ID = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")


def normalize_device_id(device_id: str | None) -> str | None:
    """The comparable form of a device id, or None for an empty one.

    >>> normalize_device_id("GPU-8F6B::3")
    'gpu-8f6b'
    >>> normalize_device_id("00000000:1B:00.0")
    '0000:1b:00.0'
    """
    if device_id is None:
        return None
    text = device_id.strip().lower()
    text = _REPLICA_SUFFIX.sub("", text)
    if not text:
        return None
    match = _PCI_BUS_ID.match(text)
    if match:
        domain, bus, device, function = match.groups()
        return f"{int(domain or '0', 16):04x}:{bus}:{device}.{function}"
    return text


def is_gpu_resource(resource_name: str, prefixes: Iterable[str]) -> bool:
    """Whether an extended resource counts as a GPU (its name starts with one of ``prefixes``)."""
    name = resource_name.lower()
    return any(name.startswith(prefix.lower()) for prefix in prefixes)


DEFAULT_DRA_DRIVERS: tuple[str, ...] = ("gpu.nvidia.com", "gpu.amd.com")
"""DRA drivers whose devices are GPUs: NVIDIA's (kubernetes-sigs/dra-driver-nvidia-gpu, also GKE's) and
AMD's (ROCm/k8s-gpu-dra-driver). Others (NVIDIA's ``compute-domain.nvidia.com``, NICs) are ignored."""

# A device name that already is an id the GPU backends read: a GPU or MIG UUID, or a PCI address.
_UUID_NAME = re.compile(r"^(?:gpu|mig)-[0-9a-f]{8}-[0-9a-f]{4}-", re.IGNORECASE)


def dra_key(driver_name: str, device_name: str) -> str:
    """The map key of a DRA device by its driver's own name for it (``dra:gpu.nvidia.com/gpu-3``): how
    :mod:`agent.context.attribution.dra` names a local GPU by each driver's naming rule."""
    return f"dra:{driver_name.strip().lower()}/{device_name.strip().lower()}"


def dra_device_keys(driver_name: str, device_name: str,
                    drivers: Iterable[str] = DEFAULT_DRA_DRIVERS) -> tuple[str, ...]:
    """The keys a DRA-allocated device is found under: its driver-named key, and its normalised id when
    the driver names devices by UUID or PCI address. Empty for a driver that gives no GPUs.

    >>> dra_device_keys("gpu.nvidia.com", "gpu-0")
    ('dra:gpu.nvidia.com/gpu-0',)
    >>> dra_device_keys("compute-domain.nvidia.com", "channel-0")
    ()
    """
    if driver_name.strip().lower() not in {d.lower() for d in drivers} or not device_name.strip():
        return ()
    keys = [dra_key(driver_name, device_name)]
    direct = normalize_device_id(device_name)
    if direct is not None and (_UUID_NAME.match(direct) or _PCI_BUS_ID.match(direct)):
        keys.append(direct)
    return tuple(keys)


def is_replica(device_id: str) -> bool:
    """Whether a device-plugin id names a time-sliced replica (``::n``, ``-slice-n``, ``/vgpun``)."""
    return _REPLICA_SUFFIX.search(device_id.strip().lower()) is not None
