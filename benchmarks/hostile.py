"""What 500 hostile connections cost the agent, and what an honest scraper sees meanwhile; side by side
with the listener it replaced (http.server, hardened as far as its settings go).

The load is benchmarks/hostile_load.py (also the suite's tests/test_load_hostile.py): ``roofwatch demo``
with TLS and basic auth, idle, slowloris, slow-body and pipelining attackers, 8 honest scrapers once a
second. The baseline is the same command from the last commit before the listener changed
(``BASELINE_COMMIT``, checked out into a temporary git worktree) with its thread-per-connection server
given the hardening its knobs allow: a 10 s socket timeout instead of 300 s and room for 1024
connections (a thread each) instead of 128. Without git history the baseline is left out, and said so.

Then the hostile neighbours (``neighbours``, the load of tests/test_load_neighbours.py): a dripping
dcgm-exporter and inference server, a label bomb, a collector that is every kind of hostile, an AMD exporter
serving 1e308 readings, slow report-socket connections and SIGHUPs with an emptied web config and an alias
bomb, around three real ``roofwatch run`` agents; what honest scrapers and a reporting job see meanwhile.

Run alone with ``.venv/bin/python -m benchmarks.hostile [--quick] [--no-baseline] [--neighbours]``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from benchmarks.figures import Figure
from benchmarks.hostile_load import REPO, Agent, Samples, percentile, run as attack, workdir

GROUP = "hostile clients"
BASELINE_COMMIT = "45094e0"
"""The last commit whose agent served HTTP with http.server (one thread per connection)."""
BASELINE_NAME = "http.server, hardened"
HARDENED = """\
import sys
from exporters import http
http._Handler.timeout = 10.0          # idle keep-alive and every read: 10 s, not 300 s
http.HANDSHAKE_TIMEOUT_S = 10.0
_init = http.AgentHTTPServer.__init__
def _hardened(self, *args, **kwargs):
    kwargs.setdefault("max_connections", 1024)   # a thread each, so this is its only lever
    _init(self, *args, **kwargs)
