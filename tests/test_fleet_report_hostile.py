"""``roofwatch fleet-report`` against a Prometheus-compatible server that is broken or means harm.

The stand-in here is a raw socket server on 127.0.0.1:0 that speaks the Prometheus HTTP API's JSON
(values as strings, NaN as ``"NaN"``) and, per scenario (the first segment of the URL path, so one
server serves every test), answers too much, too slowly, too deeply nested or with non-finite
numbers. The real command runs against it as a child process where the finding was the process's
(its memory, its hang, its traceback); the client's caps are also checked in-process. The NaN case
is checked again against a real Prometheus holding a NaN series (promtool backfill).
"""

from __future__ import annotations

import json
import math
import re
import resource
import socketserver
import subprocess
import threading
import time
import urllib.parse
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import pytest

from agent.classifier.thresholds import Thresholds
from agent.views.fleet_report import promapi
from agent.views.fleet_report.collect import FleetReport
from agent.views.fleet_report.data import Prices
from agent.views.fleet_report import dcgm
from agent.views.fleet_report.dcgm import dcgm_report, dcgm_step, dcgm_thresholds
from agent.views.fleet_report.promapi import PromClient, PromError
from agent.views.fleet_report.window import Window
from tests.agent_process import clean_env, roofwatch_cmd

REPO = Path(__file__).resolve().parent.parent
MEMORY_LIMIT = 1536 * 2**20
"""The child's address-space limit: the command needs a fraction; the old parse needed gigabytes."""
AT = 1795478400


# -- the stand-in server -------------------------------------------------------------------------


def _answer(result: list[Any], kind: str = "vector") -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}}).encode()


def _send(sock, body: bytes, status: str = "200 OK") -> None:
    sock.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                 "Connection: close\r\n\r\n".encode() + body)


def _ok(sock, query: str, endpoint: str) -> None:
    """A store that holds nothing: ``vector(1)`` answers 1, every other query an empty result."""
    if query == "vector(1)":
        _send(sock, _answer([{"metric": {}, "value": [AT, "1"]}]))
    else:
        _send(sock, _answer([], "matrix" if endpoint == "query_range" else "vector"))


def _trickle(sock, interval: float) -> None:
    """Headers at once, then the body one byte every ``interval`` s: no single read ever waits long."""
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
    while True:
        time.sleep(interval)
        sock.sendall(b" ")


