"""The selftest run: open the backend and a runner, play every phase while sampling, judge, summarise.

Real GPU: the agent's NVML backend (``nvml``; ``auto`` means the same, since the runners drive
CUDA) with a torch or cupy runner. ``nvml-virtual``: the same backend code over the fake driver,
with the virtual runner, on a hand-driven clock unless ``real_time``. Whatever cannot start is
reported in one message naming every missing piece (:class:`SelftestError`, exit 1), a bad
``--gpu`` as a usage error (exit 2); after that the run always ends in a :class:`Summary`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from agent.backends.base import BackendUnavailable
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, Thresholds
from agent.diagnostics.selftest.judge import PhaseResult, fit_thresholds, judge_phase, run_checks, skipped
from agent.diagnostics.selftest.phases import PHASES, Phase
from agent.diagnostics.selftest.report import Summary
from agent.diagnostics.selftest.runner import UsageError, Library, PhaseRunner, RunnerUnavailable, load_library
from agent.diagnostics.selftest.sampler import PhaseReports, Sampler, Window
from agent.model import DeviceInfo

if TYPE_CHECKING:
    from agent.backends.options import BackendOptions

log = logging.getLogger("roofwatch.selftest")

DEFAULT_PHASE_S = 12.0
DEFAULT_INTERVAL_S = 0.25
VIRTUAL_HINT = "The simulated selftest runs anywhere: roofwatch selftest --backend nvml-virtual"
EXIT_CANNOT_RUN, EXIT_USAGE = 1, 2


class SelftestError(Exception):
    """The selftest cannot start; ``code`` is 1 (nothing to run on) or 2 (usage)."""

    def __init__(self, message: str, code: int = EXIT_CANNOT_RUN) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Options:
    gpu: int = 0
    phases: tuple[Phase, ...] = PHASES
    phase_seconds: float = DEFAULT_PHASE_S
    interval_s: float = DEFAULT_INTERVAL_S
    backend: str = "auto"
    """``auto`` or ``nvml`` (a real GPU), or ``nvml-virtual``."""
    runner: str = "auto"
    """``auto``, ``torch`` or ``cupy`` (real GPU only)."""
    real_time: bool = False
    """``nvml-virtual`` only: play in wall-clock time, sampling from a thread as on a GPU."""
    thresholds: Thresholds = DEFAULT_THRESHOLDS
    settings: BackendOptions | None = None
    """The backends' part of the agent's settings (node name, host sources): required on a real GPU, where the
    command builds it from the settings (agent.app.commands_node), as the agent does."""
    scenario: Any = None
    """``nvml-virtual``: the scenario whose node is simulated (None: one H100 SXM)."""
    virtual_node: str | None = None
    progress: Callable[[str], None] = field(default=lambda _line: None, compare=False)


@dataclass
class _Rig:
    backend: Any
    runner: PhaseRunner
    device: DeviceInfo
    clock: Callable[[], float]
    advance: Callable[[float], None] | None


def run_selftest(options: Options) -> Summary:
    """Play ``options.phases`` on one GPU and judge each; raises SelftestError when it cannot start."""
    reports = PhaseReports(str(options.gpu))
    rig = _open_virtual(options, reports) if options.backend == "nvml-virtual" else _open_real(options, reports)
    thresholds = fit_thresholds(options.thresholds, options.phase_seconds)
    summary = Summary(node=getattr(rig.backend, "node", "local"), device=rig.device, backend=rig.backend.name,
                      runner=rig.runner.name, runner_detail=rig.runner.describe(),
                      virtual=options.backend == "nvml-virtual", phase_seconds=options.phase_seconds,
                      interval_s=options.interval_s, thresholds=thresholds, started_at=rig.clock())
    try:
        summary.findings = _findings(rig.backend, rig.device.gpu)
        sampler = Sampler(rig.backend, rig.device.gpu, options.interval_s, clock=rig.clock, advance=rig.advance)
        sampler.start()
        try:
            for number, phase in enumerate(options.phases, start=1):
                options.progress(f"[{number}/{len(options.phases)}] {phase.name}: {phase.what}")
                summary.results.append(_play(phase, rig, sampler, reports, options, thresholds))
        finally:
            sampler.stop()
        summary.sample_errors = list(sampler.errors)
    finally:
        rig.runner.close()
        rig.backend.close()
    summary.checks = run_checks(summary.results)
    return summary


def _play(phase: Phase, rig: _Rig, sampler: Sampler, reports: PhaseReports, options: Options,
          thresholds: Thresholds) -> PhaseResult:
    reason = rig.runner.skip_reason(phase)
    if reason is not None:
        return skipped(phase, reason)
    window = Window(sampler, reports)
    try:
        measured = rig.runner.run(phase, options.phase_seconds, window)
    except Exception as exc:  # noqa: BLE001 - one broken phase (out of memory, a CUDA error) must not hide the rest
        log.debug("phase %s failed", phase.name, exc_info=True)
        reports.clear()
        return skipped(phase, f"{type(exc).__name__}: {exc}", "error")
    began = window.began if window.began is not None else sampler.now()
    ended = window.ended if window.ended is not None else sampler.now()
    readings = sampler.between(began, ended)
    return judge_phase(phase, [r.sample for r in readings], measured, rig.device.spec, thresholds,
                       costs=[r.cost_s for r in readings])


# ---------------------------------------------------------------------- opening


def _open_real(options: Options, reports: PhaseReports) -> _Rig:
    from agent.backends.registry import open_nvml

    if options.settings is None:
        raise SelftestError("cannot run on a real GPU without the agent's settings (Options.settings)")
    problems = []
    backend = None
    try:
        backend = open_nvml(options.settings, reports)
    except BackendUnavailable as exc:
        problems.append(f"no NVIDIA GPU to test: {exc}")
    library = None
    try:
        library = load_library(options.runner)
    except RunnerUnavailable as exc:
        problems.append(str(exc))
    if backend is None or library is None:
        if backend is not None:
            backend.close()
        raise SelftestError("cannot run:\n  - " + "\n  - ".join(problems) + "\n" + VIRTUAL_HINT)
    try:
        device = _pick(backend, options.gpu)
        runner = open_cuda_runner(library, device)
    except SelftestError:
        backend.close()
        raise
    except RunnerUnavailable as exc:
        backend.close()
        raise SelftestError(f"cannot run: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - CUDA failing to start on this GPU is a reason, said in one line
        backend.close()
        raise SelftestError(f"cannot run: {library.name} could not start on GPU {options.gpu}: "
                            f"{type(exc).__name__}: {exc}") from None
    return _Rig(backend, runner, device, time.time, None)


def open_cuda_runner(library: Library, device: DeviceInfo) -> PhaseRunner:
    """The CUDA runner over ``library`` on the CUDA device that is NVML's ``device``."""
    from agent.diagnostics.selftest.cuda_phases import CudaRunner

    if library.name == "torch":
        from agent.diagnostics.selftest.torch_ops import TorchOps

        return CudaRunner("torch", TorchOps(library.module, device))
    from agent.diagnostics.selftest.cupy_ops import CupyOps

    return CudaRunner("cupy", CupyOps(library.module, device))


