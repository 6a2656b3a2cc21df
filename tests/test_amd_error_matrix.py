"""Every amdsmi call the AMD backend makes each interval, failing with each status class, through
the real backend and collector over the real amdsmi package and the fake libamd_smi: the failing
GPU gets what the status means (unknown value not asked again, down and re-acquired,
re-initialised, or a read that fails and is retried), the other GPU never notices, nothing
escapes, and the GPU recovers once the library answers again (docs/reliability.md, "A driver
call fails").

The fake returns the forced amdsmi_status_t from the C function; the real package's
``_check_res`` turns it into AmdSmiLibraryException (AmdSmiTimeoutException for TIMEOUT,
AmdSmiRetryException for RETRY), exactly as over libamd_smi.so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agent.backends.amd import AmdBackend
from agent.backends.nvml_virtual import SimulatedHost
from agent.backends.virtual import VirtualBackend
from agent.collector import Backoff, Collector
from agent.virtual.fake_amdsmi import FakeAmdSmiLibrary, load_amdsmi
from agent.virtual.scenario import parse_scenario
from tests.nvml_harness import T0, ManualClock

TABLE, GETTERS, BOTH = "table", "getters", "both"

FROM_TABLE = ("gr_active", "dram_active", "power_w", "sm_clock_mhz", "pcie_bytes_per_s", "pcie_replays", "links",
              "link_rx_bytes_per_s", "link_tx_bytes_per_s", "clock_event_reasons", "energy_j")
"""What only the gpu_metrics table gives: amdsmi computes activity, power, clocks, PCIe, XGMI and the
energy counter from it (its getters copy its fields), so nothing stands in when it fails; only the
temperature has a source of its own (hwmon)."""

CALLS: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    # public amdsmi name: (mode it is read in, a once-a-minute reading?, GpuSample fields it alone feeds)
    "amdsmi_get_gpu_metrics_info": (TABLE, False, FROM_TABLE),
    "amdsmi_get_energy_count": (TABLE, False, ("energy_j",)),  # asked only when the table answered
    "amdsmi_get_gpu_memory_usage": (BOTH, False, ("mem_used_bytes",)),
    "amdsmi_get_gpu_process_list": (BOTH, False, ("processes",)),
    "amdsmi_get_power_cap_info": (BOTH, True, ("power_limit_w",)),
    "amdsmi_get_gpu_total_ecc_count": (BOTH, True, ("ecc_corrected_errors", "ecc_uncorrected_errors")),
    # Where the firmware has no metrics table the temperature still has a source of its own.
    "amdsmi_get_temp_metric": (GETTERS, False, ("temperature_c",)),
}
"""The per-GPU amdsmi calls of one interval, in both reading modes (this file checks the list is complete).
amdsmi_get_gpu_activity, _power_info, _clock_info, _pcie_info and _link_metrics are never asked:
they are the table's fields, copied, and fail (or read N/A) when it does."""
CORE = {"amdsmi_get_gpu_memory_usage"}
"""The device's core reading: when it fails transiently the whole sample fails (the GPU is down)."""

ABSENT, LOST, REINIT, FAILED, NO_DATA = "absent", "lost", "reinit", "failed", "no data"
STATUSES: dict[str, str] = {
    # amdsmi_wrapper.AMDSMI_STATUS_<name>: what it must mean
    "NOT_SUPPORTED": ABSENT,
    "NO_PERM": ABSENT,
    "UNEXPECTED_SIZE": FAILED,  # EIO from sysfs: not now
    "NOT_FOUND": LOST,  # the GPU fell off the bus or was reset: its sysfs / DRM nodes vanished
    "AMDGPU_RESTART_ERR": LOST,
    "NOT_INIT": REINIT,
    "TIMEOUT": FAILED,
    "RETRY": FAILED,
    "BUSY": FAILED,
    "API_FAILED": FAILED,
    "NO_DATA": NO_DATA,  # nothing new: unknown this interval, even for the core reading
    "DRIVER_NOT_LOADED": FAILED,
    "UNKNOWN_ERROR": FAILED,
}

LOST_WHEN_CORE = ("NOT_SUPPORTED", "UNEXPECTED_SIZE")
"""How a lost or resetting GPU's reads fail through amdsmi (its handle outlives it): on the core
reading, which every GPU has, these mean the GPU is lost, not that a reading is absent."""


def expected(symbol: str, status: str) -> str:
    return LOST if symbol in CORE and status in LOST_WHEN_CORE else STATUSES[status]


SLOW_STEP_S = 61.0
"""One step past the backend's once-a-minute refresh of power cap and ECC."""


