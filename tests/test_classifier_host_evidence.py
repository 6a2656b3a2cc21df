"""Host evidence in the verdicts: process trees name the starvation sub-reason, the NIC names jitter's cause.

The GPU side comes from the virtual engine; the host side of each sample is then rewritten to
what a real node would show (a process tree, CPU pressure, NIC counters), so each test changes
exactly the evidence under test.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable

from agent.classifier.thresholds import DEFAULT_THRESHOLDS as T
from agent.model import GpuSample, HostSample, ProcessSample
from tests.test_classifier import engine_for, job, settled, verdicts_of

STARVED = {"kind": "input_starved", "duration_s": 200, "duty": 0.5, "dataloader_cpu_cores": 0.0}
JITTER = {"kind": "comm_jitter", "duration_s": 400, "mfu": 0.5, "compute_s": 1.6, "comm_s": 0.7,
          "stall_prob": 0.25, "stall_s": 1.5, "link_util": 0.1}
STEADY_DDP = {"kind": "comm_jitter", "duration_s": 400, "mfu": 0.5, "compute_s": 1.6, "comm_s": 0.3,
              "stall_prob": 0.0, "step_jitter": 0.01, "link_util": 0.3}


def rewritten(phase: dict[str, Any], gpus: list[int], seconds: float,
              change: Callable[[GpuSample], dict[str, Any]]) -> list[Any]:
    engine = engine_for(job("j", gpus, phase))
    original = engine.iter_trace

    def patched(*args: Any, **kw: Any):
        for sample in original(*args, **kw):
            yield dataclasses.replace(sample, **change(sample))

    engine.iter_trace = patched  # type: ignore[method-assign]
    return verdicts_of(engine, seconds)


def tree(main: float, workers: int, workers_cores: float, limit: float | None = None) -> Callable[[GpuSample], dict[str, Any]]:
    def change(sample: GpuSample) -> dict[str, Any]:
        procs = tuple(dataclasses.replace(p, cpu_cores=main + workers_cores, cpu_main_cores=main,
                                          cpu_workers_cores=workers_cores, workers=workers, cpu_limit_cores=limit)
                      for p in sample.processes or ())
        return {"processes": procs}
    return change


def details(verdicts: list[Any], gpu: str = "0") -> Counter[str]:
    return Counter(v.detail for v in settled(verdicts, gpu, 60))


def test_saturated_workers_mean_dataloader_whatever_their_count() -> None:
    # Three workers at 2.9 cores: saturated, though far below the 2-core total rule's spirit of "many".
    verdicts = rewritten(STARVED, [0], 120, tree(main=0.3, workers=3, workers_cores=2.9))
    assert {v.cls for v in settled(verdicts, "0", 60)} == {"input_starved"}
    assert set(details(verdicts)) == {"dataloader"}
    assert "3 loader workers use 2.9" in settled(verdicts, "0", 60)[-1].reasons[1]


def test_the_cgroup_quota_caps_what_the_workers_can_use() -> None:
    # Eight workers in a 2-core container: 1.9 cores is all they can get.
    assert set(details(rewritten(STARVED, [0], 120, tree(0.2, 8, 1.9, limit=2.0)))) == {"dataloader"}
    # The same 1.9 cores with 8 cores allotted: workers idle half the time, not the bottleneck.
    assert "dataloader" not in details(rewritten(STARVED, [0], 120, tree(0.2, 8, 1.9, limit=8.0)))


def test_cpu_pressure_with_busy_workers_is_dataloader() -> None:
    def change(sample: GpuSample) -> dict[str, Any]:
        host = dataclasses.replace(sample.host or HostSample(), cpu_pressure_ratio=0.45)
        return {**tree(0.3, 8, 3.0)(sample), "host": host}

    verdicts = rewritten(STARVED, [0], 120, change)
    assert set(details(verdicts)) == {"dataloader"}
    assert "CPU pressure" in settled(verdicts, "0", 60)[-1].reasons[1]


def test_a_busy_main_thread_with_idle_workers_is_host_launch() -> None:
    verdicts = rewritten(STARVED, [0], 120, tree(main=1.0, workers=4, workers_cores=0.2))
    assert set(details(verdicts)) == {"host_launch"}
    # Neither saturated workers nor a busy main thread: the verdict says it does not know why.
    assert set(details(rewritten(STARVED, [0], 120, tree(0.3, 4, 0.2)))) == {"unattributed"}


def test_io_evidence_wins_over_the_process_tree() -> None:
    def change(sample: GpuSample) -> dict[str, Any]:
        return {**tree(0.3, 8, 7.8)(sample), "host": HostSample(cpu_iowait_ratio=0.3, io_pressure_ratio=0.4)}

    assert set(details(rewritten(STARVED, [0], 120, change))) == {"io"}


def test_a_link_flap_names_the_network_as_the_cause_of_jitter() -> None:
    def change(sample: GpuSample) -> dict[str, Any]:
        return {"net_link_downs": 1 if int(sample.ts) % 30 == 0 else 0}

    verdicts = rewritten(JITTER, [0, 1], 200, change)
    settled_0 = settled(verdicts, "0", 60)
    assert Counter(v.cls for v in settled_0).most_common(1)[0][0] == "communication_jittered"
    assert details(verdicts).most_common(1)[0][0] == "link_flap"
    flapping = next(v for v in settled_0 if v.detail == "link_flap")
    assert flapping.reasons[0].startswith("the GPU's NIC port went down")


def test_congestion_and_retransmits_name_the_fabric() -> None:
    for field, value in (("net_congestion_per_s", 5 * T.net_congestion_per_s), ("net_retransmits_per_s", 3 * T.net_retransmits_per_s)):
        verdicts = rewritten(JITTER, [0, 1], 200, lambda s, f=field, v=value: {f: v})
        assert details(verdicts).most_common(1)[0][0] == "network_congestion", field


def test_a_congested_port_alone_does_not_make_steady_training_jittered() -> None:
    verdicts = rewritten(STEADY_DDP, [0, 1], 200, lambda s: {"net_congestion_per_s": 5 * T.net_congestion_per_s,
                                                            "net_link_downs": 0})
    assert Counter(v.cls for v in settled(verdicts, "0", 60)).most_common(1)[0][0] == "compute_bound"


def test_process_samples_keep_the_tree_through_a_trace(tmp_path) -> None:
    """The new per-process fields are optional trace additions: written and read back unchanged."""
    from agent.trace import TraceWriter, read_trace

    proc = ProcessSample(pid=7, name="python", cpu_cores=3.2, cpu_main_cores=1.0, cpu_workers_cores=2.2, workers=4,
                         cpu_limit_cores=8.0, rss_bytes=2**30, io_read_bytes_per_s=1e6, user="alice",
                         command="python train.py")
    sample = GpuSample(ts=1.0, gpu="0", processes=(proc,), net_link_downs=1,
                       host=HostSample(cpu_pressure_ratio=0.3, cpu_utilization_ratio=0.5))
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as writer:
        writer.write(sample)
    assert list(read_trace(path)) == [sample]
