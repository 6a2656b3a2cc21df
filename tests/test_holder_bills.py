"""Who a shared GPU's holders bill (issue 47, items 1 and 3): the Slurm account beside the job's user, a user and an
account on job holders, the owner on process holders, none on pods, and a holder's own MFU as a series.

* ``SLURM_JOB_ACCOUNT`` is read like the other Slurm values and refused when it is not shaped like an account
  (escape sequences, markup, spaces, 10 kB): unknown, never a label;
* a process holder's user is its owner from ``/proc/<pid>/status`` (world-readable): real child processes with
  Slurm's environment on one GPU, read through the real /proc by LocalHost;
* ``roofwatch_gpu_holder_info`` carries ``user`` and ``account``, ``roofwatch_gpu_job_info`` ``account``, and
  ``roofwatch_gpu_holder_mfu_ratio`` exists only for a holder with its own report (the ``shared`` scenario's
  ``slurm-node``: alice's job reports 40% MFU, bob's nothing).

The bills themselves, over a real Prometheus: tests/test_fleet_report_bills.py.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import pwd
import signal
import subprocess
import sys

import pytest
from pydantic import ValidationError

from agent.classifier.live import LiveClassifier
from agent.context.attribution.holders import gpu_holders
from agent.context.attribution.slurm import ProcessJob, process_job
from agent.context.local_host import LocalHost
from agent.model import Attribution, GpuSample
from agent.model.holders import Holder
from agent.virtual.backend import VirtualBackend
from agent.virtual.workloads import HolderSpec
from tests.agent_process import clean_env
from tests.test_attribution import write_proc
from tests.test_shared_gpus import Clock, _SharedBackend, cycled, holders_by_key, run_collector, scrape


@pytest.mark.parametrize("env, expected", [
    (b"SLURM_JOB_ID=42\0SLURM_JOB_ACCOUNT=physics\0", "physics"),
    (b"SLURM_JOB_ID=42\0SLURM_JOB_ACCOUNT=hpc-ml_2.a\0", "hpc-ml_2.a"),
    (b"SLURM_JOB_ID=42\0SLURM_JOB_ACCOUNT=\x1b[2Jroot\0", None),
    (b"SLURM_JOB_ID=42\0SLURM_JOB_ACCOUNT=<script>\0", None),
    (b"SLURM_JOB_ID=42\0SLURM_JOB_ACCOUNT=two words\0", None),
    (b"SLURM_JOB_ID=42\0SLURM_JOB_ACCOUNT=" + b"a" * 10_000 + b"\0", None),
    (b"SLURM_JOB_ID=42\0SLURM_JOB_ACCOUNT=ph\xffysics\0", None),
    (b"SLURM_JOB_ID=42\0SLURM_JOB_ACCOUNT=\0", None),
    (b"SLURM_JOB_ACCOUNT=physics\0", None),  # no job: an account alone bills nothing
])
def test_the_slurm_account_is_read_and_hostile_values_are_refused(tmp_path, env, expected) -> None:
    write_proc(tmp_path, 40, cgroup="0::/user.slice\n", environ=env)
    assert process_job(40, tmp_path).account == expected


def test_a_process_owner_comes_from_its_status_file(tmp_path) -> None:
    """The real uid of ``Uid:`` names the owner; a uid without a passwd entry stays its number; garbage is unknown."""
    root = pwd.getpwuid(0).pw_name
    for pid, status in ((50, "Name:\tpython\nUid:\t0\t0\t0\t0\n"), (51, "Uid:\t3999999999\t0\t0\t0\n"),
                        (52, "Uid:\t\x1b[2J\t0\n"), (53, None)):
        write_proc(tmp_path, pid, cgroup="")
        if status is not None:
            (tmp_path / str(pid) / "status").write_text(status)
    assert [process_job(pid, tmp_path).owner for pid in (50, 51, 52, 53)] == [root, "3999999999", None, None]


def test_job_holders_carry_user_and_account_process_holders_their_owner_pods_neither() -> None:
    jobs = {10: ProcessJob(job_id="5101", user="alice", account="physics", owner="alice"),
            11: ProcessJob(job_id="5102", owner="bob"),  # no SLURM_JOB_USER readable: the owner is the user
            12: ProcessJob(owner="carol"), 13: ProcessJob(owner="dave")}
    pods = {13: type("Pod", (), {"namespace": "ml", "pod": "p", "container": "c"})()}
    holders = {h.key: h for h in gpu_holders((), [10, 11, 12, 13], pod_of=pods.get, job_of=jobs.get)}
    assert {k: (h.user, h.account) for k, h in holders.items()} == {
        "job:5101": ("alice", "physics"), "job:5102": ("bob", None), "pid:12": ("carol", None),
        "ml/p/c": (None, None)}
    # A plain job id (what callers gave before) still makes a job holder, with nothing to bill it to.
    (only,) = gpu_holders((), [10], pod_of=lambda pid: None, job_of={10: "77"}.get)
    assert (only.key, only.user, only.account) == ("job:77", None, None)


@pytest.mark.slow
def test_real_slurm_jobs_sharing_a_gpu_bill_their_users_and_accounts() -> None:
    """Two real children with Slurm's environment of two jobs and a plain one on one GPU, through the real /proc."""
    code = "import time; time.sleep(60)"
    plain_env = {k: v for k, v in clean_env().items() if not k.startswith("SLURM_")}
    children = [subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True) for env in (
        clean_env(SLURM_JOB_ID="5101", SLURM_JOB_USER="alice", SLURM_JOB_ACCOUNT="physics"),
        clean_env(SLURM_JOB_ID="5102", SLURM_JOB_USER="bob", SLURM_JOB_ACCOUNT="chem"), plain_env)]
    try:
        pids = [c.pid for c in children]
        facts = LocalHost().facts("0", pids, 0.0)
        who = facts.attribution
        assert who is not None and (who.job_id, who.user, who.account) == ("5101", "alice", "physics")
        holders = {h.key: (h.user, h.account) for h in who.holders or ()}
        assert holders == {"job:5101": ("alice", "physics"), "job:5102": ("bob", "chem"),
                           f"pid:{pids[2]}": (getpass.getuser(), None)}
    finally:
        for child in children:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


