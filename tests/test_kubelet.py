"""Kubernetes attribution: device-id normalisation, the PodResources client against a real gRPC fake
kubelet, and the generated gRPC stubs. The cache is in test_kubelet_cache.py, cgroup parsing in
test_kubelet_cgroup.py; the fake kubelet and its pods in tests/kubelet_fixtures.py.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from agent.context.attribution.kubelet import KubeletError, PodResourcesClient, normalize_device_id
from tests.kubelet_fixtures import MIG_1, UUID_A, training_pods
from tests.kubelet_fixtures import kubelet  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parent.parent
PROTO = "agent/context/attribution/kubelet/podresources/v1/api.proto"


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


# -- generated stubs ----------------------------------------------------------------------


@pytest.mark.slow
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
