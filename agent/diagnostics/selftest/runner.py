"""The phase-runner interface, what a phase measures about itself, and the choice of runner.

A runner plays one phase at a time on the GPU under test; the selftest samples that GPU through
the agent's backend meanwhile. Three implementations: over PyTorch and over CuPy (both
:class:`~agent.diagnostics.selftest.cuda_phases.CudaRunner` over their own small ops module), and
the virtual one, which makes the simulated GPU of ``nvml-virtual`` play the phase. Nothing here
imports torch or cupy at module level, so the selftest (and its tests) load on any machine.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from agent.diagnostics.selftest.phases import Phase
from agent.model import DeviceInfo

INSTALL_HINT = ("install one into this environment: pip install torch (a CUDA build), "
                "or pip install cupy-cuda12x (cupy-cuda11x for CUDA 11)")


class RunnerUnavailable(Exception):
    """No runner can play phases here; the message says what is missing and how to get it."""


class UsageError(Exception):
    """``--gpu`` or ``--virtual-node`` names nothing there is (the message lists what there is)."""


@dataclass(frozen=True, slots=True)
class Measured:
    """What a phase measured about itself: CUDA-event times on a GPU, the configured truth in the simulation.

    Totals over ``seconds`` (``None`` where the phase does not measure that quantity), so the
    rates below are what the workload achieved, to hold the counters' estimates against.
    """

    seconds: float | None = None
    flops: float | None = None
    bytes: float | None = None
    kernels: int | None = None
    duty: float | None = None
    """Busy GPU time / wall time, for the starved phase."""
    steps: tuple[float, ...] = ()
    """Step times of the stream-wait phase, in seconds."""
    dtype: str | None = None
    """Precision the matrix math really ran in (cupy has no bf16: its GEMM runs in fp16)."""
    detail: str = ""
    source: str = "CUDA events"

    def rate(self, total: float | None) -> float | None:
        if total is None or not self.seconds:
            return None
        return total / self.seconds

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "detail": self.detail, "dtype": self.dtype,
                               "seconds": _r(self.seconds), "flops_per_s": _r(self.rate(self.flops)),
                               "bytes_per_s": _r(self.rate(self.bytes)),
                               "kernels_per_s": _r(self.rate(float(self.kernels) if self.kernels else None)),
                               "duty": _r(self.duty)}
        if self.steps:
            out["step_times_s"] = [round(s, 4) for s in self.steps]
        return {k: v for k, v in out.items() if v not in (None, "")}


class PhaseWindow(Protocol):
    """What a runner gets from the selftest while it plays a phase."""

    def now(self) -> float:
        """Wall-clock time as the sampler sees it."""

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass while the GPU is sampled (a sleep on a real node)."""

    def begin(self) -> None:
        """The steady part of the phase starts now: samples from here on belong to it."""

    def end(self) -> None:
        """The phase's work is finished (synchronised): later samples do not belong to it."""

    def report(self, *, step: int, step_time_s: float) -> None:
        """A finished step, reported as a job would (the stream-wait phase's rank-0 report)."""


class PhaseRunner(Protocol):
    name: str
    """``torch``, ``cupy`` or ``virtual``."""

    def describe(self) -> str:
        """Library, version and device, for the report."""

    def skip_reason(self, phase: Phase) -> str | None:
        """Why ``phase`` cannot run here (fp8 before Hopper), or None."""

    def run(self, phase: Phase, seconds: float, window: PhaseWindow) -> Measured:
        """Play ``phase`` for ``seconds`` of steady work between ``window.begin()`` and ``window.end()``."""

    def close(self) -> None:
        """Free the GPU memory and library state the phases used."""


@dataclass
class Library:
    """A GPU compute library that imported: ``torch`` or ``cupy``, and its module."""

    name: str
    module: Any
    problems: list[str] = field(default_factory=list)


def load_library(choice: str, importer: Callable[[str], Any] = importlib.import_module) -> Library:
    """Import torch (then cupy, for ``auto``) or raise RunnerUnavailable saying what to install.

    Sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` first (unless the user set it), so CUDA numbers GPUs as
    NVML does; the device is still matched by PCI bus id when the library can say it.
    """
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    names = ("torch", "cupy") if choice == "auto" else (choice,)
    problems: list[str] = []
    missing = 0
    for name in names:
        try:
            return Library(name, importer(name), problems)
        except ModuleNotFoundError:
            missing += 1
            problems.append(f"{name} is not installed")
        except Exception as exc:  # noqa: BLE001 - a broken install (CUDA libraries missing) is a reason, not a crash
            problems.append(f"{name} failed to import: {type(exc).__name__}: {exc}")
    what = "neither torch nor cupy is installed" if missing == len(names) == 2 else "; ".join(problems)
    raise RunnerUnavailable(f"no GPU compute library to run the phases: {what}; {INSTALL_HINT}")


_BUS = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?$")


def parse_bus_id(text: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI bus id as NVML (``00000000:18:00.0``) or CUDA (``0000:18:00.0``) writes it."""
    if not text:
        return None
    match = _BUS.match(text.strip())
    if match is None:
        return None
    domain, bus, dev = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(dev, 16)


def cuda_index(device: DeviceInfo, bus_ids: list[tuple[int, int, int] | None]) -> tuple[int, str]:
    """The CUDA ordinal of NVML's ``device`` among CUDA devices whose bus ids are ``bus_ids``.

    Returns (ordinal, how it was matched). RunnerUnavailable when CUDA does not see that GPU
    (``CUDA_VISIBLE_DEVICES`` hides it, or the ids disagree).
    """
    wanted = parse_bus_id(device.pci_bus_id)
    if wanted is not None and any(b is not None for b in bus_ids):
        for i, bus in enumerate(bus_ids):
            if bus == wanted:
                return i, f"cuda:{i} (matched by PCI bus id {device.pci_bus_id})"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise RunnerUnavailable(f"GPU {device.gpu} (PCI {device.pci_bus_id}) is not among the {len(bus_ids)} "
                                f"CUDA device(s) this process sees{hint}")
    index = int(device.gpu)
    if index >= len(bus_ids):
        raise RunnerUnavailable(f"GPU {device.gpu}: CUDA sees only {len(bus_ids)} device(s)")
    return index, f"cuda:{index} (by index, PCI bus order; the library gives no bus id)"


def _r(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.6g}")
