"""A fake kubelet: a real gRPC server on a unix socket serving the generated PodResourcesLister.

Tests change its answers while it runs (``pods``, ``fail``, ``hang``), read per-method call
counts, and stop and restart it on the same socket path to play a kubelet restart. ``Get`` on
an unknown pod answers as the real kubelet does: status UNKNOWN, "pod X in namespace Y not
found".
"""

from __future__ import annotations

import collections
import os
import tempfile
import threading
from concurrent import futures
from typing import Any

import grpc

from agent.context.attribution.kubelet.podresources.v1 import api_pb2 as pb
from agent.context.attribution.kubelet.podresources.v1 import api_pb2_grpc as pbg

HANG_LIMIT_S = 10.0
"""A hanging handler gives up after this long, so a broken test cannot hang the run."""


def pod(name: str, namespace: str, **containers: dict[str, list[str]]) -> pb.PodResources:
    """A PodResources message: ``pod("p", "ns", main={"nvidia.com/gpu": ["GPU-1"]})``."""
    return pb.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            pb.ContainerResources(
                name=container,
                devices=[pb.ContainerDevices(resource_name=resource, device_ids=ids) for resource, ids in resources.items()],
            )
            for container, resources in containers.items()
        ],
    )


def claim(name: str, namespace: str, *devices: tuple[str, str, str]) -> pb.DynamicResource:
    """A DRA claim as the kubelet reports it under a container's ``dynamic_resources`` (Kubernetes 1.31+,
    ``KubeletPodResourcesDynamicResources``): ``claim("gpu", "ml", ("gpu.nvidia.com", "node-1", "gpu-0"))``,
    each device a (driver, pool, device name) triplet with the CDI name NVIDIA's driver gives it."""
    return pb.DynamicResource(
        claim_name=name, claim_namespace=namespace,
        claim_resources=[pb.ClaimResource(driver_name=driver, pool_name=pool, device_name=device,
                                          cdi_devices=[pb.CDIDevice(name=f"k8s.{driver}/claim={name}-{device}")])
                         for driver, pool, device in devices])


def dra_pod(name: str, namespace: str, **containers: list[pb.DynamicResource]) -> pb.PodResources:
    """A pod whose containers got their devices through DRA claims only: ``dra_pod("p", "ns", main=[claim(...)])``."""
    return pb.PodResources(
        name=name, namespace=namespace,
        containers=[pb.ContainerResources(name=container, dynamic_resources=claims)
                    for container, claims in containers.items()],
    )


class _Servicer(pbg.PodResourcesListerServicer):
    def __init__(self, fake: FakeKubelet) -> None:
        self._fake = fake

    def List(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> pb.ListPodResourcesResponse:
        self._fake._enter("List", context)
        return pb.ListPodResourcesResponse(pod_resources=list(self._fake.pods))

    def Get(self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext) -> pb.GetPodResourcesResponse:
        self._fake._enter("Get", context)
        for candidate in self._fake.pods:
            if candidate.name == request.pod_name and candidate.namespace == request.pod_namespace:
                return pb.GetPodResourcesResponse(pod_resources=candidate)
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found")

    def GetAllocatableResources(self, request: pb.AllocatableResourcesRequest,
                                context: grpc.ServicerContext) -> pb.AllocatableResourcesResponse:
        self._fake._enter("GetAllocatableResources", context)
        return pb.AllocatableResourcesResponse()


class FakeKubelet:
    """Serve the pod-resources API on ``socket_path`` (a fresh short temp path by default).

    * ``pods``: the PodResources messages List and Get answer from; replace freely.
    * ``fail[method] = (code, details)``: abort that method with a status.
    * ``hang``: names of methods whose handler blocks until ``release`` is set (bounded by
      :data:`HANG_LIMIT_S`); ``entered[method]`` is set when a handler starts.
    * ``calls[method]``: how many calls arrived; ``in_flight[method]``: how many are running.
    """

    def __init__(self, socket_path: str | None = None) -> None:
        if socket_path is None:
            # unix socket paths are limited to ~107 bytes: keep it short, not under pytest's tmp_path.
            self._tmpdir: str | None = tempfile.mkdtemp(prefix="rwk-", dir="/tmp")
            socket_path = os.path.join(self._tmpdir, "kubelet.sock")
        else:
            self._tmpdir = None
        self.socket_path = socket_path
        self.pods: list[pb.PodResources] = []
        self.fail: dict[str, tuple[grpc.StatusCode, str]] = {}
        self.hang: set[str] = set()
        self.release = threading.Event()
        self.entered: dict[str, threading.Event] = collections.defaultdict(threading.Event)
        self.calls: collections.Counter[str] = collections.Counter()
        self.in_flight: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    def start(self) -> FakeKubelet:
        """Start serving (again, after :meth:`stop`: a new server on the same path)."""
        if self._server is not None:
            raise RuntimeError("already running")
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)  # a stale socket from the previous run
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pbg.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise RuntimeError(f"cannot bind {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket, as a kubelet going away does."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(5)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def close(self) -> None:
        """Release hanging handlers, stop, and remove the temp dir."""
        self.release.set()
        self.stop()
        if self._tmpdir is not None:
            try:
                os.rmdir(self._tmpdir)
            except OSError:
                pass

    def count(self, method: str) -> int:
        with self._lock:
            return self.calls[method]

    def _enter(self, method: str, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls[method] += 1
            self.in_flight[method] += 1
        try:
            self.entered[method].set()
            if method in self.hang:
                self.release.wait(HANG_LIMIT_S)
            failure = self.fail.get(method)
            if failure is not None:
                context.abort(*failure)
        finally:
            with self._lock:
                self.in_flight[method] -= 1

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