@pytest.fixture(scope="module")
def slurm_node() -> dict[str, list]:
    """The ``shared`` scenario's ``slurm-node`` after 70 cycles (bob's whole window without SM time)."""
    clock = Clock()
    collector = cycled(VirtualBackend("shared", node="slurm-node", clock=clock), 70, clock, analyzer=LiveClassifier())
    return {"holders": holders_by_key(collector, "0"), "series": scrape(collector), "snapshot": collector.snapshot}


def test_top_and_the_status_page_name_who_each_slurm_holder_bills_to(slurm_node) -> None:
    """A Slurm job sharing a GPU is billed to its user and account: top's SHARED GPUS line and the status page's
    owner line say whose it is (before, top showed the job key alone and the page the bare job id)."""
    from prometheus_client import generate_latest

    from agent.views.status_page import status_page
    from agent.views.top_source import parse_exposition
    from agent.views.top_holders import holder_line
    from exporters.prometheus import ExpositionCache
    from exporters.snapshot_json import snapshot_to_dict

    snapshot = slurm_node["snapshot"]
    text = ExpositionCache(lambda: snapshot).render(generate_latest, "text/plain").decode()
    rows = {row.holder: row for row in parse_exposition(text, "http://n:9477/metrics", fetched_at=0.0).holders}
    alice = holder_line(rows["job:5101"], 200).plain
    assert "job:5101  slurm  user alice · acct physics  SM " in alice, alice
    assert "user bob · acct chem" in holder_line(rows["job:5102"], 200).plain
    page = status_page(snapshot_to_dict(snapshot))
    assert "shared by <b>2</b>: job 5101 (alice, physics), job 5102 (bob, chem)" in page


