"""The agent's side of workload reports: validation, policy, matching, and both real transports."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pytest

import agent.context.workload.report_http as report_http
from agent.context.workload.report_devices import resolve_devices
from agent.context.workload.report_http import REPORT_PATH, is_loopback
from agent.context.workload.report_schema import MAX_BODY_BYTES, ReportHints
from agent.context.workload.report_socket import ReportSocketServer
from agent.context.workload.report_store import ReportStore
from agent.model import CollectorHealth, NodeSnapshot
from exporters.http import AgentHTTPServer
from tests.agent_process import poll

UUID_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UUID_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
UUID_C = "GPU-cccccccc-1111-2222-3333-444444444444"
JSON = "application/json"


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def send(store: ReportStore, payload: bytes | dict, *, content_type: str | None = JSON, peer_pid: int | None = None,
         authorization: str | None = None, from_loopback: bool = True) -> tuple[int, str]:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return store.accept(raw, content_type=content_type, peer_pid=peer_pid, authorization=authorization,
                        from_loopback=from_loopback)


# -- validation and policy (the store) ---------------------------------------------------------


def test_valid_report_is_kept_and_found_by_peer_pid_with_derived_throughput():
    clock = Clock()
    store = ReportStore(clock=clock)
    status, _ = send(store, {"step_time_s": 0.5, "tokens": 4096, "flops_per_token": 6e9, "dtype": "fp8",
                             "model_bytes": 1.4e10, "rank": 1, "world_size": 8, "step": 12, "job": "llama",
                             "pid": 7}, peer_pid=4242)
    assert status == 204
    report = store.report_for(gpu="0", uuid=UUID_A, pids=[1, 4242], now=clock.t)
    assert report is not None
    assert report.tokens_per_s == pytest.approx(8192.0)  # tokens / step_time_s
    assert (report.dtype, report.source, report.job, report.rank, report.world_size, report.step) == \
        ("fp8", "client", "llama", 1, 8, 12)
    assert report.flops_per_token == 6e9 and report.model_bytes == 1.4e10
    assert store.report_for(gpu="1", uuid=UUID_B, pids=[5], now=clock.t) is None
    assert store.stats()["accepted"] == 1


def test_explicit_tokens_per_s_wins_and_no_step_time_means_no_derivation():
    store = ReportStore(clock=Clock())
    send(store, {"tokens": 100, "tokens_per_s": 5.0, "step_time_s": 1.0}, peer_pid=1)
    send(store, {"tokens": 100}, peer_pid=2)
    assert store.report_for(gpu="0", uuid=None, pids=[1], now=1000.0).tokens_per_s == 5.0
    assert store.report_for(gpu="0", uuid=None, pids=[2], now=1000.0).tokens_per_s is None


@pytest.mark.parametrize("payload, field", [
    ({"step_time_s": -1.0}, "step_time_s"),
    ({"step_time_s": "0.5"}, "step_time_s"),
    ({"step_time_s": True}, "step_time_s"),
    ({"tokens": 1e30}, "tokens"),
    ({"flops_per_token": -5}, "flops_per_token"),
    ({"dtype": "int4"}, "dtype"),
    ({"step": 1, "job": "j" * 129}, "job"),
    ({"step": 1, "gpu": "x" * 129}, "gpu"),
    ({"step": 1, "surprise": 1}, "surprise"),
    ({"step": 1, "world_size": 0}, "world_size"),
    ({"step": 1, "rank": 2, "world_size": 2}, "rank"),
    ({"step": 1.5}, "step"),
    ({"step": 1, "pid": 0}, "pid"),
    ({"step": 1, "hints": {"CUDA_VISIBLE_DEVICES": "0" * 2000}}, "hints.CUDA_VISIBLE_DEVICES"),
    ({"step": 1, "hints": {"PATH": "/bin"}}, "hints.PATH"),
    ({"rank": 0, "world_size": 2, "job": "j"}, "step_time_s"),  # nothing meaningful: the message lists what is
    ([1, 2], "body"),
])
def test_invalid_reports_get_422_naming_the_field(payload, field):
    store = ReportStore(clock=Clock())
    status, message = send(store, payload)
    assert status == 422, message
    assert field in message
    assert store.stats()["rejected"]["invalid"] == 1 and len(store) == 0


def test_non_finite_numbers_are_rejected():
    store = ReportStore(clock=Clock())
    status, message = send(store, b'{"step_time_s": NaN}')
    assert status == 422 and "step_time_s" in message and "finite" in message
    assert send(store, b'{"tokens": Infinity}')[0] == 422


def test_bad_json_size_and_content_type():
    store = ReportStore(clock=Clock())
    assert send(store, b'{"step": 1')[0] == 400
    assert send(store, b"\xff\xfe")[0] == 400
    assert send(store, b'{"step": 1}', content_type="text/plain")[0] == 415
    assert send(store, b'{"step": 1}', content_type=None)[0] == 415
    assert send(store, b'{"step": 1}', content_type="Application/JSON; charset=utf-8")[0] == 204
    assert send(store, b" " * (MAX_BODY_BYTES + 1))[0] == 413
    rejected = store.stats()["rejected"]
    assert (rejected["bad_json"], rejected["unsupported_media_type"], rejected["too_large"]) == (2, 2, 1)


def test_token_required_on_every_transport_when_configured():
    store = ReportStore(clock=Clock(), token="s3cret")
    assert store.token_required
    for from_loopback in (True, False):
        assert send(store, {"step": 1}, from_loopback=from_loopback)[0] == 401
        assert send(store, {"step": 1}, authorization="Bearer wrong", from_loopback=from_loopback)[0] == 401
        assert send(store, {"step": 1}, authorization="Basic s3cret", from_loopback=from_loopback)[0] == 401
        assert send(store, {"step": 1}, authorization="Bearer s3cret", from_loopback=from_loopback)[0] == 204
    assert send(store, {"step": 1}, authorization="bearer  s3cret ")[0] == 204
    # Auth is decided before anything about the body is looked at.
    assert send(store, b"garbage", content_type="text/plain", authorization="Bearer nope")[0] == 401
    assert store.stats()["rejected"]["unauthorized"] == 7


def test_without_token_only_loopback_or_socket_clients_may_report():
    store = ReportStore(clock=Clock())
    status, message = send(store, {"step": 1}, from_loopback=False)
    assert status == 403 and "token" in message
    assert send(store, {"step": 1}, from_loopback=True)[0] == 204
    assert send(store, {"step": 1}, from_loopback=False, authorization="Bearer anything")[0] == 403


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("192.168.1.2", False), ("", False), ("localhost", False),
])
def test_loopback_detection(host, expected):
    assert is_loopback(host) is expected


def test_ttl_expiry_with_injected_clock():
    clock = Clock(1000.0)
    store = ReportStore(ttl_s=30.0, clock=clock)
    send(store, {"step": 1}, peer_pid=10)
    assert store.report_for(gpu="0", uuid=None, pids=[10], now=1029.0) is not None
    assert store.report_for(gpu="0", uuid=None, pids=[10], now=1031.0) is None
    assert len(store) == 0 and store.stats()["expired"] == 1
    # A fresh report from the same reporter is found again.
    clock.t = 1040.0
    send(store, {"step": 2}, peer_pid=10)
    assert store.report_for(gpu="0", uuid=None, pids=[10], now=1041.0).step == 2


def test_latest_report_per_reporter_and_eviction_of_least_recently_updated():
    clock = Clock()
    store = ReportStore(max_reporters=3, clock=clock)
    for pid in (1, 2, 3):
        clock.t += 1
        send(store, {"step": pid}, peer_pid=pid)
    clock.t += 1
    send(store, {"step": 100}, peer_pid=1)  # updating 1 makes 2 the least recently updated
    for pid in (4, 5):
        clock.t += 1
        send(store, {"step": pid}, peer_pid=pid)
    assert len(store) == 3 and store.stats()["evicted"] == 2
    found = {pid: store.report_for(gpu="0", uuid=None, pids=[pid], now=clock.t) for pid in (1, 2, 3, 4, 5)}
    assert found[1].step == 100 and found[2] is None and found[3] is None and found[4].step == 4 and found[5].step == 5


def test_claimed_pids_from_different_containers_stay_apart():
    store = ReportStore(clock=Clock())
    send(store, {"step": 1, "pid": 1, "hints": {"NVIDIA_VISIBLE_DEVICES": UUID_A}})
    send(store, {"step": 2, "pid": 1, "hints": {"NVIDIA_VISIBLE_DEVICES": UUID_B}})
    assert len(store) == 2
    assert store.report_for(gpu="0", uuid=UUID_A, pids=[999], now=1000.0).step == 1
    assert store.report_for(gpu="1", uuid=UUID_B, pids=[999], now=1000.0).step == 2


# -- matching ----------------------------------------------------------------------------------


def test_explicit_gpu_hint_beats_pid_and_excludes_other_gpus():
    clock = Clock()
    store = ReportStore(clock=clock)
    send(store, {"step": 1}, peer_pid=50)
    clock.t += 1
    send(store, {"step": 2, "gpu": UUID_A.lower()}, peer_pid=51)
    clock.t += 1
    send(store, {"step": 3, "gpu": "3"}, peer_pid=52)
    # GPU 0 holds pids 50, 51 and 52, but 51 named GPU 0 explicitly and 52 named GPU 3.
    assert store.report_for(gpu="0", uuid=UUID_A, pids=[50, 51, 52], now=clock.t).step == 2
    assert store.report_for(gpu="3", uuid=UUID_C, pids=[], now=clock.t).step == 3
    assert store.report_for(gpu="1", uuid=UUID_B, pids=[52], now=clock.t) is None


def test_peer_pid_is_preferred_over_the_claimed_pid():
    store = ReportStore(clock=Clock())
    # Over the socket the kernel says 7000; the client (in a container) claims 12.
    send(store, {"step": 1, "pid": 12}, peer_pid=7000)
    assert store.report_for(gpu="0", uuid=None, pids=[12], now=1000.0) is None
    assert store.report_for(gpu="0", uuid=None, pids=[7000], now=1000.0).step == 1


def test_claimed_pid_matches_unless_its_uuid_hints_exclude_the_gpu():
    store = ReportStore(clock=Clock())
    send(store, {"step": 1, "pid": 300})
    send(store, {"step": 2, "pid": 301, "hints": {"CUDA_VISIBLE_DEVICES": UUID_B}})
    assert store.report_for(gpu="0", uuid=UUID_A, pids=[300], now=1000.0).step == 1
    # Pid 301 on GPU A is a host process that happens to share the container process's PID.
    assert store.report_for(gpu="0", uuid=UUID_A, pids=[301], now=1000.0) is None
    assert store.report_for(gpu="1", uuid=UUID_B, pids=[301], now=1000.0).step == 2


def test_uuid_hints_with_local_rank_pick_one_and_without_apply_to_all():
    store = ReportStore(clock=Clock())
    both = f"{UUID_A},{UUID_B}"
    send(store, {"step": 1, "pid": 5, "hints": {"CUDA_VISIBLE_DEVICES": both, "LOCAL_RANK": "1"}})
    assert store.report_for(gpu="0", uuid=UUID_A, pids=[], now=1000.0) is None
    assert store.report_for(gpu="1", uuid=UUID_B, pids=[], now=1000.0).step == 1
    store = ReportStore(clock=Clock())
    send(store, {"step": 2, "pid": 5, "hints": {"CUDA_VISIBLE_DEVICES": both}})
    assert store.report_for(gpu="0", uuid=UUID_A, pids=[], now=1000.0).step == 2
    assert store.report_for(gpu="1", uuid=UUID_B, pids=[], now=1000.0).step == 2
    assert store.report_for(gpu="2", uuid=UUID_C, pids=[], now=1000.0) is None


def test_visible_devices_compose_runtime_and_cuda_lists():
    hints = ReportHints(NVIDIA_VISIBLE_DEVICES=f"{UUID_A},{UUID_B},{UUID_C}", CUDA_VISIBLE_DEVICES="2,0", LOCAL_RANK="0")
    assert resolve_devices(hints).uuids == (UUID_C.lower(),)
    assert resolve_devices(ReportHints(NVIDIA_VISIBLE_DEVICES="3,5", CUDA_VISIBLE_DEVICES="1")).indices == ("5",)
    assert resolve_devices(ReportHints(NVIDIA_VISIBLE_DEVICES="all", CUDA_VISIBLE_DEVICES="4")).indices == ("4",)
    assert resolve_devices(ReportHints(CUDA_VISIBLE_DEVICES="1,-1,2")).indices == ("1",)  # CUDA stops at a bad index
    assert resolve_devices(ReportHints(NVIDIA_VISIBLE_DEVICES="void")) == resolve_devices(None)
    assert resolve_devices(ReportHints(ROCR_VISIBLE_DEVICES="GPU-abcdef0123456789", HIP_VISIBLE_DEVICES="0")).uuids == \
        ("gpu-abcdef0123456789",)


def test_uuid_prefix_hint_matches_as_cuda_accepts_it():
    store = ReportStore(clock=Clock())
    send(store, {"step": 1, "hints": {"CUDA_VISIBLE_DEVICES": UUID_A[:12]}})
    assert store.report_for(gpu="0", uuid=UUID_A, pids=[], now=1000.0).step == 1
    assert store.report_for(gpu="1", uuid=UUID_B, pids=[], now=1000.0) is None


def test_index_only_hints_are_the_last_resort():
    clock = Clock()
    store = ReportStore(clock=clock)
    send(store, {"step": 1, "pid": 9, "hints": {"CUDA_VISIBLE_DEVICES": "2"}})
    assert store.report_for(gpu="2", uuid=UUID_C, pids=[], now=clock.t).step == 1
    assert store.report_for(gpu="1", uuid=UUID_B, pids=[], now=clock.t) is None
    # Anything stronger on the same GPU wins over the index hint.
    clock.t += 1
    send(store, {"step": 2}, peer_pid=77)
    assert store.report_for(gpu="2", uuid=UUID_C, pids=[77], now=clock.t).step == 2
    # Once the report's claimed PID puts it on GPU 0, its index no longer counts anywhere.
    assert store.report_for(gpu="0", uuid=UUID_A, pids=[9], now=clock.t).step == 1
    assert store.report_for(gpu="2", uuid=UUID_C, pids=[], now=clock.t) is None


def test_index_hints_unused_with_peer_pid_or_several_indices():
    store = ReportStore(clock=Clock())
    send(store, {"step": 1, "hints": {"CUDA_VISIBLE_DEVICES": "2"}}, peer_pid=55)  # not in pids: not on GPU 2
    send(store, {"step": 2, "pid": 8, "hints": {"CUDA_VISIBLE_DEVICES": "2,3"}})  # which one? unknown
    assert store.report_for(gpu="2", uuid=UUID_C, pids=[], now=1000.0) is None
    send(store, {"step": 3, "pid": 8, "hints": {"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1"}})
    assert store.report_for(gpu="3", uuid=None, pids=[], now=1000.0).step == 3


def test_report_for_never_raises():
    store = ReportStore(clock=Clock())
    send(store, {"step": 1}, peer_pid=3)
    assert store.report_for(gpu="0", uuid=None, pids=None, now=1000.0) is None  # type: ignore[arg-type]
    assert store.report_for(gpu="0", uuid=None, pids=["x"], now=1000.0) is None  # type: ignore[list-item]
    assert store.report_for(gpu=None, uuid=None, pids=[3], now=1000.0).step == 1  # type: ignore[arg-type]


# -- the real HTTP server ------------------------------------------------------------------------


def _snapshot() -> NodeSnapshot:
    return NodeSnapshot(ts=0.0, node="n1", devices=(), health=CollectorHealth(backend="test"), expected_devices=0)


@pytest.fixture
def http_server_factory():
    servers = []

    def make(reports: ReportStore | None) -> AgentHTTPServer:
        srv = AgentHTTPServer(("127.0.0.1", 0), _snapshot, stale_after_s=10.0, reports=reports)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def http_post(port: int, payload: bytes, headers: dict[str, str], path: str = REPORT_PATH):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()


def raw_exchange(connect, request: bytes) -> bytes:
    """Send raw bytes and read the answer until the server closes: for requests http.client will not write."""
    with connect() as sock:
        sock.settimeout(10)
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_http_report_accepted_and_matched(http_server_factory):
    store = ReportStore()
    srv = http_server_factory(store)
    port = srv.server_address[1]
    status, _, reply = http_post(port, body(step=5, tokens_per_s=1e4, pid=4321), {"Content-Type": JSON})
    assert status == 204 and reply == b""
    report = store.report_for(gpu="0", uuid=None, pids=[4321], now=store._clock())
    assert report is not None and report.step == 5 and report.tokens_per_s == 1e4


def test_http_keep_alive_carries_several_reports(http_server_factory):
    store = ReportStore()
    srv = http_server_factory(store)
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=10)
    try:
        for step in range(3):
            conn.request("POST", REPORT_PATH, body=body(step=step), headers={"Content-Type": JSON})
            response = conn.getresponse()
            response.read()
            assert response.status == 204
        sock_before = conn.sock
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        assert conn.sock is sock_before  # one connection throughout
    finally:
        conn.close()
    assert store.stats()["accepted"] == 3


def test_http_4xx(http_server_factory):
    store = ReportStore(token="tok")
    srv = http_server_factory(store)
    port = srv.server_address[1]
    auth = {"Content-Type": JSON, "Authorization": "Bearer tok"}
    status, headers, _ = http_post(port, body(step=1), {"Content-Type": JSON})
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert http_post(port, body(step=1), {**auth, "Authorization": "Bearer nope"})[0] == 401
    assert http_post(port, body(step=1), {**auth, "Content-Type": "text/plain"})[0] == 415
    assert http_post(port, b"{not json", auth)[0] == 400
    status, _, reply = http_post(port, body(step_time_s="slow"), auth)
    assert status == 422 and b"step_time_s" in reply
    assert http_post(port, b"x" * (MAX_BODY_BYTES + 1), auth)[0] == 413
    assert http_post(port, body(step=1), auth)[0] == 204

    connect = lambda: socket.create_connection(("127.0.0.1", port))  # noqa: E731
    # No Content-Length: 411.
    reply = raw_exchange(connect, b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Authorization: Bearer tok\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 411 ")
    # A huge Content-Length with no body gets 413 at once: the server never waits for (or allocates) it.
    reply = raw_exchange(connect, b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Authorization: Bearer tok\r\nContent-Length: 1000000000000\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in reply
    reply = raw_exchange(connect, b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999"
                                  b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 413 ")
    reply = raw_exchange(connect, b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 ")
    rejected = store.stats()["rejected"]
    assert rejected["length_required"] == 1 and rejected["too_large"] == 3 and rejected["unauthorized"] == 2


def test_http_reports_off_gives_404_and_other_methods_keep_405(http_server_factory):
    srv = http_server_factory(None)
    port = srv.server_address[1]
    status, _, reply = http_post(port, body(step=1), {"Content-Type": JSON})
    assert status == 404 and b"not enabled" in reply
    status, headers, _ = http_post(port, body(step=1), {"Content-Type": JSON}, path="/metrics")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", REPORT_PATH)
    assert conn.getresponse().status == 404  # GET behaviour unchanged: an unknown GET path
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("PUT", REPORT_PATH, body=b"{}")
    response = conn.getresponse()
    assert response.status == 405 and response.headers["Allow"] == "GET, HEAD"
    conn.close()


def test_http_with_store_still_405_for_post_elsewhere(http_server_factory):
    srv = http_server_factory(ReportStore())
    status, headers, _ = http_post(srv.server_address[1], body(step=1), {"Content-Type": JSON}, path="/healthz")
    assert status == 405 and headers["Allow"] == "GET, HEAD"


# -- the real unix socket server -------------------------------------------------------------------


@pytest.fixture
def short_dir():
    """Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="rw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def unix_post(path: Path, payload: bytes, headers: dict[str, str], url: str = REPORT_PATH, method: str = "POST"):
    conn = UnixConnection(str(path))
    try:
        conn.request(method, url, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()


def unix_connect(path: Path):
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        return sock
    return connect


def test_socket_server_peer_pid_mode_parent_dir_and_cleanup(short_dir):
    path = short_dir / "sub" / "report.sock"
    store = ReportStore()
    server = ReportSocketServer(path, store, mode=0o660)
    server.start()
    try:
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and stat.S_IMODE(os.lstat(path).st_mode) == 0o660
        status, _, _ = unix_post(path, body(step=3, pid=1), {"Content-Type": JSON})
        assert status == 204
        # The kernel's word (our own pid) counts, not the claimed pid 1.
        report = store.report_for(gpu="0", uuid=None, pids=[os.getpid()], now=store._clock())
        assert report is not None and report.step == 3
        assert store.report_for(gpu="0", uuid=None, pids=[1], now=store._clock()) is None
    finally:
        server.close()
    assert not path.exists()
    server.close()  # idempotent


def test_socket_server_4xx(short_dir):
    path = short_dir / "r.sock"
    store = ReportStore(token="tok")
    server = ReportSocketServer(path, store)
    server.start()
    try:
        auth = {"Content-Type": JSON, "Authorization": "Bearer tok"}
        assert unix_post(path, body(step=1), {"Content-Type": JSON})[0] == 401
        assert unix_post(path, body(step=1), auth)[0] == 204
        assert unix_post(path, body(step=1), {**auth, "Content-Type": "text/csv"})[0] == 415
        assert unix_post(path, b"]", auth)[0] == 400
        assert unix_post(path, body(dtype="int8"), auth)[0] == 422
        assert unix_post(path, b"x" * (MAX_BODY_BYTES + 1), auth)[0] == 413
        status, headers, _ = unix_post(path, b"", {}, method="GET")
        assert status == 405 and headers["Allow"] == "POST"
        assert unix_post(path, body(step=1), auth, url="/elsewhere")[0] == 404
        reply = raw_exchange(unix_connect(path), b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 411 ")
        reply = raw_exchange(unix_connect(path), b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\n"
                                                 b"Content-Length: 1000000000000\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 413 ")
    finally:
        server.close()


def test_socket_server_replaces_stale_socket_but_not_live_one_or_other_files(short_dir):
    path = short_dir / "r.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a killed agent leaves behind
    assert path.exists()
    server = ReportSocketServer(path, ReportStore())
    server.start()
    try:
        assert unix_post(path, body(step=1), {"Content-Type": JSON})[0] == 204
        with pytest.raises(OSError, match="listening"):
            ReportSocketServer(path, ReportStore())
        assert path.exists()  # the failed second server left the live socket alone
        assert unix_post(path, body(step=2), {"Content-Type": JSON})[0] == 204
    finally:
        server.close()
    regular = short_dir / "not-a-socket"
    regular.write_text("precious")
    with pytest.raises(OSError, match="not a socket"):
        ReportSocketServer(regular, ReportStore())
    assert regular.read_text() == "precious"


def test_socket_server_bounds_concurrent_connections(short_dir):
    path = short_dir / "r.sock"
    store = ReportStore()
    server = ReportSocketServer(path, store, max_connections=2)
    server.start()
    idle = []
    try:
        for _ in range(2):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            idle.append(sock)
        # Both slots are taken once the server has accepted the two idle connections.
        poll(lambda: server._slots._value == 0, 5.0, what="two connections accepted")
        reply = raw_exchange(unix_connect(path), b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 503 ")
        idle.pop().close()
        poll(lambda: server._slots._value == 1, 5.0, what="a slot freed")
        assert unix_post(path, body(step=1), {"Content-Type": JSON})[0] == 204
    finally:
        for sock in idle:
            sock.close()
        server.close()
    assert store.stats()["accepted"] == 1


def test_a_refused_client_is_answered_before_it_sends_its_body(http_server_factory):
    """No token, no answer slot: a wrong token is refused from the headers, while the announced
    body never arrives (were the body read first, this would wait for the read timeout)."""
    srv = http_server_factory(ReportStore(token="right"))
    with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as sock:
        sock.sendall(f"POST {REPORT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Authorization: Bearer wrong\r\nContent-Length: 1000\r\n\r\n".encode())
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401") and b"Connection: close" in answer


def test_a_dribbled_body_gets_408_within_the_total_limit(http_server_factory, monkeypatch):
    """The body read has one deadline in all, not one per byte, so a slow client releases its slot."""
    monkeypatch.setattr(report_http, "BODY_READ_TIMEOUT_S", 0.5)
    srv = http_server_factory(ReportStore())
    payload = body(step_time_s=1.0) + b" " * 100  # JSON allows the trailing blanks: 10 s at this pace
    with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as sock:
        sock.sendall(f"POST {REPORT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode())
        sock.setblocking(False)
        answer = b""
        for byte in payload:  # one byte every 0.1 s: each read arrives well within a per-read timeout
            try:
                sock.send(bytes([byte]))
            except OSError:
                break  # the agent answered and closed
            try:
                answer += sock.recv(4096)
            except BlockingIOError:
                pass
            if answer:
                break
            threading.Event().wait(0.1)  # the client's own pace, not a synchronisation
        sock.setblocking(True)
        answer += sock.recv(4096) if not answer else b""
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
