"""The job-side client across processes: a real child is matched to its GPU by its peer PID, the
``agent/client/`` folder copied alone into a job (as ``roofwatch_client/``, no ``agent`` package,
no site-packages) still reports and is matched through its device hints, and a forked child
starts clean without re-sending its parent's queue."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.agent_process import poll
from tests.report_fixtures import UUID_A, UUID_B, short_dir  # noqa: F401 (fixtures)
from tests.test_client import agent_socket, clean_environment, reporters  # noqa: F401 (fixtures)
from tests.test_client import settled

REPO = Path(__file__).resolve().parents[1]


CHILD_SCRIPT = textwrap.dedent("""
    import json, sys
    from agent.client import get_reporter, report
    for step in range(3):
        report(step_time_s=0.25, tokens=4096, flops_per_token=1e9, dtype="bf16", step=step)
    if "--flush" in sys.argv:
        get_reporter().flush(5.0)
        print(json.dumps({"stats": get_reporter().stats(), "pydantic": "pydantic" in sys.modules,
                          "site": "site" in sys.modules,
                          "agent": sorted(m for m in sys.modules if m == "agent" or m.startswith("agent."))}))
    # otherwise exit at once: the client's atexit hook delivers what is queued
""")


@pytest.mark.slow
def test_real_child_process_is_matched_by_its_peer_pid(agent_socket):
    path, store = agent_socket()
    env = {**os.environ, "ROOFWATCH_REPORT_SOCKET": str(path), "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CHILD_SCRIPT], cwd=REPO, env=env)
    assert child.wait(30) == 0

    def found():
        return store.report_for(gpu="0", uuid=None, pids=[4, child.pid], now=store._clock())

    report = poll(lambda: found() if found() and found().step == 2 else None, 5.0, what="the child's last report")
    assert report.tokens_per_s == pytest.approx(4096 / 0.25) and report.source == "client"
    assert {b["pid"] for b in store.bodies} == {child.pid}
    assert store.report_for(gpu="0", uuid=None, pids=[os.getpid()], now=store._clock()) is None


@pytest.mark.slow
def test_standalone_copy_in_a_container_like_child_is_matched_by_uuid(agent_socket, short_dir):
    """The client folder copied alone under another name, as the docs suggest (no ``agent`` package, no
    site-packages at all), in a child whose PID the agent does not see among the GPU's."""
    path, store = agent_socket()
    job = short_dir / "job"
    shutil.copytree(REPO / "agent" / "client", job / "roofwatch_client", ignore=shutil.ignore_patterns("__pycache__"))
    script = CHILD_SCRIPT.replace("from agent.client import", "from roofwatch_client import")
    env = {"PATH": os.environ.get("PATH", ""), "ROOFWATCH_REPORT_SOCKET": str(path),
           "CUDA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}", "LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}
    result = subprocess.run([sys.executable, "-S", "-c", script, "--flush"], cwd=job, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["stats"]["sent"] == 3 and out["stats"]["dropped"] == 0
    assert out["pydantic"] is False and out["site"] is False  # really nothing but the standard library
    assert out["agent"] == []  # relative imports only: nothing reached for an ``agent`` package
    # GPU 1 (UUID_B) lists processes that are not the child: it is found through CUDA_VISIBLE_DEVICES + LOCAL_RANK.
    report = store.report_for(gpu="1", uuid=UUID_B, pids=[1, 2, 3], now=store._clock())
    assert report is not None and report.step == 2 and (report.rank, report.world_size) == (1, 2)
    assert store.report_for(gpu="0", uuid=UUID_A, pids=[1, 2, 3], now=store._clock()) is None


def test_fork_child_starts_clean_and_parent_counts_stay_right(agent_socket, reporters):
    path, store = agent_socket(gate_step=0)
    parent = reporters(socket_path=str(path), timeout_s=20.0)
    for step in range(5):
        parent.report(step=step, tokens_per_s=1.0)
    # Step 0 is in flight (held by the agent) and steps 1-4 wait in the parent's queue.
    poll(lambda: store.waiting.is_set(), 5.0, what="step 0 to reach the agent")
    assert parent.stats()["queued"] == 5
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(read_end)
            before = parent.stats()
            parent.report(step=100, tokens_per_s=2.0)
            flushed = parent.flush(10.0)
            os.write(write_end, json.dumps({"before": before, "after": parent.stats(), "flushed": flushed}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    child = json.loads(b"".join(chunks))
    assert child["flushed"] is True
    assert child["before"] == {"sent": 0, "dropped": 0, "failed": 0, "invalid": 0, "queued": 0, "connects": 0}
    assert child["after"]["sent"] == 1 and child["after"]["connects"] == 1
    store.gate.set()
    stats = poll(lambda: settled(parent, 5), 10.0, what="the parent's reports")
    assert stats["sent"] == 5 and stats["failed"] == 0 and stats["dropped"] == 0
    # Nothing was sent twice: the child did not inherit the parent's queue.
    assert sorted(b["step"] for b in store.bodies) == [0, 1, 2, 3, 4, 100]
    assert [b["pid"] for b in store.bodies if b["step"] == 100] == [pid]
    now = store._clock()
    assert store.report_for(gpu="0", uuid=None, pids=[pid], now=now).step == 100
    assert store.report_for(gpu="0", uuid=None, pids=[os.getpid()], now=now).step == 4
