"""Scenario files for the virtual GPU engine: what runs where, and when.

A scenario is a YAML document validated by the pydantic models below. Validation is strict
(``extra="forbid"``) because a scenario is hand-written and a silently ignored typo
(``mfuu: 0.9``) would make the demo or a test quietly simulate something else. Every error is
reported as ``<file>: <field.path>: <message>`` so the user can find the offending line.

Example::

    name: tiny
    seed: 7
    nodes:
      - name: node-a
        model: h100-sxm            # a key of agent.model.specs
        gpus: 2
        workloads:
          - job: train
            gpus: [0]
            phases:
              - {kind: compute, duration_s: 60, mfu: 0.45}
              - {kind: idle, duration_s: 10}
        faults:
          - {gpu: 1, kind: error, start_s: 5, duration_s: 3}

Top-level keys starting with ``x-`` are ignored, so they can hold YAML anchors shared by the
workloads of a job that spans several nodes (its ranks must run the same phases).

A node may also set ``counters`` (what a real backend can read there: ``full``, ``amdsmi``,
``nvml_basic``, ``minimal``; default by model) and ``mig`` (``{0: [3g.40gb, 3g.40gb]}``: GPU 0 is
replaced by two MIG instances that workloads and faults name ``"0/1"`` and ``"0/2"``), and
``nvml`` (:class:`NvmlProfile`: how the fake NVIDIA driver of :mod:`agent.virtual.fake_nvml`
behaves there: driver version, permissions, unsupported symbols and fields). An AMD node may set
``amd`` (:class:`AmdProfile`): its compute and memory partition modes (with ``CPX`` each MI300X
becomes eight devices that workloads and faults name ``"0/0"`` .. ``"0/7"``, the partition id
KFD reports) and how its fake libamd_smi (:mod:`agent.virtual.fake_amdsmi`) behaves.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.model import Dtype, GpuSpec
from agent.model.specs import spec_by_key
from agent.virtual.devices import (
    COMPUTE_PARTITIONS,
    MEMORY_PARTITIONS,
    MIG_SLICES,
    ComputePartition,
    CounterPreset,
    MemoryPartition,
    mig_capable,
    parse_mig_profile,
    partition_count,
    partitionable,
)

GIB = 1024**3

BUILTIN_SCENARIOS: tuple[str, ...] = ("demo", "cluster", "mi300x", "fleet")
"""Scenarios shipped in ``agent/virtual/scenarios/<name>.yaml``."""

KIND_CLASS: dict[str, str] = {
    "compute": "compute_bound",
    "memory": "memory_bound",
    "input_starved": "input_starved",
    "comm_jitter": "communication_jittered",
    "latency": "latency_bound",
    "idle": "idle",
    "idle_held": "idle",
}
"""The true workload class of each phase kind (the label a perfect classifier would give)."""

TRAINING_KINDS = frozenset({"compute", "input_starved", "comm_jitter"})


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file and the field path."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _PhaseBase(_Strict):
    """Parameters every phase kind accepts."""

    duration_s: float = Field(gt=0.0, description="How long the phase lasts (virtual seconds).")
    power_cap_w: float | None = Field(None, gt=0.0, description="Enforced power limit; throttles the SM clock.")
    mem_used_gib: float | None = Field(None, ge=0.0, description="Device memory held by the job (GiB).")
    thermal: bool = Field(False, description="Thermal throttling: clocks cut further, thermal bits set.")


class ComputePhase(_PhaseBase):
    """Large GEMMs or training: tensor pipes busy at ``mfu`` of the dtype's dense peak."""

    kind: Literal["compute"]
    mfu: float = Field(gt=0.0, le=0.97)
    tokens_per_s: float | None = Field(None, gt=0.0, description="Whole-job throughput, for workload reports.")
    flops_per_token: float | None = Field(None, gt=0.0)
    step_s: float = Field(1.0, gt=0.0, description="Reported training step time.")


