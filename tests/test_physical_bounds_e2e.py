"""Absurd readings and flapping energy counters against the real agent process (issue 42, findings 6 and 7).

``roofwatch run`` reads a stand-in exporter on loopback (tests/dcgm_exporter_server.py) as it reads a node's
exporter: AMD's Device Metrics Exporter serving 1e308 W, -1e308 and 1e308 °C, 1e308 ECC errors and a 1e308 MHz
clock (which became ``sm_clock_hertz +Inf``), and a dcgm-exporter whose energy counter and power switch units
between scrapes (mJ read as J and back, W and mW: the total grew ~1e11 J every 2 s). /metrics must leave the
values out, stay valid for promtool, count them in ``roofwatch_source_rejected_values_total``, and the energy
total may grow by no more than the board can draw. ``roofwatch doctor`` names each value with its GPU and bound.
"""

from __future__ import annotations

import math
import subprocess
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.model.bounds import ENERGY_FIRST_READ_AGE_S, ENERGY_STEP_MARGIN, POWER_OVER_REFERENCE
from tests import amd_exporter_fixtures as fx
from tests.agent_process import gauge_values, poll
from tests.dcgm_exporter_server import FakeExporter, fixture, set_value
from tests.helm_chart import promtool
from tests.test_amd_exporter_doctor import doctor
from tests.test_amd_exporter_hostile_e2e import agent, metrics

pytestmark = pytest.mark.slow

A100_TDP_W = 400.0
"""The catalogue's A100 SXM4 80GB (the dcgm-exporter fixture's boards; it serves no power limit)."""


def rejected(text: str) -> dict[tuple[str, str], float]:
    return {(s.labels["source"], s.labels["field"]): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "roofwatch_source_rejected_values_total"}


def energy_totals(text: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == "roofwatch_gpu_energy_joules_total"}


def absurd_amd_body() -> str:
    """The MI300X SPX fixture with GPU 0's power, temperatures, ECC count and clocks past any GPU, and GPU 1's
    junction temperature at -1e308; every other reading as the fixture has it."""
    body = fx.FILES["mi300x-spx-no-profiler.prom"]()
    for name, value in (("gpu_package_power", "1e308"), ("gpu_junction_temperature", "1e308"),
                        ("gpu_memory_temperature", "-1e308"), ("gpu_ecc_uncorrect_total", "1e308")):
        body = fx.set_value(body, name, 0, value)
    for xcc in range(8):
        body = fx.set_value(body, "gpu_clock", 0, "1e308", clock_index=str(xcc))
    return fx.set_value(body, "gpu_junction_temperature", 1, "-1e308")


def test_an_amd_exporter_serving_absurd_values_is_exported_without_them_and_counted(tmp_path):
    fields = {"power_w", "temperature_c", "memory_temperature_c", "ecc_uncorrected_errors", "sm_clock_mhz"}
    with FakeExporter(absurd_amd_body()) as exporter, \
            agent(tmp_path / "agent.log", "run", "--backend", "amd-exporter", "--amd-exporter-url",
                  exporter.url) as (_, url):
        reads = exporter.requests
        text = poll(lambda: exporter.requests >= reads + 5 and (t := metrics(url))
                    and len(gauge_values(t, "roofwatch_gpu_engine_active_ratio")) == 8 and t, 40,
                    what="five more reads of the exposition and every GPU's activity exported")
    assert gauge_values(text, "roofwatch_gpu_up") == {str(g): 1.0 for g in range(8)}, "GPU 0 stays up"
    for name in ("roofwatch_gpu_power_watts", "roofwatch_gpu_temperature_celsius",
                 "roofwatch_gpu_memory_temperature_celsius", "roofwatch_gpu_sm_clock_hertz"):
        values = gauge_values(text, name)
        assert "0" not in values and len(values) >= 6, (name, values)
    assert gauge_values(text, "roofwatch_gpu_power_watts")["1"] == fx.GEMM[7]
    assert "1" not in gauge_values(text, "roofwatch_gpu_temperature_celsius")  # -1e308 °C
    assert gauge_values(text, "roofwatch_gpu_memory_temperature_celsius")["1"] == 59.0
    ecc = {s.labels["gpu"] for fam in text_string_to_metric_families(text) for s in fam.samples
           if s.name == "roofwatch_gpu_ecc_errors_total"}
    assert "0" not in ecc and "1" in ecc
    values = [s.value for fam in text_string_to_metric_families(text) for s in fam.samples]
    assert all(math.isfinite(v) and abs(v) < 1e18 for v in values), "a value past any GPU's reached /metrics"
    counts = rejected(text)
    assert set(counts) == {("amd-exporter", f) for f in fields}
    assert counts[("amd-exporter", "temperature_c")] >= 2 * counts[("amd-exporter", "sm_clock_mhz")] - 1  # 2 GPUs
    check = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check.stdout + check.stderr


