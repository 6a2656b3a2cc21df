"""Kubernetes attribution: client and cache against a real gRPC fake kubelet, cgroup parsing, stubs."""

from __future__ import annotations

import filecmp
import logging
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.context.attribution.kubelet import (
    KubeletError,
    PodRef,
    PodResourcesCache,
    PodResourcesClient,
    normalize_device_id,
    parse_cgroup,
    pod_from_cgroup,
)
from tests.agent_process import poll
from tests.fake_kubelet import FakeKubelet, pod

REPO = Path(__file__).resolve().parent.parent
PROTO = "agent/context/attribution/kubelet/podresources/v1/api.proto"
WAIT_S = 10.0  # upper bound for every wait on a background event; tests normally take ms

UUID_A = "GPU-8f6b2c1e-0d3a-4c5b-9e7f-112233445566"
UUID_B = "GPU-1a2b3c4d-5e6f-4a8b-9c0d-aabbccddeeff"
MIG_1 = "MIG-3f1e5a2b-7c9d-5e0f-8a1b-2c3d4e5f6a7b"


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    yield fake
    fake.close()


@pytest.fixture
def caches() -> Iterator[list[PodResourcesCache]]:
    """Caches made by a test, closed however the test ends."""
    made: list[PodResourcesCache] = []
    yield made
    for cache in made:
        cache.close(timeout_s=WAIT_S)


def make_cache(caches: list[PodResourcesCache], socket_path: str, **kwargs) -> PodResourcesCache:
    kwargs.setdefault("refresh_s", 60.0)  # periodic refreshes off unless a test wants them
    kwargs.setdefault("timeout_s", 5.0)
    cache = PodResourcesCache(socket_path, **kwargs)
    caches.append(cache)
    return cache


def started(cache: PodResourcesCache) -> PodResourcesCache:
    cache.start()
    poll(lambda: cache.status.refreshes or cache.status.failures, WAIT_S, interval=0.005, what="first refresh")
    return cache


def training_pods() -> list:
    return [
        # Two containers of one pod, each with its own GPU; a sidecar with no devices.
        pod("trainer-0", "ml", main={"nvidia.com/gpu": [UUID_A]}, aux={"nvidia.com/gpu": [UUID_B]}, sidecar={}),
        # A MIG slice, plus a non-GPU resource that must be ignored.
        pod("notebook", "research", lab={"nvidia.com/mig-1g.10gb": [MIG_1], "example.com/nic": ["nic-0"]}),
        # Time-slicing: two pods on replicas of the same AMD GPU (PCI id) and NVIDIA GPU.
        pod("infer-b", "serving", web={"amd.com/gpu": ["0000:C1:00.0-slice-1"], "nvidia.com/gpu": ["GPU-cafe::3"]}),
        pod("infer-a", "serving", web={"amd.com/gpu": ["0000:c1:00.0-slice-0"], "nvidia.com/gpu": ["GPU-CAFE::1"]}),
    ]


# -- device ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("GPU-ABC::7", "gpu-abc"),
        ("  GPU-abc  ", "gpu-abc"),
        ("MIG-3F1E", "mig-3f1e"),
        ("00000000:1B:00.0", "0000:1b:00.0"),
        ("0000:1b:00.0", "0000:1b:00.0"),
        ("1b:00.0", "0000:1b:00.0"),
        ("0000:c1:00.0-slice-2", "0000:c1:00.0"),
        ("nvidia0/vgpu3", "nvidia0"),
        ("", None),
        (None, None),
    ],
)
def test_device_ids_normalise(raw, normal):
    assert normalize_device_id(raw) == normal


# -- client -------------------------------------------------------------------------------


def test_client_list_returns_dataclasses(kubelet):
    kubelet.pods = training_pods()
    with PodResourcesClient(kubelet.socket_path, timeout_s=5) as client:
        pods = client.list()
    assert [p.name for p in pods] == ["trainer-0", "notebook", "infer-b", "infer-a"]
    trainer = pods[0]
    assert [c.name for c in trainer.containers] == ["main", "aux", "sidecar"]
    assert trainer.containers[0].devices[0].resource_name == "nvidia.com/gpu"
    assert trainer.containers[0].devices[0].device_ids == (UUID_A,)
    assert trainer.containers[2].devices == ()
    assert kubelet.count("List") == 1


