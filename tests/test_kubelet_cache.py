"""Kubernetes attribution: the PodResources cache against a real gRPC fake kubelet.

Mapping devices to pods, misses and early refreshes, failures and backoff, hanging kubelets, the
background thread, and revalidation with Get when List is rate limited.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from agent.context.attribution.kubelet import PodRef, PodResourcesCache
from tests.agent_process import poll
from tests.fake_kubelet import FakeKubelet, pod
from tests.kubelet_fixtures import MIG_1, UUID_A, UUID_B, training_pods
from tests.kubelet_fixtures import kubelet  # noqa: F401 (a fixture)

WAIT_S = 10.0  # upper bound for every wait on a background event; tests normally take ms


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


def test_no_background_threads_leak(kubelet):
    before = {t.ident for t in threading.enumerate() if t.name == "roofwatch-kubelet-cache"}
    cache = PodResourcesCache(kubelet.socket_path, refresh_s=0.05)
    cache.start()
    cache.close(timeout_s=WAIT_S)
    after = {t.ident for t in threading.enumerate() if t.name == "roofwatch-kubelet-cache"}
    assert after <= before
