"""The GPU counters of a serving phase: decode reading HBM, prefill filling the tensor pipes.

Each GPU of the replica spends ``prefill_share`` of its time in prefill and the rest in decode
steps (agent.virtual.serving.figures), mixed in exact proportion over any interval:

* **decode**: DRAM activity = (weight shard + KV shard) / step time / the GPU's bandwidth (the
  floor's memory term over the step, at most 0.9); tensor activity = the batch's FLOPs / step time /
  the GPU's peak (a few percent at small batches); SM activity follows DRAM, as in bandwidth-bound
  kernels; a far-above-floor server (launch- or CPU-bound) leaves the engine a little idle;
* **prefill**: the signature of a GEMM at the MFU the prompts need (prompt tokens per second x
  FLOPs per token / (prefill share x peak));
* memory held: weights + KV pool + workspace, divided over the GPUs; NVLink busy a little under
  tensor parallelism (the all-reduce of every layer).
"""

from __future__ import annotations

from typing import Any

from agent.model import WorkloadReport
from agent.virtual.kinds import PhasePlan, Placement, compute_activity
from agent.virtual.physics import Activity, DeviceModel, State, clamp, make_state
from agent.virtual.serving.figures import ServingFigures
from agent.virtual.serving.job import ServingJob
from agent.virtual.timeline import Occurrence


def decode_activity(f: ServingFigures, *, multi_gpu: bool) -> Activity:
    """One decode step, averaged: bandwidth-bound, tensor pipes nearly idle."""
    dram = f.decode_dram
    return Activity(
        gr=0.92 + 0.07 * min(1.0, dram / 0.6), sm=0.3 + 0.45 * dram, occ=0.35 + 0.3 * dram,
        tensor=clamp(f.decode_tensor), fp32=0.1, fp16=0.05, dram=dram,
        pcie_tx=0.002, pcie_rx=0.002, link=0.06 if multi_gpu else 0.0,
    )


class ServingPlan(PhasePlan):
    """A serving phase on one GPU of its replica: prefill and decode states, and the job's own report."""

    def __init__(self, phase: Any, dev: DeviceModel, where: Placement, job: ServingJob, index: int) -> None:
        super().__init__(phase, dev, where)
        figures = job.figures[index]
        assert figures is not None, "a serving phase has figures"
        self.job = job
        self.figures = figures
        multi = where.world > 1
        kw = self.state_kw()
        self.decode = make_state(decode_activity(figures, multi_gpu=multi), dev, **kw)
        prefill = compute_activity(figures.prefill_mfu, dev, multi_gpu=multi)
        self.prefill = make_state(prefill, dev, **kw)
        self.process_bytes = int(figures.held_bytes_per_gpu)
        self.cpu_cores = 1.2
        self.label = figures.true_class(prefill.dram)

    def weights(self, occ: Occurrence, a: float, b: float) -> list[tuple[State, float]]:
        share = self.figures.prefill_share
        return [(self.prefill, share * (b - a)), (self.decode, (1.0 - share) * (b - a))]

    def report(self, occ: Occurrence, t: float) -> WorkloadReport | None:
        return self.job.report(t)
