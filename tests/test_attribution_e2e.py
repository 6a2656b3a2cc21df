"""Real child processes on simulated GPUs: the job labels, the process tree and the verdict they produce.

The GPUs are the fake NVIDIA driver playing a scenario (an input-starved trainer on GPU 0, nothing
running on GPU 1); the host side is the real one (:class:`agent.host.LocalHost` over this machine's
/proc): the driver reports the PID of a real trainer process started here with a Slurm job's
environment, whose one loader worker burns a whole core.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.backends.nvml import NvmlBackend
from agent.classifier.live import LiveClassifier
from agent.collector import Collector
from agent.host import LocalHost
from exporters.prometheus import ExpositionCache
from tests.agent_process import clean_env, poll
from tests.nvml_harness import Rig, scenario

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


@pytest.fixture
def node() -> Iterator[Node]:
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
    backend = NvmlBackend(rig.nvml, host=LocalHost(min_refresh_s=0.2), clock=rig.clock, wall=rig.clock,
                          sleep=rig.clock.advance)
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
    assert "1 loader workers use" in verdict.reasons[1]
    proc = node.collector.snapshot.devices[0].sample.processes[0]
    assert proc.pid == node.trainer.pid and proc.workers == 1
    assert proc.cpu_workers_cores >= 0.5 > proc.cpu_main_cores
    text = node.exposition()
    cpu = {s.labels["role"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
           if s.name == "roofwatch_gpu_process_cpu_cores" and s.labels["gpu"] == "0"}
    assert cpu["workers"] > cpu["main"]


def test_when_the_worker_stops_the_verdict_no_longer_blames_the_loader(node: Node) -> None:
    poll(lambda: (node.cycle(), node.verdict("0"))[1] is not None and node.verdict("0").detail == "dataloader",
         60, interval=0.0, what="dataloader first")
    for child in __import__("psutil").Process(node.trainer.pid).children():
        child.kill()
    poll(lambda: (node.cycle(), node.verdict("0"))[1] is not None and node.verdict("0").detail != "dataloader",
         60, interval=0.0, what="the verdict to move off dataloader")
    assert node.verdict("0").cls == "input_starved"
