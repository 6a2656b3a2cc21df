"""Open the backend a user asked for, or find one with ``auto``.

Vendor libraries are imported lazily here and nowhere else, so ``roofwatch demo`` works on a
machine with no GPU stack, and a broken vendor install produces one clear message instead of
an import traceback.

Every opener takes a :class:`~agent.backends.options.BackendOptions`, the backends' part of the
settings that the app builds and hands down (this layer does not import the app).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from agent.backends.base import Backend, BackendUnavailable
from agent.backends.options import BackendOptions

if TYPE_CHECKING:
    from agent.context.attribution.kubelet import PodResourcesCache
    from agent.context.local_host import LocalHost
    from agent.context.sources import WorkloadSource

DEMO_HINT = "To try roofwatch without a GPU, run `roofwatch demo` (a simulated 8-GPU H100 node)."


VIRTUAL_HEAD_START_S = 60.0
"""How long the virtual scenario has been running when the agent starts."""


def open_virtual(settings: BackendOptions, reports: WorkloadSource | None = None) -> Backend:
    from agent.virtual.backend import VirtualBackend
    from agent.virtual.scenario import ScenarioError, resolve_scenario

    try:
        scenario = resolve_scenario(settings.scenario)
    except ScenarioError as exc:
        raise BackendUnavailable(f"virtual backend: {exc}") from None
    # The scenario started VIRTUAL_HEAD_START_S ago: the first sample already shows the workloads,
    # and the classifier can be primed with that minute (VirtualBackend.warm_samples).
    backend = VirtualBackend(
        scenario, node=settings.virtual_node, interval_s=settings.interval_s,
        start_time=time.time() - settings.interval_s - VIRTUAL_HEAD_START_S,
    )
    # Serving jobs get fake vLLM/SGLang/TGI endpoints, scraped over HTTP as on a real node.
    from agent.backends.virtual_serving import serve_virtual_endpoints

    try:
        serve_virtual_endpoints(backend, settings)
    except OSError as exc:
        backend.close()
        raise BackendUnavailable(f"virtual backend: cannot start the fake inference servers: {exc}") from None
    return backend


def open_local_host(settings: BackendOptions, reports: WorkloadSource | None = None) -> LocalHost:
    """The real host side, with the sources the settings enable, each started in the background.

    Workload reports the job sends itself (``reports``) win over what an inference server's
    metrics imply. The kubelet cache starts when its socket exists (a Kubernetes node) or when
    the socket was configured explicitly (then a missing socket is logged and retried).
    """
    from agent.context.attribution.kubelet import pod_from_cgroup
    from agent.context.local_host import LocalHost

    workloads: list[WorkloadSource] = [reports] if reports is not None else []
    if settings.inference_endpoints:
        from agent.context.workload.inference.scraper import InferenceScraper

        scraper = InferenceScraper(settings.inference_endpoints, interval_s=settings.inference_interval_s,
                                   timeout_s=settings.inference_timeout_s, models=settings.models)
        scraper.start()
        workloads.append(scraper)
    pods = _kubelet_pods(settings)
    return LocalHost(sysfs_root=settings.sysfs_root, workloads=workloads, pods=pods, pod_from_pid=pod_from_cgroup)


def _kubelet_pods(settings: BackendOptions) -> PodResourcesCache | None:
    """The kubelet pod-resources cache, started, when the socket exists or was configured; else None."""
    from agent.context.attribution.kubelet import PodResourcesCache

    socket_path = settings.kubelet_socket
    if not socket_path or not (Path(socket_path).exists() or "kubelet_socket" in settings.explicit):
        return None
    pods = PodResourcesCache(socket_path, refresh_s=settings.kubelet_refresh_s)
    pods.start()
    return pods


def open_nvml(settings: BackendOptions, reports: WorkloadSource | None = None) -> Backend:
    from agent.backends.nvml import NvmlBackend, load_pynvml

    nvml = load_pynvml()  # fails fast (no driver) before any background source starts
    return with_dcgm(settings, with_dcgm_exporter(settings, NvmlBackend(nvml, node=settings.node_name,
                                                                        host=open_local_host(settings, reports))))


def open_nvml_virtual(settings: BackendOptions, reports: WorkloadSource | None = None) -> Backend:
    """The real NVML backend over the fake driver that plays the virtual scenario."""
    from agent.backends.nvml_virtual import VirtualNvmlBackend

    backend = VirtualNvmlBackend(open_virtual(settings), pods=_kubelet_pods(settings))  # type: ignore[arg-type]
    return with_dcgm(settings, with_dcgm_exporter(settings, backend), virtual=backend.virtual)


def with_dcgm(settings: BackendOptions, backend: Backend, virtual=None) -> Backend:
    """An NVML backend whose GPUs without GPM get DCGM's profiling counters (setting ``dcgm``; docs/nvidia.md).

    ``virtual``: the simulated node of nvml-virtual, whose DCGM is the fake host engine over the fake
    bindings (agent/virtual/fake_dcgm), and only with ``dcgm: on``."""
    from agent.backends.dcgm import dcgm_join

    mode, paths = settings.dcgm, settings.dcgm_bindings_path
    if virtual is None:
        return dcgm_join(backend, mode=mode, host=settings.dcgm_host, paths=paths, interval_s=settings.interval_s)
    if mode != "on":
        return backend
    from agent.backends.dcgm_virtual import virtual_loader
    from agent.virtual.fake_dcgm import BINDINGS_DIR

    if "dcgm_bindings_path" not in settings.explicit:
        paths = (str(BINDINGS_DIR),)
    return dcgm_join(backend, mode=mode, host=settings.dcgm_host, paths=paths, interval_s=settings.interval_s,
                     load=virtual_loader(virtual))


def dcgm_exporter_reader(settings: BackendOptions):
    """The background reader of ``dcgm_exporter_url`` (agent.backends.dcgm_exporter.reader)."""
    from agent.backends.dcgm_exporter import ExporterReader

    assert settings.dcgm_exporter_url is not None
    return ExporterReader(settings.dcgm_exporter_url, interval_s=settings.dcgm_exporter_interval_s,
                          timeout_s=settings.dcgm_exporter_timeout_s, stale_s=settings.dcgm_exporter_stale_s)


def with_dcgm_exporter(settings: BackendOptions, backend: Backend) -> Backend:
    """An NVML backend completed by the node's dcgm-exporter when ``dcgm_exporter_url`` is set."""
    if not settings.dcgm_exporter_url:
        return backend
    from agent.backends.dcgm_exporter import DcgmExporterJoin

    return DcgmExporterJoin(backend, dcgm_exporter_reader(settings))  # type: ignore[return-value]