class MemoryPhase(_PhaseBase):
    """Bandwidth-bound work (batch-1 decode, STREAM): DRAM at ``mbu``, tensor pipes nearly idle."""

    kind: Literal["memory"]
    mbu: float = Field(gt=0.0, le=0.9)


class InputStarvedPhase(_PhaseBase):
    """Training waiting on its data loader: busy bursts of ``duty`` x ``period_s``, then idle."""

    kind: Literal["input_starved"]
    duty: float = Field(gt=0.0, lt=1.0)
    busy_mfu: float = Field(0.45, gt=0.0, le=0.97)
    period_s: float = Field(0.8, gt=0.0)
    dataloader_cpu_cores: float = Field(7.5, ge=0.0, description="CPU the loader workers burn, in cores.")
    loader_workers: int | None = Field(None, ge=0, le=1024, description="Loader worker processes; default: "
                                       "one per core they burn (saturated workers, the usual cause of starvation).")
    iowait: float = Field(0.0, ge=0.0, le=1.0, description="Host iowait this job causes (fetch-bound loaders).")
    flops_per_token: float = Field(4.8e10, gt=0.0)


class CommJitterPhase(_PhaseBase):
    """Synchronous data-parallel steps: compute, then an all-reduce whose wait jitters."""

    kind: Literal["comm_jitter"]
    mfu: float = Field(0.5, gt=0.0, le=0.97, description="MFU while computing.")
    compute_s: float = Field(1.5, gt=0.0, description="Compute time per step of a normal rank.")
    comm_s: float = Field(0.8, ge=0.0, description="Collective transfer time per step (links busy).")
    stall_prob: float = Field(0.25, ge=0.0, le=1.0, description="Chance that a step's collective stalls.")
    stall_s: float = Field(2.0, ge=0.0, description="Mean stall length (drawn 0.5x..1.5x).")
    step_jitter: float = Field(0.03, ge=0.0, le=0.5, description="Relative per-step noise on compute time.")
    straggler_rank: int | None = Field(None, ge=0, description="Index into the job's ranks of the slow rank.")
    straggler_slowdown: float = Field(1.3, ge=1.0, le=10.0)
    link_util: float = Field(0.6, ge=0.0, le=0.95, description="Fabric utilisation while transferring.")
    flops_per_token: float = Field(4.8e10, gt=0.0)


class LatencyPhase(_PhaseBase):
    """Small kernels, launch-bound loops: resident most of the time, neither roof reached.

    ``sm``, ``tensor`` and ``dram`` move the signature for hard cases (batch-1 decode of a small
    model on a big GPU: few SMs busy, little DRAM traffic); the engine stays busy (GR 0.9).
    """

    kind: Literal["latency"]
    sm: float = Field(0.28, ge=0.0, le=1.0, description="SM activity.")
    tensor: float = Field(0.1, ge=0.0, le=0.97, description="Tensor-pipe activity.")
    dram: float = Field(0.15, ge=0.0, le=0.9, description="DRAM activity.")

    @model_validator(mode="after")
    def _tensor_within_sm(self) -> "LatencyPhase":
        if self.tensor > self.sm:
            raise ValueError(f"tensor: {self.tensor} exceeds sm ({self.sm}); tensor pipes only run on active SMs")
        return self


class IdlePhase(_PhaseBase):
    """Nothing running; ``held`` (or kind ``idle_held``) keeps a process holding memory."""

    kind: Literal["idle", "idle_held"]
    held: bool = False

    @property
    def holds_memory(self) -> bool:
        return self.held or self.kind == "idle_held"


Phase = Annotated[
    Union[ComputePhase, MemoryPhase, InputStarvedPhase, CommJitterPhase, LatencyPhase, IdlePhase],
    Field(discriminator="kind"),
]
PHASE_KINDS: tuple[str, ...] = tuple(KIND_CLASS)


_GPU_REF = re.compile(r"^(\d+)(?:/(\d+))?$")