def test_doctor_names_each_absurd_reading_with_its_gpu_value_and_bound():
    done = doctor("", absurd_amd_body())
    assert done.returncode == 3, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("WARN physical bounds")]
    assert len(lines) == 6, done.stdout
    power = next(line for line in lines if "power_w" in line)
    assert "[GPU 0]" in power and "amd-exporter reports power_w = 1e+308" in power
    assert "outside 0..2250 W: 3 x the board's 750 W TDP" in power  # the catalogue's MI300X
    cold = next(line for line in lines if "[GPU 1]" in line)
    assert "temperature_c = -1e+308, outside -40..150 °C" in cold
    assert any("sm_clock_mhz = 1e+308, outside 0..10000 MHz" in line for line in lines)


def flapping(body: str, started: float, flipped: bool) -> str:
    """The fixture's 8 GPUs drawing their fixture power since ``started`` into their energy counters (mJ) honestly,
    or with the units switched: the counter in J (read as mJ), the power in mW (read as W)."""
    for fam in text_string_to_metric_families(body):
        if fam.name == "DCGM_FI_DEV_POWER_USAGE":
            watts = {s.labels["gpu"]: s.value for s in fam.samples}
        if fam.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
            millijoules = {s.labels["gpu"]: s.value for s in fam.samples}
    elapsed = time.monotonic() - started
    for gpu, power in watts.items():
        energy = millijoules[gpu] + power * elapsed * 1000
        body = set_value(body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu,
                         f"{energy / 1000 if flipped else energy:.0f}")
        body = set_value(body, "DCGM_FI_DEV_POWER_USAGE", gpu, f"{power * 1000 if flipped else power:.1f}")
    return body


def test_a_dcgm_exporter_flipping_units_grows_the_energy_total_no_more_than_the_boards_can_draw(tmp_path):
    base, stop, started = fixture("a100-8x-pods.prom"), threading.Event(), time.monotonic()
    with FakeExporter(flapping(base, started, False)) as exporter:
        def flip() -> None:  # two honest bodies, then one with the units switched, every 0.3 s
            step = 0
            while not stop.wait(0.3):
                step += 1
                exporter.set_body(flapping(base, started, flipped=step % 3 == 2))

        flipper = threading.Thread(target=flip, daemon=True)
        flipper.start()
        try:
            with agent(tmp_path / "agent.log", "run", "--backend", "dcgm-exporter", "--dcgm-exporter-url",
                       exporter.url, ROOFWATCH_DCGM_EXPORTER_INTERVAL_S="0.2") as (_, url):
                agent_started, reads, powers = time.monotonic(), exporter.requests, []

                def settled() -> str | None:
                    text = metrics(url)
                    powers.extend(gauge_values(text, "roofwatch_gpu_power_watts").values())
                    energy = energy_totals(text)
                    return text if exporter.requests >= reads + 40 and len(energy) == 8 else None

                text = poll(settled, 60, interval=0.2, what="forty reads of the flipping exporter")
                elapsed = time.monotonic() - agent_started
        finally:
            stop.set()
            flipper.join(5)
    most = A100_TDP_W * ENERGY_STEP_MARGIN * (elapsed + ENERGY_FIRST_READ_AGE_S)
    energy = energy_totals(text)
    assert all(joules <= most for joules in energy.values()), (energy, most)
    assert powers and max(powers) <= A100_TDP_W * POWER_OVER_REFERENCE, "a power in mW was exported as W"
    counts = rejected(text)
    assert counts[("dcgm-exporter", "energy_j_step")] >= 8 and counts[("dcgm-exporter", "power_w")] >= 8, counts
    assert min(energy.values()) > 0, "the honest steps between the flips are still counted"