def open_dcgm_exporter(settings: BackendOptions, reports: WorkloadSource | None = None) -> Backend:
    """The GPUs as the node's dcgm-exporter lists them, with no driver access (docs/nvidia.md)."""
    from agent.backends.dcgm_exporter import DcgmExporterBackend

    if not settings.dcgm_exporter_url:
        raise BackendUnavailable("dcgm-exporter backend: no exporter to read: set dcgm_exporter_url "
                                 "(--dcgm-exporter-url URL, ROOFWATCH_DCGM_EXPORTER_URL)")
    node = settings.node_name if "node_name" in settings.explicit else None
    backend = DcgmExporterBackend(dcgm_exporter_reader(settings), node=node, max_devices=settings.max_devices)
    return with_host_after_first_read(backend, settings, reports)


def with_host_after_first_read(backend, settings: BackendOptions, reports: WorkloadSource | None) -> Backend:
    """An exporter backend read once (fails fast, and names the node after the exporter's host name
    label), then given the node's side: after the first read, so no scraper is left behind on failure."""
    try:
        backend.first_read()
    except BackendUnavailable:
        backend.close()
        raise
    backend.host = open_local_host(settings, reports)
    return backend


def open_amd_exporter(settings: BackendOptions, reports: WorkloadSource | None = None) -> Backend:
    """The GPUs and partitions as the node's AMD Device Metrics Exporter lists them, no amdsmi (docs/amd.md)."""
    from agent.backends.amd_exporter import AmdExporterBackend

    if not settings.amd_exporter_url:
        raise BackendUnavailable("amd-exporter backend: no exporter to read: set amd_exporter_url "
                                 "(--amd-exporter-url URL, ROOFWATCH_AMD_EXPORTER_URL)")
    reader = amd_exporter_reader(settings)
    node = settings.node_name if "node_name" in settings.explicit else None
    backend = AmdExporterBackend(reader, node=node, max_devices=settings.max_devices,
                                 window_us=settings.amd_exporter_profiler_window_us)
    return with_host_after_first_read(backend, settings, reports)


