"""``roofwatch doctor``: can this node be watched fully, and if not, what is missing and how to fix it.

Every check yields a finding (agent.diagnostics.findings) with a status, what was seen, what it
costs (which metrics and which workload classes become unavailable) and the fix. The exit status
sums it up: 0 everything works, 3 the agent works with pieces missing, 1 no GPU can be read at all.

Checks run through the same backend code the agent runs (the NVML backend's own probe), so
doctor reports what the agent will actually be able to read, not what a separate test thinks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from agent.diagnostics.amd import amd_findings, check_amd_device_nodes
from agent.diagnostics.amd_exporter import standalone_findings as amd_exporter_findings
from agent.diagnostics.dcgm import dcgm_findings
from agent.diagnostics.dcgm_exporter import findings as dcgm_exporter_findings
from agent.diagnostics.dcgm_exporter import standalone_findings
from agent.diagnostics.findings import Finding, Report, package_version
from agent.diagnostics.inference import inference_findings
from agent.diagnostics.nvidia import check_device_nodes, nvml_findings
from agent.diagnostics.otlp import otlp_findings
from agent.diagnostics.physical_bounds import bounds_findings
from agent.diagnostics.verdict_basis import basis_findings


def run_doctor(settings: Any, *, root: Path = Path("/"), environ: dict[str, str] | None = None) -> Report:
    """Check the backend ``settings`` select (auto: NVML, then AMD) and the host around it."""
    from agent.backends.base import BackendUnavailable
    from agent.backends.exporter_backend import ExporterNotAnswering
    from agent.backends.options import BackendOptions
    from agent.backends.registry import OPENERS, install_spec_overrides

    options = BackendOptions.of(settings)  # the backends' part of the settings, as the agent hands it down
    install_spec_overrides(options.specs)  # the config's specs: entries, as the agent would resolve them
    report = Report()
    report.add(Finding("roofwatch", "info", f"python {sys.version.split()[0]}, "
                                            f"nvidia-ml-py {package_version('nvidia-ml-py') or 'not installed'}, "
                                            f"amdsmi {package_version('amdsmi') or 'not installed'}"))
    wanted = settings.backend
    if wanted in ("auto", "nvml"):
        report.add(*check_device_nodes(root, environ))
    if wanted in ("auto", "amd"):
        report.add(*check_amd_device_nodes(root, required=wanted == "amd"))
    names = ("nvml", "amd") if wanted == "auto" else (wanted,)
    for name in names:
        try:
            backend = OPENERS[name](options)
        except ExporterNotAnswering as exc:  # a neighbour that may only be late: what `run` does meanwhile
            report.add(Finding(f"{name} backend", "fail", f"waiting for {exc.what}: {exc.why}; `roofwatch run` "
                               "serves meanwhile (/readyz 503 naming it) and reads the GPUs once it answers",
                               "every metric from this vendor", _UNAVAILABLE_FIX.get(name, "")))
            continue
        except BackendUnavailable as exc:
            report.add(Finding(f"{name} backend", "fail" if wanted != "auto" or name == "nvml" else "info", str(exc),
                               "every metric from this vendor", _UNAVAILABLE_FIX.get(name, "")))
            continue
        try:
            try:
                devices = backend.discover()
            except BackendUnavailable as exc:
                report.add(Finding(f"{name} backend", "fail", str(exc), "every metric from this vendor"))
                continue
            if getattr(backend, "name", None) == "dcgm-exporter":
                findings, gpus = standalone_findings(backend)
            elif getattr(backend, "name", None) == "amd-exporter":  # boards and partitions as DME lists them
                findings, gpus = amd_exporter_findings(backend)
            elif hasattr(backend, "devices") and hasattr(backend, "nvml"):
                findings, gpus = nvml_findings(backend)
                findings.extend(dcgm_exporter_findings(backend))  # where NVML's samples are joined to it
                findings += dcgm_findings(backend, settings)
            elif hasattr(backend, "devices") and hasattr(backend, "amdsmi"):
                findings, gpus = amd_findings(backend)
            else:
                findings, gpus = [Finding(f"{name} backend", "ok", f"{len(devices)} GPU(s)")], len(devices)
            profiler_state = getattr(backend, "profiler_state", None)
            if profiler_state is not None:  # the AMD Device Metrics Exporter (docs/amd.md)
                state = profiler_state()
                findings.append(Finding("amd-exporter profiler", "ok" if state.startswith("profiler metrics present")
                                        and "too short" not in state else "warn", state,
                                        "" if state.startswith("profiler metrics present") else
                                        "no tensor (MFMA) or HBM counter: compute vs memory rests on power and UMC "
                                        "activity, no counter MFU"))
            report.add(*findings)
            report.add(*basis_findings(backend, devices))
            report.add(*bounds_findings(backend, devices))
            report.gpus += gpus
        finally:
            backend.close()
        if report.gpus:
            break
    report.add(*inference_findings(settings))
    report.add(*otlp_findings(settings))
    if report.gpus == 0:
        report.add(Finding("summary", "info", "no GPU telemetry here. To try roofwatch without a GPU, run "
                                              "`roofwatch demo`."))
    return report


_UNAVAILABLE_FIX = {
    "nvml": "install the NVIDIA driver (it provides libnvidia-ml.so.1); in a container use the NVIDIA container toolkit",
    "dcgm-exporter": "run dcgm-exporter on this node (the GPU Operator does) and set dcgm_exporter_url to its "
                     "/metrics (docs/nvidia.md)",
    "amd-exporter": "run AMD's Device Metrics Exporter on this node and set amd_exporter_url to its /metrics "
                    "(docs/amd.md)",
    "amd": "install ROCm (package amd-smi-lib) and the amdsmi wrapper of the same version "
           "(pip install /opt/rocm/share/amd_smi); see docs/amd.md",
}