def scenario(mode: str) -> Any:
    amd = {"not_supported": ["amdsmi_get_gpu_metrics_info"]} if mode == GETTERS else {}
    return parse_scenario({"name": "t", "seed": 11, "nodes": [{
        "name": "n1", "model": "mi300x", "gpus": 2, "amd": amd, "workloads": [
            {"job": "train", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.45, "duration_s": 7200}]},
            {"job": "decode", "gpus": [1], "process": "vllm",
             "phases": [{"kind": "memory", "mbu": 0.6, "duration_s": 7200}]},
        ]}]})


class Rig:
    """Two MI300X behind the fake libamd_smi, the real amdsmi package, AmdBackend and the Collector."""

    def __init__(self, mode: str) -> None:
        self.clock = ManualClock()
        self.virtual = VirtualBackend(scenario(mode), clock=self.clock, start_time=T0 - 100.0)
        self.library = FakeAmdSmiLibrary(self.virtual)
        self.amdsmi = load_amdsmi(self.library)
        self.backend = AmdBackend(self.amdsmi, host=SimulatedHost(self.library), clock=self.clock, wall=self.clock,
                                  sleep=self.clock.advance)
        self.collector = Collector(self.backend, node="n1", clock=self.clock, monotonic=self.clock,
                                   sample_timeout_s=60.0, backoff=Backoff(initial_s=1.0, max_s=4.0))

    def status(self, name: str) -> int:
        return getattr(self.amdsmi.amdsmi_wrapper, f"AMDSMI_STATUS_{name}")

    def cycle(self, seconds: float = 1.0) -> dict[str, Any]:
        self.clock.advance(seconds)
        return {d.info.gpu: d for d in self.collector.collect_once().devices}

    def calls(self, symbol: str, gpu: str | None = "0") -> int:
        return self.library.calls[(gpu, symbol)]

    def close(self) -> None:
        self.collector.stop()
        self.backend.close()
        self.library.close()
        self.virtual.close()


def known(sample: Any) -> set[str]:
    """The readings a sample has a value for."""
    return {f.name for f in dataclasses.fields(sample) if getattr(sample, f.name) is not None}


def fresh(state: Any, now: float) -> bool:
    return state.up and state.sample is not None and state.sample.ts == now


@pytest.fixture
def rig():
    made: list[Rig] = []

    def make(mode: str) -> Rig:
        made.append(Rig(mode))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("symbol", CALLS)
def test_each_call_failing_with_each_status(rig, symbol, status):
    mode, slow, fields = CALLS[symbol]
    meaning = expected(symbol, status)
    r = rig(GETTERS if mode == GETTERS else TABLE)
    for _ in range(3):
        devices = r.cycle()
    assert fresh(devices["0"], r.clock()) and fresh(devices["1"], r.clock())
    full = {gpu: known(devices[gpu].sample) for gpu in ("0", "1")}
    assert set(fields) <= full["0"], f"{symbol} feeds nothing in {mode} mode: the test setup is wrong"
    before = devices["0"].sample
    inits = r.calls("amdsmi_init", None)

    r.library.force_error(symbol, r.status(status), gpu="0")
    calls = [r.calls(symbol)]
    for step in range(4):
        # A slow reading is due once a minute: the first failing cycle is a refresh, then 1 s intervals.
        devices = r.cycle(SLOW_STEP_S if slow and step == 0 else 1.0)  # never raises, whatever amdsmi says
        now = r.clock()
        calls.append(r.calls(symbol))
        other = devices["1"]
        assert fresh(other, now), f"GPU 1 noticed GPU 0's {status}: {other.error}"
        assert full["1"] <= known(other.sample), f"GPU 1 lost {full['1'] - known(other.sample)}"
        failing = devices["0"]
        if not failing.up:  # says why, and is one of the backend's own errors: no amdsmi exception escapes
            assert failing.error.split(":")[0] in ("lost", "DeviceError", "LibraryError"), failing.error
        if meaning == ABSENT:
            assert fresh(failing, now), failing.error
            assert all(getattr(failing.sample, f) is None for f in fields), "absent is unknown, never 0"
            assert full["0"] - set(fields) <= known(failing.sample)
        elif meaning == LOST:
            assert not failing.up and failing.error.startswith("lost:"), failing.error
        elif meaning == REINIT:
            assert not failing.up and "amdsmi not initialised" in failing.error, failing.error
        elif meaning == NO_DATA or meaning == FAILED and symbol not in CORE:
            assert fresh(failing, now), failing.error  # one reading failed, not the device
            for f in fields:  # unknown this interval; a slow reading may keep its last value
                assert getattr(failing.sample, f) in ((None, getattr(before, f)) if slow else (None,)), f
        elif meaning == FAILED:  # the core reading: this sample fails, the device is retried with back-off
            assert not failing.up and "memory failed" in failing.error, failing.error
    if meaning == ABSENT:
        assert calls[-1] == calls[0] + 1, f"asked again after {status}: {calls}"
        reason = "not supported" if status == "NOT_SUPPORTED" else "no permission"
        assert reason in r.backend.devices["0"].absent.values()
    elif meaning == REINIT:
        assert r.calls("amdsmi_init", None) > inits, "NOT_INIT must re-initialise amdsmi"
        assert calls[-1] >= calls[0] + 2, f"not retried: {calls}"
    elif meaning == NO_DATA or meaning == FAILED and symbol not in CORE:
        assert calls == list(range(calls[0], calls[0] + 5)), f"not retried every interval: {calls}"
    else:
        assert calls[-1] >= calls[0] + 2, f"not retried: {calls}"

    r.library.clear_forced_errors()
    handles = r.calls("amdsmi_get_processor_handles")
    for _ in range(12):  # back-off caps at 4 s here
        devices = r.cycle()
        state = devices["0"]
        if fresh(state, r.clock()) and (full["0"] - set(fields) if meaning == ABSENT else full["0"]) <= known(state.sample):
            break
    else:
        pytest.fail(f"GPU 0 did not recover after amdsmi answered again: {devices['0'].error}, "
                    f"missing {full['0'] - known(devices['0'].sample) if devices['0'].sample else 'sample'}")
    assert fresh(devices["1"], r.clock())
    if meaning in (LOST, REINIT):
        assert r.calls("amdsmi_get_processor_handles") > handles, "re-acquired through a fresh enumeration"
    # A minute on: the slow readings are due again; what was absent stays unasked.
    settled = r.calls(symbol)
    devices = r.cycle(SLOW_STEP_S)
    assert fresh(devices["0"], r.clock()) and fresh(devices["1"], r.clock())
    if meaning == ABSENT:
        assert r.calls(symbol) == settled and all(getattr(devices["0"].sample, f) is None for f in fields)
    else:
        assert r.calls(symbol) == settled + 1 and set(fields) <= known(devices["0"].sample)