def _gpu_ref(value: Any) -> Any:
    """A GPU index (``3``, ``"3"``) or a MIG instance / AMD partition ``"<index>/<j>"``, canonicalised.

    Indices stay ints (what scenarios always used); instances become ``"3/1"``, the trace
    format's GPU id. Anything else is left for pydantic to reject with its usual message.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return value
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"GPU index must be >= 0, got {value}")
        return value
    match = _GPU_REF.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is neither a GPU index nor a MIG instance or partition '<index>/<j>'")
    if match.group(2) is None:
        return int(match.group(1))
    return f"{int(match.group(1))}/{int(match.group(2))}"  # the node checks the range (MIG from 1, partitions from 0)


GpuRef = Annotated[Union[int, str], BeforeValidator(_gpu_ref)]
"""What a workload or fault names: a whole GPU (int), a MIG instance or an AMD partition (``"i/j"``)."""


def gpu_parent(ref: int | str) -> int:
    """The physical GPU index of a reference (the GPU itself, or a MIG instance's or partition's parent)."""
    return ref if isinstance(ref, int) else int(ref.split("/", 1)[0])


class Workload(_Strict):
    """One job's share of a node: the GPUs (or MIG instances) it uses and the phases it cycles through."""

    job: str = Field(min_length=1)
    gpus: list[GpuRef] = Field(min_length=1)
    dtype: Dtype = "bf16"
    repeat: bool = True
    process: str | None = Field(None, min_length=1, description="Process name (default by kind).")
    pid: int | None = Field(None, ge=1, description="Host PID the driver reports for this job's process "
                            "(default: a stable made-up one); lets a test attach a real process to a simulated GPU.")
    phases: list[Phase] = Field(min_length=1)

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, gpus: list[int | str]) -> list[int | str]:
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"GPU listed twice: {gpus}")
        return gpus


FaultKind = Literal["error", "lost", "hang", "xid"]

XID_DEFAULT_DURATION_S = 1.0
"""``duration_s`` given to an ``xid`` fault that names none (an XID is an instant, not a window)."""


class Fault(_Strict):
    """A window of virtual time in which reading one GPU fails (for collector tests), or an XID.

    ``error``, ``lost`` and ``hang`` make reads fail during [start_s, start_s + duration_s).
    ``xid`` is an instant: the fake NVML driver (:mod:`agent.virtual.fake_nvml`) delivers XID
    ``xid`` once, as an NVML event, when virtual time reaches ``start_s``; reads keep working and
    the virtual backend ignores it. ``duration_s`` is irrelevant for it (defaults to 1).
    """

    gpu: GpuRef = Field(description="A GPU (all its MIG instances fail with it) or one instance 'i/j'.")
    kind: FaultKind
    start_s: float = Field(ge=0.0)
    duration_s: float = Field(gt=0.0, description="Length of the window (ignored for kind xid).")
    hang_s: float = Field(30.0, gt=0.0, description="How long a hung call blocks (kind hang).")
    xid: int | None = Field(None, ge=1, le=65535, description="The XID code (kind xid only, required there).")

    @model_validator(mode="before")
    @classmethod
    def _xid_duration_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "xid" and "duration_s" not in data:
            return {**data, "duration_s": XID_DEFAULT_DURATION_S}
        return data

    @model_validator(mode="after")
    def _xid_only_with_kind_xid(self) -> "Fault":
        if self.kind == "xid" and self.xid is None:
            raise ValueError("xid: required for kind xid (the XID code, e.g. 79)")
        if self.kind != "xid" and self.xid is not None:
            raise ValueError(f"xid: only allowed with kind xid, not {self.kind}")
        return self


DriverVersion = Annotated[str, Field(pattern=r"^\d{3,4}\.\d{1,3}(\.\d{1,3})?$")]
CSymbol = Annotated[str, Field(pattern=r"^nvml[A-Za-z0-9_]+$")]