def test_holder_info_names_each_jobs_user_and_account(slurm_node) -> None:
    info = {s.labels["holder"]: s.labels for s in slurm_node["series"]["roofwatch_gpu_holder_info"]}
    assert {k: (v.get("user"), v.get("account"), v["via"]) for k, v in info.items()} == {
        "job:5101": ("alice", "physics", "slurm"), "job:5102": ("bob", "chem", "slurm")}
    (whole,) = [s.labels for s in slurm_node["series"]["roofwatch_gpu_job_info"] if s.labels["gpu"] == "1"]
    assert (whole["job_id"], whole["user"], whole["account"]) == ("5103", "carol", "bio")


def test_the_mfu_series_exists_only_for_a_holder_with_its_own_report(slurm_node) -> None:
    mfu = {s.labels["holder"]: (s.labels["gpu"], s.value) for s in slurm_node["series"]["roofwatch_gpu_holder_mfu_ratio"]}
    assert mfu == {"job:5101": ("0", pytest.approx(0.4, abs=1e-9))}, "alice reports 40%; bob nothing; GPU 1 is whole"
    assert slurm_node["holders"]["job:5102"].verdict == "idle_held"


def test_a_whole_gpu_node_has_no_holder_mfu_series() -> None:
    series = scrape(run_collector("demo", 3))
    assert "roofwatch_gpu_holder_mfu_ratio" not in series and "roofwatch_gpu_holder_info" not in series
    assert "roofwatch_gpu_power_watts" in series, "the scrape itself worked"


@pytest.mark.parametrize("spec", [
    {"via": "slurm", "share": 0.5, "mem_gib": 1},  # a Slurm holder names its job
    {"via": "slurm", "job": "1", "pod": "p", "namespace": "n", "share": 0.5, "mem_gib": 1},
    {"via": "time-slicing", "pod": "p", "namespace": "n", "user": "alice", "share": 0.5, "mem_gib": 1},
    {"via": "slurm", "job": "1", "mfu": 1.5, "share": 0.5, "mem_gib": 1},
])
def test_a_scenario_holder_that_mixes_kinds_is_refused(spec) -> None:
    HolderSpec(via="slurm", job="1", user="alice", account="physics", share=0.5, mem_gib=1, mfu=0.4)  # the right way
    with pytest.raises(ValidationError):
        HolderSpec(**spec)


class _HostileJobs(_SharedBackend):
    """One GPU shared by two Slurm jobs whose user and account are 10 kB of hostile text (a holder the virtual
    fleet or a future source builds without slurm.py's checks), and a whole-GPU account alike."""

    def sample(self, gpu: str, now: float) -> GpuSample:
        holders = tuple(Holder(kind="job", via="slurm", job_id=str(i), user=f"{self.HOSTILE}{i}",
                               account=f"{self.HOSTILE}{i}", pids=(10 + i,)) for i in range(2))
        sample = super().sample(gpu, now)
        return dataclasses.replace(sample, attribution=Attribution(job_id="1", account=self.HOSTILE, holders=holders))


def test_hostile_users_and_accounts_are_clipped_in_metrics_and_json() -> None:
    from exporters.snapshot_json import snapshot_to_dict

    collector = cycled(_HostileJobs(), 3, Clock())
    series = scrape(collector)
    info = [s.labels for s in series["roofwatch_gpu_holder_info"]]
    assert len(info) == 2 and {len(labels[k]) for labels in info for k in ("user", "account")} == {128}
    (job,) = [s.labels for s in series["roofwatch_gpu_job_info"]]
    assert len(job["account"]) == 128
    device = snapshot_to_dict(collector.snapshot)["devices"][0]
    assert {len(h["holder"][k]) for h in device["holders"][:2] for k in ("user", "account")} == {128}
    assert len(device["sample"]["attribution"]["account"]) == 128
