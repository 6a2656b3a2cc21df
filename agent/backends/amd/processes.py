"""One device's process list through amdsmi, kept when libamd_smi answers NO_PERM after filling it.

libamd_smi's ``amdsmi_get_gpu_process_list`` (ROCm/amdsmi ``src/amd_smi/amd_smi.cc``, 6.2 to 7.0) takes the
processes from KFD, then each one's name, engine time and GTT/CPU memory from its ``/proc`` fdinfo. When it could
not read one (another user's process, to an agent that is not root: the shipped image runs unprivileged), it still
fills the whole list, that entry with its PID, VRAM and CU occupancy and an empty name, and answers
``AMDSMI_STATUS_NO_PERM``. The Python wrapper of every release raises on any status but success, so the list is
lost, and the error policy would switch processes off for good: one foreign process on one GPU, and the node's
holders and their shares were gone until restart.

So the backend makes the wrapper's one C call itself, through the package's own ctypes binding
(``amdsmi_wrapper.amdsmi_get_gpu_process_list`` with the release's own ``amdsmi_proc_info_t`` and the wrapper's
room of 1024), and reads the entries as the wrapper does: name ("N/A" when empty), ``pid``, ``mem``,
``memory_usage``, and ``cu_occupancy`` where the release's structure has it (6.4.2+), all ones as "N/A" (the
wrapper's ``_validate_if_max_uint``). Success, or NO_PERM with entries written, is the list; any other status, or
a NO_PERM that wrote no entry (the whole call refused), raises the wrapper's own exception for the error policy
(NO_PERM: processes off for good, as before). A package without that binding is asked through the wrapper.
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.backends.amd.errors import NO_PERM, SUCCESS, code_of

MAX_PROCESSES = 1024
"""The room the wrapper of every release gives the call (``amdsmi_interface.MAX_NUM_PROCESSES``)."""
UINT32_MAX = 0xFFFFFFFF


def process_list(amdsmi: Any, handle: Any) -> list[dict[str, Any]]:
    """``amdsmi_get_gpu_process_list(handle)`` as the wrapper returns it, except that a NO_PERM after a filled list
    keeps the list. One C call, as the wrapper makes; a package without the binding is asked through the wrapper."""
    wrapper = getattr(amdsmi, "amdsmi_wrapper", None)
    call = getattr(wrapper, "amdsmi_get_gpu_process_list", None)
    entry = getattr(wrapper, "amdsmi_proc_info_t", None)
    if call is None or entry is None:
        return amdsmi.amdsmi_get_gpu_process_list(handle)
    counted = getattr(amdsmi, "wrap", None)  # the backend's call counter (driver_calls), where it has one
    call = counted(call) if counted is not None else call
    room = ctypes.c_uint32(MAX_PROCESSES)
    entries = (entry * MAX_PROCESSES)()
    status = call(handle, ctypes.byref(room), entries)
    count = min(room.value, MAX_PROCESSES)
    if status == SUCCESS or (status == NO_PERM and count and entries[0].pid):
        return [_entry(entries[i]) for i in range(count)]
    _raise(amdsmi, status)  # as the wrapper would: NO_PERM with nothing written is the whole call refused
    return []


def _raise(amdsmi: Any, status: int) -> None:
    """The wrapper's own exception for ``status`` (its ``_check_res``: RETRY and TIMEOUT have subclasses)."""
    check = getattr(getattr(amdsmi, "amdsmi_interface", None), "_check_res", None)
    if check is not None:
        check(status)
    raise amdsmi.AmdSmiLibraryException(status)


def _entry(e: Any) -> dict[str, Any]:
    name = bytes(e.name).split(b"\0", 1)[0].decode("utf-8", errors="replace").strip()
    out: dict[str, Any] = {
        "name": name or "N/A", "pid": e.pid, "mem": e.mem,
        "memory_usage": {"gtt_mem": e.memory_usage.gtt_mem, "cpu_mem": e.memory_usage.cpu_mem,
                         "vram_mem": e.memory_usage.vram_mem},
    }
    if any(field[0] == "cu_occupancy" for field in type(e)._fields_):
        out["cu_occupancy"] = "N/A" if e.cu_occupancy == UINT32_MAX else e.cu_occupancy
    return out