def _stream_big(sock, total: int) -> None:
    """A vector of ``total`` bytes, made as it is sent (never held), without a Content-Length."""
    sock.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n'
                 b'{"status":"success","data":{"resultType":"vector","result":[')
    block = b'{"metric":{},"value":[1,"1"]},' * (2**20 // 30)  # 30 bytes a series, as in the finding
    for _ in range(total // len(block)):
        sock.sendall(block)
    sock.sendall(b'{"metric":{},"value":[1,"1"]}]}}')


BIG_QUERY = "sum by (cluster, model, spec, class, waste)"
"""The first section's query (GPU-hours by class of the whole fleet)."""
NAN_VECTOR = [{"metric": {"cluster": "east", "model": "m", "spec": "s", "class": c}, "value": [AT, v]}
              for c, v in (("idle", "NaN"), ("compute_bound", "+Inf"), ("memory_bound", "-Inf"), ("unknown", "2.5"))]
DCGM_GPU = {"UUID": "GPU-x", "gpu": "0", "Hostname": "h", "modelName": "NVIDIA H100 80GB HBM3"}


def _scenario(kind: str) -> Callable[[Any, str, str], None]:
    return {
        "ok": _ok,
        "deep": lambda sock, q, e: _send(sock, b"[" * 100_000 + b"]" * 100_000),
        "trickle": lambda sock, q, e: _trickle(sock, 1.0),
        # The fleet's energy queries (this period and the one before), not the namespace bill's, which also
        # reads the shared GPUs' per-holder energy.
        "trickle-energy": lambda sock, q, e: (_trickle(sock, 0.5) if "energy_joules" in q and "holder" not in q
                                              else _ok(sock, q, e)),
        "big": lambda sock, q, e: _stream_big(sock, 240 * 2**20) if BIG_QUERY in q else _ok(sock, q, e),
        "endless": lambda sock, q, e: _stream_big(sock, 64 * 2**20),
        "declared": lambda sock, q, e: sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9000000\r\n\r\n"),
        "series": lambda sock, q, e: _send(sock, _answer([{"metric": {}, "value": [AT, "1"]}] * 20_001)),
        "points": lambda sock, q, e: _send(sock, _answer([{"metric": {}, "values": [[AT, "1"]] * 100_001}], "matrix")),
        "nan": lambda sock, q, e: _send(sock, _answer(NAN_VECTOR)) if BIG_QUERY in q else _ok(sock, q, e),
        "error": lambda sock, q, e: _send(sock, b'{"status":"error","errorType":"bad_data","error":"1:5: parse error: '
                                          b'unexpected <by>"}', "400 Bad Request"),
        "dcgm-nan": _dcgm_nan,
        "drip": _drip,
    }[kind]


def _dcgm_nan(sock, query: str, endpoint: str) -> None:
    """One dcgm-exporter GPU whose power reads NaN at every other step and +Inf once."""
    if query.startswith("max by (cluster, UUID"):
        _send(sock, _answer([{"metric": DCGM_GPU, "value": [AT, "1"]}]))
    elif endpoint == "query_range" and "DCGM_FI_DEV_POWER_USAGE" in query:
        values = [[AT - 3600 + 60 * i, "NaN" if i % 2 else "400"] for i in range(60)] + [[AT, "+Inf"]]
        _send(sock, _answer([{"metric": {"UUID": "GPU-x"}, "values": values}], "matrix"))
    elif endpoint == "query_range" and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in query:
        _send(sock, _answer([{"metric": {"UUID": "GPU-x"}, "values": [[AT - 3600 + 60 * i, "0.9"] for i in range(61)]}],
                            "matrix"))
    else:
        _ok(sock, query, endpoint)


AMD_OBJECT = {"cluster": "", "hostname": "h", "gpu_id": "0", "gpu_partition_id": "0", "card_model": "102-G30211-0C"}
LISTINGS = ("max by (cluster, UUID", "max by (cluster, hostname, gpu_id, gpu_partition_id")
"""The start of the dcgm and the amd source's listing query."""
SEEN: dict[str, list[tuple[str, str]]] = defaultdict(list)
"""Per base path (``/drip/<test>``): (query, the API's ``timeout`` parameter) of every request, in order."""


def _drip(sock, query: str, endpoint: str) -> None:
    """A store that answers at once what lets a report go on (``vector(1)``; one GPU in each exporter
    source's listing) and drips every other answer a byte a second."""
    if query == "vector(1)":
        _ok(sock, query, endpoint)
    elif query.startswith(LISTINGS[0]):
        _send(sock, _answer([{"metric": DCGM_GPU, "value": [AT, "1"]}]))
    elif query.startswith(LISTINGS[1]):
        _send(sock, _answer([{"metric": AMD_OBJECT, "value": [AT, "1"]}]))
    else:
        _trickle(sock, 1.0)


class StandIn(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock = self.request
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        length = next((int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:")), 0)
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return
            body += chunk
        form = urllib.parse.parse_qs(body.decode())
        query = form.get("query", [""])[0]
        SEEN[path.split("/api/")[0]].append((query, form.get("timeout", [""])[0]))
        try:
            _scenario(path.split("/")[1])(sock, query, path.rsplit("/", 1)[1])
        except OSError:  # the client gave up: that is the point
            pass


@pytest.fixture(scope="module")
def server():
    stand_in = socketserver.ThreadingTCPServer(("127.0.0.1", 0), StandIn)
    stand_in.daemon_threads = True
    thread = threading.Thread(target=stand_in.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{stand_in.server_address[1]}"
    stand_in.shutdown()
    stand_in.server_close()


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def fleet_report(base: str, tmp: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """The real command as a child process, under the memory limit, failing the test past ``timeout`` s."""
    return subprocess.run(roofwatch_cmd("fleet-report", "--prometheus", base, "--range", "2h", "--out", str(tmp / "f.html"),
                                        "--json", str(tmp / "f.json"), *args),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=clean_env(),
                          preexec_fn=_limit_memory)


def strict_json(text: str) -> Any:
    """``json.loads`` that refuses NaN and Infinity, as strict parsers (JavaScript's JSON.parse, jq) do."""
    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def embedded(page: str) -> Any:
    found = re.search(r'<script type="application/json" id="fleet-data">(.*?)</script>', page, re.S)
    assert found
    return strict_json(found.group(1))


# -- 1. a big answer is refused at a cap, and the report goes on --------------------------------------


@pytest.mark.slow
def test_a_huge_answer_is_refused_and_named_while_the_report_renders(server, tmp_path: Path) -> None:
    """240 MiB of 8 M series once took the command to 5.9 GiB and 2 min: now the query is refused at
    8 MiB, listed, and the process stays within 1.5 GiB of address space."""
    done = fleet_report(f"{server}/big", tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    data = strict_json((tmp_path / "f.json").read_text())
    refused = [p for p in data["problems"] if p["section"] == "GPU-hours by class"]
    assert len(refused) == 1 and "answer refused: larger than 8 MiB" in refused[0]["error"], data["problems"]
    assert BIG_QUERY in refused[0]["query"]
    page = (tmp_path / "f.html").read_text()
    assert "answer refused: larger than 8 MiB" in page and 'id="problems"' in page
    assert 'id="waste-user"' in page or "No GPUs held by a job in this period." in page, "later sections still render"
    assert embedded(page)["problems"] == data["problems"]


@pytest.mark.parametrize(("kind", "message"), [
    ("declared", "larger than 8 MiB"), ("endless", "larger than 8 MiB"),
    ("series", "20,001 series, more than the 20,000"), ("points", "100,001 points, more than the 100,000")])
def test_the_caps_refuse_too_many_bytes_series_or_points(server, kind: str, message: str) -> None:
    """Each cap on its own: a declared length over the byte cap (nothing read), an endless body (cut
    at the cap), more series or more points than any report query needs, though under the byte cap."""
    client = PromClient(f"{server}/{kind}", timeout_s=10)
    with pytest.raises(PromError, match=re.escape(message)):
        if kind == "points":
            client.query_range("up", AT - 3600, AT, 60)
        else:
            client.query("up", AT)


def test_every_legitimate_answer_fits_the_caps() -> None:
    """The caps are sized from the queries: a dcgm range query is at most 16 GPUs x 1440 steps (time
    slices keep a 400-day window there too), well inside the point and byte caps."""
    for days in (1, 7, 10, 30, 400):
        window = Window.pick(AT, days * 86400)
        step = dcgm_step(window.range_s)
        slices = dcgm.dcgm_slices(window, step)
        assert slices[0][0] == window.start + step and slices[-1][1] == window.end
        assert all(b - a == step for (_, a), (b, _) in zip(slices, slices[1:])), "contiguous, no step twice"
        assert max(round((b - a) / step) + 1 for a, b in slices) <= dcgm.MAX_POINTS
    assert 16 * dcgm.MAX_POINTS * 4 <= promapi.MAX_POINTS
    one_point = len(b'[1795478400.123,"12345.678901234567"],')
    assert 16 * dcgm.MAX_POINTS * one_point * 4 < promapi.MAX_ANSWER_BYTES
    series = len(json.dumps({"metric": {"cluster": "east", "user": "a-long-user-name", "model": "NVIDIA H100 80GB HBM3",
                                        "spec": "h100-sxm", "class": "communication_jittered",
                                        "waste": "communication_jittered"},
                             "value": [1795478400.123, "12345.678901234567"]}))
    assert promapi.MAX_SERIES * series < promapi.MAX_ANSWER_BYTES


# -- 2. each query gives up at its deadline --------------------------------------------------------


@pytest.mark.slow
def test_a_trickling_server_cannot_hold_the_command(server, tmp_path: Path) -> None:
    """Headers, then a body byte every second: no read ever times out, and the command once hung on
    it. Now the first query gives up at --timeout + 5 s and the command exits 1 in one line."""
    done = fleet_report(f"{server}/trickle", tmp_path, "--timeout", "2", timeout=90)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"roofwatch fleet-report: --prometheus {server}/trickle"), lines
    assert "no whole answer within 7 s" in lines[0], "the deadline, not something else, ended it"


@pytest.mark.slow
def test_each_query_gives_up_at_its_deadline_and_the_rest_is_reported(server, tmp_path: Path) -> None:
    """The two energy queries (this period and the one before) trickle; each is cut at its own
    deadline, named on the page, and every other section is still computed."""
    done = fleet_report(f"{server}/trickle-energy", tmp_path, "--timeout", "1", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    data = strict_json((tmp_path / "f.json").read_text())
    late = [p for p in data["problems"] if "no whole answer within 6 s" in p["error"]]
    assert {p["section"] for p in late} == {"Energy", "Trend (previous period)"}, data["problems"]
    assert all("energy_joules" in p["query"] for p in late) and len(late) == 2
    assert data["queries"] >= 15, "the queries after the late ones still ran"


# -- 2b. the whole command has a deadline ------------------------------------------------------------

MARGIN_S = 6.0
"""Past the deadline: the interpreter's start, classifying what was answered, writing the page."""


def _dripped(seen: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(q, t) for q, t in seen if q != "vector(1)" and not q.startswith(LISTINGS)]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["roofwatch", "dcgm", "amd"])
def test_the_deadline_bounds_the_whole_command_and_names_what_was_not_answered(server, tmp_path: Path,
                                                                                source: str) -> None:
    """Every answer after the first drips: with --timeout 3 each query gives up at 8 s, and 17 of them
    once took the command 113 s at --timeout 2. With --deadline 10 the first gives up at its own 8 s,
    the second is sent with the 2 s left (and tells the server so), none is sent after that, and the
    page lists every query the store did not answer, with its PromQL."""
    started = time.monotonic()
    done = fleet_report(f"{server}/drip/{source}", tmp_path, "--source", source, "--timeout", "3", "--deadline", "10",
                        timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert took < 10 + MARGIN_S, f"{took:.1f} s"
    data = strict_json((tmp_path / "f.json").read_text())
    seen = SEEN[f"/drip/{source}"]
    assert data["queries"] == len(seen), "no query was sent that the report does not count"
    problems = data["problems"]
    late = [p for p in problems if p["error"] == "not run: the command's --deadline of 10 s had passed"]
    cut = [p for p in problems if p["error"].startswith("no whole answer within")]
    assert len(late) == data["not_run"] > 0 and all(p["query"] for p in late)
    assert len(late) + len(cut) == len(problems), "every dripped query and every one not run is listed, nothing else"
    dripped = _dripped(seen)
    assert [p["query"] for p in cut] == [q for q, _ in dripped], "each query the store was sent and dripped is named"
    assert len(cut) == 2, [p["error"] for p in cut]
    assert cut[0]["error"].startswith("no whole answer within 8 s (--timeout") and dripped[0][1] == "3s"
    assert "the time left before the command's --deadline of 10 s" in cut[1]["error"]
    left = re.fullmatch(r"(\d+)ms", dripped[1][1])
    assert left and 0 < int(left.group(1)) < 2100, dripped[1]
    assert done.stdout.strip().endswith(f"the --deadline of 10 s passed before {len(late)} more queries could run")
    page = (tmp_path / "f.html").read_text()
    assert embedded(page) == data and 'id="problems"' in page and "had passed" in page


@pytest.mark.slow
def test_the_default_deadline_is_five_query_deadlines(server, tmp_path: Path) -> None:
    """Without --deadline: 5 x (--timeout + 5 s), 30 s at --timeout 1, where every query dripping to its
    own 6 s deadline once took 16 x 6 s and more."""
    started = time.monotonic()
    done = fleet_report(f"{server}/drip/default", tmp_path, "--timeout", "1", timeout=30 + MARGIN_S)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert took < 30 + MARGIN_S
    data = strict_json((tmp_path / "f.json").read_text())
    assert data["deadline_s"] == 30 and data["not_run"] > 0
    sent = len(_dripped(SEEN["/drip/default"]))
    assert 4 <= sent <= 5 and len(data["problems"]) == sent + data["not_run"]
    assert {p["section"] for p in data["problems"]} >= {"GPU-hours by class", "Energy", "Trend (previous period)"}


# -- 3. non-finite samples are skipped, counted and never reach the JSON ----------------------------


def test_non_finite_samples_are_skipped_and_counted(server) -> None:
    answer = PromClient(f"{server}/nan").query(f"{BIG_QUERY} (x)", AT)
    assert answer.skipped == 3
    assert [(s.labels["class"], s.value) for s in answer] == [("unknown", 2.5)]


@pytest.mark.slow
def test_a_nan_answer_leaves_the_report_and_its_json_valid(server, tmp_path: Path) -> None:
    done = fleet_report(f"{server}/nan", tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    data = strict_json((tmp_path / "f.json").read_text())
    page = (tmp_path / "f.html").read_text()
    assert embedded(page) == data
    assert data["totals"]["gpu_hours"] == pytest.approx(2.5)
    skipped = [p for p in data["problems"] if p["section"] == "GPU-hours by class"]
    assert len(skipped) == 1 and skipped[0]["error"].startswith("3 non-finite samples (NaN, +Inf or -Inf)")
    cards = re.findall(r'<div class="v">(.*?)</div>', page)
    assert cards and not any(re.search(r"nan|inf", c, re.I) for c in cards), cards
    assert not re.search(r">\$?(nan|inf|-inf)<", page, re.I)


def test_the_report_json_is_strict_even_when_a_sum_overflows() -> None:
    """A finite answer can still add up to infinity (two 1e308 GPU-hours): the JSON says null there."""
    report = FleetReport(window=Window.pick(AT, 7200), cluster=None, prices=Prices(),
                         energy={"kwh": math.inf, "by_cluster": {"east": math.nan}}, mfu={"mean": math.nan})
    data = strict_json(report.to_json_text())
    assert data["energy"] == {"kwh": None, "by_cluster": {"east": None}} and data["totals"]["mfu_mean"] is None


def test_dcgm_fields_skip_non_finite_samples_and_say_how_many(server) -> None:
    window = Window.pick(AT, 3600)
    report = dcgm_report(PromClient(f"{server}/dcgm-nan"), window, cluster=None, prices=Prices(),
                         thresholds=dcgm_thresholds(Thresholds(), dcgm_step(window.range_s)))
    power = [p for p in report.problems if p.section == "dcgm DCGM_FI_DEV_POWER_USAGE"]
    assert len(power) == 1 and power[0].error.startswith("31 non-finite samples"), report.problems
    assert report.dcgm["gpus_read"] == 1 and report.dcgm["samples"] > 0
    strict_json(report.to_json_text())


@pytest.mark.slow
def test_a_nan_series_in_a_real_prometheus(tmp_path: Path) -> None:
    """The synthetic fleet backfilled into a real Prometheus, with one GPU's ``idle`` class series
    NaN throughout (a 0/0 in a recording rule): Prometheus sums the NaN into east's idle GPU-hours
    and answers "NaN" for that row; the report leaves that row out, says so, and stays valid JSON."""
    from tests import fleet_fixture as fx
    from tests.fleet_stores import backfilled_prometheus, fleet_end

    end = fleet_end()
    poisoned = 'roofwatch_gpu_workload_class{cluster="east",gpu="0",node="e1",uuid="GPU-east-e1-0000",class="idle"}'
    lines = [f"{s} {'NaN' if s == poisoned else v} {t}\n" for s, v, t in fx.samples(end)]
    assert sum(line.startswith(poisoned + " NaN") for line in lines) > 100, "the NaN series is in the backfill"
    prometheus = backfilled_prometheus(tmp_path, {"fleet": "".join(lines) + "# EOF\n"})
    try:
        done = subprocess.run(roofwatch_cmd("fleet-report", "--prometheus", prometheus.base, "--range", "2h",
                                            "--end", str(end), "--out", str(tmp_path / "f.html"),
                                            "--json", str(tmp_path / "f.json")),
                              capture_output=True, text=True, timeout=300, cwd=REPO, env=clean_env())
    finally:
        log = prometheus.stop()
    assert done.returncode == 0, (done.stderr[-3000:], log[-2000:])
    data = strict_json((tmp_path / "f.json").read_text())
    page = (tmp_path / "f.html").read_text()
    assert embedded(page) == data
    # east's idle GPU-hours (notebook-b's 8) are the NaN row; every other row is whole: 48 - 8.
    assert data["totals"]["gpu_hours"] == pytest.approx(48.0 - 8.0)
    assert {c["cluster"]: c["total_hours"] for c in data["clusters"]} == pytest.approx({"east": 24.0, "west": 16.0})
    by_section = {p["section"]: p["error"] for p in data["problems"]}
    assert by_section["GPU-hours by class"].startswith("1 non-finite sample (NaN, +Inf or -Inf)"), data["problems"]
    assert "non-finite" in by_section["Trend (previous period)"]
    cards = re.findall(r'<div class="v">(.*?)</div>', page)
    assert cards[0] == "40.0" and not any(re.search(r"nan|inf", c, re.I) for c in cards), cards


# -- 4. JSON nested 100 000 deep -----------------------------------------------------------------------


def test_deeply_nested_json_is_a_query_error(server) -> None:
    with pytest.raises(PromError, match="nested too deeply"):
        PromClient(f"{server}/deep").query("up", AT)


@pytest.mark.slow
def test_deeply_nested_json_ends_the_command_in_one_line(server, tmp_path: Path) -> None:
    done = fleet_report(f"{server}/deep", tmp_path, timeout=60)
    assert done.returncode == 1 and done.stdout == "", done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"roofwatch fleet-report: --prometheus {server}/deep: "), lines
    assert "nested too deeply" in lines[0]
    assert not (tmp_path / "f.html").exists()


# -- the server's own error text -----------------------------------------------------------------------


def test_the_servers_error_text_is_kept(server) -> None:
    with pytest.raises(PromError, match=re.escape("HTTP 400: 1:5: parse error: unexpected <by>")):
        PromClient(f"{server}/error").query("sum by", AT)
