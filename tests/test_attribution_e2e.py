"""Real child processes on simulated GPUs: the job labels, the process tree and the verdict they produce.

The GPUs are the fake NVIDIA driver playing a scenario (an input-starved trainer on GPU 0, nothing
running on GPU 1); the host side is the real one (:class:`agent.context.local_host.LocalHost` over this machine's
/proc): the driver reports the PID of a real trainer process started here with a Slurm job's
environment, whose one loader worker burns a whole core. Two things are made independent of the machine
running the suite: the host's clock runs at the pace of the worker's CPU time (so the worker reads as one
saturated core even when a busy runner gives it less), and the node's CPU and PSI figures are a calm node's.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections import namedtuple
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.backends.nvml import NvmlBackend
from agent.classifier.live import LiveClassifier
from agent.collector import Collector
from agent.context.host.node_stats import NodeStats
from agent.context.local_host import LocalHost
from exporters.prometheus import ExpositionCache
from tests.agent_process import clean_env, poll
from tests.nvml_harness import Rig, scenario

pytestmark = pytest.mark.slow

TRAINER = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a saturated loader worker
print("ready", flush=True)
time.sleep(600)
"""


@dataclass
class Node:
    rig: Rig
    collector: Collector
    trainer: subprocess.Popen[str]
    uuids: list[str]

    def cycle(self) -> None:
        self.rig.step(1.0)
        self.collector.collect_once()

    def exposition(self, **kw: Any) -> str:
        return ExpositionCache(lambda: self.collector.snapshot, **kw).render(generate_latest, "text/plain").decode()

    def verdict(self, gpu: str) -> Any:
        return next((v for v in self.collector.snapshot.verdicts if v.gpu == gpu), None)


