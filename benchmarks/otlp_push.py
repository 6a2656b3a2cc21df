"""What the OTLP push costs beside the scrape path, measured in the same run (issue 37's budget).

Two figures, both ratios against the scrape path so they mean the same on any machine:

1. **The agent, as a process**: the 8-GPU ``nvml-virtual`` demo (the real NVML code path over the fake
   driver, as ``benchmarks.collector_cost`` runs it), scraped every 10 s, once without and once with
   ``--otlp-endpoint`` pushing every 10 s to a loopback sink in this process. Net CPU (the fake driver's
   own time taken out) with the push, over net CPU without: the budget is at most 25 % more.
2. **One push against one scrape render**, in this process on the scrape benchmark's node snapshot
   (``benchmarks.scrape_snapshot``): thread CPU of a whole push (families, conversion, protobuf
   encoding, the HTTP request) over thread CPU of rendering ``/metrics`` for a new snapshot.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

from benchmarks.collector_cost import _free_port, _get, _probe, launched
from benchmarks.figures import Figure

PUSH_INTERVAL_S = 10.0
SCRAPE_INTERVAL_S = 10.0


class Sink:
    """Accepts OTLP/HTTP posts on loopback and counts them (what a collector costs is not the agent's)."""

    def __init__(self) -> None:
        sink = self
        self.posts = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                sink.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def agent_net_cpu(otlp_url: str | None, warmup_s: float, window_s: float) -> float:
    """Net CPU seconds per wall second of the demo agent over one window, scraped every 10 s."""
    port = _free_port()
    args = ["demo", "--backend", "nvml-virtual", "--listen", f"127.0.0.1:{port}", "--interval", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ROOFWATCH_"))}
    env.update(PYTHONUNBUFFERED="1", ROOFWATCH_OTLP_INTERVAL_S=str(PUSH_INTERVAL_S))
    if otlp_url:
        args += ["--otlp-endpoint", otlp_url]
    url = f"http://127.0.0.1:{port}/metrics"
    with launched("the demo agent", "roofwatch", args, url, env=env, prefix="roofwatch-bench-otlp-") as (proc, ps, probe):
        time.sleep(warmup_s)
        first = _probe(proc, probe, 1)
        cpu0, t0 = sum(ps.cpu_times()[:2]), time.monotonic()
        end = t0 + window_s
        while (now := time.monotonic()) < end:  # the scrape path, as Prometheus would drive it
            _get(url)
            time.sleep(min(SCRAPE_INTERVAL_S, max(0.0, end - now)))
        cpu1, t1 = sum(ps.cpu_times()[:2]), time.monotonic()
        last = _probe(proc, probe, 2)
    return ((cpu1 - cpu0) - (last["driver_cpu_s"] - first["driver_cpu_s"])) / (t1 - t0)


def push_against_render(n: int) -> tuple[float, float, int]:
    """Median thread CPU (ms) of one push and of one uncached ``/metrics`` render, and the points pushed."""
    from prometheus_client.exposition import generate_latest

    from benchmarks.scrape_snapshot import fresh, node_snapshot
    from exporters.otlp import open_pusher
    from exporters.otlp.endpoint import resolve
    from exporters.prometheus import ExpositionCache

    sink = Sink()
    try:
        snapshot = node_snapshot()
        settings = SimpleNamespace(otlp_endpoint=sink.url, otlp_protocol="http/protobuf", otlp_headers={},
                                   otlp_timeout_s=5.0, otlp_interval_s=PUSH_INTERVAL_S, otlp_queue_size=6)
        pusher = open_pusher(resolve(settings, {}), lambda: snapshot)
        current = {"snapshot": snapshot}
        cache = ExpositionCache(lambda: current["snapshot"])
        push_ms, render_ms = [], []
        for i in range(n + 3):
            fresh_snapshot = fresh(snapshot, i + 1)
            t = time.thread_time()
            ok = pusher.push(fresh_snapshot)
            push_ms.append((time.thread_time() - t) * 1000)
            assert ok, "the loopback sink refused a push"
            current["snapshot"] = fresh(snapshot, 10_000 + i)
            t = time.thread_time()
            cache.render(generate_latest, "text/plain")
            render_ms.append((time.thread_time() - t) * 1000)
        _, points = pusher.build(snapshot)
        pusher.stop()
        return statistics.median(push_ms[3:]), statistics.median(render_ms[3:]), points
    finally:
        sink.close()


def run(quick: bool = False) -> list[Figure]:
    warmup, window = (5.0, 40.0) if quick else (10.0, 120.0)
    sink = Sink()
    try:
        without = agent_net_cpu(None, warmup, window)
        with_push = agent_net_cpu(sink.url + "/v1/metrics", warmup, window)
        pushes = sink.posts
    finally:
        sink.close()
    push_ms, render_ms, points = push_against_render(10 if quick else 40)
    g = "OTLP push @10 s"
    added = (with_push - without) / without * 100.0
    return [
        Figure(g, "agent net CPU added by the push (scraped every 10 s either way)", added, "%", 25.0,
               note=f"net CPU {with_push * 100:.3g}% vs {without * 100:.3g}% of a core; {pushes} pushes received"),
        Figure(g, "thread CPU of one push (families, conversion, encoding, HTTP)", push_ms, "ms", None,
               render_ms, "one uncached /metrics render", note=f"{points} points per push"),
    ]


def main() -> None:
    from benchmarks.figures import table

    print(table(run("--quick" in sys.argv)))


if __name__ == "__main__":
    main()
