"""The AMD half of ``roofwatch doctor``: device files, ROCm and amdsmi versions, partitions and
what each device can be read for, from the AMD backend's own probe.

The amdsmi package a node has decides part of what can be read (docs/amd.md, "Versions"): the
backend finds once which functions it lacks (:mod:`agent.backends.amd.bindings`) and each device
which fields its metrics table lacks; both are reported here with what they cost."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable

from agent.backends.amd.bindings import MINIMUM, NEWEST_TESTED
from agent.backends.exporter_reader import listed
from agent.diagnostics.amd_exporter import match_findings, partition_findings, skipped_findings
from agent.diagnostics.findings import Finding, package_version
from agent.diagnostics.spec_advice import spec_finding

AMD_CAPABILITY_IMPACT: dict[str, tuple[str, str, str]] = {
    "gr_active": ("fail", "roofwatch_gpu_engine_active_ratio and every workload class (the GPU reads unknown)",
                  "amdsmi computes activity from the gpu_metrics table only: check /dev/kfd and /dev/dri access "
                  "and the GPU firmware; a compute partition's own activity needs amdsmi 6.3+"),
    "power": ("warn", "roofwatch_gpu_power_watts; the power proxy that separates compute- from latency-bound "
              "(AMD has no tensor counter)", "socket power comes from the gpu_metrics table: it needs MI200 or "
              "newer firmware and partition 0"),
    "energy": ("warn", "roofwatch_gpu_energy_joules_total and energy recording rules", "update the GPU firmware / ROCm"),
    "pcie": ("info", "roofwatch_gpu_pcie_bandwidth_bytes_per_second and roofwatch_gpu_pcie_replays_total",
             "needs the PCIe fields of the gpu_metrics table (v1.4+, MI300)"),
    "clock_event_reasons": ("warn", "roofwatch_gpu_clock_event_active and the throttled flag",
                            "needs the gpu_metrics residency counters (MI300, amdsmi 6.3+)"),
    "processes": ("warn", "roofwatch_gpu_processes, per-process VRAM and compute units",
                  "run with the host PID namespace and read access to /sys/kernel/debug (KFD process list)"),
    "ecc": ("info", "ECC error counters (the ECC alert)", "RAS is disabled or unsupported on this GPU"),
}
AMD_EXPECTED = ("gr_active", "power", "energy", "pcie", "clock_event_reasons", "processes", "ecc")
PRIMARY_ONLY = ("power", "energy", "pcie")


def check_amd_device_nodes(root: Path = Path("/"), *, required: bool = True) -> list[Finding]:
    """/dev/kfd (compute) and /dev/dri/renderD* (per GPU): present and readable by this user?

    ``required`` is False when AMD is only one of the vendors ``auto`` tries: then a missing
    /dev/kfd is information, not a failure.
    """
    dev = root / "dev"
    kfd = dev / "kfd"
    render = sorted(p.name for p in (dev / "dri").glob("renderD*")) if (dev / "dri").is_dir() else []
    if not kfd.exists():
        status = "fail" if required else "info"
        return [Finding("AMD device files", status, "/dev/kfd is missing (no amdgpu driver, or not passed to the "
                        "container)", "every AMD metric" if required else "",
                        "load the amdgpu driver (modprobe amdgpu); in a container pass --device /dev/kfd "
                        "--device /dev/dri, or request amd.com/gpu in Kubernetes" if required else "")]
    unreadable = [str(p.relative_to(root)) for p in [kfd, *((dev / "dri" / n) for n in render)]
                  if not os.access(p, os.R_OK | os.W_OK)]
    detail = f"/dev/kfd and {len(render)} render node(s) ({', '.join(render) or 'none'})"
    if unreadable:
        return [Finding("AMD device files", "fail", detail + f"; no read/write access to {', '.join(unreadable)}",
                        "those GPUs", "add the agent's user to the video and render groups (or run as root)")]
    return [Finding("AMD device files", "ok", detail)]


def amd_findings(backend: Any) -> tuple[list[Finding], int]:
    """Library, driver and ROCm versions, partitions and every capability, from a discovered AmdBackend."""
    bindings = backend.bindings
    rocm = f", ROCm {backend.rocm_version}" if backend.rocm_version else ""
    out = [Finding("AMD driver", "ok", f"amdgpu {backend.driver_version or 'unknown'}, libamd_smi "
                                      f"{backend.library_version or 'unknown'}{rocm}"
                                      f", amdsmi package {bindings.package or package_version('amdsmi') or 'unknown'}"),
           amdsmi_package_finding(bindings)]
    if not backend.rocm_version:  # not an ok: said as what it is, with why, and why it does not matter much
        out.append(Finding("ROCm version", "info", f"unknown ({getattr(backend, 'rocm_version_note', None) or 'not read'}); "
                           "roofwatch needs only libamd_smi, whose version is above; the amdsmi package must come "
                           "from the same ROCm release (docs/amd.md)"))
    devices = backend.devices
    modes_seen: set[str] = set()
    models_advised: set[str] = set()
    for gpu, device in devices.items():
        info = device.info
        spec = info.spec.key if info.spec else "unknown"
        where = f", partition {device.partition} of {device.partitions} ({info.partition})" if device.partitions > 1 else ""
        out.append(Finding("GPU", "info", f"{info.model} ({info.uuid}), {info.pci_bus_id}, spec {spec}{where}", gpu=gpu))
        advice = spec_finding(info.model, info.spec, gpu, models_advised)
        if advice is not None:
            out.append(advice)
        if info.partition and info.partition not in modes_seen:
            modes_seen.add(info.partition)
            out.append(Finding("partitions", "info", f"compute/memory partition mode {info.partition}: each partition "
                               "is a device held to its share of the GPU's peaks; socket power, energy, PCIe and "
                               "XGMI are read on partition 0 only", gpu=gpu.split("/")[0]))
        out.extend(_capability_findings(device))
    if hasattr(backend, "unmatched"):  # joined with the Device Metrics Exporter
        out.extend(exporter_join_findings(backend))
        return out, len(devices)
    out.append(Finding("tensor activity", "info", "amdsmi has no tensor-pipe, SM-occupancy or FP-pipe counter: "
                       "counter MFU is unavailable (MFU needs workload reports), and compute- vs latency-bound "
                       "rests on power with lower confidence",
                       "roofwatch_gpu_tensor_active_ratio, counter MFU", "report tokens/s and FLOPs per token from "
                       "the job (agent.client) to get MFU"))
    return out, len(devices)


def amdsmi_package_finding(bindings: Any) -> Finding:
    """Whether this amdsmi release is one roofwatch is tested with, and what the functions it lacks cost."""
    version = bindings.version
    tested = f"{'.'.join(map(str, MINIMUM))} to {'.'.join(map(str, NEWEST_TESTED))}"
    lacking = "; ".join(f"no {name}: {note}" for name, note in bindings.notes.items())
    fix = ("install the amdsmi wrapper of your ROCm (pip install /opt/rocm/share/amd_smi); a newer ROCm's "
           "wrapper has these functions")
    if version is not None and version[:2] < MINIMUM:
        return Finding("amdsmi package", "warn", f"amdsmi {bindings.package} is older than any tested ({tested})"
                       + (f"; {lacking}" if lacking else ""), "readings this release lacks are unknown",
                       f"upgrade ROCm to {'.'.join(map(str, MINIMUM))} or newer and {fix}")
    if lacking:
        return Finding("amdsmi package", "info", f"amdsmi {bindings.package or '(unknown version)'}: {lacking}",
                       "the readings named are unknown or taken another way", fix)
    if version is None:
        return Finding("amdsmi package", "info", f"amdsmi version unknown (tested: {tested}); every function "
                       "roofwatch uses is present")
    newer = " (newer than any tested)" if version[:2] > NEWEST_TESTED else ""
    return Finding("amdsmi package", "ok", f"amdsmi {bindings.package}{newer}: every function roofwatch uses is present")


def _capability_findings(device: Any) -> Iterable[Finding]:
    caps = set(device.info.capabilities)
    for cap in AMD_EXPECTED:
        if cap in caps or (not device.primary and cap in PRIMARY_ONLY):
            continue
        status, impact, fix = AMD_CAPABILITY_IMPACT[cap]
        absent = device.absent
        own = absent.get(cap)  # the capability's own reason (a table field this amdsmi lacks), else every one
        reasons = own or "; ".join(f"{k} {r}" for k, r in absent.items())
        yield Finding(cap, status, f"unavailable{': ' + reasons if reasons else ''}", impact, fix, gpu=device.gpu)


JOIN = "amd-exporter join"


def exporter_join_findings(backend: Any, now: float | None = None) -> list[Finding]:
    """amdsmi joined with the Device Metrics Exporter (agent.backends.amd_exporter.join): is it answering,
    how devices were matched, which exporter devices matched none, and per device where its fields came from."""
    now = time.time() if now is None else now
    status = backend.reader.status()
    if not status.up:
        return [Finding(JOIN, "fail", f"{status.url}: {status.error}", "tensor (MFMA), VALU and HBM counters",
                        "check that the Device Metrics Exporter runs on this node and that amd_exporter_url reaches it")]
    out = [Finding(JOIN, "ok", f"{status.url}: {len(status.gpus)} GPU(s) or partition(s) listed")]
    out.extend(skipped_findings(backend.reader))
    for gpu in backend.devices:
        try:
            backend.sample(gpu, now)
        except Exception as exc:  # noqa: BLE001 - the amdsmi findings already name a device that cannot be read
            out.append(Finding("counter source", "info", f"no sample to join: {exc}", gpu=gpu))
            continue
        by_source: dict[str, list[str]] = {}
        for name, source in sorted(backend.counter_sources(gpu).items()):
            by_source.setdefault(source, []).append(name)
        out.append(Finding("counter source", "info", "; ".join(f"{source}: {', '.join(names)}" for source, names
                                                               in sorted(by_source.items())) or "no sample yet", gpu=gpu))
        state = backend.join_state(gpu)
        if state is not None and state.problem is not None:
            out.append(Finding(JOIN, "warn", state.problem, "the exporter's profiler counters for this device",
                               "the exporter must run on this node and list the device with the board serial "
                               "amdsmi reports (serial_number, gpu_partition_id)", gpu=gpu))
    out.extend(match_findings(backend))
    out.extend(partition_findings(backend.reader.records()))  # DME issue #495: partitions it does not list
    unmatched = backend.unmatched()
    if unmatched:
        out.append(Finding(JOIN, "warn", f"{len(unmatched)} exporter device(s) match no amdsmi device: "
                           f"{listed(unmatched, 8)}", "their profiler counters are not used",
                           "check that amd_exporter_url is this node's own exporter"))
    return out
