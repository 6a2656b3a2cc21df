"""The NVIDIA half of ``roofwatch doctor``: device files and container setup, the nvidia-ml-py release's
gaps, and what each GPU can be read for, from the NVML backend's own probe (so doctor reports what the
agent will actually read)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from agent.backends.nvml.bindings import UPGRADE
from agent.backends.nvml.gpm_totals import DISAGREE, TOLERANCE
from agent.diagnostics.findings import Finding, package_version
from agent.diagnostics.spec_advice import spec_finding

# What each NVML capability feeds, and how to get it back. Keys are DeviceInfo.capabilities names.
CAPABILITY_IMPACT: dict[str, tuple[str, str, str]] = {
    "gpm": ("warn", "SM activity, SM occupancy, tensor-pipe and FP-pipe activity, DRAM bandwidth utilisation "
            "(GPM); counter MFU and achieved FLOP/s; compute_bound / latency_bound fall back to a power "
            "proxy with lower confidence",
            "GPM needs a Hopper or newer GPU and driver R520+; on older GPUs roofwatch reads DCGM's profiling "
            "fields (dcgm: auto, a running nv-hostengine) or a co-located dcgm-exporter (dcgm_exporter_url): "
            "docs/nvidia.md, Pre-Hopper GPUs"),
    "gr_active": ("fail", "roofwatch_gpu_engine_active_ratio and every workload class (all GPUs read unknown)",
                  "give the agent access to the GPU (see the permission findings)"),
    "dram_active": ("warn", "roofwatch_gpu_dram_active_ratio (share of peak bandwidth), MBU from counters; memory_bound "
                    "rests on utilization.memory (busy time, weaker evidence) with lower confidence",
                    "needs GPM (Hopper+); before Hopper, DCGM profiling (dcgm_host) or a co-located dcgm-exporter "
                    "(dcgm_exporter_url): docs/nvidia.md, Pre-Hopper GPUs"),
    "power": ("warn", "roofwatch_gpu_power_watts; the power proxy for GPUs without tensor counters",
              "power is not exposed for MIG instances or some virtual GPUs; nothing to fix on bare metal"),
    "energy": ("warn", "roofwatch_gpu_energy_joules_total and energy recording rules", "needs Volta or newer"),
    "pcie": ("info", "roofwatch_gpu_pcie_bytes_total (host transfers behind input_starved)",
             "PCIe byte counters need driver 555+ (or GPM on Hopper+)"),
    "nvlink": ("info", "roofwatch_gpu_link_bytes_total; the communication signal of communication_jittered is weaker",
               "normal on PCIe cards without NVLink bridges"),
    "clock_event_reasons": ("warn", "roofwatch_gpu_clock_event_active and the throttled flag",
                            "update the driver (clocks-event reasons need R535+, throttle reasons older)"),
    "processes": ("warn", "roofwatch_gpu_processes and per-process memory; the dataloader sub-reason of input_starved",
                  "run with the host PID namespace (hostPID: true, --pid=host) so the driver's PIDs are visible"),
    "process_utilization": ("info", "per-process SM utilisation", "not available on MIG instances or without permission"),
    "ecc": ("info", "ECC error counters (the ECC alert)", "ECC is off or unsupported on this GPU (nvidia-smi -e 1, then reset)"),
    "remapped_rows": ("info", "row-remapping state (the row-remap alert)", "row remapping exists on Ampere and newer data-centre GPUs"),
}


EXPECTED = ("gpm", "gr_active", "dram_active", "power", "energy", "pcie", "clock_event_reasons", "processes", "ecc",
            "remapped_rows")
"""Capabilities a fully usable data-centre GPU offers; MIG instances are judged without the whole-GPU ones."""


WHOLE_GPU_ONLY = ("power", "energy", "pcie", "process_utilization", "ecc", "remapped_rows", "nvlink")


def check_device_nodes(root: Path = Path("/"), environ: dict[str, str] | None = None) -> list[Finding]:
    """Are the NVIDIA device files there (containers need them passed in)?"""
    env = os.environ if environ is None else environ
    dev = root / "dev"
    nodes = sorted(p.name for p in dev.glob("nvidia[0-9]*")) if dev.is_dir() else []
    in_container = (root / ".dockerenv").exists() or (root / "run/.containerenv").exists() or \
        "KUBERNETES_SERVICE_HOST" in env
    visible = env.get("NVIDIA_VISIBLE_DEVICES") or env.get("CUDA_VISIBLE_DEVICES")
    found: list[Finding] = []
    where = "in a container" if in_container else "on the host"
    if not (dev / "nvidiactl").exists():
        fix = ("run the container with the NVIDIA container toolkit (--gpus all, or a nvidia.com/gpu "
               "resource / runtimeClassName: nvidia in Kubernetes)" if in_container
               else "install the NVIDIA driver and load it (nvidia-smi should list the GPUs)")
        found.append(Finding("device files", "fail", f"/dev/nvidiactl is missing ({where})",
                             "every NVIDIA metric", fix))
    else:
        unreadable = [n for n in nodes if not os.access(dev / n, os.R_OK | os.W_OK)]
        detail = f"{len(nodes)} GPU device file(s) ({', '.join(nodes) or 'none'}) {where}"
        if visible:
            detail += f"; visible devices: {visible}"
        if unreadable:
            found.append(Finding("device files", "fail", detail + f"; no read/write access to {', '.join(unreadable)}",
                                 "those GPUs", "run as root or a member of the group owning /dev/nvidia*"))
        else:
            found.append(Finding("device files", "ok", detail))
    return found


def nvml_findings(backend: Any) -> tuple[list[Finding], int]:
    """Driver, bindings, per-GPU persistence, GPM and every capability, from a discovered NvmlBackend."""
    nvml, module = backend.nvml, backend.module
    bindings = getattr(backend, "bindings", None)
    release = (bindings.version if bindings is not None else None) or package_version("nvidia-ml-py") or "(copy)"
    out = [Finding("NVIDIA driver", "ok", f"driver {backend.driver_version}, NVML {backend.nvml_version}, "
                                         f"nvidia-ml-py {release}")]
    out.extend(binding_findings(bindings, release))
    devices = backend.devices
    parents_seen: set[str] = set()
    models_advised: set[str] = set()
    for gpu, device in devices.items():
        info = device.info
        if device.handles.handle is None:  # listed at start without a handle (discovery.lost_at_start)
            out.append(Finding("GPU", "fail", "NVML counts this GPU but cannot hand it out (GPU is lost)",
                               "every metric of this GPU; the agent reports it down and keeps looking for it",
                               "check dmesg for XID 79 (fell off the bus) or 'requires reset'; reset it "
                               "(nvidia-smi -r -i INDEX) or reboot, after draining the node", gpu=gpu))
            continue
        out.append(Finding("GPU", "info", f"{info.model} ({info.uuid}), spec "
                                          f"{info.spec.key if info.spec else 'unknown'}", gpu=gpu))
        advice = spec_finding(info.model, info.spec, gpu, models_advised)
        if advice is not None:
            out.append(advice)
        parent_key = gpu.split("/")[0]
        if parent_key not in parents_seen:
            parents_seen.add(parent_key)
            if "parent_memory" in device.absent:
                out.append(Finding("MIG", "info", f"whole-GPU memory: {device.absent['parent_memory']}",
                                   fix="nothing needed; run the agent as root to read it", gpu=parent_key))
            handle = device.handles.parent if device.is_mig else device.handles.handle
            try:
                persistence = nvml.nvmlDeviceGetPersistenceMode(handle)
            except module.NVMLError:
                persistence = None
            if persistence == 0:
                out.append(Finding("persistence mode", "warn", "off: the driver re-initialises the GPU whenever no "
                                   "client holds it, which stalls NVML calls", "nothing, but reads can take "
                                   "tens of milliseconds", "enable nvidia-persistenced (or nvidia-smi -pm 1)",
                                   gpu=parent_key))
            elif persistence == 1:
                out.append(Finding("persistence mode", "ok", "on", gpu=parent_key))
        out.extend(_capability_findings(device))
    events = backend.events
    if events is not None and events.unavailable:
        out.append(Finding("XID events", "warn", f"cannot watch events: {events.unavailable}",
                           "roofwatch_gpu_xid_errors_total", "needs driver access to /dev/nvidiactl"))
    return out, len(devices)


def binding_findings(bindings: Any, release: str) -> list[Finding]:
    """What this nvidia-ml-py release lacks and what the agent does instead (agent.backends.nvml.bindings)."""
    if bindings is None:
        return []
    lost = bindings.lost
    out = []
    for name, what in bindings.missing.items():
        status = "warn" if name in lost else "info"
        out.append(Finding("nvidia-ml-py", status, f"{release} has no {name}: {what}",
                           what if name in lost else "", "" if name in bindings.harmless else UPGRADE))
    return out


def _field_findings(device: Any) -> Iterable[Finding]:
    """Field values switched off at the probe (unsupported, or an id this driver does not know). On a
    MIG instance the unsupported ones are the whole-GPU fields the MIG line already names."""
    off = {k.removeprefix("field:"): why for k, why in device.absent.items()
           if k.startswith("field:") and not (device.is_mig and why == "not supported")}
    if off:
        listed = "; ".join(f"{key} ({why})" for key, why in sorted(off.items()))
        yield Finding("field values", "info", f"not read: {listed}", gpu=device.gpu)


def _capability_findings(device: Any) -> Iterable[Finding]:
    yield from _field_findings(device)
    caps = set(device.info.capabilities)
    gpu = device.gpu
    gpm_reason = device.absent.get("gpm")
    if "gpm" in caps:
        yield Finding("GPM", "ok", "supported (two-sample read succeeded)", gpu=gpu)
        yield from _totals_findings(device)
    else:
        status, impact, fix = CAPABILITY_IMPACT["gpm"]
        if gpm_reason and "permission" in gpm_reason:
            fix = ("profiling counters are restricted to admins: set the nvidia module option "
                   "NVreg_RestrictProfilingToAdminUsers=0, or run the agent as root")
        yield Finding("GPM", status, f"unavailable: {gpm_reason or 'unknown reason'}", impact, fix, gpu=gpu)
    for cap in EXPECTED[1:]:
        if cap in caps or (device.is_mig and cap in WHOLE_GPU_ONLY):
            continue
        status, impact, fix = CAPABILITY_IMPACT[cap]
        reason = _reason(device, cap)
        yield Finding(cap, status, f"unavailable{': ' + reason if reason else ''}", impact, fix, gpu=gpu)
    if device.is_mig:
        yield Finding("MIG", "info", "a MIG instance: power, temperature, PCIe and NVLink are whole-GPU readings NVML "
                      "does not split per instance; its energy is an estimate, its share of the board's counter by "
                      "activity and compute slices (docs/attribution.md, MIG instances)", gpu=gpu)
        refused = device.absent.get("parent_energy")
        if refused:
            yield Finding("MIG energy", "warn", f"the board's energy counter is unreadable: {refused}",
                          "this instance has no roofwatch_gpu_energy_joules_total: its pods' energy bills count 0 kWh",
                          "needs Volta or newer and a driver that gives nvmlDeviceGetTotalEnergyConsumption on the "
                          "parent GPU's handle", gpu=gpu)


def _totals_findings(device: Any) -> Iterable[Finding]:
    """Which activity a GPM GPU's verdicts read: GPM's cumulative metrics 248-260 as Δactive / Δelapsed, or the
    sampled ratios, and why (agent.backends.nvml.gpm_totals). The ``activity`` line (as DCGM's) where the totals
    are used or the self-check switched them off; a ``GPM totals`` line where the driver refused them or no window
    has been read yet (doctor's own probe reads one baseline). Nothing where this nvidia-ml-py defines none of the
    ids (before 13.615): the ratios, as always."""
    totals = getattr(device, "gpm_totals", None)
    if totals is None:
        return
    state = totals.state()
    gpu = device.gpu
    if state.off == DISAGREE:
        yield Finding("activity", "warn", f"{DISAGREE}; GPM's sampled ratios are used",
                      "none: the ratios over the same samples stand in",
                      "report the driver version: its cumulative GPM metrics do not count as DCGM 4.6 reads them",
                      gpu=gpu)
    elif state.off is not None:
        yield Finding("GPM totals", "info", f"sampled ratios from GPM: its cumulative metrics (ids 248-260) were "
                      f"{state.off}; not asked for again", gpu=gpu)
    elif state.used:
        seen = f"; latest window {state.window_cycles:.3g} SM cycles" if state.window_cycles else ""
        if state.restarts:
            seen += f", {state.restarts} reading(s) where counters went back (restart or reset: that window dropped)"
        yield Finding("activity", "info", f"cumulative counters: {', '.join(state.used)} as Δactive / Δelapsed over "
                      f"the agent's own window (NVML GPM ids 248-260 over the ratios' two samples, each within "
                      f"{TOLERANCE:g} of GPM's ratio), preferred to the sampled ratios{seen}", gpu=gpu)
    else:
        yield Finding("GPM totals", "info", "sampled ratios from GPM so far: its cumulative metrics (ids 248-260) are "
                      f"read and used from their second window on, where they agree with the ratios within "
                      f"{TOLERANCE:g}", gpu=gpu)


_REASON_KEYS = {
    "gr_active": ("utilization",), "dram_active": ("gpm", "gpm:dram_active"),
    "power": ("field:power_instant_mw", "power_usage"), "energy": ("field:energy_mj", "energy"),
    "pcie": ("field:pcie_tx_bytes",), "clock_event_reasons": ("clock_event_reasons", "clock_throttle_reasons"),
    "processes": ("processes", "processes_v2"), "ecc": ("field:ecc_dbe_volatile",), "remapped_rows": ("field:remapped_failure",),
}


def _reason(device: Any, cap: str) -> str:
    reasons = [f"{k} {device.absent[k]}" for k in _REASON_KEYS.get(cap, ()) if k in device.absent]
    return "; ".join(reasons)