http.AgentHTTPServer.__init__ = _hardened
from agent.app import cli
sys.exit(cli.main(sys.argv[1:]))
"""
ATTACKERS = 500
SCRAPERS = 8
QUIET_SCRAPES = 300


@contextlib.contextmanager
def baseline_tree() -> Iterator[Path | None]:
    """A worktree of BASELINE_COMMIT, removed afterwards; None where the history is not there."""
    path = Path(tempfile.mkdtemp(prefix="rw-baseline-"))
    made = subprocess.run(["git", "worktree", "add", "--detach", str(path), BASELINE_COMMIT], cwd=REPO,
                          capture_output=True, text=True)
    try:
        yield path if made.returncode == 0 else None
    finally:
        if made.returncode == 0:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, capture_output=True)
        shutil.rmtree(path, ignore_errors=True)


def measure(command: list[str] | None, cwd: Path | None, seconds: float) -> tuple[Samples, list[float], int]:
    """Quiet scrapes first (the served cost without an attack), then the attack; and the peak threads."""
    directory = workdir()
    agent = Agent(directory, command, cwd)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if agent.scrape()[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        quiet: list[float] = []
        conn = None
        for _ in range(QUIET_SCRAPES):
            started = time.perf_counter()
            _, conn = agent.scrape(conn)
            quiet.append(time.perf_counter() - started)
        threads: list[int] = []
        samples = attack(agent, attackers=ATTACKERS, scrapers=SCRAPERS, seconds=seconds,
                         on_tick=lambda _: threads.append(agent.threads()))
        return samples, quiet, max(threads, default=agent.threads())
    finally:
        agent.stop()
        shutil.rmtree(directory, ignore_errors=True)


def run(quick: bool = False, baseline: bool = True) -> list[Figure]:
    seconds = 20.0 if quick else 60.0
    ours = measure(None, None, seconds)
    theirs = None
    note = f"{ATTACKERS} hostile connections, {SCRAPERS} scrapers at 1/s, {seconds:.0f} s, TLS + basic auth"
    if baseline:
        with baseline_tree() as tree:
            if tree is None:
                note += "; baseline left out: no git history"
            else:
                theirs = measure([sys.executable, "-c", HARDENED], tree, seconds)
    return figures(ours, theirs, note, seconds)


def figures(ours: tuple[Samples, list[float], int], theirs: tuple[Samples, list[float], int] | None,
            note: str, seconds: float) -> list[Figure]:
    def fig(name: str, pick, unit: str, budget: float | None = None, extra: str = "") -> Figure:
        value = pick(*ours)
        base = pick(*theirs) if theirs is not None else None
        return Figure(GROUP, name, value, unit, budget=budget, baseline=base,
                      baseline_name=BASELINE_NAME if base is not None else "", note=(extra or note))

    return [
        fig("honest scrape p50 under attack", lambda s, q, t: percentile(s.latencies, 0.5) * 1e3, "ms"),
        fig("honest scrape p99 under attack", lambda s, q, t: percentile(s.latencies, 0.99) * 1e3, "ms", 1000.0),
        fig("honest scrape max under attack", lambda s, q, t: max(s.latencies) * 1e3, "ms", 1000.0),
        fig("honest scrapes failed under attack", lambda s, q, t: float(len(s.failures)), "scrapes", 0.0,
            extra="refused, reset or timed out (10 s)"),
        fig("peak RSS under attack", lambda s, q, t: max(s.rss_mib), "MiB", 256.0,
            extra="systemd MemoryMax and the Helm limit: 256 MiB"),
        fig("agent CPU under attack", lambda s, q, t: s.cpu_s / seconds * 100, "% of a core"),
        fig("peak threads under attack", lambda s, q, t: float(t), "threads"),
        fig("hostile connections held open (median)", lambda s, q, t: percentile([float(n) for n in s.hostile_open], 0.5),
            "connections", extra="what the attack managed to keep open; the listener closes each at its deadline"),
        fig("served GET /metrics p50, no attack", lambda s, q, t: percentile(q, 0.5) * 1e3, "ms",
            extra=f"TLS + basic auth + gzip, keep-alive, real process; n={QUIET_SCRAPES}"),
        fig("served GET /metrics p99, no attack", lambda s, q, t: percentile(q, 0.99) * 1e3, "ms",
            extra=f"TLS + basic auth + gzip, keep-alive, real process; n={QUIET_SCRAPES}"),
    ]


NEIGHBOURS_GROUP = "hostile neighbours"


def neighbours(quick: bool = False) -> list[Figure]:
    """The neighbours' load (benchmarks/neighbours_load.py, asserted by tests/test_load_neighbours.py): what honest
    scrapers and a reporting job see while the node's own neighbours misbehave, around three agents."""
    from benchmarks.neighbours_load import HONEST_SERVERS, Neighbourhood, attack as misbehave, workdir as nb_dir

    seconds = 24.0 if quick else 60.0
    directory = nb_dir()
    hood = Neighbourhood(directory)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if hood.ready():
                    break
            time.sleep(0.5)
        threads = hood.threads()
        seen = misbehave(hood, seconds)
    finally:
        hood.close()
        shutil.rmtree(directory, ignore_errors=True)
    note = (f"every neighbour of benchmarks/neighbours_load.py at once (dripping exporter and servers, a label bomb, "
            f"a collector answering 1.5 GiB/redirects/drips, an AMD exporter at 1e308, SIGHUPs with an empty web "
            f"config and an alias bomb); {seconds:.0f} s, basic auth")

    def fig(name: str, value: float, unit: str, budget: float | None = None, extra: str = "") -> Figure:
        return Figure(NEIGHBOURS_GROUP, name, value, unit, budget=budget, note=extra or note)

    latencies = seen.scrape_latencies.get("nvml", [])
    amd = seen.scrape_latencies.get("amd-exporter", []) + seen.scrape_latencies.get("amd-join", [])
    unauthenticated = [s for statuses in seen.unauthenticated.values() for s in statuses]
    return [
        fig("honest scrape p50", percentile(latencies, 0.5) * 1e3, "ms", extra="the nvml agent; " + note),
        fig("honest scrape p99", percentile(latencies, 0.99) * 1e3, "ms", 1000.0, extra="the nvml agent; " + note),
        fig("honest scrape max", max(latencies, default=float("nan")) * 1e3, "ms", 1000.0,
            extra="the nvml agent; " + note),
        fig("honest scrape max, AMD agents", max(amd, default=float("nan")) * 1e3, "ms", 1000.0,
            extra="run --backend amd-exporter and amd-virtual joined, both reading the hostile exporter"),
        fig("honest scrapes failed", float(len(seen.scrape_failures)), "scrapes", 0.0, extra="of all three agents"),
        fig("scrapes without a password let through", float(sum(1 for s in unauthenticated if s != 401)),
            "scrapes", 0.0, extra="401 expected throughout, across both SIGHUPs, from all three agents"),
        fig("job reports not answered 204", float(sum(1 for s in seen.reports if s != "204")), "reports", 0.0,
            extra=f"{len(seen.reports)} reports with the token on the unix socket from another process, 2 a second"),
        fig("honest inference servers with figures (fewest seen)", float(min(seen.honest_servers_seen, default=0)),
            "servers", extra=f"of {HONEST_SERVERS}; one dripping server and a label bomb beside them"),
        fig("values past a GPU's bounds in AMD agents' /metrics", float(len(seen.absurd)), "samples", 0.0),
        fig("planted credentials shown in /metrics", float(len(seen.secrets_shown)), "times", 0.0),
        *[fig(f"peak RSS, {name} agent", max(rss), "MiB", 256.0) for name, rss in seen.rss_mib.items()],
        fig("peak threads", float(max(seen.threads.get("nvml", [0]))), "threads",
            extra=f"the nvml agent; {threads.get('nvml')} before the attack"),
    ]


def main() -> None:
    from benchmarks.figures import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 s of attack instead of 60")
    parser.add_argument("--no-baseline", action="store_true", help="leave out the http.server baseline")
    parser.add_argument("--neighbours", action="store_true",
                        help="only the hostile-neighbours load (benchmarks/neighbours_load.py)")
    args = parser.parse_args()
    if args.neighbours:
        print(table(neighbours(quick=args.quick)))
        return
    print(table(run(quick=args.quick, baseline=not args.no_baseline) + neighbours(quick=args.quick)))


if __name__ == "__main__":
    main()
