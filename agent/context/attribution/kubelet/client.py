"""A thin, blocking client for the kubelet pod-resources API (``/v1.PodResourcesLister``).

It only translates: gRPC over the kubelet's unix socket in, plain dataclasses out, and one
exception type (:class:`KubeletError`) for every failure, so that callers never see protobuf
messages or ``grpc.RpcError``. Every call carries a deadline, and a missing socket fails before
gRPC is involved, so a node without a kubelet (or a pod without the hostPath mount) is reported
in microseconds with a message that says what to mount. Caching, retries and backoff belong
to :mod:`agent.context.attribution.kubelet.cache`.
"""

from __future__ import annotations

import os
import stat
import threading
from typing import Any

import grpc

from agent.context.attribution.kubelet.model import (
    ClaimDevice,
    ContainerDevices,
    ContainerResources,
    DynamicResources,
    PodResources,
)
from agent.context.attribution.kubelet.podresources.v1 import api_pb2, api_pb2_grpc

# The kubelet's own consumers allow 16 MiB; gRPC's 4 MiB default is too small for a List on a
# node with many pods, each listing CPU ids and memory.
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    # Keep gRPC's own reconnect backoff short: the cache decides how often to retry.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_http_proxy", 0),
)


class KubeletError(Exception):
    """A pod-resources call failed; the message names the socket and the gRPC status.

    ``code`` is the gRPC status code, or None when no call was made (no socket, client closed).
    """

    def __init__(
        self,
        message: str,
        *,
        socket_path: str,
        method: str,
        code: grpc.StatusCode | None = None,
        details: str | None = None,
    ) -> None:
        super().__init__(message)
        self.socket_path = socket_path
        self.method = method
        self.code = code
        self.details = details

    @property
    def unsupported(self) -> bool:
        """The kubelet does not serve this method: too old (UNIMPLEMENTED), or ``Get`` is
        behind the ``KubeletPodResourcesGet`` feature gate, which answers "method disabled"."""
        if self.code is grpc.StatusCode.UNIMPLEMENTED:
            return True
        return self.code is grpc.StatusCode.UNKNOWN and "disabled" in (self.details or "").lower()


def _claim_from_message(message: api_pb2.DynamicResource) -> DynamicResources:
    """A DRA claim of a container; a kubelet before 1.31 (or without ``KubeletPodResourcesDynamicResources``)
    sends none, so an empty list is the common case."""
    return DynamicResources(
        claim_name=message.claim_name,
        claim_namespace=message.claim_namespace,
        devices=tuple(
            ClaimDevice(driver_name=resource.driver_name, pool_name=resource.pool_name,
                        device_name=resource.device_name,
                        cdi_devices=tuple(cdi.name for cdi in resource.cdi_devices))
            for resource in message.claim_resources
        ),
    )


def _pod_from_message(message: api_pb2.PodResources) -> PodResources:
    return PodResources(
        name=message.name,
        namespace=message.namespace,
        containers=tuple(
            ContainerResources(
                name=container.name,
                devices=tuple(
                    ContainerDevices(resource_name=devices.resource_name, device_ids=tuple(devices.device_ids))
                    for devices in container.devices
                ),
                dynamic=tuple(_claim_from_message(claim) for claim in container.dynamic_resources),
            )
            for container in message.containers
        ),
    )


class PodResourcesClient:
    """Calls ``List`` and ``Get`` on the kubelet's pod-resources socket.

    Safe to share between threads; :meth:`close` from another thread ends a call in flight
    (it fails with CANCELLED), which is how the cache stops promptly while the kubelet hangs.
    """

    def __init__(self, socket_path: str | os.PathLike[str], timeout_s: float = 2.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self._socket_path = os.path.abspath(os.fspath(socket_path))
        self._timeout_s = float(timeout_s)
        self._lock = threading.Lock()  # guards the channel fields only, never held across a call
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None
        self._closed = False

    @property
    def socket_path(self) -> str:
        return self._socket_path

    def list(self) -> list[PodResources]:
        """All pods on the node with the devices of each container (``List``)."""
        response = self._call("List", api_pb2.ListPodResourcesRequest())
        return [_pod_from_message(pod) for pod in response.pod_resources]

    def get(self, pod: str, namespace: str) -> PodResources | None:
        """One pod (``Get``), or None when the kubelet does not know it.

        The kubelet answers an unknown pod with a plain error (status UNKNOWN, "pod ... not
        found") rather than NOT_FOUND; both count as "not found" here. Any other failure,
        including a kubelet where ``Get`` is disabled or missing (:attr:`KubeletError.unsupported`),
        raises.
        """
        request = api_pb2.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
        try:
            response = self._call("Get", request)
        except KubeletError as err:
            if err.code is grpc.StatusCode.NOT_FOUND or (
                err.code is grpc.StatusCode.UNKNOWN and "not found" in (err.details or "").lower()
            ):
                return None
            raise
        if not response.HasField("pod_resources"):
            return None
        return _pod_from_message(response.pod_resources)

    def close(self) -> None:
        """Release the channel and cancel calls in flight. Idempotent."""
        with self._lock:
            self._closed = True
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _error(self, method: str, message: str, code: grpc.StatusCode | None = None,
               details: str | None = None) -> KubeletError:
        return KubeletError(message, socket_path=self._socket_path, method=method, code=code, details=details)

    def _check_socket(self, method: str) -> None:
        """Fail fast, before gRPC starts connecting, when there is no socket to connect to."""
        try:
            mode = os.stat(self._socket_path).st_mode
        except FileNotFoundError:
            raise self._error(
                method,
                f"no kubelet pod-resources socket at {self._socket_path} "
                "(is /var/lib/kubelet/pod-resources mounted into the agent's pod?)",
            ) from None
        except OSError as err:
            raise self._error(
                method, f"cannot stat kubelet pod-resources socket {self._socket_path}: {err.strerror}"
            ) from None
        if not stat.S_ISSOCK(mode):
            raise self._error(
                method, f"{self._socket_path} is not a unix socket (expected the kubelet pod-resources socket)"
            )

    def _get_stub(self, method: str) -> api_pb2_grpc.PodResourcesListerStub:
        with self._lock:
            if self._closed:
                raise self._error(method, f"pod-resources client for {self._socket_path} is closed")
            if self._stub is None:
                self._channel = grpc.insecure_channel(
                    f"unix://{self._socket_path}", options=list(_CHANNEL_OPTIONS)
                )
                self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
            return self._stub

    def _drop_channel(self) -> None:
        """Forget a channel whose connection failed, so the next call dials afresh instead of
        waiting out gRPC's reconnect backoff (the kubelet re-creates its socket on restart)."""
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()

    def _call(self, method: str, request: Any) -> Any:
        self._check_socket(method)
        stub = self._get_stub(method)
        try:
            return getattr(stub, method)(request, timeout=self._timeout_s)
        except ValueError:  # the channel was closed by close() between _get_stub and the call
            raise self._error(method, f"pod-resources client for {self._socket_path} is closed",
                              code=grpc.StatusCode.CANCELLED) from None
        except grpc.RpcError as err:
            code = err.code() if callable(getattr(err, "code", None)) else None
            details = err.details() if callable(getattr(err, "details", None)) else str(err)
            if code is grpc.StatusCode.UNAVAILABLE:
                self._drop_channel()
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                details = f"no answer within {self._timeout_s:g} s"
            name = code.name if code is not None else "UNKNOWN"
            raise self._error(
                method,
                f"kubelet pod-resources {method} on unix://{self._socket_path} failed: {name}: {details}",
                code=code,
                details=details,
            ) from None
