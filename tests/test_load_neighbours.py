"""Hostile neighbours, all at once, against a real agent process (the rig: benchmarks/neighbours_load.py).

A dcgm-exporter dripping its answer, one dripping and four honest inference servers, 70 slow connections
on the report socket, and a SIGHUP after the web config was emptied. Meanwhile every honest scrape and
every honest report is answered, the four honest servers keep their serving figures, basic auth stays on,
memory stays under the unit's 256 MiB, and the threads return to their baseline. Latencies are printed
here and measured by ``python -m benchmarks.hostile --neighbours``, never asserted.
"""

from __future__ import annotations

import shutil

import pytest

from benchmarks.neighbours_load import HONEST_SERVERS, Neighbourhood, attack, workdir
from tests.agent_process import poll

pytestmark = pytest.mark.slow

SECONDS = 24.0
"""Longer than the report socket's 10 s header deadline and a few of each neighbour's 2 s deadlines."""
MEMORY_MAX_MIB = 256


@pytest.fixture
def hood():
    directory = workdir()
    hood = Neighbourhood(directory)
    try:
        poll(lambda: hood.scrape()[0] == 200, 30, what="the agent serving with the password")
        poll(lambda: hood.honest_servers_in(hood.scrape()[1]) == HONEST_SERVERS, 30,
             what="the honest inference servers' serving figures")
        yield hood
    finally:
        hood.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_hostile_neighbours_cost_the_agent_nothing_it_promises(hood: Neighbourhood) -> None:
    threads = hood.threads()
    seen = attack(hood, SECONDS)
    latencies = sorted(seen.scrape_latencies)
    print(f"\n  {len(latencies)} honest scrapes: p50 {latencies[len(latencies) // 2] * 1e3:.1f} ms, "
          f"max {latencies[-1] * 1e3:.1f} ms; {len(seen.reports)} reports; peak RSS {max(seen.rss_mib):.1f} MiB; "
          f"threads {threads} -> peak {max(seen.threads)}")
    assert not seen.scrape_failures, seen.scrape_failures[:5]
    assert len(latencies) >= SECONDS - 4, "the scrapers ran for the whole attack"
    assert set(seen.unauthenticated) == {401}, "basic auth stayed on, through the SIGHUP with an empty web config"
    assert "reload failed" in seen.reload_logged and "empty" in seen.reload_logged, seen.reload_logged
    assert seen.reports and set(seen.reports) == {"204"}, seen.reports
    assert len(seen.reports) >= SECONDS, "the job reported the whole time"
    assert set(seen.honest_servers_seen) == {HONEST_SERVERS}, "the four honest servers kept their figures"
    assert max(seen.rss_mib) < MEMORY_MAX_MIB
    poll(lambda: hood.threads() <= threads, 30, what=f"the agent back to its {threads} threads")
    assert hood.proc.poll() is None and hood.scrape()[0] == 200
