"""The hardware side of a scenario: nodes (model, GPU count, MIG and partition layout) and faults.

Kept apart from the workload schema (:mod:`agent.virtual.workloads`) because this is where the
cross-field checks against the spec catalogue live: a workload must name GPUs, MIG instances or
AMD partitions the node really has, and ask for no more memory or power than the modelled card
offers. The fleet-wide checks (jobs spanning nodes) live on
:class:`~agent.virtual.scenario.Scenario`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from agent.model import GpuSpec
from agent.model.specs import spec_by_key
from agent.virtual.devices import (
    GIB,
    MIG_GI_ID_MAX,
    MIG_SLICES,
    CounterPreset,
    check_vgpu,
    device_info,
    mig_capable,
    mig_slices,
    parse_mig_profile,
    partition_count,
    partitionable,
)
from agent.virtual.profiles import AmdProfile, DcgmProfile, NvmlProfile
from agent.virtual.serving.figures import ServingError, phase_figures
from agent.virtual.workloads import GpuRef, ServingPhase, StrictModel, Workload, gpu_parent

FaultKind = Literal["error", "lost", "hang", "xid"]

XID_DEFAULT_DURATION_S = 1.0
"""``duration_s`` given to an ``xid`` fault that names none (an XID is an instant, not a window)."""


class Fault(StrictModel):
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


class Node(StrictModel):
    """One host with ``gpus`` identical GPUs of catalogue model ``model``."""

    name: str = Field(min_length=1)
    model: str
    gpus: int = Field(ge=1, le=64)
    counters: CounterPreset | None = Field(
        None, description="What a real backend can read (default by model: see devices.default_counters).")
    mig: dict[Annotated[int, Field(ge=0)], list[str]] = Field(
        default_factory=dict, description="GPU index -> its MIG instance profiles, e.g. {0: [3g.40gb, 3g.40gb]}.")
    mig_ids: dict[Annotated[int, Field(ge=0)], list[Annotated[int, Field(ge=0, le=MIG_GI_ID_MAX)]]] = Field(
        default_factory=dict, description="GPU index -> the GPU instance id of each of its mig instances, in the "
        "same order (default 1, 2, ...): the id NVML reports and the instance's name 'i/<id>', e.g. {0: [13]} "
        "for a 1g.5gb the driver placed as GPU instance 13.")
    vgpu: str | None = Field(
        None, description="Each GPU as a guest VM sees a time-sliced vGPU of this board, by the name its driver "
        "reports (e.g. 'GRID A100-10C' on a100-pcie-40gb): that name, the profile's frame buffer; no MIG.")
    workloads: list[Workload] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)
    nvml: NvmlProfile = Field(
        default_factory=NvmlProfile, description="The fake NVML driver's behaviour on this node.")
    dcgm: DcgmProfile = Field(
        default_factory=DcgmProfile, description="The fake DCGM host engine's behaviour on this node (with dcgm: on).")
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
                if isinstance(phase, ServingPhase):
                    try:  # what the GPUs cannot run (more KV cache than the pool, prefill past the peak) is an error here
                        phase_figures(phase, gpus=len(workload.gpus), model=self.model, spec=spec, dtype=workload.dtype)
                    except ServingError as exc:
                        raise ValueError(f"{where}.phases.{p_i}.{exc.field}: {exc.message}") from None
        for f_i, fault in enumerate(self.faults):
            self._check_ref(fault.gpu, f"faults.{f_i}.gpu", whole_ok=True)
        return self

    def mig_instances(self, index: int) -> list[tuple[int, str]]:
        """(GPU instance id, profile) of each MIG instance of GPU ``index`` ([] for a whole GPU)."""
        profiles = self.mig.get(index) or []
        ids = self.mig_ids.get(index) or list(range(1, len(profiles) + 1))
        return list(zip(ids, profiles))

    def _check_mig(self, spec: GpuSpec) -> None:
        """MIG only on capable models, real GPUs, valid profiles, within the model's slices and memory."""
        if self.vgpu is not None:
            problem = check_vgpu(self.vgpu, self.model)
            if problem is not None:
                raise ValueError(f"vgpu: {problem}")
            if self.mig:
                raise ValueError("mig: a time-sliced vGPU has no MIG mode of its own (drop mig or vgpu)")
        if self.mig and not mig_capable(self.model, spec.vendor):
            raise ValueError(f"mig: {self.model} does not support MIG (MIG-capable: A100, A30, H100, H200, GH200, B200)")
        for index, ids in self.mig_ids.items():
            if len(ids) != len(self.mig.get(index) or []):
                raise ValueError(f"mig_ids.{index}: {len(ids)} ids for the {len(self.mig.get(index) or [])} "
                                 f"MIG instances of GPU {index}")
            if len(set(ids)) != len(ids):
                raise ValueError(f"mig_ids.{index}: GPU instance ids must differ, got {ids}")
        total = mig_slices(self.model)
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
            if slices > total:
                raise ValueError(f"{where}: instances use {slices} compute slices; a GPU has {total}"
                                 + (f" ({self.model})" if total != MIG_SLICES else ""))
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
                ids = ", ".join(f"{index}/{j}" for j, _ in self.mig_instances(index))
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
        ids = [j for j, _ in self.mig_instances(index)]
        if sub not in ids:
            raise ValueError(f"{where}: MIG instance {ref} does not exist (GPU {index} has {len(ids)}); "
                             "MIG instances are numbered from 1, or by the GPU instance ids mig_ids gives "
                             f"({', '.join(f'{index}/{j}' for j in ids)})")

    def _memory_of(self, ref: int | str, spec: GpuSpec) -> tuple[int | None, str]:
        """Device memory a job on ``ref`` can hold, and how to name that device in errors."""
        if isinstance(ref, int):
            if self.vgpu is not None:
                shown = device_info(0, self.name, 0, self.model, spec, vgpu=self.vgpu)
                return shown.memory_total_bytes, f"{self.model} as vGPU {self.vgpu}"
            return spec.memory_bytes, self.model
        index, instance = (int(x) for x in ref.split("/", 1))
        if self.partitions > 1:
            memory = spec.memory_bytes // self.partitions if spec.memory_bytes else None
            return memory, f"{self.model} {self.amd.compute_partition} partition"
        profile = dict(self.mig_instances(index))[instance]
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