def amd_exporter_reader(settings: BackendOptions, fetch=None):
    """The background reader of ``amd_exporter_url`` (agent.backends.exporter_reader, DME's dialect); ``fetch``
    replaces HTTP (the virtual exporter of amd-virtual answers in process)."""
    from agent.backends.amd_exporter import amd_exporter_reader as reader

    assert settings.amd_exporter_url is not None
    return reader(settings.amd_exporter_url, interval_s=settings.amd_exporter_interval_s,
                  timeout_s=settings.amd_exporter_timeout_s, stale_s=settings.amd_exporter_stale_s, fetch=fetch)


def with_amd_exporter(settings: BackendOptions, backend: Backend, fetch=None) -> Backend:
    """An amdsmi backend completed by the node's Device Metrics Exporter when ``amd_exporter_url`` is set."""
    if not settings.amd_exporter_url:
        return backend
    from agent.backends.amd_exporter.join import AmdExporterJoin

    return AmdExporterJoin(backend, amd_exporter_reader(settings, fetch),  # type: ignore[return-value]
                           window_us=settings.amd_exporter_profiler_window_us)


def open_amd(settings: BackendOptions, reports: WorkloadSource | None = None) -> Backend:
    from agent.backends.amd import AmdBackend, load_amdsmi

    amdsmi = load_amdsmi()  # fails fast (no ROCm, version skew) before any background source starts
    return with_amd_exporter(settings, AmdBackend(amdsmi, node=settings.node_name,
                                                  host=open_local_host(settings, reports)))


def open_amd_virtual(settings: BackendOptions, reports: WorkloadSource | None = None) -> Backend:
    """The real AMD backend over the fake libamd_smi that plays the virtual scenario (default: mi300x)."""
    from agent.backends.amd_virtual import VirtualAmdBackend

    if "scenario" not in settings.explicit:
        settings = settings.replace(scenario="mi300x")
    try:
        backend = VirtualAmdBackend(open_virtual(settings))  # type: ignore[arg-type]
    except ImportError as exc:
        raise BackendUnavailable(f"amd-virtual needs the amdsmi Python package ({exc}); "
                                 "pip install 'roofwatch[amd]' (no ROCm needed for the simulation)") from None
    dme = backend.start_dme() if not settings.amd_exporter_url else None  # the scenario's virtual DME, if any
    if dme is None:
        return with_amd_exporter(settings, backend)
    return with_amd_exporter(settings.replace(amd_exporter_url=dme.url), backend, fetch=dme.fetch)  # read in process


OPENERS = {"nvml": open_nvml, "amd": open_amd, "virtual": open_virtual, "nvml-virtual": open_nvml_virtual,
           "amd-virtual": open_amd_virtual, "dcgm-exporter": open_dcgm_exporter,
           "amd-exporter": open_amd_exporter}


def install_spec_overrides(specs: Mapping[str, Mapping[str, float | str]]) -> None:
    """Make the config's ``specs:`` peaks (by driver name) the ones discovery resolves for those names."""
    from agent.model.specs.override import override_spec, set_overrides

    set_overrides({name: override_spec(name, fields) for name, fields in specs.items()})


def open_backend(settings: BackendOptions, reports: WorkloadSource | None = None) -> Backend:
    """Open ``settings.backend``; ``auto`` tries NVML then AMD and explains every failure.

    ``reports`` is where workload reports sent to this agent land (the real backends use it; the
    simulated fleet has its own)."""
    install_spec_overrides(settings.specs)
    if settings.backend != "auto":
        return OPENERS[settings.backend](settings, reports)
    reasons = []
    for name in ("nvml", "amd"):
        try:
            return OPENERS[name](settings, reports)
        except BackendUnavailable as exc:
            reasons.append(str(exc))
    raise BackendUnavailable("no GPU backend found:\n  - " + "\n  - ".join(reasons) + "\n" + DEMO_HINT)
