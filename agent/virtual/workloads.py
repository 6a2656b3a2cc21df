"""What runs on a simulated GPU: the phase kinds of a scenario and the workloads that cycle them.

These are the leaves of the scenario schema (:mod:`agent.virtual.scenario`). They live apart from
the node and fleet models because the engine's per-kind signatures (:mod:`agent.virtual.kinds`)
and the timeline (:mod:`agent.virtual.timeline`) need the phase types but nothing about nodes.

Validation is strict (``extra="forbid"``, see :class:`StrictModel`) because a scenario is
hand-written and a silently ignored typo (``mfuu: 0.9``) would make the demo or a test quietly
simulate something else.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from agent.model import Dtype

KIND_CLASS: dict[str, str] = {
    "compute": "compute_bound",
    "memory": "memory_bound",
    "input_starved": "input_starved",
    "comm_jitter": "communication_jittered",
    "latency": "latency_bound",
    "idle": "idle",
    "idle_held": "idle",
    "serving": "memory_bound",
}
"""The true workload class of each phase kind (the label a perfect classifier would give)."""

TRAINING_KINDS = frozenset({"compute", "input_starved", "comm_jitter"})

SERVING_MIN_FLOOR_MULTIPLE = 1.12
"""A decode step can take no less than this many times its floor: 1 / 0.9, the DRAM activity ceiling of
agent.virtual.physics (no GPU streams HBM at its datasheet peak), rounded up."""


class StrictModel(BaseModel):
    """Base of every scenario model: unknown keys are errors and parsed scenarios are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _PhaseBase(StrictModel):
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


class ServingPhase(_PhaseBase):
    """An inference server (one model replica on the workload's GPUs) decoding a steady batch.

    The decode step takes ``floor_multiple`` x the floor its GPUs allow (weights and KV cache read
    from HBM, or the batch's FLOPs at the dense peak); prefill takes ``prefill_share`` of the GPU
    time. The engine derives the rest (agent.virtual.serving.figures): request rate, latencies,
    KV-cache usage, counters; the fake server of ``server`` exports them (agent.virtual.serving).
    """

    kind: Literal["serving"]
    server: Literal["vllm", "sglang", "tgi"] = Field("vllm", description="Which server's /metrics to export.")
    model: str = Field(min_length=1, max_length=200, description="Model name the server reports (model_name).")
    weight_bytes: float = Field(gt=0.0, le=1e15, description="Bytes of weights of the replica, read once per decode step.")
    params: float | None = Field(None, gt=0.0, le=1e15, description="Parameters (2 x params FLOPs per token); "
                                 "default weight_bytes / 2 (16-bit weights).")
    kv_bytes_per_token: float = Field(131072.0, gt=0.0, le=1e9, description="KV-cache bytes per token of context "
                                      "over all layers: 2 x layers x KV heads x head dim x bytes per value.")
    kv_cache_bytes: float | None = Field(None, gt=0.0, le=1e15, description="KV-cache pool of the replica; default "
                                         "90% of its GPUs' memory less the weights and 1 GiB workspace per GPU.")
    running: int = Field(ge=1, le=100_000, description="Requests in the running batch.")
    waiting: int = Field(0, ge=0, le=1_000_000, description="Requests queued for admission.")
    max_running: int | None = Field(None, ge=1, le=1_000_000, description="The server's batch cap "
                                    "(vLLM max_num_seqs, SGLang max_running_requests); only SGLang <= 0.3 exports it.")
    prompt_tokens: int = Field(1024, ge=1, le=10_000_000, description="Mean prompt length of a request.")
    output_tokens: int = Field(256, ge=2, le=10_000_000, description="Mean output length of a request.")
    floor_multiple: float = Field(1.2, ge=SERVING_MIN_FLOOR_MULTIPLE, le=100.0,
                                  description="Decode step time / the floor at this batch.")
    prefill_share: float = Field(0.05, gt=0.0, le=0.9, description="Share of GPU time spent in prefill.")
    preemptions_per_s: float = Field(0.0, ge=0.0, le=1e6, description="Requests preempted (vLLM) or retracted "
                                     "(SGLang) per second for lack of KV cache; TGI exports none.")
    device_timer: bool = Field(False, description="SGLang only: run with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1, which "
                               "exports GPU seconds by forward mode (sglang:forward_execution_seconds_total).")

    @model_validator(mode="after")
    def _consistent(self) -> "ServingPhase":
        if self.max_running is not None and self.running > self.max_running:
            raise ValueError(f"running: {self.running} exceeds max_running ({self.max_running})")
        if self.device_timer and self.server != "sglang":
            raise ValueError(f"device_timer: only SGLang has a device timer, not {self.server}")
        return self

    def replica(self) -> tuple[object, ...]:
        """What stays fixed for one server process whatever its traffic (checked across a workload's phases)."""
        return (self.server, self.model, self.weight_bytes, self.params, self.kv_bytes_per_token,
                self.kv_cache_bytes, self.max_running, self.device_timer)


class IdlePhase(_PhaseBase):
    """Nothing running; ``held`` (or kind ``idle_held``) keeps a process holding memory."""

    kind: Literal["idle", "idle_held"]
    held: bool = False

    @property
    def holds_memory(self) -> bool:
        return self.held or self.kind == "idle_held"


