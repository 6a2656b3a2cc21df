"""Open the backend a user asked for, or find one with ``auto``.

Vendor libraries are imported lazily here and nowhere else, so ``roofwatch demo`` works on a
machine with no GPU stack, and a broken vendor install produces one clear message instead of
an import traceback.
"""

from __future__ import annotations

import time

from agent.backends.base import Backend, BackendUnavailable
from agent.config import Settings

DEMO_HINT = "To try roofwatch without a GPU, run `roofwatch demo` (a simulated 8-GPU H100 node)."


VIRTUAL_HEAD_START_S = 60.0
"""How long the virtual scenario has been running when the agent starts."""


def open_virtual(settings: Settings) -> Backend:
    from agent.backends.virtual import VirtualBackend
    from agent.virtual.scenario import ScenarioError, resolve_scenario

    try:
        scenario = resolve_scenario(settings.scenario)
    except ScenarioError as exc:
        raise BackendUnavailable(f"virtual backend: {exc}") from None
    # The scenario started VIRTUAL_HEAD_START_S ago: the first sample already shows the workloads,
    # and the classifier can be primed with that minute (VirtualBackend.warm_samples).
    return VirtualBackend(
        scenario, node=settings.virtual_node, interval_s=settings.interval_s,
        start_time=time.time() - settings.interval_s - VIRTUAL_HEAD_START_S,
    )


def open_nvml(settings: Settings) -> Backend:
    from agent.backends.nvml import NvmlBackend, load_pynvml
    from agent.host import LocalHost

    return NvmlBackend(load_pynvml(), node=settings.node_name, host=LocalHost(sysfs_root=settings.sysfs_root))


def open_nvml_virtual(settings: Settings) -> Backend:
    """The real NVML backend over the fake driver that plays the virtual scenario."""
    from agent.backends.nvml_virtual import VirtualNvmlBackend

    return VirtualNvmlBackend(open_virtual(settings))  # type: ignore[arg-type]


def open_amd(settings: Settings) -> Backend:
    try:
        import amdsmi  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        raise BackendUnavailable("AMD: the amdsmi package is not installed (pip install 'roofwatch[amd]')") from None
    except Exception as exc:  # noqa: BLE001 - amdsmi raises KeyError when libamd_smi.so is missing
        raise BackendUnavailable(f"AMD: amdsmi could not load libamd_smi.so ({type(exc).__name__}: {exc})") from None
    try:
        from agent.backends.amd import AmdBackend  # type: ignore[import-not-found]
    except ImportError:
        raise BackendUnavailable("AMD: amdsmi loaded, but this build of roofwatch has no AMD backend yet") from None
    return AmdBackend(settings)  # pragma: no cover - arrives with the AMD backend


OPENERS = {"nvml": open_nvml, "amd": open_amd, "virtual": open_virtual, "nvml-virtual": open_nvml_virtual}


def open_backend(settings: Settings) -> Backend:
    """Open ``settings.backend``; ``auto`` tries NVML then AMD and explains every failure."""
    if settings.backend != "auto":
        return OPENERS[settings.backend](settings)
    reasons = []
    for name in ("nvml", "amd"):
        try:
            return OPENERS[name](settings)
        except BackendUnavailable as exc:
            reasons.append(str(exc))
    raise BackendUnavailable("no GPU backend found:\n  - " + "\n  - ".join(reasons) + "\n" + DEMO_HINT)
