"""The report store: validation of a body and the intake policy (media type, size, token, loopback),
expiry and eviction, and the rules that match a stored report to a GPU (peer PID, claimed PID,
explicit GPU, visible-device hints)."""

from __future__ import annotations

import json

import pytest

from agent.context.workload.report_devices import resolve_devices
from agent.context.workload.report_http import is_loopback
from agent.context.workload.report_schema import MAX_BODY_BYTES, ReportHints
from agent.context.workload.report_store import ReportStore
from tests.report_fixtures import JSON, UUID_A, UUID_B, UUID_C, Clock


def send(store: ReportStore, payload: bytes | dict, *, content_type: str | None = JSON, peer_pid: int | None = None,
         authorization: str | None = None, from_loopback: bool = True) -> tuple[int, str]:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return store.accept(raw, content_type=content_type, peer_pid=peer_pid, authorization=authorization,
                        from_loopback=from_loopback)


# -- validation and policy ---------------------------------------------------------------------


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


def test_without_a_process_list_a_report_must_name_its_gpu_and_is_matched_without_pids():
    """``--backend dcgm-exporter`` lists no processes: a report found only by PID would be answered 204 and
    then match nothing, so it is refused saying how to name the GPU; named ones match with no PIDs."""
    clock = Clock()
    store = ReportStore(clock=clock, pids_visible=False)
    status, message = send(store, {"tokens_per_s": 100.0, "pid": 7}, peer_pid=4242)
    assert status == 422 and "name its GPU" in message and "NVIDIA_VISIBLE_DEVICES" in message
    assert send(store, {"tokens_per_s": 1.0, "gpu": "1"})[0] == 204
    assert send(store, {"tokens_per_s": 2.0, "hints": {"NVIDIA_VISIBLE_DEVICES": UUID_A}}, peer_pid=11)[0] == 204
    assert send(store, {"tokens_per_s": 3.0, "hints": {"CUDA_VISIBLE_DEVICES": "2"}}, peer_pid=12)[0] == 204
    found = {gpu: store.report_for(gpu=gpu, uuid=uuid, pids=[], now=clock.t)
             for gpu, uuid in (("0", UUID_A), ("1", UUID_B), ("2", UUID_C))}
    assert {gpu: r.tokens_per_s if r else None for gpu, r in found.items()} == {"0": 2.0, "1": 1.0, "2": 3.0}
    # with a process list, an index-only hint from a peer whose PID is on no GPU stays unmatched
    listed = ReportStore(clock=clock)
    assert send(listed, {"tokens_per_s": 100.0, "pid": 7}, peer_pid=4242)[0] == 204
    assert send(listed, {"tokens_per_s": 3.0, "hints": {"CUDA_VISIBLE_DEVICES": "2"}}, peer_pid=12)[0] == 204
    assert listed.report_for(gpu="2", uuid=UUID_C, pids=[], now=clock.t) is None
