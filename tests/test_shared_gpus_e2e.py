"""A real agent process over the test kubelet shows per-holder series for a time-sliced GPU and a DRA GPU (issue 47).

``roofwatch demo --backend nvml-virtual --scenario shared`` runs the real NVML backend over the fake driver,
with ``kubelet_socket`` pointing at a real gRPC pod-resources server (tests/fake_kubelet.py, the vendored v1
proto). The kubelet names pods the scenario does not run: one more pod on a time-sliced replica of GPU 0
(``GPU-…::4``) and one more pod on the DRA claim of GPU 2 (driver ``gpu.nvidia.com``, device ``gpu-2``, the
name NVIDIA's DRA driver gives the GPU with minor 2). Both must appear as holders of their GPU, found through
the kubelet, beside the scenario's; GPU 1's four MPS clients are ``via="mps"`` (NVML's MPS client list);
the idle notebook is ``idle_held`` for itself; and each GPU's holders'
energy, with ``unattributed``, adds up to its energy counter in the same scrape.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import AgentProcess, clean_env, poll
from tests.fake_kubelet import FakeKubelet, claim, dra_pod, pod

pytestmark = pytest.mark.slow

SHARED_CLAIM = ("gpu.nvidia.com", "shared-node", "gpu-2")


def samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_a_real_agent_shows_every_holder_of_a_time_sliced_and_a_dra_gpu_from_the_kubelet() -> None:
    kubelet = FakeKubelet().start()
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", "nvml-virtual", "--scenario", "shared",
                         env=clean_env(ROOFWATCH_KUBELET_SOCKET=kubelet.socket_path, ROOFWATCH_KUBELET_REFRESH_S="1"))
    try:
        agent.wait_healthy(60)
        uuid = {s.labels["gpu"]: s.labels["uuid"] for s in samples(agent.metrics(), "roofwatch_gpu_info")}
        sliced = {"nvidia.com/gpu": [f"{uuid['0']}::{n}" for n in (1, 2, 3, 4)]}
        kubelet.pods = [
            pod("trainer-0", "ml", main={"nvidia.com/gpu": [sliced["nvidia.com/gpu"][0]]}),
            pod("notebook", "research", main={"nvidia.com/gpu": [sliced["nvidia.com/gpu"][1]]}),
            pod("augment", "vision", main={"nvidia.com/gpu": [sliced["nvidia.com/gpu"][2]]}),
            pod("eval-0", "ml", eval={"nvidia.com/gpu": [sliced["nvidia.com/gpu"][3]]}),
            dra_pod("chat-a", "inference", main=[claim("shared-h100", "inference", SHARED_CLAIM)]),
            dra_pod("chat-b", "inference", main=[claim("shared-h100", "inference", SHARED_CLAIM)]),
            dra_pod("chat-c", "inference", web=[claim("shared-h100", "inference", SHARED_CLAIM)]),
        ]

        def every_holder() -> str | None:
            text = agent.metrics()
            info = {(s.labels["gpu"], s.labels["holder"]): s.labels for s in samples(text, "roofwatch_gpu_holder_info")}
            idle = {(s.labels["gpu"], s.labels["holder"]) for s in samples(text, "roofwatch_gpu_holder_class")
                    if s.labels["class"] == "idle_held"}
            found = ("0", "ml/eval-0/eval") in info and ("2", "inference/chat-c/web") in info
            return text if found and ("0", "research/notebook/main") in idle else None

        text = poll(every_holder, 90, interval=0.5, what="the kubelet's holders and the idle notebook in /metrics")
        info = {(s.labels["gpu"], s.labels["holder"]): s.labels for s in samples(text, "roofwatch_gpu_holder_info")}
        assert info[("0", "ml/eval-0/eval")]["via"] == "time-slicing"
        assert {k[1] for k in info if k[0] == "0"} == {"ml/trainer-0/main", "research/notebook/main",
                                                       "vision/augment/main", "ml/eval-0/eval"}
        assert [info[k]["via"] for k in info if k[0] == "1"] == ["mps"] * 4, "GPU 1's clients, from NVML's MPS list"
        chat_c = info[("2", "inference/chat-c/web")]
        assert (chat_c["via"], chat_c["claim"]) == ("dra", "inference/shared-h100")
        assert {k[1] for k in info if k[0] == "2"} == {"inference/chat-a/main", "inference/chat-b/main",
                                                       "inference/chat-c/web"}
        memory = {(s.labels["gpu"], s.labels["holder"]): s.value
                  for s in samples(text, "roofwatch_gpu_holder_memory_used_bytes")}
        assert memory[("0", "ml/eval-0/eval")] == 0 and memory[("2", "inference/chat-c/web")] == 0, \
            "named by the kubelet, no process on the GPU: allocated, no context"
        gpu_energy = {s.labels["gpu"]: s.value for s in samples(text, "roofwatch_gpu_energy_joules_total")}
        for gpu in ("0", "2"):
            holders = sum(s.value for s in samples(text, "roofwatch_gpu_holder_energy_joules_total")
                          if s.labels["gpu"] == gpu)
            assert holders == pytest.approx(gpu_energy[gpu], rel=1e-9), f"GPU {gpu}: holders + unattributed"
        assert not [s for s in samples(text, "roofwatch_gpu_holder_info") if s.labels["gpu"] in ("4", "5", "6", "7")]
    finally:
        agent.kill()
        kubelet.close()
