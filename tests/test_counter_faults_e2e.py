"""Counter wraps and resets against the real agent process.

The agent runs ``roofwatch run --backend nvml`` (the real NVML backend over the fake driver, as in
tests/test_driver_wait.py) with its sysfs root on a fixture tree holding one InfiniBand port.
The test rewrites the port's counter files under the running agent, as the HCA would: a 32-bit
wrap of ``port_xmit_data`` and then a reset (driver reload, ``perfquery -R``). The exported
totals must grow by exactly the traffic in between, and never go back or jump by 2^32 words.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import clean_env, http_get, poll, roofwatch_cmd
from tests.prometheus_server import free_port
from tests.test_driver_wait import LATE_DRIVER
from tests.test_infiniband import Sysfs

pytestmark = pytest.mark.slow


def _nic_bytes(url: str) -> dict[str, float]:
    status, body = http_get(url + "metrics")
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "roofwatch_nic_bytes":
            return {s.labels["direction"]: s.value for s in family.samples
                    if s.name == "roofwatch_nic_bytes_total" and s.labels["device"] == "mlx5_0"}
    return {}


def test_a_wrap_and_a_reset_of_infiniband_counters_under_the_running_agent(tmp_path):
    sysfs = Sysfs(tmp_path / "sys")
    marker = tmp_path / "driver"
    marker.touch()  # the driver is there from the start
    sysfs.counters("mlx5_0", port_xmit_data=2**32 - 1000, port_rcv_data=5_000)
    sysfs.counters("mlx5_1", port_xmit_data=0, port_rcv_data=0)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = clean_env(ROOFWATCH_TEST_DRIVER_MARKER=str(marker), ROOFWATCH_SYSFS_ROOT=str(sysfs.root),
                    PYTHONPATH=os.pathsep.join([str(LATE_DRIVER), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.Popen(roofwatch_cmd("run", "--backend", "nvml", "--listen", f"127.0.0.1:{port}", "--interval", "0.2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert poll(lambda: _nic_bytes(url), 30, what="the port's totals") == {"tx": 0.0, "rx": 0.0}

        sysfs.counters("mlx5_0", port_xmit_data=1_000, port_rcv_data=5_500)  # tx wrapped past 2^32
        # Both files changed (the agent may read between the two writes; it then catches up).
        wrapped = poll(lambda: (b := _nic_bytes(url)) and b["tx"] > 0 and b["rx"] > 0 and b, 10,
                       what="traffic across the wrap")
        assert wrapped == {"tx": 2_000 * 4.0, "rx": 500 * 4.0}, "4-octet words, 2000 of them across the wrap"

        sysfs.counters("mlx5_0", port_xmit_data=10, port_rcv_data=20)  # both reset (driver reload)
        reset = poll(lambda: (b := _nic_bytes(url)) and b["tx"] > wrapped["tx"] and b["rx"] > wrapped["rx"] and b, 10,
                     what="traffic after the reset")
        assert reset == {"tx": 8_000 + 10 * 4.0, "rx": 2_000 + 20 * 4.0}, "what counted since the reset"

        sysfs.counters("mlx5_0", port_xmit_data=110, port_rcv_data=20)
        later = poll(lambda: (b := _nic_bytes(url)) and b["tx"] > reset["tx"] and b, 10, what="more traffic")
        assert later == {"tx": reset["tx"] + 400, "rx": reset["rx"]}
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
