"""Device id -> pod map, refreshed from the kubelet in a background thread.

The collection loop asks :meth:`PodResourcesCache.pod_for` for every GPU on every cycle, so the
lookup must cost a dict read and nothing else: it never takes a lock, never waits, never calls
the kubelet. A daemon thread calls ``List`` every ``refresh_s`` seconds, builds a fresh map
and swaps it in with one attribute assignment, so readers see either the old map or the new
one, never a half-built one. (dcgm-exporter's pod mapper once ran ``List`` synchronously on
every scrape, with no negative cache; that is what this design avoids.)

Decisions worth knowing:

* **Failed lookups are remembered.** An id that is not in the map is recorded with the time of
  its first miss; asking again costs a dict lookup. The first miss of an id (a pod that just
  started, say) wakes the refresher early, but early refreshes are at least
  ``min_early_refresh_s`` (default ``refresh_s / 4``) after the previous ``List``, and never
  happen while the kubelet is failing (backoff wins). A remembered miss never wakes it again;
  the periodic refresh picks it up. An id that later resolves is forgotten as a miss, so when
  its pod ends the next miss counts as new once more. At most ``_MAX_MISSES`` ids are
  remembered; beyond that, misses are not recorded and wake nothing.
* **Failures keep the last good map.** When ``List`` fails the map is kept, ``status.ok``
  turns False, the state change is logged once (warning; recovery at info), and retries back
  off exponentially from ``refresh_s`` up to ``backoff_max_s``.
* **Get is used to revalidate when List is refused for load.** The kubelet rate-limits this API
  (RESOURCE_EXHAUSTED) and a ``List`` on a busy node may run past the deadline
  (DEADLINE_EXCEEDED); in both cases the kubelet is alive but ``List`` is the expensive call.
  Then each pod already in the map is checked with ``Get`` (one cheap call per GPU pod, in
  namespace/pod order, stopping at the first failure): pods the kubelet no longer knows are
  dropped, so a GPU is not attributed to a finished pod while ``List`` stays refused, and
  pods it returns are updated. The rest of the map is kept and ``status.ok`` stays False. A
  kubelet without ``Get`` (older than 1.27, or the ``KubeletPodResourcesGet`` gate off) is
  detected once and never asked again.
* **Shared GPUs** (time-slicing replicas ``::N``, ``-slice-N``, several containers holding the
  same device): :meth:`pods_for` returns every holder, sorted by namespace, pod, container;
  :meth:`pod_for` returns the first of them, so the choice is stable across refreshes.
* **DRA claims** (a container's ``dynamic_resources``) are indexed like device-plugin devices, under
  ``dra:<driver>/<device>`` (and the device's UUID or PCI address when the driver names it so); the
  host side asks with the names each driver gives a local GPU (agent.context.attribution.dra).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import grpc

from agent.context.attribution.kubelet.client import KubeletError, PodResourcesClient
from agent.context.attribution.kubelet.devices import (
    DEFAULT_RESOURCE_PREFIXES,
    dra_device_keys,
    is_gpu_resource,
    is_replica,
    normalize_device_id,
)
from agent.context.attribution.kubelet.model import PodRef, PodResources

log = logging.getLogger("roofwatch.kubelet")

_MAX_MISSES = 1024
_MAX_BACKOFF_EXPONENT = 30
# List refused because the kubelet is busy, not because it is gone: worth trying Get instead.
_REVALIDATE_ON = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED})

PodKey = tuple[str, str]  # (namespace, pod name)


@dataclass(frozen=True)
class CacheStatus:
    """A snapshot for diagnostics and metrics. Times are from the cache's clock
    (``time.monotonic`` by default) except ``last_success_wall``, which is ``time.time()``."""

    ok: bool
    """The last ``List`` succeeded (False before the first one and while failing)."""
    last_success: float | None
    last_success_wall: float | None
    last_error: str | None
    """Text of the last failure; kept after recovery so that it can still be inspected."""
    pods: int
    """Pods holding at least one GPU-ish device in the current map."""
    devices: int
    """Distinct (normalised) device ids in the current map."""
    refreshes: int
    """Successful ``List`` calls."""
    failures: int
    """Failed ``List`` calls."""
    consecutive_failures: int
    early_refreshes: int
    """Refreshes started before ``refresh_s`` because of a new miss."""
    revalidations: int
    """Failed ``List`` calls after which at least one pod was checked with ``Get``."""
    get_supported: bool | None
    """None until ``Get`` was tried, then whether the kubelet serves it."""
    misses: int
    """Device ids remembered as unknown."""


@dataclass(frozen=True)
class _Snapshot:
    """Everything ``pod_for`` reads, replaced as a whole after each refresh."""

    by_device: Mapping[str, tuple[PodRef, ...]] = field(default_factory=lambda: MappingProxyType({}))
    pods: Mapping[PodKey, PodResources] = field(default_factory=lambda: MappingProxyType({}))


def _ref_order(ref: PodRef) -> tuple[str, str, str, str, str]:
    return (ref.namespace or "", ref.pod or "", ref.container or "", ref.via or "", ref.claim or "")


def build_snapshot(pods: Iterable[PodResources], prefixes: Iterable[str]) -> _Snapshot:
    """Index the GPU-ish devices of ``pods`` by normalised device id; keep only pods that hold one."""
    prefixes = tuple(prefixes)
    holders: dict[str, set[PodRef]] = {}
    gpu_pods: dict[PodKey, PodResources] = {}
    for pod in pods:
        for container in pod.containers:
            names = {"namespace": pod.namespace or None, "pod": pod.name or None, "container": container.name or None}
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name, prefixes):
                    continue
                for device_id in devices.device_ids:
                    key = normalize_device_id(device_id)
                    if key is None:
                        continue
                    via = "time-slicing" if is_replica(device_id) else "device-plugin"
                    holders.setdefault(key, set()).add(PodRef(**names, via=via))
                    gpu_pods[(pod.namespace, pod.name)] = pod
            for claim in container.dynamic:  # DRA: mapped like device-plugin devices (docs/attribution.md)
                ref = PodRef(**names, via="dra", claim=f"{claim.claim_namespace}/{claim.claim_name}")
                for device in claim.devices:
                    for key in dra_device_keys(device.driver_name, device.device_name):
                        holders.setdefault(key, set()).add(ref)
                        gpu_pods[(pod.namespace, pod.name)] = pod
    by_device = {key: tuple(sorted(refs, key=_ref_order)) for key, refs in holders.items()}
    return _Snapshot(by_device=MappingProxyType(by_device), pods=MappingProxyType(gpu_pods))


class PodResourcesCache:
    """Which pod holds a GPU, from the kubelet pod-resources API, without ever waiting for it.

    ``start()`` launches the refresher (a daemon thread); ``close()`` stops it, cancelling a
    kubelet call in flight. ``pod_for()`` and ``status`` may be called from any thread, before
    ``start()`` (empty map) and after ``close()`` (last map). A ``client`` passed in (tests,
    or a shared one) is owned by the cache from then on: ``close()`` closes it.
    """

    def __init__(
        self,
        socket_path: str,
        *,
        refresh_s: float = 10.0,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        resource_prefixes: Iterable[str] = DEFAULT_RESOURCE_PREFIXES,
        min_early_refresh_s: float | None = None,
        backoff_max_s: float = 300.0,
        client: PodResourcesClient | None = None,
    ) -> None:
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be positive, got {refresh_s!r}")
        self._socket_path = socket_path
        self._refresh_s = float(refresh_s)
        self._early_s = float(min_early_refresh_s) if min_early_refresh_s is not None else self._refresh_s / 4
        self._backoff_max_s = max(float(backoff_max_s), self._refresh_s)
        self._clock = clock
        self._prefixes = tuple(resource_prefixes)
        self._client = client if client is not None else PodResourcesClient(socket_path, timeout_s=timeout_s)

        self._snapshot = _Snapshot()
        self._misses: dict[str, float] = {}  # normalised id -> clock() of its first miss

        self._wake = threading.Event()  # set by a new miss and by close()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

        # Written by the refresher thread only.
        self._last_attempt: float | None = None
        self._healthy: bool | None = None  # None until the first attempt: drives log-once
        self._get_supported: bool | None = None
        self._status = CacheStatus(
            ok=False, last_success=None, last_success_wall=None, last_error=None, pods=0, devices=0,
            refreshes=0, failures=0, consecutive_failures=0, early_refreshes=0, revalidations=0,
            get_supported=None, misses=0,
        )

    # -- public API ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the refresher thread; the first ``List`` runs at once."""
        if self._stop.is_set():
            raise RuntimeError("PodResourcesCache was closed; create a new one")
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="roofwatch-kubelet-cache", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the refresher and wait up to ``timeout_s`` for it. A kubelet call in flight is
        cancelled (the client's channel is closed), so this returns promptly even when the
        kubelet hangs. Idempotent."""
        self._stop.set()
        self._wake.set()
        self._client.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("kubelet cache thread did not stop within %.1f s", timeout_s)

    @property
    def running(self) -> bool:
        """Whether the refresher thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the refresher thread to end (after :meth:`close`)."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def pod_for(self, *device_ids: str | None) -> PodRef | None:
        """The pod holding the device known by any of ``device_ids`` (GPU UUID, MIG UUID, PCI
        bus id; tried in order), or None. Never blocks and never calls the kubelet."""
        refs = self.pods_for(*device_ids)
        return refs[0] if refs else None

    def pods_for(self, *device_ids: str | None) -> tuple[PodRef, ...]:
        """Every pod/container holding the device (several when it is shared), sorted by
        namespace, pod, container; empty when unknown. Never blocks."""
        by_device = self._snapshot.by_device  # one read: a consistent map
        keys = [key for key in map(normalize_device_id, device_ids) if key is not None]
        for key in keys:
            refs = by_device.get(key)
            if refs:
                self._misses.pop(key, None)
                return refs
        self._remember_misses(keys)
        return ()

    @property
    def status(self) -> CacheStatus:
        """The current :class:`CacheStatus`."""
        status = self._status
        return CacheStatus(**{**status.__dict__, "misses": len(self._misses)})

    # -- misses -------------------------------------------------------------------------

    def _remember_misses(self, keys: list[str]) -> None:
        """Record first misses (dict operations only, atomic under the GIL); a first miss asks
        the refresher to run early. The refresher enforces the rate limit."""
        new = False
        for key in keys:
            if key not in self._misses and len(self._misses) < _MAX_MISSES:
                self._misses[key] = self._clock()
                new = True
        if new:
            self._wake.set()

    # -- refresher thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._refresh()
                if not self._wait_until_due():
                    return
        except Exception as exc:  # a bug here must not kill attribution silently
            log.exception("kubelet cache refresher crashed; attribution stays frozen")
            self._set_status(ok=False, last_error=f"refresher crashed: {exc!r}")

    def _retry_delay(self) -> float:
        failures = self._status.consecutive_failures
        if failures == 0:
            return self._refresh_s
        return min(self._refresh_s * 2 ** min(failures - 1, _MAX_BACKOFF_EXPONENT), self._backoff_max_s)

    def _wait_until_due(self) -> bool:
        """Sleep until the next refresh is due; False when closed. Woken early by a new miss,
        but never sooner than ``min_early_refresh_s`` after the last attempt, and not at all
        while backing off from failures."""
        assert self._last_attempt is not None
        early_requested = False
        while True:
            if self._stop.is_set():
                return False
            now = self._clock()
            due = self._last_attempt + self._retry_delay()
            early = early_requested and self._status.consecutive_failures == 0
            if early:
                due = min(due, self._last_attempt + self._early_s)
            if now >= due:
                if early and due < self._last_attempt + self._refresh_s:
                    self._set_status(early_refreshes=self._status.early_refreshes + 1)
                return True
            if self._wake.wait(due - now):
                self._wake.clear()
                early_requested = True

    def _refresh(self) -> None:
        self._last_attempt = self._clock()
        try:
            pods = self._client.list()
        except KubeletError as err:
            if self._stop.is_set():
                return  # cancelled by close(): not a kubelet failure
            revalidated = err.code in _REVALIDATE_ON and self._revalidate_with_get()
            self._record_failure(err, revalidated)
            return
        self._install(build_snapshot(pods, self._prefixes))
        self._record_success()

    def _revalidate_with_get(self) -> bool:
        """Check the known GPU pods one by one with ``Get``; True when at least one answered."""
        if self._get_supported is False:
            return False
        pods = dict(self._snapshot.pods)
        answered = False
        for namespace, name in sorted(pods):
            if self._stop.is_set():
                break
            try:
                current = self._client.get(name, namespace)
            except KubeletError as err:
                if err.unsupported:
                    self._get_supported = False
                    log.info("kubelet pod-resources Get is not available (%s); not using it again", err)
                else:
                    log.debug("kubelet pod-resources Get failed, keeping the remaining pods: %s", err)
                break
            self._get_supported = answered = True
            if current is None:
                del pods[(namespace, name)]
            else:
                pods[(namespace, name)] = current
        if answered:
            self._install(build_snapshot(pods.values(), self._prefixes))
        self._set_status(get_supported=self._get_supported)
        return answered

    def _install(self, snapshot: _Snapshot) -> None:
        self._snapshot = snapshot  # the atomic swap readers rely on
        self._set_status(pods=len(snapshot.pods), devices=len(snapshot.by_device))

    def _record_success(self) -> None:
        status = self._status
        if self._healthy is False:
            log.info("kubelet pod-resources answering again at %s: %d GPU pods, %d devices",
                     self._socket_path, status.pods, status.devices)
        elif self._healthy is None:
            log.info("kubelet pod-resources at %s: %d GPU pods, %d devices",
                     self._socket_path, status.pods, status.devices)
        self._healthy = True
        self._set_status(
            ok=True, last_success=self._last_attempt, last_success_wall=time.time(),
            refreshes=status.refreshes + 1, consecutive_failures=0,
        )

    def _record_failure(self, err: KubeletError, revalidated: bool) -> None:
        status = self._status
        self._set_status(
            ok=False, last_error=str(err), failures=status.failures + 1,
            consecutive_failures=status.consecutive_failures + 1,
            revalidations=status.revalidations + int(revalidated),
        )
        if self._healthy is not False:
            log.warning("kubelet pod-resources unavailable, keeping the last map (%d GPU pods); "
                        "retrying with backoff up to %.0f s: %s", status.pods, self._backoff_max_s, err)
        else:
            log.debug("kubelet pod-resources still unavailable: %s", err)
        self._healthy = False

    def _set_status(self, **changes: object) -> None:
        self._status = CacheStatus(**{**self._status.__dict__, **changes})