class NvmlProfile(_Strict):
    """How the node's (fake) NVIDIA driver behaves, for :mod:`agent.virtual.fake_nvml`.

    Only the fake libnvidia-ml reads this; the virtual backend ignores it. It lets tests and the
    demo run the real NVML backend against old drivers, locked-down containers and flaky fields.
    """

    driver_version: DriverVersion = Field(
        "580.95.05", description="nvmlSystemGetDriverVersion; its major number gates which symbols exist "
        "(< 510: no nvmlDeviceGetComputeRunningProcesses_v3; < 520: no nvmlGpm*; < 535: no "
        "nvmlDeviceGetCurrentClocksEventReasons; < 550: no nvmlDeviceGetProcessesUtilizationInfo; < 565: no "
        "nvmlDeviceGetTemperatureV; < 555: PCIe byte fields 197/198 not supported).")
    cuda_driver_version: int = Field(
        13000, ge=1000, description="nvmlSystemGetCudaDriverVersion (1000 x major + 10 x minor); its major "
        "is the first part of nvmlSystemGetNVMLVersion ('13.580.95.05').")
    driver_loaded: bool = Field(True, description="False: nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED.")
    persistence_mode: bool = Field(True, description="nvmlDeviceGetPersistenceMode.")
    gpm: bool = Field(True, description="False: nvmlGpmQueryDeviceSupport says unsupported even on Hopper or newer.")
    no_permission: list[CSymbol] = Field(
        default_factory=list, description="C symbols (e.g. nvmlGpmSampleGet) that return NVML_ERROR_NO_PERMISSION.")
    not_supported: list[CSymbol] = Field(
        default_factory=list, description="C symbols that return NVML_ERROR_NOT_SUPPORTED.")
    failing_fields: list[int] = Field(
        default_factory=list, description="nvmlDeviceGetFieldValues field ids that fail with NOT_SUPPORTED "
        "inside an otherwise successful batch.")

    @property
    def driver_major(self) -> int:
        return int(self.driver_version.split(".", 1)[0])


AmdSymbol = Annotated[str, Field(pattern=r"^amdsmi_[a-z0-9_]+$")]


class AmdProfile(_Strict):
    """How the node's AMD GPUs are partitioned and how its (fake) libamd_smi behaves.

    The partition modes shape the devices every backend sees; the rest only matters to the fake
    library of :mod:`agent.virtual.fake_amdsmi` that the real amdsmi package runs on.
    """

    compute_partition: ComputePartition = Field(
        "SPX", description="SPX: one device per GPU; DPX/QPX/CPX: 2/4/8 devices per GPU, one per group of XCDs "
        "(MI300X, MI325X, MI355X).")
    memory_partition: MemoryPartition = Field(
        "NPS1", description="NUMA nodes per socket; never more than the compute partitions (NPS4 needs CPX).")
    rocm_version: str = Field("7.0.2", pattern=r"^\d+\.\d+(\.\d+)?$", description="amdsmi_get_lib_version.")
    driver_version: str = Field("6.12.12", min_length=1, description="amdgpu driver version (amdsmi_get_gpu_driver_info).")
    library: bool = Field(True, description="False: libamd_smi.so is missing (importing amdsmi raises KeyError).")
    missing_symbols: list[AmdSymbol] = Field(
        default_factory=list, description="C symbols the library lacks: importing a newer amdsmi wrapper fails "
        "with 'undefined symbol', as on a ROCm older than the wrapper.")
    not_supported: list[AmdSymbol] = Field(
        default_factory=list, description="C symbols that return AMDSMI_STATUS_NOT_SUPPORTED.")
    no_permission: list[AmdSymbol] = Field(
        default_factory=list, description="C symbols that return AMDSMI_STATUS_NO_PERM.")
    na_metrics: list[str] = Field(
        default_factory=list, description="amdsmi_gpu_metrics_t fields the firmware leaves at all ones "
        "(the amdsmi package reports them as 'N/A').")

    @model_validator(mode="after")
    def _nps_within_partitions(self) -> "AmdProfile":
        if MEMORY_PARTITIONS[self.memory_partition] > COMPUTE_PARTITIONS[self.compute_partition]:
            raise ValueError(f"memory_partition: {self.memory_partition} needs at least as many compute partitions "
                             f"({self.compute_partition} has {COMPUTE_PARTITIONS[self.compute_partition]})")
        return self


