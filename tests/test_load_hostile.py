"""Load, end to end: 500 hostile connections for 36 s against the real agent with TLS and basic auth on.

Idle, idle-after-handshake, slowloris, slow-body and pipelining-never-reading clients (the rig is
benchmarks/hostile_load.py, shared with ``./dev.sh bench``), while 8 honest scrapers scrape ``/metrics``
once a second: every honest scrape is answered (its latency is printed here and measured as a benchmark,
``python -m benchmarks.hostile``), the agent stays under the systemd unit's
256 MiB, and once the attackers leave the agent is as before: the attack runs in three rounds of 12 s (longer than the
10 s header deadline, so every slow connection is cut and comes back at least once in each), and the
last may grow the agent only a little (``LEAK_SHARE`` says why not compare with the start). ``ROOFWATCH_HOSTILE_S`` changes the 36 s
(``python -m benchmarks.hostile`` runs 60 s).
"""

from __future__ import annotations

import os
import shutil

import pytest

from benchmarks.hostile_load import Agent, percentile, run, workdir
from tests.agent_process import poll

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("ROOFWATCH_HOSTILE_S", "36"))
ATTACKERS = 500
SCRAPERS = 8
ROUNDS = 3
MEMORY_MAX_MIB = 256
"""MemoryMax in deploy/systemd/roofwatch.service, the Helm chart's limit too."""
LEAK_SHARE = 0.6
"""After an attack the allocator keeps much of what 500 TLS connections used, and each later attack after a
calm grows it a little more (fragmentation) until it levels off: measured, RSS after each 12 s round, idle
machine 49 -> 92 -> 122 -> 122 -> 122 MiB; beside a busy machine 49 -> 94 -> 112 -> 129 MiB (the third round
+17 MiB). So RSS against the start, or any fixed number of MiB, says more about the allocator and the
machine than about the agent. What separates a leak is that it grows by the same amount every round (each
opens more than a thousand connections) where fragmentation's growth decays: the last of three rounds may
grow the agent by at most this share of what the first did (measured: 0.4 at worst). RSS can only see a
large leak this way (some 20 kB per connection); the unit tests hold the listener's books to zero."""


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


def _attack(agent: Agent, seconds: float, start_rss: float) -> float:
    """One round: every honest scrape answered, the attack held open, memory under the unit's limit; then
    connections, threads and files back to where they were. Returns the RSS once the attackers are gone."""
    threads, fds = agent.threads(), agent.fds()
    samples = run(agent, attackers=ATTACKERS, scrapers=SCRAPERS, seconds=seconds)

    worst = max(samples.latencies)
    print(f"\n  {len(samples.latencies)} honest scrapes under {ATTACKERS} hostile connections for {seconds:.0f} s: "
          f"p50 {percentile(samples.latencies, 0.5) * 1e3:.1f} ms, p99 {percentile(samples.latencies, 0.99) * 1e3:.1f} ms, "
          f"max {worst * 1e3:.1f} ms; hostile connections open (median) "
          f"{percentile([float(n) for n in samples.hostile_open], 0.5):.0f}; attacks opened {samples.attacks}; "
          f"RSS {start_rss:.1f} -> peak {max(samples.rss_mib):.1f} MiB; "
          f"agent CPU {samples.cpu_s / seconds * 100:.0f}% of a core")
    assert not samples.failures, samples.failures[:5]
    assert len(samples.latencies) >= SCRAPERS * (seconds - 2), "the scrapers ran for the whole attack"
    assert percentile([float(n) for n in samples.hostile_open], 0.5) >= 0.8 * ATTACKERS, \
        "the attack held its connections open (else it tested nothing)"
    assert max(samples.rss_mib) < MEMORY_MAX_MIB

    # The attackers are gone: connections, threads and files back to where they were, scrapes fine.
    poll(lambda: agent.hostile_connections() == 0, 30, what="the hostile connections to be closed")
    poll(lambda: agent.threads() == threads, 30, what=f"the agent back to {threads} threads")
    poll(lambda: agent.fds() <= fds + 2, 30, what=f"the agent back to {fds} open files")
    after = agent.rss_mib()
    print(f"  after: RSS {after:.1f} MiB, {agent.threads()} threads, {agent.fds()} files")
    assert after < MEMORY_MAX_MIB
    assert all(agent.scrape()[0] == 200 for _ in range(5))
    return after


def test_honest_scrapes_are_all_answered_under_500_hostile_connections(agent: Agent) -> None:
    for _ in range(3):
        agent.scrape()  # warm: workers started, the password remembered
    after = [agent.rss_mib()]
    for _ in range(ROUNDS):
        after.append(_attack(agent, SECONDS / ROUNDS, after[-1]))
    first, last = after[1] - after[0], after[-1] - after[-2]
    assert last <= LEAK_SHARE * first, \
        f"RSS after each round {after}: the last grew {last:.1f} MiB, memory grows with connections served"