def _open_virtual(options: Options, reports: PhaseReports) -> _Rig:
    from agent.diagnostics.selftest.virtual_runner import open_virtual_rig

    try:
        backend, runner, clock, advance = open_virtual_rig(
            options.scenario, options.virtual_node, options.gpu, options.phases, options.phase_seconds,
            options.interval_s, reports, real_time=options.real_time)
    except UsageError as exc:
        raise SelftestError(str(exc), EXIT_USAGE) from None
    except (RunnerUnavailable, BackendUnavailable, KeyError, ValueError) as exc:
        raise SelftestError(f"cannot run the virtual selftest: {exc}") from None
    try:
        device = _pick(backend, options.gpu)
    except BaseException:
        backend.close()
        raise
    return _Rig(backend, runner, device, clock, advance)


def _pick(backend: Any, gpu: int) -> DeviceInfo:
    """The discovered GPU ``gpu``; a usage error listing the GPUs when there is none, an error for MIG."""
    try:
        devices = backend.discover()
    except BackendUnavailable as exc:
        raise SelftestError(f"cannot run: {exc}") from None
    by_id = {d.gpu: d for d in devices}
    if str(gpu) in by_id:
        return by_id[str(gpu)]
    instances = [d.gpu for d in devices if d.gpu.startswith(f"{gpu}/")]
    if instances:
        raise SelftestError(f"GPU {gpu} is in MIG mode (instances {', '.join(instances)}); the selftest needs a "
                            "whole GPU: pick another with --gpu, or disable MIG (nvidia-smi -i N -mig 0)")
    whole = sorted({d.gpu.split("/")[0] for d in devices}, key=int)
    raise SelftestError(f"--gpu {gpu}: no such GPU; this node has GPU(s) {', '.join(whole)}", EXIT_USAGE)


def _findings(backend: Any, gpu: str) -> list:
    """What ``roofwatch doctor`` says about this GPU (GPM refused, permissions), as the run's findings."""
    from agent.diagnostics.nvidia import nvml_findings

    try:
        found, _ = nvml_findings(backend)
    except Exception as exc:  # noqa: BLE001 - a finding that cannot be made must not stop the selftest
        log.debug("doctor findings failed: %s", exc)
        return []
    return [f for f in found if f.gpu in (None, gpu)]