class Node(_Strict):
    """One host with ``gpus`` identical GPUs of catalogue model ``model``."""

    name: str = Field(min_length=1)
    model: str
    gpus: int = Field(ge=1, le=64)
    counters: CounterPreset | None = Field(
        None, description="What a real backend can read (default by model: see devices.default_counters).")
    mig: dict[Annotated[int, Field(ge=0)], list[str]] = Field(
        default_factory=dict, description="GPU index -> its MIG instance profiles, e.g. {0: [3g.40gb, 3g.40gb]}.")
    workloads: list[Workload] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)
    nvml: NvmlProfile = Field(
        default_factory=NvmlProfile, description="The fake NVML driver's behaviour on this node.")
    amd: AmdProfile = Field(
        default_factory=AmdProfile, description="AMD partition modes and the fake libamd_smi's behaviour on this node.")

    @field_validator("model")
    @classmethod
    def _known_model(cls, key: str) -> str:
        try:
            spec_by_key(key)
        except KeyError as exc:
            raise ValueError(str(exc.args[0]) if exc.args else f"unknown GPU model {key!r}") from None
        return key

    @model_validator(mode="after")
    def _consistent(self) -> "Node":
        spec = spec_by_key(self.model)
        self._check_mig(spec)
        self._check_partitions(spec)
        owner: dict[str, str] = {}
        for w_i, workload in enumerate(self.workloads):
            where = f"workloads.{w_i}"
            for gpu in workload.gpus:
                self._check_ref(gpu, f"{where}.gpus", whole_ok=False)
                if str(gpu) in owner:
                    raise ValueError(f"{where}.gpus: GPU {gpu} already used by job {owner[str(gpu)]!r}")
                owner[str(gpu)] = workload.job
            if workload.dtype not in spec.peak_flops:
                supported = ", ".join(sorted(spec.peak_flops))
                raise ValueError(f"{where}.dtype: {workload.dtype} not supported by {self.model} ({supported})")
            memory, what = min((self._memory_of(gpu, spec) for gpu in workload.gpus), key=lambda mw: mw[0] or 0)
            for p_i, phase in enumerate(workload.phases):
                _check_phase_limits(phase, spec, f"{where}.phases.{p_i}", what, memory)
        for f_i, fault in enumerate(self.faults):
            self._check_ref(fault.gpu, f"faults.{f_i}.gpu", whole_ok=True)
        return self

    def _check_mig(self, spec: GpuSpec) -> None:
        """MIG only on capable models, real GPUs, valid profiles, within 7 slices and the memory."""
        if self.mig and not mig_capable(self.model, spec.vendor):
            raise ValueError(f"mig: {self.model} does not support MIG (MIG-capable: A100, H100, H200, GH200, B200)")
        memory_gb = spec.memory_bytes / GIB if spec.memory_bytes else None
        for index, profiles in self.mig.items():
            where = f"mig.{index}"
            if index >= self.gpus:
                raise ValueError(f"{where}: GPU {index} does not exist (node has {self.gpus})")
            if not profiles:
                raise ValueError(f"{where}: a GPU in MIG mode needs at least one instance")
            slices = gb = 0
            for p_i, profile in enumerate(profiles):
                parsed = parse_mig_profile(profile)
                if parsed is None:
                    raise ValueError(f"{where}.{p_i}: invalid MIG profile {profile!r}; expected '<g>g.<N>gb' "
                                     "with g in 1..7 and N >= 1, e.g. '3g.40gb'")
                slices, gb = slices + parsed[0], gb + parsed[1]
            if slices > MIG_SLICES:
                raise ValueError(f"{where}: instances use {slices} compute slices; a GPU has {MIG_SLICES}")
            if memory_gb is not None and gb > memory_gb + 1e-9:
                raise ValueError(f"{where}: instances use {gb} GB of memory; {self.model} has {memory_gb:.0f} GB")

    def _check_partitions(self, spec: GpuSpec) -> None:
        if self.amd.compute_partition != "SPX" and not partitionable(self.model):
            raise ValueError(f"amd.compute_partition: {self.model} has no compute partitions "
                             "(partitionable: MI300X, MI325X, MI355X)")

    @property
    def partitions(self) -> int:
        """Devices each GPU of this node shows (AMD compute partitions; 1 otherwise)."""
        return partition_count(self.model, self.amd.compute_partition)

    def _check_ref(self, ref: int | str, where: str, *, whole_ok: bool) -> None:
        """The GPU exists; a MIG or partitioned GPU is named by its instances or partitions
        (faults may name the whole GPU)."""
        index = gpu_parent(ref)
        if index >= self.gpus:
            raise ValueError(f"{where}: GPU {index} does not exist (node has {self.gpus})")
        profiles = self.mig.get(index)
        parts = self.partitions
        if isinstance(ref, int):
            if profiles and not whole_ok:
                ids = ", ".join(f"{index}/{j}" for j in range(1, len(profiles) + 1))
                raise ValueError(f"{where}: GPU {index} is in MIG mode; use its instances ({ids})")
            if parts > 1 and not whole_ok:
                raise ValueError(f"{where}: GPU {index} is in {self.amd.compute_partition} mode; use its partitions "
                                 f"({index}/0 .. {index}/{parts - 1})")
            return
        sub = int(ref.split("/", 1)[1])
        if parts > 1:
            if sub >= parts:
                raise ValueError(f"{where}: partition {ref} does not exist (GPU {index} has {parts}: "
                                 f"{index}/0 .. {index}/{parts - 1})")
            return
        if not profiles:
            raise ValueError(f"{where}: GPU {index} is not in MIG mode (no mig entry), so it has no instance {ref}")
        if not 1 <= sub <= len(profiles):
            raise ValueError(f"{where}: MIG instance {ref} does not exist (GPU {index} has {len(profiles)}); "
                             "MIG instances are numbered from 1")

    def _memory_of(self, ref: int | str, spec: GpuSpec) -> tuple[int | None, str]:
        """Device memory a job on ``ref`` can hold, and how to name that device in errors."""
        if isinstance(ref, int):
            return spec.memory_bytes, self.model
        index, instance = (int(x) for x in ref.split("/", 1))
        if self.partitions > 1:
            memory = spec.memory_bytes // self.partitions if spec.memory_bytes else None
            return memory, f"{self.model} {self.amd.compute_partition} partition"
        profile = self.mig[index][instance - 1]
        parsed = parse_mig_profile(profile)
        assert parsed is not None
        return parsed[1] * GIB, f"{self.model} MIG {profile}"


