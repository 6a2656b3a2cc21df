"""The snapshot the scrape benchmark renders: a full 8-GPU node with 64 processes and 8 HCA ports.

Built apart from the timing so the test suite can check the very snapshot the benchmark measures
(tests/test_benchmarks.py) without running any timing loop.
"""

from __future__ import annotations

import dataclasses

from agent.context.host.infiniband import ERROR_COUNTERS
from agent.model import (
    CLOCK_EVENT_REASONS,
    Attribution,
    DeviceState,
    NicPort,
    NodeSnapshot,
    ProcessSample,
    RemappedRows,
    XidCount,
)

GPUS = 8
PROCS_PER_GPU = 8


def node_snapshot() -> NodeSnapshot:
    """The virtual fleet's 8-GPU node with classification on, filled out to 64 processes.

    A real collector is used (not a hand-built snapshot) so the verdict families are as the agent
    publishes them; every GPU then gets 8 processes with every field known, and the NVIDIA fields
    the virtual backend leaves out (ECC, remapped rows, throttle time, XIDs) plus 8 InfiniBand
    ports are filled in, so every family a real H100 node exports has series.
    """
    from agent.app.assemble import make_collector, open_backend_or_fail
    from agent.app.config import Settings

    settings = Settings(backend="virtual")
    collector = make_collector(settings, open_backend_or_fail(settings))
    try:
        collector.collect_once()
        snapshot = collector.collect_once()  # the second cycle has rates and two-sample (GPM) values
    finally:
        collector.stop()
    if len(snapshot.devices) != GPUS or len(snapshot.verdicts) != GPUS:
        raise RuntimeError(f"expected {GPUS} GPUs with verdicts, got {len(snapshot.devices)} / {len(snapshot.verdicts)}")
    devices = tuple(_full_device(index, device) for index, device in enumerate(snapshot.devices))
    nics = tuple(_nic_port(index) for index in range(GPUS))
    return dataclasses.replace(snapshot, devices=devices, nics=nics)


def _full_device(index: int, device: DeviceState) -> DeviceState:
    """One GPU with 8 processes and the fields a real NVML read has that the simulation lacks."""
    sample = device.sample
    if sample is None:
        raise RuntimeError(f"virtual GPU {device.info.gpu} has no sample")
    who = sample.attribution
    sample = dataclasses.replace(
        sample,
        processes=tuple(_process(index, rank) for rank in range(PROCS_PER_GPU)),
        attribution=Attribution(job_id=who.job_id if who else f"job-{index}", user="alice", partition="gpu",
                                namespace="ml-training", pod=f"trainer-{index}", container="main"),
        memory_temperature_c=70.0 + index * 1.37,
        clock_event_time_s={reason: 12.5 * bit + index / 7 for reason, bit in CLOCK_EVENT_REASONS.items()},
        ecc_corrected_errors=3 + index,
        ecc_uncorrected_errors=0,
        remapped_rows=RemappedRows(correctable=index % 2, uncorrectable=0, pending=False, failure=False),
        driver_calls=41,
    )
    xids = (XidCount(xid=31, count=2, last_ts=sample.ts - 600.0),) if index == 3 else ()
    return dataclasses.replace(device, sample=sample, xid_errors=xids)


def _process(gpu: int, rank: int) -> ProcessSample:
    """Distinct pid and name, every field known, values with the digits real readings have."""
    scale = 1.0 + gpu / 97 + rank / 31
    return ProcessSample(
        pid=100_000 + gpu * 1_000 + rank, name=f"{('python', 'torchrun', 'vllm', 'pt_worker')[rank % 4]}-{gpu}-{rank}",
        used_memory_bytes=(rank + 1) * 1_234_567_891, cpu_cores=1.5 * scale, sm_util=0.1 * scale,
        command="python train.py --config big.yaml", user="alice", cpu_main_cores=0.97 * scale,
        cpu_workers_cores=0.53 * scale, workers=rank, cpu_limit_cores=8.0, rss_bytes=3_221_225_472 + rank * 4096,
        io_read_bytes_per_s=1.25e6 * scale, io_write_bytes_per_s=3.3e4 * scale, compute_units=38 + rank,
    )


def _nic_port(index: int) -> NicPort:
    """One HCA port per GPU, as on an 8-rail node, with every error counter present."""
    return NicPort(device=f"mlx5_{index}", port=1, link_layer="InfiniBand", active=True, rate_bytes_per_s=5e10,
                   tx_bytes=1.234e12 * (index + 1), rx_bytes=2.345e12 * (index + 1),
                   events={name: float(position * 17 + index) for position, name in enumerate(ERROR_COUNTERS)})


def fresh(snapshot: NodeSnapshot, sequence: int) -> NodeSnapshot:
    """The same contents under a new sequence number: the render cache treats it as a new cycle's."""
    return dataclasses.replace(snapshot, sequence=sequence)
