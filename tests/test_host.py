"""The host side of a sample on the real host: a real child process, real /proc, a PSI fixture."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from agent.context.local_host import LocalHost
from agent.context.host.node_stats import read_pressure
from tests.agent_process import poll

BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


@pytest.mark.slow
def test_names_a_process_and_measures_the_cpu_of_it_and_its_children():
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               f"c = subprocess.Popen([sys.executable, '-c', {BUSY!r}])\n"
                               "time.sleep(30)\n"], start_new_session=True)
    try:
        host = LocalHost()
        first = host.facts("0", [parent.pid], 0.0).processes[parent.pid]
        assert first.name and first.name.startswith("python") and first.cpu_cores is None  # no baseline yet
        # The busy child burns about one core; the sleeping parent almost nothing.
        def busy() -> float | None:
            cores = host.facts("0", [parent.pid], 0.0).processes[parent.pid].cpu_cores
            return cores if cores and cores > 0.3 else None

        cores = poll(busy, 15, interval=0.3, what="child CPU")
        assert 0.3 < cores < 1.6
        again = host.facts("1", [parent.pid], 0.0).processes[parent.pid]  # the same process on a second GPU
        assert again.cpu_cores == cores
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the busy child too
        parent.wait()


def test_a_process_that_is_gone_or_invisible_has_no_facts():
    host = LocalHost()
    facts = host.facts("0", [2**22 + 12345], 0.0)
    assert facts.processes[2**22 + 12345].name is None


def test_io_pressure_is_read_from_psi_some_avg10(tmp_path):
    psi = tmp_path / "io"
    psi.write_text("some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=5.00 avg60=1.00 avg300=0.50 total=45\n")
    assert read_pressure(psi) == 0.125
    assert read_pressure(tmp_path / "missing") is None
    psi.write_text("garbage\n")
    assert read_pressure(psi) is None