def _check_phase_limits(phase: Any, spec: Any, where: str, what: str, memory_bytes: int | None) -> None:
    """Reject values the modelled GPU cannot take (memory larger than the card, absurd caps).

    ``memory_bytes`` is the smallest device the job runs on (a MIG instance holds only its share).
    A power cap is always the whole GPU's limit: MIG instances share it.
    """
    if phase.mem_used_gib is not None and memory_bytes and phase.mem_used_gib * GIB > memory_bytes:
        raise ValueError(
            f"{where}.mem_used_gib: {phase.mem_used_gib} GiB exceeds the {what} memory "
            f"({memory_bytes / GIB:.0f} GiB)"
        )
    if phase.power_cap_w is not None and spec.tdp_w:
        if not 0.25 * spec.tdp_w <= phase.power_cap_w <= spec.tdp_w:
            raise ValueError(
                f"{where}.power_cap_w: {phase.power_cap_w} W outside {0.25 * spec.tdp_w:.0f}..{spec.tdp_w:.0f} W for {spec.key}"
            )


class Scenario(_Strict):
    """A whole simulated fleet."""

    name: str = Field(min_length=1)
    seed: int = 0
    description: str = ""
    nodes: list[Node] = Field(min_length=1)

    @model_validator(mode="after")
    def _jobs_consistent(self) -> "Scenario":
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"nodes: duplicate node names in {names}")
        first: dict[str, tuple[str, Workload]] = {}
        world: dict[str, int] = {}
        for n_i, node in enumerate(self.nodes):
            for w_i, workload in enumerate(node.workloads):
                world[workload.job] = world.get(workload.job, 0) + len(workload.gpus)
                where = f"nodes.{n_i}.workloads.{w_i}"
                if workload.job not in first:
                    first[workload.job] = (where, workload)
                    continue
                ref_where, ref = first[workload.job]
                if ref.phases != workload.phases or ref.repeat != workload.repeat or ref.dtype != workload.dtype:
                    raise ValueError(
                        f"{where}: job {workload.job!r} also runs at {ref_where} with different "
                        "phases/repeat/dtype; the ranks of one job must run the same schedule (use a YAML anchor)"
                    )
        for job, (where, workload) in first.items():
            for p_i, phase in enumerate(workload.phases):
                if isinstance(phase, CommJitterPhase) and world[job] < 2:
                    raise ValueError(
                        f"{where}.phases.{p_i}.kind: comm_jitter needs a job with at least 2 GPUs; {job!r} has 1"
                    )
                rank = getattr(phase, "straggler_rank", None)
                if rank is not None and rank >= world[job]:
                    raise ValueError(
                        f"{where}.phases.{p_i}.straggler_rank: {rank} but job {job!r} has {world[job]} ranks"
                    )
        return self

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


