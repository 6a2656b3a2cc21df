"""An inference server that starts after the agent, or restarts under it (issue 46 item 3), in the scraper itself.

A rate needs two scrapes. Before, the second came a whole interval after the first (5 s by default), so a server
that had just come up, or had just restarted (its counters back to zero: no rate across the reset), had no
figures for one interval more. And the server's PIDs were looked for once a minute: a server that was not
listening at the agent's first look kept no GPU for up to a minute after it came. The agent's real process
over a late and restarting server is tests/test_late_neighbours.py.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from agent.context.workload.inference.endpoint import InferenceEndpoint
from agent.context.workload.inference.scraper import InferenceScraper
from tests.agent_process import poll
from tests.dcgm_exporter_server import FakeExporter

BODIES = Path(__file__).parent / "fixtures" / "inference"


class Script:
    """A fetch that answers from a list: a body, or an exception to raise (the server down); the last again."""

    def __init__(self, *answers: str | Exception) -> None:
        self.answers, self.calls = list(answers), 0

    def __call__(self, url: str, timeout_s: float, max_bytes: int) -> bytes:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, Exception):
            raise answer
        return answer.encode()


def body(name: str) -> str:
    return (BODIES / name).read_text()


def test_a_server_that_has_just_answered_is_scraped_again_a_second_later_not_an_interval():
    script = Script(body("vllm-1.prom"), body("vllm-2.prom"))
    scraper = InferenceScraper([InferenceEndpoint(url="http://127.0.0.1:1/metrics", gpus=["0"])], interval_s=30.0,
                               fetch=script, recovery_s=0.1)
    try:
        scraper.start()
        status = poll(lambda: (s := scraper.status()[0]) and s.has_rate and s, 1.5, interval=0.02,
                      what="a rate, although the interval is 30 s")
    finally:
        scraper.close()
    assert status.scrapes_total == 2 and script.calls == 2, "one quick second scrape, then the interval again"


@pytest.mark.slow  # waits out a scrape interval
def test_a_server_that_restarted_has_its_rate_a_second_after_its_reset_not_an_interval():
    script = Script(body("vllm-1.prom"), body("vllm-2.prom"), body("vllm-1.prom"), body("vllm-2.prom"))
    scraper = InferenceScraper([InferenceEndpoint(url="http://127.0.0.1:1/metrics", gpus=["0"])], interval_s=1.0,
                               fetch=script, recovery_s=0.05)
    try:
        scraper.start()
        # 0 s: first answer, 0.05 s: rate; 1.05 s: counters went back (a restart), 1.1 s: rate again (was 2.05 s).
        poll(lambda: script.calls >= 4 and scraper.status()[0].has_rate, 1.8, interval=0.02,
             what="a rate again a moment after the reset")
    finally:
        scraper.close()


def test_the_pids_of_a_server_that_comes_after_the_agent_are_found_when_it_answers():
    """Without ``gpus``, a server's GPUs are those its processes hold; its PIDs are those listening on its port.
    A server that starts after the agent had none at the first look, and kept none for ``pid_refresh_s``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    scraper = InferenceScraper([InferenceEndpoint(url=f"http://127.0.0.1:{port}/metrics")], timeout_s=2.0)
    scraper.scrape_once(now=1000.0)
    down = scraper.status()[0]
    assert not down.up and down.pids == ()
    with FakeExporter(body("vllm-1.prom"), port=port):  # listens in this process
        scraper.scrape_once(now=1005.0)
    status = scraper.status()[0]
    assert status.up and os.getpid() in status.pids, status