def start_trainer(env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", TRAINER], env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


class WorkerPacedClock:
    """Time as the saturated loader worker lives it: while the worker runs, the clock advances by the CPU
    time the worker got, so it reads as exactly one busy core however many other processes share the
    machine (a busy CI runner gives it a fraction of a core of real time, and the verdict then depended on
    the runner's load); once the worker has exited, by real time."""

    def __init__(self, worker: psutil.Process) -> None:
        self._worker = worker
        self._now = 0.0
        self._last_cpu: float | None = None
        self._last_real = time.monotonic()

    def _worker_cpu(self) -> float | None:
        try:
            if self._worker.status() == psutil.STATUS_ZOMBIE:
                return None
            times = self._worker.cpu_times()
        except psutil.Error:
            return None
        return times.user + times.system

    def __call__(self) -> float:
        real, cpu = time.monotonic(), self._worker_cpu()
        if cpu is not None and self._last_cpu is not None:
            self._now += max(0.0, cpu - self._last_cpu)
        elif cpu is None:
            self._now += real - self._last_real
        self._last_cpu, self._last_real = cpu, real
        return self._now


def calm_node_stats(tmp_path: Path, clock: Callable[[], float]) -> NodeStats:
    """The node's CPU and I/O as a calm node's: no pressure, no iowait (the machine running the suite may
    be busy, and its real PSI and iowait would decide the starvation's sub-reason)."""
    pressure = tmp_path / "proc" / "pressure"
    pressure.mkdir(parents=True)
    for name in ("cpu", "io"):
        (pressure / name).write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                                     "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    ticks = itertools.count()
    CpuTimes = namedtuple("CpuTimes", "user system idle iowait")

    def cpu_times() -> CpuTimes:
        n = next(ticks)
        return CpuTimes(user=n * 1.0, system=0.0, idle=n * 1.0, iowait=0.0)

    return NodeStats(tmp_path / "proc", min_refresh_s=1.0, clock=clock, cpu_times=cpu_times)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    uuid_probe = Rig(scenario(gpus=2))
    uuids = [d.uuid for d in uuid_probe.backend().discover()]  # the same scenario and seed give the same UUIDs
    uuid_probe.close()
    # GPU 1 runs nothing, but the job's environment names it: allocated and idle.
    env = clean_env(SLURM_JOB_ID="4242", SLURM_JOB_USER="alice", SLURM_JOB_PARTITION="a100",
                    CUDA_VISIBLE_DEVICES=f"{uuids[0]},{uuids[1]}")
    trainer = start_trainer(env)
    rig = Rig(scenario(gpus=2, workloads=[
        {"job": "train", "gpus": [0], "pid": trainer.pid,
         "phases": [{"kind": "input_starved", "duration_s": 3600, "duty": 0.45, "dataloader_cpu_cores": 0.0}]}]))
    (worker,) = psutil.Process(trainer.pid).children()
    clock = WorkerPacedClock(worker)
    # Refreshed once a second of the worker's CPU time: the worker's time and the clock are read a moment
    # apart and in 10 ms ticks, which over 0.2 s made it read 0.9-1.1 cores, at the saturation threshold.
    host = LocalHost(min_refresh_s=1.0, clock=clock, node_stats=calm_node_stats(tmp_path, clock))
    backend = NvmlBackend(rig.nvml, host=host, clock=rig.clock, wall=rig.clock, sleep=rig.clock.advance)
    collector = Collector(backend, node="n1", interval_s=1.0, clock=rig.clock, monotonic=rig.clock,
                          analyzer=LiveClassifier())
    try:
        yield Node(rig, collector, trainer, uuids)
    finally:
        collector.stop()
        rig.close()
        os.killpg(trainer.pid, signal.SIGKILL)  # the worker too
        trainer.wait()


def info_labels(text: str, name: str) -> dict[str, dict[str, str]]:
    return {s.labels["gpu"]: s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}


def test_the_real_trainers_job_labels_its_gpu_and_the_gpu_it_holds_idle(node: Node) -> None:
    node.cycle()
    text = node.exposition(gpu_labels=("job_id",))
    jobs = info_labels(text, "roofwatch_gpu_job_info")
    assert jobs["0"]["job_id"] == "4242" and jobs["0"]["user"] == "alice" and jobs["0"]["partition"] == "a100"
    assert jobs["1"]["job_id"] == "4242", "GPU 1 is in the job's CUDA_VISIBLE_DEVICES though nothing runs on it"
    power = {s.labels["gpu"]: s.labels for f in text_string_to_metric_families(text) for s in f.samples
             if s.name == "roofwatch_gpu_power_watts"}
    assert power["0"]["job_id"] == "4242" and power["1"]["job_id"] == "4242"
    owners = info_labels(text, "roofwatch_gpu_process_info")
    assert owners["0"]["pid"] == str(node.trainer.pid) and owners["0"]["user"]


def test_a_saturated_loader_worker_makes_the_verdict_dataloader(node: Node) -> None:
    def starved_by_loader() -> Any:
        node.cycle()
        verdict = node.verdict("0")
        return verdict if verdict is not None and (verdict.cls, verdict.detail) == ("input_starved", "dataloader") else None

    verdict = poll(starved_by_loader, 60, interval=0.0, what="an input_starved/dataloader verdict for GPU 0")
    # The node is calm (its stats are injected) and the worker's clock is its own CPU time: the reason
    # is the workers' saturation, however busy the machine running the test is.
    assert re.match(r"1 loader workers use [01]\.\d of the 1\.0 cores they can have", verdict.reasons[1]), verdict.reasons
    proc = node.collector.snapshot.devices[0].sample.processes[0]
    assert proc.pid == node.trainer.pid and proc.workers == 1
    assert proc.cpu_workers_cores >= 0.5 > proc.cpu_main_cores
    text = node.exposition()
    cpu = {s.labels["role"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
           if s.name == "roofwatch_gpu_process_cpu_cores" and s.labels["gpu"] == "0"}
    assert cpu["workers"] > cpu["main"]


def test_when_the_worker_stops_the_verdict_no_longer_blames_the_loader(node: Node) -> None:
    def detail() -> str | None:
        node.cycle()
        verdict = node.verdict("0")
        return verdict.detail if verdict is not None else None

    poll(lambda: detail() == "dataloader", 60, interval=0.0, what="dataloader first")
    for child in psutil.Process(node.trainer.pid).children():
        child.kill()
    poll(lambda: detail() not in (None, "dataloader"), 60, interval=0.0, what="the verdict to move off dataloader")
    assert node.verdict("0").cls == "input_starved"


REPORTER = """
import time
from agent.client import report
print("ready", flush=True)
step = 0
while True:
    step += 1
    report(step=step, step_time_s=1.0, tokens={tokens}, flops_per_token={flops}, dtype="bf16", rank=0, world_size=1,
           job="pretrain-7b")
    time.sleep(0.1)
"""


def test_a_job_reporting_through_the_client_shows_workload_mfu_next_to_counter_mfu_and_its_pod(tmp_path) -> None:
    """A real process reports over the unix socket; its GPU's pod comes from a real gRPC kubelet."""
    from agent.context.attribution.kubelet import PodResourcesCache
    from exporters.http.report_socket import ReportSocketServer
    from agent.context.workload.report_store import ReportStore
    from agent.model.specs import spec_by_key
    from tests.fake_kubelet import FakeKubelet, pod

    peak = spec_by_key("h100-sxm").peak_flops["bf16"]
    flops_per_token, target = 1.4e10, 0.37
    tokens = target * peak / flops_per_token  # per 1 s step, whole job (world size 1)
    socket_path = str(tmp_path / "report.sock")
    clocks: list[Any] = []  # the store dates reports by the simulated wall clock the collector asks with
    store = ReportStore(ttl_s=30.0, clock=lambda: clocks[0]() if clocks else 0.0)
    server = ReportSocketServer(socket_path, store)
    server.start()
    job = subprocess.Popen([sys.executable, "-c", REPORTER.format(tokens=tokens, flops=flops_per_token)],
                           env=clean_env(ROOFWATCH_REPORT_SOCKET=socket_path), stdout=subprocess.PIPE, text=True,
                           start_new_session=True)
    kubelet = FakeKubelet().start()
    rig = None
    collector = None
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        rig = Rig(scenario(gpus=2, workloads=[
            {"job": "train", "gpus": [0], "pid": job.pid,
             "phases": [{"kind": "compute", "duration_s": 3600, "mfu": 0.5}]}]))
        clocks.append(rig.clock)
        pods = PodResourcesCache(kubelet.socket_path, refresh_s=60.0)
        backend = NvmlBackend(rig.nvml, clock=rig.clock, wall=rig.clock, sleep=rig.clock.advance,
                              host=LocalHost(min_refresh_s=0.2, workloads=[store], pods=pods))
        uuid0 = next(d.uuid for d in backend.discover() if d.gpu == "0")
        kubelet.pods = [pod("trainer-0", "ml", main={"nvidia.com/gpu": [uuid0]})]
        pods.start()  # after its kubelet has the pod (the backend closes it with its host)
        collector = Collector(backend, node="n1", interval_s=1.0, clock=rig.clock, monotonic=rig.clock,
                              analyzer=LiveClassifier())
        node = Node(rig, collector, job, [uuid0])

        def both_mfus() -> dict[str, float] | None:
            node.cycle()
            text = node.exposition(gpu_labels=("pod", "namespace"))
            mfu = {s.labels["source"]: (s.value, s.labels) for f in text_string_to_metric_families(text)
                   for s in f.samples if s.name == "roofwatch_gpu_mfu_ratio" and s.labels["gpu"] == "0"}
            return mfu if {"workload", "counters"} <= set(mfu) and mfu["workload"][1]["pod"] == "trainer-0" else None

        mfu = poll(both_mfus, 60, interval=0.0, what="workload and counter MFU with pod labels on GPU 0")
        assert mfu["workload"][0] == pytest.approx(target, rel=1e-6)
        assert mfu["counters"][0] == pytest.approx(0.5, abs=0.1), "the simulated tensor activity"
        assert mfu["workload"][1]["namespace"] == "ml" and mfu["workload"][1]["dtype"] == "bf16"
        text = node.exposition()
        assert info_labels(text, "roofwatch_gpu_pod_info")["0"]["container"] == "main"
        assert info_labels(text, "roofwatch_gpu_job_info")["0"]["job_id"] == "pretrain-7b", "reported job name"
        assert "1" not in info_labels(text, "roofwatch_gpu_pod_info")
        report = collector.snapshot.devices[0].sample.workload
        assert report is not None and report.source == "client" and report.dtype == "bf16"
    finally:
        if collector is not None:
            collector.stop()
        if rig is not None:
            rig.close()
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        server.close()
        kubelet.close()