Phase = Annotated[
    Union[ComputePhase, MemoryPhase, InputStarvedPhase, CommJitterPhase, LatencyPhase, ServingPhase, IdlePhase],
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


class HolderSpec(StrictModel):
    """One holder of a shared GPU (issue 47): a pod given a time-sliced replica or a shared DRA claim, or an
    MPS client process. The GPU's physics stay its workload's phases; its holders split the SM time of each
    interval by ``share`` and hold ``mem_gib`` each, as the driver's per-process lists would show them."""

    pod: str | None = Field(None, min_length=1, description="Pod name; none for an MPS client process or a Slurm job.")
    namespace: str | None = Field(None, min_length=1)
    container: str = Field("main", min_length=1)
    via: Literal["time-slicing", "dra", "mps", "slurm"] = "time-slicing"
    job: str | None = Field(None, min_length=1, max_length=64, description="Slurm job id (via: slurm).")
    user: str | None = Field(None, min_length=1, max_length=64, description="Slurm job user (via: slurm).")
    account: str | None = Field(None, min_length=1, max_length=64, description="Slurm account (via: slurm).")
    mfu: float | None = Field(None, gt=0.0, le=1.0, description="The MFU its own workload report gives (tokens/s x "
                              "FLOPs/token over the GPU's peak); none: it reports nothing of its own.")
    claim: str | None = Field(None, min_length=1, description="DRA claim as namespace/name (via: dra).")
    share: float = Field(ge=0.0, le=1.0, description="Share of the GPU's SM time its process uses.")
    mem_gib: float = Field(ge=0.0, description="Device memory its process holds (GiB).")
    process: str | None = Field(None, min_length=1, description="Process name (default: the workload's).")

    @model_validator(mode="after")
    def _named(self) -> "HolderSpec":
        if self.via == "mps" and self.pod is not None:
            raise ValueError("an MPS client is a process: give it no pod")
        if self.via == "slurm":
            if self.pod is not None or self.job is None:
                raise ValueError("a holder via slurm is a Slurm job: give it a job and no pod")
            return self
        if self.job is not None or self.user is not None or self.account is not None:
            raise ValueError(f"a holder via {self.via} has no Slurm job, user or account")
        if self.via != "mps" and (self.pod is None or self.namespace is None):
            raise ValueError(f"a holder via {self.via} is a pod: give it a namespace and a pod")
        return self


class Workload(StrictModel):
    """One job's share of a node: the GPUs (or MIG instances) it uses and the phases it cycles through."""

    job: str = Field(min_length=1)
    gpus: list[GpuRef] = Field(min_length=1)
    dtype: Dtype = "bf16"
    repeat: bool = True
    process: str | None = Field(None, min_length=1, description="Process name (default by kind).")
    pid: int | None = Field(None, ge=1, description="Host PID the driver reports for this job's process "
                            "(default: a stable made-up one); lets a test attach a real process to a simulated GPU.")
    phases: list[Phase] = Field(min_length=1)
    user: str | None = Field(None, min_length=1, max_length=64, description="Slurm job user of a whole-GPU job.")
    account: str | None = Field(None, min_length=1, max_length=64, description="Slurm account of a whole-GPU job.")
    holders: list[HolderSpec] = Field(default_factory=list, max_length=64, description="Holders sharing each of "
                                      "its GPUs (time-sliced pods, a shared DRA claim, MPS clients); none: the job "
                                      "holds its GPUs alone.")

    @field_validator("holders")
    @classmethod
    def _shares_fit(cls, holders: list[HolderSpec]) -> list[HolderSpec]:
        total = sum(h.share for h in holders)
        if total > 1.0 + 1e-9:
            raise ValueError(f"the holders' shares add up to {total:g}; a GPU has no more than all of its SM time")
        return holders

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, gpus: list[int | str]) -> list[int | str]:
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"GPU listed twice: {gpus}")
        return gpus

    @model_validator(mode="after")
    def _one_server(self) -> "Workload":
        """A serving workload is one server process: its model and configuration cannot change between phases,
        and it only serves or idles (the fake server keeps answering, with nothing moving, while it idles)."""
        serving = [(i, p) for i, p in enumerate(self.phases) if isinstance(p, ServingPhase)]
        if not serving:
            return self
        for i, phase in enumerate(self.phases):
            if not isinstance(phase, (ServingPhase, IdlePhase)):
                raise ValueError(f"phases.{i}.kind: a serving workload only serves or idles, not {phase.kind}")
        first = serving[0][1].replica()
        for i, phase in serving[1:]:
            if phase.replica() != first:
                raise ValueError(f"phases.{i}: server, model, weight_bytes, params, kv_bytes_per_token, kv_cache_bytes, "
                                 "max_running and device_timer must be the same in every serving phase of a workload "
                                 "(one server)")
        if any(isinstance(g, str) for g in self.gpus):
            raise ValueError("gpus: a serving workload runs on whole GPUs, not MIG instances or partitions")
        return self

    @property
    def serving(self) -> ServingPhase | None:
        """The first serving phase (the server's fixed configuration), or None for any other workload."""
        return next((p for p in self.phases if isinstance(p, ServingPhase)), None)