@pytest.mark.parametrize("mode", [TABLE, GETTERS])
def test_the_matrix_covers_every_call_of_an_interval(rig, mode):
    """Every amdsmi call a GPU makes in a minute of intervals is a row of the matrix, and nothing else."""
    r = rig(mode)
    r.cycle()
    before = r.library.calls.copy()
    r.cycle(SLOW_STEP_S)
    r.cycle()
    made = {symbol for (gpu, symbol), n in r.library.calls.items() if gpu == "0" and n > before.get((gpu, symbol), 0)}
    assert made == {s for s, (m, _, _) in CALLS.items() if m in (mode, BOTH)}


REACQUIRE = ("amdsmi_get_processor_handles", "amdsmi_get_gpu_device_uuid")
"""What a down GPU calls each interval it is retried: a fresh enumeration, then each handle's UUID
(then its core reading; failing that, amdsmi is re-initialised and the same again)."""


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("symbol", REACQUIRE)
def test_each_reacquisition_call_failing_with_each_status(rig, symbol, status):
    """A lost GPU whose re-acquisition fails stays down (it cannot be told from a GPU still gone) and
    comes back once amdsmi answers again; the other GPU never notices."""
    r = rig(TABLE)
    for _ in range(3):
        r.cycle()
    r.library.force_error("amdsmi_get_gpu_metrics_info", r.status("NOT_FOUND"), gpu="0")
    assert not r.cycle()["0"].up
    r.library.clear_forced_errors()
    r.library.force_error(symbol, r.status(status), gpu="0")
    tries = r.calls(symbol)
    # NOT_INIT from the enumeration re-initialises amdsmi, after which every GPU is re-bound through
    # that same enumeration: while it keeps failing no GPU can be, so this one cell is library-wide
    # by nature (amdsmi lists the processors of all sockets in one call); both must still come back.
    library_wide = symbol == "amdsmi_get_processor_handles" and STATUSES[status] == REINIT
    for _ in range(6):
        devices = r.cycle()
        assert not devices["0"].up and devices["0"].error.startswith("lost:"), devices["0"].error
        assert library_wide or fresh(devices["1"], r.clock()), devices["1"].error
    assert r.calls(symbol) > tries, "a down GPU is retried"
    r.library.clear_forced_errors()
    for _ in range(12):  # back-off caps at 4 s here
        devices = r.cycle()
        if fresh(devices["0"], r.clock()) and fresh(devices["1"], r.clock()):
            break
    else:
        pytest.fail(f"not re-acquired after amdsmi answered again: {devices['0'].error} / {devices['1'].error}")