# ----------------------------------------------------------------------------- loading


def _format_loc(loc: tuple[int | str, ...]) -> str:
    """Dotted field path, without pydantic's union-tag steps (``phases.0.compute.mfu``)."""
    parts: list[str] = []
    for i, item in enumerate(loc):
        if isinstance(item, str) and item in PHASE_KINDS and i > 0 and isinstance(loc[i - 1], int):
            continue
        parts.append(str(item))
    return ".".join(parts)


_SUBPATH = re.compile(r"^([A-Za-z_]\w*(?:\.\w+)*): (.*)$", re.DOTALL)


def _format_error(source: str, exc: ValidationError) -> str:
    """One line per problem: ``<source>: <dotted.path>: <message>``.

    Cross-field validators report the rest of the path at the start of their message
    (``workloads.1.gpus: ...``); it is joined onto pydantic's location so the user sees one path.
    """
    lines = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        loc = _format_loc(tuple(err["loc"]))
        match = _SUBPATH.match(msg)
        if match:
            loc = f"{loc}.{match.group(1)}" if loc else match.group(1)
            msg = match.group(2)
        lines.append(f"{source}: {loc}: {msg}" if loc else f"{source}: {msg}")
    return "\n".join(lines)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate an already-parsed document (a dict, as from YAML) into a :class:`Scenario`."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    # Top-level ``x-*`` keys are free (as in docker-compose): a place for YAML anchors.
    data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))}
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_error(source, exc)) from None


def _parse_text(text: str, source: str) -> Scenario:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: invalid YAML: {exc}") from None
    return parse_scenario(data, source)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raises :class:`ScenarioError` naming file and field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario: {exc.strerror or exc}") from None
    return _parse_text(text, str(path))


def builtin_scenario(name: str) -> Scenario:
    """One of :data:`BUILTIN_SCENARIOS`, read from the installed package."""
    if name not in BUILTIN_SCENARIOS:
        raise ScenarioError(f"unknown built-in scenario {name!r}; built-in: {', '.join(BUILTIN_SCENARIOS)}")
    text = resources.files("agent.virtual").joinpath("scenarios", f"{name}.yaml").read_text(encoding="utf-8")
    return _parse_text(text, f"{name}.yaml")


def resolve_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name, otherwise a YAML file path (what ``--scenario`` accepts)."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_SCENARIOS:
        return builtin_scenario(name_or_path)
    return load_scenario(name_or_path)
