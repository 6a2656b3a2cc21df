"""Load, end to end: 500 hostile connections for 60 s against the real agent with TLS and basic auth on.

Idle, idle-after-handshake, slowloris, slow-body and pipelining-never-reading clients (the rig is
benchmarks/hostile_load.py, shared with ``./dev.sh bench``), while 8 honest scrapers scrape ``/metrics``
once a second: every honest scrape is answered (its latency is printed here and measured as a benchmark,
``python -m benchmarks.hostile``), the agent stays under the systemd unit's
256 MiB, and once the attackers leave the agent is as before. ``ROOFWATCH_HOSTILE_S`` changes the 60 s.
"""

from __future__ import annotations

import os
import shutil

import pytest

from benchmarks.hostile_load import Agent, percentile, run, workdir
from tests.agent_process import poll

pytestmark = pytest.mark.e2e

SECONDS = float(os.environ.get("ROOFWATCH_HOSTILE_S", "60"))
ATTACKERS = 500
SCRAPERS = 8
MEMORY_MAX_MIB = 256
"""MemoryMax in deploy/systemd/roofwatch.service, the Helm chart's limit too."""
RSS_AFTER_SLACK_MIB = 60
"""After the attack the allocator keeps much of what 500 TLS connections used (measured: +46 MiB after
20 s, the same after 60 s, so it is retained, not growing); a leak per connection (thousands are
opened) would grow with the duration and pass this."""


@pytest.fixture
def agent():
    directory = workdir()
    agent = Agent(directory)
    try:
        poll(lambda: agent.scrape()[0] == 200, 30, what="the agent serving over TLS with the password")
        yield agent
    finally:
        agent.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_honest_scrapes_are_all_answered_under_500_hostile_connections(agent: Agent) -> None:
    for _ in range(3):
        agent.scrape()  # warm: workers started, the password remembered
    threads, fds, rss = agent.threads(), agent.fds(), agent.rss_mib()

    samples = run(agent, attackers=ATTACKERS, scrapers=SCRAPERS, seconds=SECONDS)

    worst = max(samples.latencies)
    print(f"\n  {len(samples.latencies)} honest scrapes under {ATTACKERS} hostile connections for {SECONDS:.0f} s: "
          f"p50 {percentile(samples.latencies, 0.5) * 1e3:.1f} ms, p99 {percentile(samples.latencies, 0.99) * 1e3:.1f} ms, "
          f"max {worst * 1e3:.1f} ms; hostile connections open (median) "
          f"{percentile([float(n) for n in samples.hostile_open], 0.5):.0f}; attacks opened {samples.attacks}; "
          f"RSS {rss:.1f} -> peak {max(samples.rss_mib):.1f} MiB; agent CPU {samples.cpu_s / SECONDS * 100:.0f}% of a core")
    assert not samples.failures, samples.failures[:5]
    assert len(samples.latencies) >= SCRAPERS * (SECONDS - 2), "the scrapers ran for the whole attack"
    assert percentile([float(n) for n in samples.hostile_open], 0.5) >= 0.8 * ATTACKERS, \
        "the attack held its connections open (else it tested nothing)"
    assert max(samples.rss_mib) < MEMORY_MAX_MIB

    # The attackers are gone: connections, threads and files back to where they were, scrapes fine.
    poll(lambda: agent.hostile_connections() == 0, 30, what="the hostile connections to be closed")
    poll(lambda: agent.threads() == threads, 30, what=f"the agent back to {threads} threads")
    poll(lambda: agent.fds() <= fds + 2, 30, what=f"the agent back to {fds} open files")
    after = agent.rss_mib()
    print(f"  after: RSS {after:.1f} MiB, {agent.threads()} threads, {agent.fds()} files")
    assert after < rss + RSS_AFTER_SLACK_MIB and after <= max(samples.rss_mib) + 2
    assert all(agent.scrape()[0] == 200 for _ in range(5))
