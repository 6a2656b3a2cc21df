"""Process and ECC C functions.

amdsmi_get_gpu_process_list lists the processes of one processor (a partition sees only its
own): VRAM bytes, GTT and CPU-mapped bytes, cumulative graphics-engine time in ns (this
process's share of gr_active integrated over time) and cu_occupancy, the compute units its
queues occupy (the sample's ``compute_units``; N/A when the virtual engine does not say), where
the release's ``amdsmi_proc_info_t`` has the field (6.4.2+; the wrapper's layout decides).

As libamd_smi does (ROCm/amdsmi ``src/amd_smi/amd_smi.cc``, amdsmi_get_gpu_process_list): the
list comes from KFD, each process's name, engine time and GTT/CPU memory from its ``/proc``
fdinfo; a process whose ``/proc`` entry cannot be read (another user's, to an unprivileged
caller: :attr:`FakeAmdSmiLibrary.unreadable_pids`) keeps only its PID, VRAM and CU occupancy,
with an empty name, and the call fills the whole list and then answers NO_PERM (OUT_OF_RESOURCES
takes precedence when the list did not fit).
"""

from __future__ import annotations

from typing import Any

from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.api_memory import GTT_PER_PROCESS_BYTES
from agent.virtual.fake_amdsmi.device import AmdDevice
from agent.virtual.fake_amdsmi.arguments import Fail, is_null, out_struct, put, target
from agent.virtual.fake_nvml.symbols import c_function


class ProcessFunctions:
    """Mixin of :class:`~agent.virtual.fake_amdsmi.library.FakeAmdSmiLibrary`: uses its state and helpers."""

    @c_function("amdsmi_get_gpu_process_list", handle=True)
    def _c_process_list(self, dev: AmdDevice, max_processes: Any, out: Any) -> int | None:
        """``*max_processes``: room in ``out`` on entry, processes on exit; too little room: OUT_OF_RESOURCES."""
        room = out_struct(max_processes)
        self._fresh(dev)
        s = self._sample(dev)
        procs = s.processes or ()
        entries = target(out)
        if is_null(entries):
            room.value = len(procs)
            return None
        capacity = min(room.value, len(entries)) if hasattr(entries, "__len__") else room.value
        unreadable = False
        for i, p in enumerate(procs[:capacity]):
            e = entries[i]
            hidden = p.pid in self.unreadable_pids
            unreadable = unreadable or hidden
            put(e, "name", "" if hidden else p.name or "")  # 32 bytes until amdsmi 6.4, 256 after
            e.pid = p.pid
            e.mem = p.used_memory_bytes or 0
            e.engine_usage.gfx = 0 if hidden else int(dev.process_gfx_ns.get(p.pid, 0.0))
            e.engine_usage.enc = 0
            e.memory_usage.gtt_mem = 0 if hidden else GTT_PER_PROCESS_BYTES
            e.memory_usage.cpu_mem = 0 if hidden else p.rss_bytes or 0
            e.memory_usage.vram_mem = p.used_memory_bytes or 0
            put(e, "container_name", "")
            cus = getattr(p, "compute_units", None)
            put(e, "cu_occupancy", codes.UINT32_MAX if cus is None else cus)  # amdsmi 6.4.2+
        written = min(capacity, len(procs))
        room.value = written if written == len(procs) else len(procs)
        if written < len(procs):
            return codes.STATUS_OUT_OF_RESOURCES
        return codes.STATUS_NO_PERM if unreadable else None

    @c_function("amdsmi_get_gpu_total_ecc_count", handle=True)
    def _c_total_ecc(self, dev: AmdDevice, out: Any) -> None:
        """Errors of the whole socket (the HBM is shared); a count the engine does not model is 0."""
        counts = out_struct(out)
        self._fresh(dev)
        samples = [d.latest for d in self._socket_of(dev).devices if d.latest is not None]
        if not samples:
            raise Fail(codes.STATUS_API_FAILED)
        counts.correctable_count = sum(s.ecc_corrected_errors or 0 for s in samples)
        counts.uncorrectable_count = sum(s.ecc_uncorrected_errors or 0 for s in samples)
        counts.deferred_count = 0
