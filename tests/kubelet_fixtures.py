"""A real gRPC fake kubelet (tests/fake_kubelet.py) with the pods the kubelet attribution tests use.

Shared by tests/test_kubelet.py and tests/test_kubelet_cache.py, with the ``kubelet`` fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fake_kubelet import FakeKubelet, pod

UUID_A = "GPU-8f6b2c1e-0d3a-4c5b-9e7f-112233445566"
UUID_B = "GPU-1a2b3c4d-5e6f-4a8b-9c0d-aabbccddeeff"
MIG_1 = "MIG-3f1e5a2b-7c9d-5e0f-8a1b-2c3d4e5f6a7b"


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    yield fake
    fake.close()


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