def test_client_get(kubelet):
    kubelet.pods = training_pods()
    with PodResourcesClient(kubelet.socket_path, timeout_s=5) as client:
        found = client.get("notebook", "research")
        missing = client.get("gone", "research")
    assert found is not None and found.name == "notebook" and found.namespace == "research"
    assert found.containers[0].devices[0].device_ids == (MIG_1,)
    assert missing is None  # the kubelet's "pod ... not found" (status UNKNOWN) means None
    assert kubelet.count("Get") == 2


def test_client_error_names_socket_and_status(kubelet):
    kubelet.fail["List"] = (grpc.StatusCode.PERMISSION_DENIED, "go away")
    kubelet.fail["Get"] = (grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
    with PodResourcesClient(kubelet.socket_path, timeout_s=5) as client:
        with pytest.raises(KubeletError) as listed:
            client.list()
        with pytest.raises(KubeletError) as got:
            client.get("p", "ns")
    assert kubelet.socket_path in str(listed.value)
    assert "PERMISSION_DENIED" in str(listed.value) and "go away" in str(listed.value)
    assert listed.value.code is grpc.StatusCode.PERMISSION_DENIED and not listed.value.unsupported
    assert got.value.unsupported


def test_client_missing_socket_fails_fast_and_readably(tmp_path):
    path = tmp_path / "nowhere" / "kubelet.sock"
    client = PodResourcesClient(path, timeout_s=30)
    started_at = time.monotonic()
    with pytest.raises(KubeletError) as err:
        client.list()
    assert time.monotonic() - started_at < 1.0
    assert str(path) in str(err.value) and "/var/lib/kubelet/pod-resources" in str(err.value)
    assert err.value.code is None
    client.close()


def test_client_not_a_socket(tmp_path):
    path = tmp_path / "kubelet.sock"
    path.write_text("")
    with pytest.raises(KubeletError, match="not a unix socket"):
        PodResourcesClient(path).list()


def test_client_times_out_on_a_hanging_kubelet(kubelet):
    kubelet.hang.add("List")
    with PodResourcesClient(kubelet.socket_path, timeout_s=0.2) as client:
        with pytest.raises(KubeletError) as err:
            client.list()
    assert err.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "DEADLINE_EXCEEDED" in str(err.value) and kubelet.socket_path in str(err.value)


def test_client_closed(kubelet):
    client = PodResourcesClient(kubelet.socket_path)
    client.close()
    with pytest.raises(KubeletError, match="closed"):
        client.list()


# -- cache: mapping -----------------------------------------------------------------------


def test_cache_maps_devices_to_pods(kubelet, caches):
    kubelet.pods = training_pods()
    cache = started(make_cache(caches, kubelet.socket_path))
    assert cache.status.ok
    assert cache.pod_for(UUID_A) == PodRef(namespace="ml", pod="trainer-0", container="main")
    assert cache.pod_for(UUID_B.upper()) == PodRef(namespace="ml", pod="trainer-0", container="aux")
    assert cache.pod_for(MIG_1) == PodRef(namespace="research", pod="notebook", container="lab")
    # Time-slicing: replicas collapse onto the device; the holder is picked by namespace/pod/container.
    assert cache.pod_for("GPU-cafe") == PodRef(namespace="serving", pod="infer-a", container="web")
    assert [ref.pod for ref in cache.pods_for("GPU-CAFE")] == ["infer-a", "infer-b"]
    # AMD: the PCI id as NVML-style long form and as sysfs short form.
    assert cache.pod_for("00000000:C1:00.0").pod == "infer-a"
    assert cache.pod_for("0000:c1:00.0").pod == "infer-a"
    # Several ids for one GPU: the first that is known wins; None ids are skipped.
    assert cache.pod_for(None, "GPU-unknown", UUID_A).container == "main"
    # Non-GPU resources are not indexed.
    assert cache.pod_for("nic-0") is None
    status = cache.status
    assert (status.pods, status.devices) == (4, 5)
    assert kubelet.count("List") == 1


def test_cache_resource_prefixes_are_configurable(kubelet, caches):
    kubelet.pods = training_pods()
    cache = started(make_cache(caches, kubelet.socket_path, resource_prefixes=("amd.com/",)))
    assert cache.pod_for(UUID_A) is None
    assert cache.pod_for("0000:c1:00.0").pod == "infer-a"


def test_pod_for_before_start_and_after_close(kubelet, caches):
    kubelet.pods = training_pods()
    cache = make_cache(caches, kubelet.socket_path)
    assert cache.pod_for(UUID_A) is None  # empty map, no kubelet call
    assert kubelet.count("List") == 0
    started(cache)
    cache.close(timeout_s=WAIT_S)
    assert cache.pod_for(UUID_A).pod == "trainer-0"  # the last map is still served


# -- cache: misses and early refresh -------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_unknown_device_is_remembered_and_costs_nothing(kubelet, caches):
    kubelet.pods = training_pods()
    # No rate limit at all, so that any kubelet call caused by a repeated miss would show.
    cache = started(make_cache(caches, kubelet.socket_path, refresh_s=60.0, min_early_refresh_s=0.0))
    assert kubelet.count("List") == 1
    assert cache.pod_for("GPU-idle") is None  # first miss: one early refresh
    poll(lambda: cache.status.refreshes == 2, WAIT_S, interval=0.005, what="early refresh")
    kubelet.entered["List"].clear()
    for _ in range(1000):
        assert cache.pod_for("GPU-idle", "0000:99:00.0") is None  # a second id: one more new miss
    poll(lambda: cache.status.refreshes == 3, WAIT_S, interval=0.005, what="early refresh")
    kubelet.entered["List"].clear()
    for _ in range(1000):
        assert cache.pod_for("00000000:99:00.0") is None  # the same PCI id, remembered
        assert cache.pod_for("gpu-IDLE::2") is None
    assert not kubelet.entered["List"].wait(0.3)  # bounded check that nothing was called
    assert kubelet.count("List") == 3
    status = cache.status
    assert status.misses == 2 and status.early_refreshes == 2


def test_new_miss_refreshes_early_and_finds_a_new_pod(kubelet, caches):
    kubelet.pods = training_pods()
    clock = FakeClock()
    cache = started(make_cache(caches, kubelet.socket_path, refresh_s=60.0, clock=clock))
    kubelet.pods = [*training_pods(), pod("new", "ml", main={"nvidia.com/gpu": ["GPU-fresh"]})]
    clock.now += 60.0 / 4  # past the early-refresh limit, far from the periodic refresh
    assert cache.pod_for("GPU-fresh") is None  # not yet: the lookup never waits
    found = poll(lambda: cache.pod_for("GPU-fresh"), WAIT_S, interval=0.005, what="early refresh")
    assert found == PodRef(namespace="ml", pod="new", container="main")
    assert kubelet.count("List") == 2
    assert cache.status.early_refreshes == 1
    assert cache.status.misses == 0  # resolved, so no longer a miss


def test_early_refreshes_are_rate_limited(kubelet, caches):
    kubelet.pods = training_pods()
    cache = started(make_cache(caches, kubelet.socket_path, refresh_s=60.0, min_early_refresh_s=0.25))
    began = time.monotonic()
    for count in range(400):  # a storm of new misses: ~1 per ms (a fixed number: a loaded runner is slower)
        cache.pod_for(f"GPU-storm-{count}")
        time.sleep(0.001)
    elapsed = time.monotonic() - began
    calls = kubelet.count("List")
    assert 2 <= calls <= 2 + math.ceil(elapsed / 0.25)  # not one per miss
    assert cache.status.early_refreshes == calls - 1


# -- cache: failures ----------------------------------------------------------------------


def test_kubelet_down_keeps_last_map_and_recovers(kubelet, caches, caplog):
    kubelet.pods = training_pods()
    cache = started(make_cache(caches, kubelet.socket_path, refresh_s=0.05, backoff_max_s=0.2))
    assert cache.status.ok
    with caplog.at_level(logging.DEBUG, logger="roofwatch.kubelet"):
        kubelet.stop()
        poll(lambda: cache.status.failures >= 3, WAIT_S, interval=0.005, what="failures while down")
        status = cache.status
        assert not status.ok and status.consecutive_failures >= 3
        assert kubelet.socket_path in status.last_error
        assert cache.pod_for(UUID_A).pod == "trainer-0"  # last good map kept
        kubelet.pods = [pod("after", "ml", main={"nvidia.com/gpu": [UUID_A]})]
        kubelet.start()  # same socket path, new server: a kubelet restart
        poll(lambda: cache.status.ok, WAIT_S, interval=0.005, what="recovery")
    assert cache.pod_for(UUID_A).pod == "after"
    assert cache.status.consecutive_failures == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()  # once per state change
    assert sum("answering again" in r.getMessage() for r in caplog.records) == 1


def test_failures_back_off_exponentially(kubelet, caches):
    kubelet.fail["List"] = (grpc.StatusCode.INTERNAL, "boom")
    clock = FakeClock()
    cache = started(make_cache(caches, kubelet.socket_path, refresh_s=1.0, backoff_max_s=8.0, clock=clock))
    delays = []
    for _ in range(5):
        failures = cache.status.failures
        delays.append(cache._retry_delay())
        clock.now += delays[-1]
        cache._wake.set()  # let the refresher look at the clock (a miss would do the same)
        poll(lambda: cache.status.failures > failures, WAIT_S, interval=0.005, what="retry")
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    # While failing, new misses do not shorten the backoff.
    calls = kubelet.count("List")
    cache.pod_for("GPU-new-during-backoff")
    kubelet.entered["List"].clear()
    assert not kubelet.entered["List"].wait(0.3)
    assert kubelet.count("List") == calls


def test_missing_socket_reports_quickly_and_attaches_later(tmp_path, caches):
    fake = FakeKubelet()  # not started: its socket does not exist yet
    try:
        fake.pods = training_pods()
        cache = make_cache(caches, fake.socket_path, refresh_s=0.05, backoff_max_s=0.1)
        began = time.monotonic()
        started(cache)
        assert time.monotonic() - began < 2.0
        status = cache.status
        assert not status.ok and "no kubelet pod-resources socket" in status.last_error
        assert cache.pod_for(UUID_A) is None
        fake.start()
        poll(lambda: cache.pod_for(UUID_A), WAIT_S, interval=0.005, what="attach after the socket appears")
    finally:
        fake.close()


def test_hanging_kubelet_never_blocks_pod_for_and_close_is_prompt(kubelet, caches):
    kubelet.pods = training_pods()
    cache = started(make_cache(caches, kubelet.socket_path, refresh_s=60.0, min_early_refresh_s=0.0, timeout_s=30.0))
    kubelet.hang.add("List")
    kubelet.entered["List"].clear()
    assert cache.pod_for("GPU-wakes-the-refresher") is None
    assert kubelet.entered["List"].wait(WAIT_S), "the refresher did not call List"
    # The refresher is now stuck inside List (deadline 30 s); lookups still answer at once.
    began = time.monotonic()
    for _ in range(100):
        assert cache.pod_for(UUID_A).pod == "trainer-0"
    assert time.monotonic() - began < 0.5
    assert kubelet.in_flight["List"] == 1 and not kubelet.release.is_set()
    # close() cancels the call in flight instead of waiting for the deadline.
    began = time.monotonic()
    cache.close(timeout_s=WAIT_S)
    assert time.monotonic() - began < 2.0
    assert not cache.running
    assert not kubelet.release.is_set()  # the server handler was still blocked throughout
    assert cache.status.failures == 0  # a cancelled call is not a kubelet failure


def test_close_stops_the_thread(kubelet, caches):
    cache = started(make_cache(caches, kubelet.socket_path, refresh_s=0.05))
    assert cache.running
    cache.close(timeout_s=WAIT_S)
    assert not cache.running
    calls = kubelet.count("List")
    kubelet.entered["List"].clear()
    assert not kubelet.entered["List"].wait(0.2)
    assert kubelet.count("List") == calls
    cache.close()  # idempotent
    with pytest.raises(RuntimeError):
        cache.start()


def test_threads_are_daemons(kubelet, caches):
    cache = started(make_cache(caches, kubelet.socket_path))
    assert cache._thread is not None and cache._thread.daemon


# -- cache: Get ---------------------------------------------------------------------------


def test_rate_limited_list_revalidates_known_pods_with_get(kubelet, caches):
    kubelet.pods = training_pods()
    clock = FakeClock()
    cache = started(make_cache(caches, kubelet.socket_path, refresh_s=1.0, backoff_max_s=1.0, clock=clock))
    assert cache.status.pods == 4

    def next_refresh() -> None:
        failures = cache.status.failures
        clock.now += 1.0
        cache._wake.set()
        poll(lambda: cache.status.failures > failures, WAIT_S, interval=0.005, what="refresh")

    # The kubelet refuses List; notebook has ended, trainer-0 lost its second GPU.
    kubelet.fail["List"] = (grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
    kubelet.pods = [p for p in training_pods() if p.name != "notebook"]
    kubelet.pods[0] = pod("trainer-0", "ml", main={"nvidia.com/gpu": [UUID_A]})
    next_refresh()
    assert kubelet.count("Get") == 4  # one per known GPU pod
    status = cache.status
    assert not status.ok and "RESOURCE_EXHAUSTED" in status.last_error
    assert status.revalidations == 1 and status.get_supported is True
    assert cache.pod_for(MIG_1) is None  # the ended pod is dropped
    assert cache.pod_for(UUID_B) is None
    assert cache.pod_for(UUID_A).pod == "trainer-0"
    assert cache.pod_for("GPU-cafe").pod == "infer-a"

    # A kubelet without Get (feature gate off): detected on the first call, never asked again.
    kubelet.fail["Get"] = (grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
    next_refresh()
    assert kubelet.count("Get") == 5
    next_refresh()
    assert kubelet.count("Get") == 5
    assert cache.status.get_supported is False
    assert cache.pod_for(UUID_A).pod == "trainer-0"  # map kept


def test_other_list_failures_do_not_use_get(kubelet, caches):
    kubelet.pods = training_pods()
    cache = started(make_cache(caches, kubelet.socket_path, refresh_s=0.05, backoff_max_s=0.05))
    kubelet.fail["List"] = (grpc.StatusCode.INTERNAL, "boom")
    poll(lambda: cache.status.failures >= 2, WAIT_S, interval=0.005, what="failures")
    assert kubelet.count("Get") == 0
    assert cache.pod_for(UUID_A).pod == "trainer-0"


# -- cgroup fallback ----------------------------------------------------------------------

POD_UID = "4e7c1a2b-3d4f-4a5b-8c6d-7e8f9a0b1c2d"
CID = "a3f1c0d2e4b5968778695a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d"


@pytest.mark.parametrize(
    "cgroup",
    [
        # cgroupfs driver, cgroup v1, Burstable and Guaranteed
        f"12:memory:/kubepods/burstable/pod{POD_UID}/{CID}\n11:cpu,cpuacct:/kubepods/burstable/pod{POD_UID}/{CID}\n",
        f"5:devices:/kubepods/pod{POD_UID}/{CID}\n",
        # cgroupfs driver, cgroup v2, CRI-O
        f"0::/kubepods/besteffort/pod{POD_UID}/crio-{CID}\n",
        # systemd driver, cgroup v2: containerd, CRI-O, Docker
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_UID.replace('-', '_')}.slice/docker-{CID}.scope\n",
        # systemd driver, cgroup v1 (hybrid: a v2 line for systemd too)
        f"1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n0::/\n",
        # nested under a kind/kubelet cgroup root
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
    ],
    ids=["v1-cgroupfs-burstable", "v1-cgroupfs-guaranteed", "v2-cgroupfs-crio", "v2-systemd-containerd",
         "v2-systemd-crio-guaranteed", "v2-systemd-docker", "v1-systemd-containerd", "v2-kind"],
)
def test_cgroup_layouts(cgroup):
    assert parse_cgroup(cgroup) == (POD_UID, CID)


def test_cgroup_outside_kubernetes_and_pod_level():
    assert parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert parse_cgroup("0::/system.slice/slurmstepd.scope/job_42/step_0\n") is None
    assert parse_cgroup("garbage\n\n") is None
    assert parse_cgroup(f"0::/kubepods/burstable/pod{POD_UID}\n") == (POD_UID, None)
    assert parse_cgroup(f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/crio-conmon-{CID}.scope\n") == (POD_UID, None)
    static = "0d8b0f1c2e3a4b5c6d7e8f9a0b1c2d3e"  # static pods use a 32-hex config hash as UID
    assert parse_cgroup(f"0::/kubepods/burstable/pod{static}/{CID}\n") == (static, CID)


def write_proc(root: Path, pid: int, cgroup: str, environ: bytes | None = None, namespace: str | None = None) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "cgroup").write_text(cgroup)
    if environ is not None:
        (base / "environ").write_bytes(environ)
    if namespace is not None:
        ns_file = base / "root/var/run/secrets/kubernetes.io/serviceaccount/namespace"
        ns_file.parent.mkdir(parents=True)
        ns_file.write_text(namespace + "\n")


def test_pod_from_cgroup_with_privileges(tmp_path):
    cgroup = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
    write_proc(tmp_path, 4242, cgroup, environ=b"PATH=/usr/bin\0HOSTNAME=trainer-0\0HOME=/root\0", namespace="ml")
    assert pod_from_cgroup(4242, proc_root=tmp_path) == PodRef(
        namespace="ml", pod="trainer-0", container=None, pod_uid=POD_UID, container_id=CID
    )


def test_pod_from_cgroup_without_privileges(tmp_path):
    write_proc(tmp_path, 7, f"0::/kubepods/pod{POD_UID}/{CID}\n")  # environ and root unreadable/absent
    assert pod_from_cgroup(7, proc_root=tmp_path) == PodRef(
        namespace=None, pod=None, container=None, pod_uid=POD_UID, container_id=CID
    )


def test_pod_from_cgroup_never_raises(tmp_path):
    assert pod_from_cgroup(999, proc_root=tmp_path) is None  # process gone
    write_proc(tmp_path, 8, "0::/user.slice\n", environ=b"HOSTNAME=laptop\0")
    assert pod_from_cgroup(8, proc_root=tmp_path) is None  # not in a pod
    base = tmp_path / "9"
    base.mkdir()
    (base / "cgroup").mkdir()  # reading a directory raises IsADirectoryError
    assert pod_from_cgroup(9, proc_root=tmp_path) is None


# -- generated stubs ----------------------------------------------------------------------


def test_generated_stubs_match_the_proto(tmp_path):
    """Regenerate from the vendored proto; the committed stubs must be byte-identical."""
    result = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", PROTO],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    generated = tmp_path / "agent/context/attribution/kubelet/podresources/v1"
    committed = REPO / "agent/context/attribution/kubelet/podresources/v1"
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        assert filecmp.cmp(generated / name, committed / name, shallow=False), (
            f"{name} is stale: regenerate it (see agent/context/attribution/kubelet/podresources/README.md)"
        )


def test_wire_method_paths_match_the_kubelet():
    from agent.context.attribution.kubelet.podresources.v1 import api_pb2

    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert {m.name for m in service.methods} == {"List", "Get", "GetAllocatableResources"}


def test_proto_ships_as_package_data():
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "*.proto" in config["tool"]["setuptools"]["package-data"]["agent.context.attribution.kubelet.podresources.v1"]


def test_no_background_threads_leak(kubelet):
    before = {t.ident for t in threading.enumerate() if t.name == "roofwatch-kubelet-cache"}
    cache = PodResourcesCache(kubelet.socket_path, refresh_s=0.05)
    cache.start()
    cache.close(timeout_s=WAIT_S)
    after = {t.ident for t in threading.enumerate() if t.name == "roofwatch-kubelet-cache"}
    assert after <= before
