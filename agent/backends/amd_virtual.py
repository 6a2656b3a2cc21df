"""``amd-virtual``: the real AMD backend over a fake libamd_smi that plays the virtual fleet.

The real ``amdsmi`` package (its interface and ctypes wrapper, unchanged) is loaded as a private
copy whose C library is :mod:`agent.virtual.fake_amdsmi`, driven by the same simulation as the
``virtual`` backend. So ``roofwatch demo --backend amd-virtual`` shows MI300X GPUs through every
amdsmi call, dict key, unit and "N/A" a real node would give. What amdsmi cannot know (process
CPU, host I/O, NIC traffic, the job's own reports) comes from the simulation's host side.
"""

from __future__ import annotations

from typing import Any

from agent.backends.amd.backend import AmdBackend
from agent.backends.amd.library import import_error_message
from agent.backends.base import BackendUnavailable
from agent.backends.nvml_virtual import SimulatedHost
from agent.model import GpuSample
from agent.virtual.backend import VirtualBackend


class VirtualAmdBackend(AmdBackend):
    """:class:`AmdBackend` on a fake libamd_smi; also offers the virtual backend's demo head start."""

    name = "amd-virtual"

    def __init__(self, virtual: VirtualBackend, **kwargs: Any) -> None:
        from agent.virtual.fake_amdsmi import FakeAmdSmiLibrary, load_amdsmi

        self.virtual = virtual
        self.library = FakeAmdSmiLibrary(virtual)
        kwargs.setdefault("host", SimulatedHost(self.library))
        kwargs.setdefault("node", virtual.node)
        try:
            amdsmi = load_amdsmi(self.library)
        except Exception as exc:  # noqa: BLE001 - the same import traps as the real package (docs/amd.md)
            self.library.close()
            virtual.close()
            raise BackendUnavailable(import_error_message(exc)) from None
        super().__init__(amdsmi, **kwargs)

    def start_dme(self, *, serve: bool = False) -> Any:
        """The node's virtual Device Metrics Exporter when its scenario asks for one (``amd: {device_metrics_exporter:
        true}``), or None. Rendered in process for the reader (``dme.fetch``, ``dme.url``): the demo opens no port
        beside the one the user chose; ``serve`` also serves it on a loopback port (for tests over HTTP)."""
        if not self.library.profile.device_metrics_exporter:
            return None
        from agent.virtual.fake_dme import VirtualDme

        self.dme = VirtualDme(self.library, serve=serve)
        return self.dme

    def warm_samples(self, now: float, seconds: float, interval_s: float = 1.0) -> list[GpuSample]:
        return self.virtual.warm_samples(now, seconds, interval_s)

    def close(self) -> None:
        dme = getattr(self, "dme", None)
        if dme is not None:
            dme.close()
        super().close()
        self.library.close()
        self.virtual.close()
