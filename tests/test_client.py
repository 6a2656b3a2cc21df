"""The job-side client in one process: reports reach the agent over real transports, and the
client never blocks or raises, backing off without an agent. The fixtures here are shared with
tests/test_client_processes.py (real child processes, the standalone copy, fork)."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from agent import client
from agent.client import Reporter
from exporters.http.limits import ListenerLimits
from exporters.http.report_socket import SOCKET_LIMITS, ReportSocketServer
from agent.context.workload.report_store import ReportStore
from exporters.http import AgentHTTPServer
from tests.agent_process import poll
from tests.report_fixtures import UUID_A, UUID_B, empty_snapshot, short_dir  # noqa: F401 (fixtures)

ENV_KEYS = ("ROOFWATCH_REPORT_SOCKET", "ROOFWATCH_REPORT_URL", "ROOFWATCH_REPORT_TOKEN", "ROOFWATCH_JOB", "SLURM_JOB_ID",
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
            "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


class RecordingStore(ReportStore):
    """A real store that also keeps every body it was given, and can hold back one step until released."""

    def __init__(self, *, gate_step: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.bodies: list[dict] = []
        self.gate_step = gate_step
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def accept(self, body: bytes, **kwargs):
        data = json.loads(body)
        if self.gate_step is not None and data.get("step") == self.gate_step:
            self.waiting.set()
            self.gate.wait(20)
        self.bodies.append(data)
        return super().accept(body, **kwargs)


@pytest.fixture
def agent_socket(short_dir):
    """A real ReportSocketServer; yields (socket path, its RecordingStore)."""
    started = []

    def start(limits=None, **store_kwargs):
        store = RecordingStore(**store_kwargs)
        path = short_dir / f"agent{len(started)}.sock"
        server = ReportSocketServer(path, store, limits=limits)
        server.start()
        started.append(server)
        store.server = server
        return path, store

    yield start
    for server in started:
        server.store.gate.set()
        server.close()


@pytest.fixture
def reporters():
    made: list[Reporter] = []

    def make(**kwargs) -> Reporter:
        reporter = Reporter(**kwargs)
        made.append(reporter)
        return reporter

    yield make
    for reporter in made:
        reporter.close(timeout=0.1)


def settled(reporter: Reporter, total: int) -> dict[str, int] | None:
    """Stats once every one of ``total`` reports has been sent, failed or dropped."""
    stats = reporter.stats()
    done = stats["sent"] + stats["failed"] + stats["dropped"]
    return stats if done == total and stats["queued"] == 0 else None


@pytest.fixture
def hanging_agent(short_dir):
    """A unix socket that accepts connections and never answers: a wedged agent."""
    path = short_dir / "hang.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    listener.settimeout(0.05)
    held: list[socket.socket] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield path, held
    stop.set()
    thread.join(5)
    listener.close()
    for conn in held:
        conn.close()


# -- delivery ----------------------------------------------------------------------------------


def test_report_reaches_the_agent_with_pid_env_defaults_and_hints(agent_socket, reporters, monkeypatch):
    path, store = agent_socket()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", UUID_A)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    reporter = reporters(socket_path=str(path))
    reporter.report(step_time_s=0.5, tokens=1000, flops_per_token=6e9, dtype="bf16", model_bytes=2e9, step=7)
    stats = poll(lambda: settled(reporter, 1), 5.0, what="the report to be sent")
    assert stats["sent"] == 1 and stats["connects"] == 1
    sent = store.bodies[0]
    assert sent["pid"] == os.getpid() and sent["job"] == "4711" and (sent["rank"], sent["world_size"]) == (3, 8)
    assert sent["hints"] == {"CUDA_VISIBLE_DEVICES": UUID_A, "LOCAL_RANK": "0"}
    report = store.report_for(gpu="0", uuid=None, pids=[os.getpid()], now=store._clock())
    assert report.tokens_per_s == pytest.approx(2000.0) and report.dtype == "bf16" and report.step == 7
    assert store.report_for(gpu="5", uuid=UUID_A, pids=[], now=store._clock()).step == 7


def test_explicit_arguments_override_the_environment_and_dtypes_translate(agent_socket, reporters, monkeypatch):
    path, store = agent_socket()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("ROOFWATCH_JOB", "from-env")
    monkeypatch.setenv("SLURM_JOB_ID", "ignored")

    class dtype:  # noqa: N801 - named like torch.dtype, which is how the client recognises one
        def __str__(self) -> str:
            return "torch.bfloat16"

    reporter = reporters(socket_path=str(path))
    reporter.report(tokens_per_s=5.0, dtype=dtype(), rank=1, world_size=2, gpu=3)
    reporter.report(tokens_per_s=5.0, dtype="FLOAT8_E4M3FN", job="explicit", gpu=UUID_B)
    poll(lambda: settled(reporter, 2), 5.0, what="both reports to be sent")
    first, second = store.bodies
    assert (first["dtype"], first["rank"], first["world_size"], first["gpu"], first["job"]) == ("bf16", 1, 2, "3", "from-env")
    assert (second["dtype"], second["job"], second["gpu"], second["rank"]) == ("fp8", "explicit", UUID_B, 3)


def test_http_transport_from_environment_with_token_and_keep_alive(reporters, monkeypatch, short_dir):
    store = ReportStore(token="tok")
    server = AgentHTTPServer(("127.0.0.1", 0), empty_snapshot, stale_after_s=10.0, reports=store)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("ROOFWATCH_REPORT_SOCKET", str(short_dir / "absent.sock"))  # missing: the URL is used
        monkeypatch.setenv("ROOFWATCH_REPORT_URL", server.url)
        monkeypatch.setenv("ROOFWATCH_REPORT_TOKEN", "tok")
        reporter = reporters()
        for step in range(5):
            reporter.report(step=step, tokens_per_s=100.0)
        stats = poll(lambda: settled(reporter, 5), 5.0, what="five reports over HTTP")
        assert stats["sent"] == 5 and stats["connects"] == 1  # one kept-alive connection
        assert store.stats()["accepted"] == 5

        wrong = reporters(token="wrong")
        for step in range(20):
            wrong.report(step=step)
        stats = poll(lambda: settled(wrong, 20), 5.0, what="the rejected reporter to settle")
        # One 401, then it backs off instead of sending every step.
        assert stats["failed"] == 1 and stats["dropped"] == 19 and stats["sent"] == 0 and stats["connects"] == 1
        assert store.stats()["rejected"]["unauthorized"] == 1
    finally:
        server.shutdown()
        server.server_close()


def test_module_level_report_uses_a_lazy_default_reporter(agent_socket, monkeypatch):
    path, store = agent_socket()
    monkeypatch.setenv("ROOFWATCH_REPORT_SOCKET", str(path))
    monkeypatch.setattr(client, "_default", None)
    client.report(step=1, tokens_per_s=10.0)
    reporter = client.get_reporter()
    try:
        assert client.get_reporter() is reporter
        poll(lambda: settled(reporter, 1), 5.0, what="the default reporter to send")
        assert reporter.stats()["sent"] == 1 and store.bodies[0]["step"] == 1
    finally:
        reporter.close(timeout=1.0)


def test_reused_connection_closed_by_the_agent_is_retried_once(agent_socket, reporters):
    # The agent drops idle keep-alive connections quickly.
    path, store = agent_socket(limits=ListenerLimits(**{**vars(SOCKET_LIMITS), "idle_timeout_s": 0.2}))
    reporter = reporters(socket_path=str(path))
    reporter.report(step=1)
    poll(lambda: settled(reporter, 1), 5.0, what="the first report")
    # The agent closes the idle connection.
    poll(lambda: store.server.open_connections == 0, 5.0, what="the agent to close the idle connection")
    reporter.report(step=2)
    stats = poll(lambda: settled(reporter, 2), 5.0, what="the second report")
    assert stats["sent"] == 2 and stats["failed"] == 0 and stats["connects"] == 2
    assert [b["step"] for b in store.bodies] == [1, 2]


# -- never blocks, never raises -----------------------------------------------------------------


def test_absent_agent_never_blocks_and_is_not_retried_every_step(reporters, short_dir):
    reporter = reporters(socket_path=str(short_dir / "nobody.sock"), url="")
    reporter.report(step=0, step_time_s=0.1)
    poll(lambda: settled(reporter, 1), 5.0, what="the first attempt to fail")
    for step in range(1, 1000):  # every later step finds the client backing off
        assert reporter.report(step=step, step_time_s=0.1) is None
    stats = poll(lambda: settled(reporter, 1000), 5.0, what="all reports accounted for")
    assert stats["dropped"] == 1000 and stats["sent"] == 0 and stats["failed"] == 0
    assert stats["connects"] == 1  # one attempt, then back-off


def test_hanging_agent_never_blocks_the_loop(reporters, hanging_agent):
    path, held = hanging_agent
    reporter = reporters(socket_path=str(path), max_queue=64)
    for step in range(1000):
        assert reporter.report(step=step) is None
    # The queue is bounded: at most 64 waiting plus one in flight; the rest were dropped at once.
    early = reporter.stats()
    assert early["queued"] <= 65 and early["dropped"] >= 1000 - 65
    stats = poll(lambda: settled(reporter, 1000), 5.0, what="the hung send to time out")
    assert stats["failed"] == 1 and stats["dropped"] == 999 and stats["sent"] == 0
    assert stats["connects"] == 1 and len(held) == 1


def test_backoff_grows_to_a_minute_and_recovers(reporters, short_dir):
    now = {"t": 0.0}
    path = short_dir / "late.sock"
    reporter = reporters(socket_path=str(path), clock=lambda: now["t"])
    reporter.report(step=0)
    poll(lambda: reporter.stats()["connects"] == 1 and settled(reporter, 1), 5.0, what="the first attempt")
    failed_at, total = 0.0, 1
    for delay in (5.0, 10.0, 20.0, 40.0, 60.0, 60.0):
        now["t"] = failed_at + delay - 0.01
        before = reporter.stats()["connects"]
        reporter.report(step=1)  # still backing off: dropped at once, no connection attempt
        total += 1
        assert reporter.stats()["connects"] == before and settled(reporter, total)
        now["t"] = failed_at + delay + 0.01
        reporter.report(step=1)
        total += 1
        poll(lambda: reporter.stats()["connects"] == before + 1 and settled(reporter, total), 5.0,
             what=f"a retry after {delay}s")
        failed_at = now["t"]
    assert reporter.stats()["sent"] == 0
    store = ReportStore()
    server = ReportSocketServer(path, store)
    server.start()
    try:
        now["t"] = failed_at + 60.01
        reporter.report(step=99)
        stats = poll(lambda: settled(reporter, total + 1), 5.0, what="delivery once the agent is up")
        assert stats["sent"] == 1 and store.report_for(gpu="0", uuid=None, pids=[os.getpid()], now=store._clock()).step == 99
    finally:
        server.close()


def test_no_retry_before_the_backoff_expires(reporters, short_dir):
    now = {"t": 100.0}
    reporter = reporters(socket_path=str(short_dir / "none.sock"), clock=lambda: now["t"])
    reporter.report(step=0)
    poll(lambda: settled(reporter, 1), 5.0, what="the first attempt")
    for t in (101.0, 104.99):
        now["t"] = t
        reporter.report(step=1)  # dropped synchronously while backing off
    stats = reporter.stats()
    assert stats["connects"] == 1 and stats["dropped"] == 3 and stats["queued"] == 0


class BadFloat(float):
    def __float__(self) -> float:
        raise RuntimeError("conversion explodes")


class dtype:  # noqa: N801 - looks like a torch dtype to the client
    def __str__(self) -> str:
        raise RuntimeError("str explodes")


GARBAGE = [
    {"step_time_s": "0.5"},
    {"step_time_s": float("nan")},
    {"tokens": float("inf")},
    {"tokens": -1},
    {"flops_per_token": True},
    {"model_bytes": object()},
    {"step_time_s": BadFloat(1.0)},
    {"step": 1.5},
    {"step": -3},
    {"rank": "0", "step": 1},
    {"step": 1, "rank": 4, "world_size": 4},
    {"step": 1, "world_size": 0},
    {"dtype": "int4"},
    {"dtype": 16},
    {"dtype": dtype()},
    {"step": 1, "job": 42},
    {"step": 1, "job": "x" * 200},
    {"step": 1, "gpu": object()},
    {"step": 1, "gpu": -1},
    {"step": 1, "gpu": ""},
    {},
    {"rank": 0, "world_size": 2},
]


def test_garbage_arguments_are_dropped_and_counted_never_raised(agent_socket, reporters):
    path, store = agent_socket()
    reporter = reporters(socket_path=str(path))
    for kwargs in GARBAGE:
        assert reporter.report(**kwargs) is None
    stats = reporter.stats()
    assert stats["invalid"] == len(GARBAGE) and stats["dropped"] == len(GARBAGE) and stats["queued"] == 0
    reporter.report(step=1)  # a good report afterwards still goes through
    stats = poll(lambda: settled(reporter, len(GARBAGE) + 1), 5.0, what="the good report")
    assert stats["sent"] == 1 and len(store.bodies) == 1
    assert client.report(step_time_s="nonsense") is None  # the module-level call is just as safe


def test_an_error_inside_the_sender_is_swallowed_and_counted(agent_socket, reporters):
    path, store = agent_socket()
    now = {"t": 0.0}
    reporter = reporters(socket_path=str(path), clock=lambda: now["t"])

    def explode(body: bytes) -> int:
        raise RuntimeError("bug in the sender")

    reporter._post = explode  # type: ignore[method-assign]
    reporter.report(step=1)
    stats = poll(lambda: settled(reporter, 1), 5.0, what="the failure to be counted")
    assert stats["failed"] == 1
    del reporter._post  # back to the real method
    now["t"] = 61.0  # past the back-off
    reporter.report(step=2)
    stats = poll(lambda: settled(reporter, 2), 5.0, what="the sender to recover")
    assert stats["sent"] == 1 and store.bodies[-1]["step"] == 2


def test_close_sends_what_is_queued_then_drops(agent_socket, reporters):
    path, store = agent_socket()
    reporter = reporters(socket_path=str(path))
    for step in range(3):
        reporter.report(step=step)
    reporter.close(timeout=5.0)
    assert reporter.stats()["sent"] == 3
    reporter.report(step=4)
    reporter.close()
    stats = reporter.stats()
    assert stats["sent"] == 3 and stats["dropped"] == 1 and [b["step"] for b in store.bodies] == [0, 1, 2]
