"""The names each DRA driver gives a local GPU, so a claim's device finds the GPU the backend reads.

The kubelet's pod-resources API names a DRA-allocated device by its driver, pool and device name only;
the UUID is an attribute of the driver's ResourceSlice, which lives in the API server (dcgm-exporter
watches ResourceSlices for it, which needs cluster RBAC). The agent stays node-local instead and
derives each driver's canonical name from what the node itself shows:

* NVIDIA (``gpu.nvidia.com``, kubernetes-sigs/dra-driver-nvidia-gpu): a whole GPU is ``gpu-<minor>``,
  the minor of ``/dev/nvidia<minor>``, which the driver writes as ``Device Minor:`` in
  ``/proc/driver/nvidia/gpus/<pci>/information``. MIG devices (``gpu-<minor>-mig-<profile>-<start>-<size>``)
  are not derived: they map only when the name is a MIG UUID.
* AMD (``gpu.amd.com``, ROCm/k8s-gpu-dra-driver): ``gpu-<card>-<render>``, the DRM ``card<N>`` and
  ``renderD<M>`` nodes under the GPU's PCI device in sysfs.

A driver that names devices by UUID or PCI address needs nothing here (agent.context.attribution.kubelet.devices).
Each GPU's names are read once and remembered: they change only with a driver reload.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from agent.context.attribution.kubelet.devices import dra_key, normalize_device_id

_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)
_CARD = re.compile(r"^card(\d+)$")
_RENDER = re.compile(r"^renderD(\d+)$")
_MAX_READ = 64 * 1024


class DraNames:
    """``names(bus_id)``: the ``dra:<driver>/<device>`` keys of the GPU at PCI address ``bus_id``."""

    def __init__(self, proc_root: str | Path = "/proc", sysfs_root: str | Path = "/sys") -> None:
        self._nvidia = Path(proc_root) / "driver" / "nvidia" / "gpus"
        self._pci = Path(sysfs_root) / "bus" / "pci" / "devices"
        self._known: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def names(self, bus_id: str | None) -> tuple[str, ...]:
        """Never raises: a GPU whose files are absent or unreadable has no DRA names (not mapped)."""
        pci = normalize_device_id(bus_id)
        if pci is None:
            return ()
        with self._lock:
            known = self._known.get(pci)
        if known is not None:
            return known
        names = (*self._nvidia_names(pci), *self._amd_names(pci))
        with self._lock:
            if len(self._known) < 1024:
                self._known[pci] = names
        return names

    def _nvidia_names(self, pci: str) -> tuple[str, ...]:
        try:
            with open(self._nvidia / pci / "information", encoding="utf-8", errors="replace") as handle:
                text = handle.read(_MAX_READ)
        except OSError:
            return ()
        match = _MINOR.search(text)
        return (dra_key("gpu.nvidia.com", f"gpu-{int(match.group(1))}"),) if match else ()

    def _amd_names(self, pci: str) -> tuple[str, ...]:
        try:
            entries = [entry.name for entry in (self._pci / pci / "drm").iterdir()]
        except OSError:
            return ()
        cards = [int(m.group(1)) for name in entries if (m := _CARD.match(name))]
        renders = [int(m.group(1)) for name in entries if (m := _RENDER.match(name))]
        if len(cards) != 1 or len(renders) != 1:
            return ()
        return (dra_key("gpu.amd.com", f"gpu-{cards[0]}-{renders[0]}"),)
