"""Hostile neighbours, all at once, against real agent processes (the rig: benchmarks/neighbours_load.py).

Three agents behind basic auth: ``run --backend nvml`` over the fake driver, ``run --backend amd-exporter`` and
``run --backend amd-virtual`` joined to the same AMD exporter. Their neighbours: a dcgm-exporter dripping its
answer; one dripping, one label-bombing and four honest inference servers; an OTLP collector answering push
after push with 1.5 GiB of body, a redirect, dripped headers, a dripped body and a 401 quoting the token back;
an AMD Device Metrics Exporter serving 1e308 and -1e308 readings, a ``link_index="²"`` line and a huge
``/gpumetrics``; 70 slow connections on the report socket; a SIGHUP after the web config was emptied and one
after the settings file became a YAML alias bomb. Credentials are planted everywhere the settings take one.

Meanwhile every honest scrape of every agent and every honest report is answered, the four honest servers
keep their serving figures, basic auth stays on, each agent's memory stays under the unit's 256 MiB, no
value past a GPU's physical bounds reaches an AMD agent's /metrics (they are counted instead), the pushes
are counted as failures, no planted credential shows in any log or page, and threads return to their
baseline. Latencies are printed here and measured by ``python -m benchmarks.hostile --neighbours``, never
asserted.
"""

from __future__ import annotations

import shutil

import pytest

from benchmarks.neighbour_parties import API_KEY, OTLP_TOKEN, PLANTED, counter
from benchmarks.neighbours_load import COLLECTOR_MODES, HONEST_SERVERS, Neighbourhood, attack, workdir
from tests.agent_process import poll

pytestmark = pytest.mark.slow

SECONDS = 24.0
"""Longer than the report socket's 10 s header deadline, a few of each neighbour's 2 s deadlines and four
rounds of the collector's five answers."""
MEMORY_MAX_MIB = 256
PAGES = ("/metrics", "/api/v1/snapshot", "/")


@pytest.fixture
def hood():
    directory = workdir()
    try:
        hood = Neighbourhood(directory)  # ends what it started if an agent does not start
        try:
            poll(hood.ready, 60, interval=0.5, what="every agent serving with the password, the honest servers' "
                 "serving figures and every AMD GPU")
            yield hood
        finally:
            hood.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_hostile_neighbours_cost_the_agents_nothing_they_promise(hood: Neighbourhood) -> None:
    threads = hood.threads()
    seen = attack(hood, SECONDS)
    print()
    for name, latencies in seen.scrape_latencies.items():
        latencies = sorted(latencies)
        print(f"  {name}: {len(latencies)} honest scrapes: p50 {latencies[len(latencies) // 2] * 1e3:.1f} ms, max "
              f"{latencies[-1] * 1e3:.1f} ms; peak RSS {max(seen.rss_mib[name]):.1f} MiB; threads {threads[name]} "
              f"-> peak {max(seen.threads[name])}")
    print(f"  {len(seen.reports)} reports; collector answered {len(hood.collector.served)} pushes")

    # every honest party answered, through both SIGHUPs, and auth stayed on
    assert not seen.scrape_failures, seen.scrape_failures[:5]
    for agent in hood.agents:
        assert len(seen.scrape_latencies[agent.name]) >= SECONDS - 4, f"the scrapers of {agent.name} ran throughout"
        assert set(seen.unauthenticated[agent.name]) == {401}, f"basic auth stayed on in {agent.name}"
        assert max(seen.rss_mib[agent.name]) < MEMORY_MAX_MIB, agent.name
        assert agent.peak_rss_mib() < MEMORY_MAX_MIB, f"{agent.name}'s peak, start-up included"
        assert agent.proc.poll() is None and agent.get()[0] == 200
    assert seen.reports and set(seen.reports) == {"204"}, seen.reports
    assert len(seen.reports) >= SECONDS, "the job reported the whole time"
    assert seen.report_without_token == ["401"], "the report token was in force"
    assert set(seen.honest_servers_seen) == {HONEST_SERVERS}, "the four honest servers kept their figures"

    reloads = seen.reload_logged.splitlines()
    assert any("reload failed" in line and "empty" in line for line in reloads), seen.reload_logged
    assert any("reload failed" in line and "alias bomb" in line and str(hood.config) in line
               for line in reloads), seen.reload_logged

    # the label bomb: refused in one line, beside the honest servers' figures
    nvml_log = hood.agent.log.read_text()
    bomb_lines = [line for line in nvml_log.splitlines() if "refused past the label bounds" in line]
    assert len(bomb_lines) == 1 and "model_name" in bomb_lines[0], bomb_lines

    # the OTLP pushes: each mode answered, none but the 200s counted as delivered, the planted headers sent
    text = hood.scrape()[1]
    served = hood.collector.served
    assert set(served) == set(COLLECTOR_MODES), served
    delivered = counter(text, "roofwatch_otlp_exports_total", outcome="success") + \
        counter(text, "roofwatch_otlp_exports_total", outcome="partial")
    assert delivered <= served.count("huge"), (delivered, served)
    assert counter(text, "roofwatch_otlp_exports_total", outcome="failure") >= len(COLLECTOR_MODES) - 1
    assert hood.collector.requests[0]["authorization"] == f"Bearer {OTLP_TOKEN}"
    assert hood.collector.requests[0]["x-api-key"] == API_KEY
    otlp_lines = [line for line in nvml_log.splitlines() if "logger=roofwatch.otlp" in line]
    assert any("OTLP push failed" in line and "redirected (307) to https://<hidden>@127.0.0.1:9/" in line
               for line in otlp_lines), otlp_lines
    assert nvml_log.count("answer was longer than 16 KiB") == 1, "said once, not once per push"

    # the AMD exporter's absurd values: never in /metrics, counted or skipped; no GPU marked down for them
    assert not seen.absurd, seen.absurd[:5]
    for name, ups in seen.gpus_up.items():
        assert all(up >= {str(g) for g in range(7)} for up in ups), f"{name} marked a GPU down"
    amd_text = hood.amd_exporter.get()[1]
    rejected = {field for field in ("power_w", "temperature_c", "memory_temperature_c", "sm_clock_mhz",
                                    "ecc_uncorrected_errors")
                if counter(amd_text, "roofwatch_source_rejected_values_total", source="amd-exporter", field=field)}
    assert rejected == {"power_w", "temperature_c", "memory_temperature_c", "sm_clock_mhz",
                        "ecc_uncorrected_errors"}, rejected
    skipped = [line for line in hood.amd_exporter.log.read_text().splitlines() if "unreadable line(s) skipped" in line]
    assert len(skipped) == 1 and "gpu_total_vram" in skipped[0], skipped
    assert hood.dme.asked("/gpumetrics") >= 2, "the join read /gpumetrics at start and again when a GPU left"
    assert "/gpumetrics unusable" in hood.amd_join.log.read_text()

    # no planted credential in any output
    assert not seen.secrets_shown, seen.secrets_shown
    for agent in hood.agents:
        outputs = {path: agent.get(path)[1] for path in PAGES}
        outputs["stderr"] = agent.log.read_text()
        assert "Traceback" not in outputs["stderr"], outputs["stderr"][-3000:]
        for where, shown in outputs.items():
            for secret in PLANTED:
                assert secret not in shown, f"{secret} in {agent.name} {where}"

    for name, before in threads.items():
        agent = next(a for a in hood.agents if a.name == name)
        poll(lambda: agent.threads() <= before, 30, what=f"the {name} agent back to its {before} threads")
