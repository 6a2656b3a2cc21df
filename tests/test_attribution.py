"""Slurm job attribution of GPU processes: real child processes with Slurm's environment, and
/proc fixture trees with the cgroup paths slurmd creates (v1 and v2), as node_exporter tests do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.context.attribution.slurm import process_job_id, slurm_job_from_cgroup, slurm_job_from_environ
from agent.context.local_host import LocalHost
from tests.agent_process import clean_env

CGROUP_V1 = """12:pids:/slurm/uid_1000/job_4242/step_0/task_0
4:memory:/slurm/uid_1000/job_4242/step_0/task_0
1:name=systemd:/system.slice/slurmd.service
"""
CGROUP_V2 = "0::/system.slice/slurmstepd.scope/job_981/step_batch/user/task_0\n"
NOT_SLURM = "0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope\n0::/user.slice/job_77\n"


def test_job_id_from_slurm_cgroup_paths_v1_and_v2():
    assert slurm_job_from_cgroup(CGROUP_V1) == "4242"
    assert slurm_job_from_cgroup(CGROUP_V2) == "981"
    assert slurm_job_from_cgroup(NOT_SLURM) is None  # a job_ directory outside Slurm's tree is not a job
    assert slurm_job_from_cgroup("") is None


def test_job_id_from_environment():
    assert slurm_job_from_environ(b"PATH=/bin\0SLURM_JOB_ID=77\0SLURM_JOB_PARTITION=gpu\0") == "77"
    assert slurm_job_from_environ(b"SLURM_JOBID=78\0") == "78"
    assert slurm_job_from_environ(b"SLURM_JOB_ID=\0HOME=/root\0") is None
    assert slurm_job_from_environ(b"") is None


def write_proc(root: Path, pid: int, cgroup: str | None = None, environ: bytes | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    if cgroup is not None:
        (d / "cgroup").write_text(cgroup)
    if environ is not None:
        (d / "environ").write_bytes(environ)


def test_cgroup_wins_and_environment_is_the_fallback(tmp_path):
    write_proc(tmp_path, 10, cgroup=CGROUP_V2, environ=b"SLURM_JOB_ID=1\0")
    write_proc(tmp_path, 11, cgroup=NOT_SLURM, environ=b"SLURM_JOB_ID=555\0")
    write_proc(tmp_path, 12, cgroup=NOT_SLURM)
    assert process_job_id(10, tmp_path) == "981"
    assert process_job_id(11, tmp_path) == "555"
    assert process_job_id(12, tmp_path) is None
    assert process_job_id(13, tmp_path) is None  # gone: unknown, not an error


def test_unreadable_environment_means_unknown(tmp_path):
    write_proc(tmp_path, 20, cgroup=NOT_SLURM)
    (tmp_path / "20" / "environ").mkdir()  # reading it fails like EACCES on another user's process
    assert process_job_id(20, tmp_path) is None


@pytest.mark.slow
def test_a_gpu_process_started_by_slurm_attributes_its_gpu_to_the_job():
    """A real child with Slurm's environment, read through the real /proc by LocalHost."""
    code = "import time; time.sleep(60)"
    in_job = subprocess.Popen([sys.executable, "-c", code], env=clean_env(SLURM_JOB_ID="31337"),
                              start_new_session=True)
    outside = {k: v for k, v in clean_env().items() if not k.startswith("SLURM_")}
    plain = subprocess.Popen([sys.executable, "-c", code], env=outside, start_new_session=True)
    try:
        host = LocalHost()
        facts = host.facts("0", [in_job.pid], 0.0)
        assert facts.attribution is not None and facts.attribution.job_id == "31337"
        assert facts.processes[in_job.pid].name.startswith("python")
        assert host.facts("1", [plain.pid], 0.0).attribution is None
        # Two processes on one GPU: the job of the one that has one.
        both = host.facts("2", [plain.pid, in_job.pid], 0.0)
        assert both.attribution is not None and both.attribution.job_id == "31337"
    finally:
        for child in (in_job, plain):
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def test_a_process_in_another_pid_namespace_has_no_job_and_no_error(tmp_path):
    host = LocalHost(proc_root=tmp_path)  # an empty /proc: every PID is invisible
    assert host.facts("0", [424242], 0.0).attribution is None


def test_lookups_are_made_once_per_process_including_misses(tmp_path, monkeypatch):
    """The collector asks every cycle; /proc is read once per PID, also for PIDs it cannot see."""
    import agent.context.local_host as host_module

    write_proc(tmp_path, 30, cgroup=CGROUP_V1)
    reads: list[int] = []
    real = host_module.process_job
    monkeypatch.setattr(host_module, "process_job", lambda pid, root: reads.append(pid) or real(pid, root))
    host = LocalHost(proc_root=tmp_path)
    for _ in range(5):
        assert host.facts("0", [31, 30], 0.0).attribution.job_id == "4242"  # 31 is invisible
    assert sorted(reads) == [30, 31]
