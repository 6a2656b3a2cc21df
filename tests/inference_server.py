"""A real HTTP server in a child process serving the inference fixture expositions, for the scraper tests.

The server serves the fixture expositions in tests/fixtures/inference in the order the URL names
them, so PID discovery, timeouts and size limits are exercised for real, and the bodies
tests/inference_bodies.py makes for each scrape (label bombs, overflowing values, counters going
backwards), so a real agent can be pointed at a hostile server. Shared by the inference, doctor and serving
tests, with the module-scoped ``server`` fixture.
"""

from __future__ import annotations

import dataclasses
import itertools
import selectors
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from agent.context.workload.inference.scraper import InferenceEndpoint, InferenceScraper

FIXTURES = Path(__file__).parent / "fixtures" / "inference"
REPO = Path(__file__).resolve().parents[1]
T0, DT = 1_000.0, 5.0

# /seq/<nonce>/<file,file,...>/metrics serves the files in turn (the last one again afterwards);
# HANG accepts and never answers, 404 answers Not Found. /big/<n> serves n bytes of junk.
# /gen/<nonce>/<recipe>/metrics serves the body tests/inference_bodies.py makes for the hit number;
# /hits/<path> says how often <path> was asked for.
# ?gzip=1 compresses, but only when the client asked for gzip; ?cl=0 leaves out Content-Length.
SERVER = r'''
import gzip, http.server, os, subprocess, sys, threading, time, urllib.parse
root = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from tests.inference_bodies import generated
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
hits, hung, lock = {}, [0], threading.Lock()

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, code, body, query):
        gz = query.get("gzip") == ["1"] and "gzip" in self.headers.get("Accept-Encoding", "")
        if query.get("gzip") == ["1"] and not gz:
            code, body = 406, b"gzip required"
        if gz:
            body = gzip.compress(body)
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if gz:
            self.send_header("Content-Encoding", "gzip")
        if query.get("cl") != ["0"]:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query, parts = urllib.parse.parse_qs(url.query), url.path.strip("/").split("/")
        if parts[0] == "hung":
            return self.reply(200, str(hung[0]).encode(), {})
        if parts[0] == "big":
            return self.reply(200, b"x" * int(parts[1]), query)
        if parts[0] == "hits":
            with lock:
                count = hits.get("/" + "/".join(parts[1:]), 0)
            return self.reply(200, str(count).encode(), {})
        with lock:
            i = hits.get(url.path, 0)
            hits[url.path] = i + 1
        if parts[0] == "gen":
            return self.reply(200, generated(parts[2], i + 1).encode(), query)
        files = parts[2].split(",")
        name = files[min(i, len(files) - 1)]
        if name == "HANG":
            with lock:
                hung[0] += 1
            time.sleep(3600)
        elif name == "404":
            self.reply(404, b"not found", {})
        else:
            with open(os.path.join(root, name), "rb") as f:
                self.reply(200, f.read(), query)

httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
httpd.daemon_threads = True
print(httpd.server_address[1], child.pid, flush=True)
httpd.serve_forever()
'''


@dataclasses.dataclass
class Server:
    pid: int
    port: int
    grandchild: int
    nonce: itertools.count

    def seq(self, *files: str, query: str = "") -> str:
        """A fresh URL (its own position in the sequence) serving ``files`` in turn."""
        return f"http://127.0.0.1:{self.port}/seq/{next(self.nonce)}/{','.join(files)}/metrics{query}"

    def gen(self, recipe: str) -> str:
        """A fresh URL serving the body ``recipe`` makes (tests/inference_bodies.py), counting its own hits."""
        return f"http://127.0.0.1:{self.port}/gen/{next(self.nonce)}/{recipe}/metrics"

    def hits(self, url: str) -> int:
        """How often the server was asked for ``url`` (one it gave out)."""
        path = url.split(str(self.port), 1)[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/hits{path}", timeout=5) as r:
            return int(r.read())

    def hung(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/hung", timeout=5) as r:
            return int(r.read())


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(FIXTURES), str(REPO)], stdout=subprocess.PIPE, text=True)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=20), "fixture server did not start"
        port, grandchild = map(int, proc.stdout.readline().split())
        yield Server(proc.pid, port, grandchild, itertools.count())
    finally:
        proc.kill()
        proc.wait(timeout=10)


def scraped(url: str, now: tuple[float, ...] = (T0, T0 + DT), **endpoint) -> InferenceScraper:
    scraper = InferenceScraper([InferenceEndpoint(url=url, **endpoint)], clock=lambda: pytest.fail("clock used"))
    for t in now:
        scraper.scrape_once(now=t)
    return scraper
