"""What each published capture (tests/fixtures/captures) shows, read off its own lines, for
tests/test_captures_replay.py: the capture reader, the roofwatch families each DCGM field becomes (in
roofwatch's units), one entry per capture, and where the agent is known to answer wrong; and for
tests/test_captures_join*.py, how each capture's node is played on the fake NVML (``play_of``) and joined.

Expectations are quoted from the capture next to each entry, never taken from the agent's output.
"""

from __future__ import annotations

import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

CAPTURES = Path(__file__).parent / "fixtures" / "captures"
HOST = socket.gethostname()
"""The agent's node name where the capture has no ``Hostname`` label (the ``node_name`` default)."""
UNNAMED = "NVIDIA GPU (model not exported)"
"""The model roofwatch names a GPU whose exposition has no ``modelName`` label (dcgm-exporter 2.x)."""
MIB = 1024 * 1024


def capture(file: str) -> str:
    return (CAPTURES / file).read_text(encoding="utf-8")


# ---------------------------------------------------------------- the capture's own lines

_SAMPLE = re.compile(r'([A-Za-z_:][A-Za-z0-9_:]*)\{((?:\s*[A-Za-z_][A-Za-z0-9_]*\s*=\s*"[^"]*"\s*,?)*)\}\s+(\S+)')
_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"]*)"')
DCGM_BLANK = float(0x7FFFFFFFFFFFFFF0)
"""DCGM_INT64_BLANK; NOT_FOUND, NOT_SUPPORTED (9223372036854775794) and NOT_PERMISSIONED follow it."""


def fields(file: str) -> dict[str, dict[str, float]]:
    """GPU key (``"3"``, ``"3/7"`` for GPU instance 7) -> DCGM field (upper case) -> value, first line wins.

    Only whole sample lines count: a shell prompt, a ``> ``-quoted line or one whose labels the author
    elided with ``...`` is no sample (the agent skips such lines and counts them, docs/attribution.md),
    and a DCGM blank is no value."""
    out: dict[str, dict[str, float]] = {}
    for line in capture(file).splitlines():
        match = _SAMPLE.fullmatch(line.strip())
        if match is None or not match.group(1).upper().startswith("DCGM_FI_"):
            continue
        labels, value = dict(_PAIR.findall(match.group(2))), float(match.group(3))
        if value >= DCGM_BLANK:
            continue
        key = f"{labels['gpu']}/{labels['GPU_I_ID']}" if labels.get("GPU_I_ID") else labels["gpu"]
        out.setdefault(key, {}).setdefault(match.group(1).upper(), value)
    return out


def _scaled(name: str, factor: float = 1.0) -> Callable[[dict[str, float]], float | None]:
    return lambda f: f[name] * factor if name in f else None


def _engine(f: dict[str, float]) -> float | None:
    """PROF_GR_ENGINE_ACTIVE, else GPU_UTIL (percent) as the duty."""
    if "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in f:
        return f["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    return f["DCGM_FI_DEV_GPU_UTIL"] / 100 if "DCGM_FI_DEV_GPU_UTIL" in f else None


def _memory_total(f: dict[str, float]) -> float | None:
    """DCGM splits the framebuffer into used + free + reserved (FB_RESERVED, DCGM 3.1+)."""
    if "DCGM_FI_DEV_FB_USED" not in f or "DCGM_FI_DEV_FB_FREE" not in f:
        return None
    return (f["DCGM_FI_DEV_FB_USED"] + f["DCGM_FI_DEV_FB_FREE"] + f.get("DCGM_FI_DEV_FB_RESERVED", 0.0)) * MIB


READINGS: dict[str, Callable[[dict[str, float]], float | None]] = {
    "roofwatch_gpu_power_watts": _scaled("DCGM_FI_DEV_POWER_USAGE"),
    "roofwatch_gpu_power_limit_watts": _scaled("DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    "roofwatch_gpu_temperature_celsius": _scaled("DCGM_FI_DEV_GPU_TEMP"),
    # 0 on GDDR boards (T4, L4, L40S, RTX, vGPU): they have no memory sensor, so no reading
    "roofwatch_gpu_memory_temperature_celsius": lambda f: f.get("DCGM_FI_DEV_MEMORY_TEMP") or None,
    "roofwatch_gpu_sm_clock_hertz": _scaled("DCGM_FI_DEV_SM_CLOCK", 1e6),
    "roofwatch_gpu_memory_used_bytes": _scaled("DCGM_FI_DEV_FB_USED", MIB),
    "roofwatch_gpu_memory_total_bytes": _memory_total,
    "roofwatch_gpu_engine_active_ratio": _engine,
    "roofwatch_gpu_tensor_active_ratio": _scaled("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    "roofwatch_gpu_dram_active_ratio": _scaled("DCGM_FI_PROF_DRAM_ACTIVE"),
    "roofwatch_gpu_sm_active_ratio": _scaled("DCGM_FI_PROF_SM_ACTIVE"),
    "roofwatch_gpu_sm_occupancy_ratio": _scaled("DCGM_FI_PROF_SM_OCCUPANCY"),
    "roofwatch_gpu_memory_busy_ratio": _scaled("DCGM_FI_DEV_MEM_COPY_UTIL", 0.01),
    "roofwatch_gpu_pcie_replays_total": _scaled("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
}
"""roofwatch family -> its value from a GPU's capture fields, in roofwatch's unit (None: the capture lacks it)."""

NEVER_GIVEN: dict[str, tuple[str, ...]] = {
    "roofwatch_gpu_throttled": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
    "roofwatch_gpu_clock_event_active": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
    "roofwatch_gpu_remapped_rows": ("DCGM_FI_DEV_ROW_REMAP_PENDING",),  # all four fields, or nothing
    "roofwatch_gpu_ecc_errors_total": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    "roofwatch_gpu_pipe_active_ratio": ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
                                        "DCGM_FI_PROF_PIPE_FP16_ACTIVE"),
    "roofwatch_gpu_sm_clock_max_hertz": ("DCGM_FI_DEV_MAX_SM_CLOCK",),
}
"""Families no capture gives the fields of: absent for every GPU (checked against each capture first)."""

COUNTER_FIELDS: dict[str, tuple[str, ...]] = {
    "roofwatch_gpu_energy_joules_total": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_POWER_USAGE"),
    "roofwatch_gpu_pcie_bytes_total": ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"),
    # DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (nvdocs, linode) is left out by design: DCGM documents no unit
    "roofwatch_gpu_link_bytes_total": ("DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"),
}
"""Since-start counters and the fields any of which gives one (energy: the energy counter, or power x time)."""


# ---------------------------------------------------------------- what each dcgm-exporter capture shows


def _same(keys: str, model: str, spec: str) -> dict[str, tuple[str, str]]:
    return {key: (model, spec) for key in keys.split()}


IDLE_FREE, IDLE_HELD, NO_COUNTERS = ("idle", "idle_free"), ("idle", "idle_held"), ("unknown", "no_counters")


@dataclass(frozen=True)
class Replay:
    """What one dcgm-exporter capture shows, read off its lines (quoted in the comment above each)."""

    file: str
    node: str
    """The ``Hostname`` label; the agent's own host name where the capture has none."""
    info: dict[str, tuple[str, str]]
    """GPU key -> (model, catalogue spec key, "" where nothing identifies the GPU)."""
    verdicts: dict[str, tuple[str, str]]
    """GPU key -> (class, detail) once settled."""
    read: frozenset[str]
    """READINGS families the capture gives at least one GPU (the rest must be absent everywhere)."""
    pods: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    """GPU key -> (namespace, pod, container) from the pod labels."""
    skipped: tuple[int, int] = (0, 0)
    """(lines that are no sample, the first one's line number): a shell line, ``> `` quoting, ``...``."""


FULL_CSV = frozenset({"roofwatch_gpu_power_watts", "roofwatch_gpu_temperature_celsius", "roofwatch_gpu_sm_clock_hertz",
                       "roofwatch_gpu_memory_used_bytes", "roofwatch_gpu_memory_total_bytes",
                       "roofwatch_gpu_engine_active_ratio", "roofwatch_gpu_tensor_active_ratio",
                       "roofwatch_gpu_dram_active_ratio", "roofwatch_gpu_memory_busy_ratio",
                       "roofwatch_gpu_pcie_replays_total"})
"""What dcgm-exporter's default CSV plus its DCP ratios give (MEMORY_TEMP is 0, so no reading, on GDDR boards)."""
ENGINE = frozenset({"roofwatch_gpu_engine_active_ratio"})

REPLAYS = [
    # PROF_GR_ENGINE_ACTIVE 0.000000 for gpu 0, 1, 2; pod="tensorflow-0" namespace="redacted"
    # container="tensorflow" on 0 and 1 only; Hostname="l40s.example.com".
    Replay("dcgm-exporter/dcgm226-l40s-pods-excerpt.txt", "l40s.example.com", _same("0 1 2", "NVIDIA L40S", "l40s"),
           {"0": IDLE_HELD, "1": IDLE_HELD, "2": IDLE_FREE}, ENGINE,
           pods={g: ("redacted", "tensorflow-0", "tensorflow") for g in ("0", "1")}),
    # POWER_MGMT_LIMIT 300 (gpu 2, 3), PCIE_REPLAY_COUNTER 0 (0-3), GPU_UTIL 0 (gpu 0 only): GPUs 1-3 have
    # no activity field at all, so nothing classifies them.
    Replay("dcgm-exporter/issue250-v100-excerpt.txt", "r6i3n0", _same("0 1 2 3", "Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
           {"0": IDLE_FREE, "1": NO_COUNTERS, "2": NO_COUNTERS, "3": NO_COUNTERS},
           frozenset({"roofwatch_gpu_power_limit_watts", "roofwatch_gpu_pcie_replays_total"}) | ENGINE),
    # dcgm_fi_prof_gr_engine_active 0.000000 with uuid="...", GPU_I_PROFILE 3g.40gb (0/1, 1/1) and 4g.40gb
    # (0/2), pod_name="" pod_namespace="" container_name="", no Hostname label.
    Replay("dcgm-exporter/issue272-lowercase-mig-oldns-excerpt.txt", HOST,
           {"0/1": ("NVIDIA A100 80GB PCIe MIG 3g.40gb", "a100-pcie-80gb-mig-3g.40gb"),
            "0/2": ("NVIDIA A100 80GB PCIe MIG 4g.40gb", "a100-pcie-80gb-mig-4g.40gb"),
            "1/1": ("NVIDIA A100 80GB PCIe MIG 3g.40gb", "a100-pcie-80gb-mig-3g.40gb")},
           {"0/1": IDLE_FREE, "0/2": IDLE_FREE, "1/1": IDLE_FREE}, ENGINE),
    # GPU_I_PROFILE="1g.6gb": PROF_GR_ENGINE_ACTIVE 0 for 0/3-0/6 and 1/3; FB_USED 3 for those and 1/4,
    # which has no activity field.
    Replay("dcgm-exporter/issue317-a30-mig-excerpt.txt", "yg-data-k8s-gpu-a30-node-test-test0003.mt",
           _same("0/3 0/4 0/5 0/6 1/3 1/4", "NVIDIA A30 MIG 1g.6gb", "a30-mig-1g.6gb"),
           {"0/3": IDLE_FREE, "0/4": IDLE_FREE, "0/5": IDLE_FREE, "0/6": IDLE_FREE, "1/3": IDLE_FREE, "1/4": NO_COUNTERS},
           frozenset({"roofwatch_gpu_memory_used_bytes"}) | ENGINE),
    # "> DCGM_FI_PROF_GR_ENGINE_ACTIVE{...GPU_I_ID="1"...} 0.381124" is quoted, so no sample line: skipped and
    # counted, as documented. What is left, PIPE_TENSOR_ACTIVE 0.022137, gives no duty: no verdict.
    # pod="" namespace="" container="": no pod.
    Replay("dcgm-exporter/issue68-a30-mig-tfbench-excerpt.txt", "dcgm-exporter-sn5rp",
           {"0/1": ("NVIDIA A30 MIG 2g.12gb", "a30-mig-2g.12gb")}, {"0/1": NO_COUNTERS},
           frozenset({"roofwatch_gpu_tensor_active_ratio"}), skipped=(1, 1)),
    # Exporter 4.x default CSV + DCP: POWER_USAGE 16.365, GPU_TEMP 31, MEMORY_TEMP 0, FB 22563 free + 0 used
    # + 470 reserved, PROF_GR_ENGINE_ACTIVE 0, GPU_UTIL 0; the first line is blank.
    Replay("dcgm-exporter/kops-l4.txt", "i-030791dc5a37cd257", _same("0", "NVIDIA L4", "l4"), {"0": IDLE_FREE}, FULL_CSV),
    # "Handling connection for 9400" (kubectl port-forward) first; POWER_USAGE 40.979, GPU_TEMP 48,
    # PROF_GR_ENGINE_ACTIVE 0.004656 (a vectorAdd loop: under the 5 % idle duty), FB_USED 1; pod labels
    # container="cuda" namespace="default" pod="cuda-75454ffb9f-8ljq7" pod_uid="".
    Replay("dcgm-exporter/linode-rtx4000ada-pod.txt", "lke529760-766837-0a634ab30000",
           _same("0", "NVIDIA RTX 4000 Ada Generation", "rtx-4000-ada"), {"0": IDLE_HELD}, FULL_CSV,
           pods={"0": ("default", "cuda-75454ffb9f-8ljq7", "cuda")}, skipped=(1, 1)),
    # Exporter 2.x, no modelName. GPU 0: POWER_USAGE 409.692, GPU_TEMP 61, MEMORY_TEMP 69 (HBM), FB 35690 free +
    # 4845 used, GR 0.995630, TENSOR 0.929260, DRAM 0.690789; instance 13 (1g.5gb, an A100 40GB profile, as is
    # the 40535 MiB framebuffer): GR 0.995687, TENSOR 0.930433, DRAM 0.800339. Tensor pipes busy: compute bound.
    Replay("dcgm-exporter/nvdocs-a100-mig-busy.txt", "ub20-a100-k8s",
           {"0": (UNNAMED, "a100-40gb"), "0/13": (f"{UNNAMED} MIG 1g.5gb", "a100-40gb-mig-1g.5gb")},
           {"0": ("compute_bound", "at_roof"), "0/13": ("compute_bound", "balanced")},
           (FULL_CSV - {"roofwatch_gpu_memory_busy_ratio"}) | {"roofwatch_gpu_memory_temperature_celsius"}),
    # Exporter 2.1.4: `...` on lines 7 and 11, no modelName, no Hostname; SM_CLOCK 139, MEM_CLOCK 405 and
    # MEMORY_TEMP 9223372036854775794 (DCGM_INT64_NOT_SUPPORTED): no activity field, nothing names the GPU.
    Replay("dcgm-exporter/nvdocs-sentinel-2.1.4.txt", HOST, {"0": (UNNAMED, "")}, {"0": NO_COUNTERS},
           frozenset({"roofwatch_gpu_sm_clock_hertz"}), skipped=(2, 7)),
    # GPU_UTIL 0 six times, Tesla T4, Hostname="ip-10-200-3-41"; nothing else.
    Replay("dcgm-exporter/rafay-t4-concat.txt", "ip-10-200-3-41", _same("0", "Tesla T4", "t4"), {"0": IDLE_FREE}, ENGINE),
    # "$ kubectl logs job/dcgm-quick-check" first; POWER_USAGE 35.686, GPU_TEMP 32, MEMORY_TEMP 0, FB 45459 free
    # + 0 used + 608 reserved, PROF_GR_ENGINE_ACTIVE 0, DRAM 0.000131.
    Replay("dcgm-exporter/upcloud-l40s.txt", "gpu1-wl8sg", _same("0", "NVIDIA L40S", "l40s"), {"0": IDLE_FREE}, FULL_CSV,
           skipped=(1, 1)),
    # Only the two SM_CLOCK lines (210) keep their labels; the 18 after them read {gpu="0",...,modelName=...,...}:
    # no sample lines, so power, temperature, memory and activity are not read and nothing classifies the GPUs.
    Replay("dcgm-exporter/viettel-l40s-elided.txt", "ubuntu-sv16", _same("0 1", "NVIDIA L40S", "l40s"),
           {"0": NO_COUNTERS, "1": NO_COUNTERS}, frozenset({"roofwatch_gpu_sm_clock_hertz"}), skipped=(18, 3)),
    # vGPU GRID A100-10C: SM_CLOCK 1410, MEMORY_TEMP 0, GPU_UTIL 0, MEM_COPY_UTIL 0, FB 9323 free + 0 used +
    # 916 reserved; no power series, no PROF_* field.
    Replay("dcgm-exporter/vks-grid-a100-10c.txt", "conformance-test-np1-qcqc8-bpdtl-wv2gs",
           _same("0", "GRID A100-10C", "a100-pcie-40gb-vgpu-a100-10c"), {"0": IDLE_FREE},
           frozenset({"roofwatch_gpu_sm_clock_hertz", "roofwatch_gpu_memory_used_bytes", "roofwatch_gpu_memory_total_bytes",
                      "roofwatch_gpu_memory_busy_ratio"}) | ENGINE),
]
DCGM_CAPTURES = sorted(str(p.relative_to(CAPTURES)) for p in (CAPTURES / "dcgm-exporter").glob("*.txt"))
REPLAY_OF = {r.file: r for r in REPLAYS}


# ---------------------------------------------------------------- what each inference capture shows

BESIDE = "dcgm-exporter/upcloud-l40s.txt"
"""The exporter capture the inference agents read their GPU 0 from (one L40S, 864 GB/s)."""
MODEL_BYTES = 1.0e9
LLAMA32 = "/shared/public/elr-models/meta-llama/Llama-3.2-3B/5cc0ffe09ee49f7be6ca7c794ee6bd7245e84e60/"


@dataclass(frozen=True)
class Served:
    """What one inference capture shows (None: the capture has no series for it)."""

    file: str
    server: str
    model: str
    running: float | None
    waiting: float | None
    kv_usage: float | None
    tokens_per_gpu: float | None = None
    """Output tokens/s per GPU: needs the generation-token counter."""


SERVED = [
    # vllm:num_requests_running / _waiting / kv_cache_usage_perc {engine="0",model_name=...} 0.0;
    # prompt_tokens_total and generation_tokens_total 0.0, so 0 tokens/s is a measurement.
    Served("vllm/kops-qwen05b-v1-idle.txt", "vllm", "Qwen/Qwen2.5-0.5B-Instruct", 0.0, 0.0, 0.0, tokens_per_gpu=0.0),
    # V0: num_requests_running 0.0, num_requests_waiting 0.0, gpu_cache_usage_perc 0.0; no token counter.
    Served("vllm/prodstack318-qwen25coder32b-v0-excerpt.txt", "vllm", "Qwen/Qwen2.5-Coder-32B-Instruct", 0.0, 0.0, 0.0),
    # model_name="qwenvl": running 0.0, waiting 0.0, gpu_cache_usage_perc 0.0.
    Served("vllm/qwen3vl55-cacheconfig-v0-excerpt.txt", "vllm", "qwenvl", 0.0, 0.0, 0.0),
    # sglang:num_running_reqs 0.0, token_usage 0.0; no queue gauge.
    Served("sglang/pr4444-llama3-8b-idle-excerpt.txt", "sglang", "/shared/public/models/Meta-Llama-3-8B-Instruct",
           0.0, None, 0.0),
    # {name="..."}: max_total_num_tokens, max_prefill_tokens, max_running_requests, context_len, prompt_tokens_total.
    Served("sglang/pr1853-llama32-3b-name-label-excerpt.txt", "sglang", LLAMA32, None, None, None),
    # Pre-release names: num_requests_running 0.0, num_requests_waiting 0.0, token_usage 0.0.
    Served("sglang/pr1461-gemma2-9b-wip-excerpt.txt", "sglang", "google/gemma-2-9b-it", 0.0, 0.0, 0.0),
    # sglang_ underscore names: cuda_graph_passes_total 311 and realtime_tokens_total only (see the doctor test).
    Served("sglang/smg813-underscore-names-excerpt.txt", "sglang", "meta-llama/Llama-3.1-8B-Instruct", None, None, None),
    # tgi_batch_current_size 0.0, tgi_queue_size 0.0; TGI exports no model name.
    Served("tgi-style/ibmvllm18-tgis-excerpt.txt", "tgi", "", 0.0, 0.0, None),
    # llamacpp:prompt_tokens_total 143, tokens_predicted_total 673 (both counters: a static body is 0 tokens/s),
    # no requests_processing / requests_deferred in the excerpt, no labels: no model name.
    Served("llamacpp/llamacpp-pr13196-vulkan-metrics-excerpt.txt", "llamacpp", "", None, None, None,
           tokens_per_gpu=0.0),
]
SERVED_OF = {s.file: s for s in SERVED}
INFERENCE_CAPTURES = sorted(str(p.relative_to(CAPTURES)) for d in ("vllm", "sglang", "tgi-style", "llamacpp")
                            for p in (CAPTURES / d).glob("*.txt"))
SMG813 = "sglang/smg813-underscore-names-excerpt.txt"


# ---------------------------------------------------------------- how a join test plays each capture's node


def mig_layout(file: str) -> dict[int, list[tuple[int, str]]]:
    """GPU index -> [(GPU instance id, profile)] from the capture's sample lines' ``GPU_I_ID`` and
    ``GPU_I_PROFILE`` labels, ordered by id (a ``> ``-quoted or elided line is no sample)."""
    out: dict[int, dict[int, str]] = {}
    for line in capture(file).splitlines():
        match = _SAMPLE.fullmatch(line.strip())
        if match is None:
            continue
        labels = dict(_PAIR.findall(match.group(2)))
        if labels.get("GPU_I_ID"):
            out.setdefault(int(labels["gpu"]), {})[int(labels["GPU_I_ID"])] = labels["GPU_I_PROFILE"]
    return {gpu: sorted(ids.items()) for gpu, ids in sorted(out.items())}


@dataclass(frozen=True)
class Play:
    """The node a join test plays on the fake NVML for one capture (``roofwatch demo --backend
    nvml-virtual``): catalogue model, GPU count, MIG layout (GPU -> [(GPU instance id, profile)]), and the
    vGPU name the guest's driver reports, each read off the capture (``play_of``)."""

    model: str
    gpus: int
    mig: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    vgpu: str | None = None

    def devices(self) -> list[str]:
        """The device ids NVML gives: whole GPUs, and a GPU in MIG mode as its instances ``i/<GI id>``."""
        return [f"{i}/{gi}" for i in range(self.gpus) for gi, _ in self.mig.get(i, [])] + \
               [str(i) for i in range(self.gpus) if i not in self.mig]


UNNAMED_PLAYS = {"dcgm-exporter/nvdocs-sentinel-2.1.4.txt": "t4"}
"""Captures whose lines identify no model, and the catalogue model a join plays in their place. In join
mode the model is NVML's, never the capture's, so any model the lines do not contradict does. Sentinel:
MEM_CLOCK 405 rules out the A100s (HBM2 at a fixed 1215 MHz, as nvdocs-a100-mig-busy's MEM_CLOCK shows)
and MEMORY_TEMP NOT_SUPPORTED says GDDR (no memory sensor); the T4 is such a GDDR6 board."""


def play_of(file: str) -> Play:
    """How a join plays ``file``'s node, from the capture's own lines and its :data:`REPLAYS` entry."""
    from agent.model.specs.mig_identity import FAMILIES
    from agent.model.specs.vgpu import vgpu_spec

    info, layout = REPLAY_OF[file].info, mig_layout(file)
    gpus = 1 + max(int(key.split("/")[0]) for key in info)
    keys = {spec.split("-mig-")[0] for _, spec in info.values()}
    (key,) = keys
    vgpu = None
    if file in UNNAMED_PLAYS:
        key = UNNAMED_PLAYS[file]
    elif "-vgpu-" in key:  # a guest's vGPU: the board behind it, named as the guest's driver names it
        (vgpu,) = {model for model, _ in info.values()}
        spec = vgpu_spec(vgpu)
        assert spec is not None and spec.key == key, f"{file}: {vgpu} is not {key}"
        key = key.split("-vgpu-")[0]
    elif key in FAMILIES:  # no modelName, identified by MIG profiles: the board its power reading allows,
        from agent.model.specs import spec_by_key  # within 10 % over the TDP (a busy GPU's 1 s average overshoots)

        power = max(f.get("DCGM_FI_DEV_POWER_USAGE", 0.0) for f in fields(file).values())
        (key,) = [k for k in FAMILIES[key][0] if power <= 1.1 * (spec_by_key(k).tdp_w or 0)]
    return Play(key, gpus, layout, vgpu)


JOIN_SEED = 11
JOIN_ENV = {"ROOFWATCH_DCGM_EXPORTER_INTERVAL_S": "0.2", "ROOFWATCH_CLASSIFIER__WINDOW_S": "2",
            "ROOFWATCH_CLASSIFIER__LONG_WINDOW_S": "4", "ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S": "0.5"}
JOIN_WAIT_S = 60.0


@dataclass
class Joined:
    """One ``roofwatch demo --backend nvml-virtual`` joined to a capture served as its node's exporter."""

    file: str
    play: Play
    url: str
    proc: subprocess.Popen
    log: Path
    uuids: dict[str, str]
    """Physical GPU index -> the fake's UUID, which the served capture carries in place of its own."""
    scenario: Path
    exporter_url: str

    def get(self, path: str) -> bytes:
        from tests.agent_process import http_get

        if self.proc.poll() is not None:
            raise AssertionError(f"the agent for {self.file} exited ({self.proc.returncode}): "
                                 f"{self.log.read_text()[-3000:]}")
        status, body = http_get(self.url + path)
        if status != 200:
            raise ValueError(f"{path}: HTTP {status}")
        return body

    def devices(self, ready: Callable[[dict], bool]) -> dict[str, dict]:
        """Device id -> its snapshot entry (``info`` and ``sample``), once every device of the play has a
        sample that ``ready`` accepts."""
        import json

        from tests.agent_process import poll

        def done():
            snap = json.loads(self.get("api/v1/snapshot"))
            got = {d["info"]["gpu"]: d for d in snap["devices"]}
            return (set(got) == set(self.play.devices())
                    and all(d["sample"] and ready(d["sample"]) for d in got.values()) and got)
        return poll(done, JOIN_WAIT_S, what=f"a sample of each device joined to {self.file}")


def start_joined(file: str, tmp: Path, procs: list[subprocess.Popen], exporters: list) -> Joined:
    """The capture, its UUIDs swapped for the fake's, served as the node's dcgm-exporter, and an agent on the
    fake NVML playing :func:`play_of` the capture, a GEMM on every device: engine about 1, memory high, and
    at 0.9 MFU against a power limit of 0.8 x TDP (NVML's own, unlike any capture's), power at that limit and
    the SM clock throttled below the board's maximum, which an idle capture may read (vks: 1410 MHz)."""
    import yaml

    from agent.model.specs import spec_by_key
    from agent.virtual.devices import device_uuid
    from tests.agent_process import clean_env, roofwatch_cmd
    from tests.dcgm_exporter_server import FakeExporter, replace_uuids
    from tests.prometheus_server import free_port

    replay, play = REPLAY_OF[file], play_of(file)
    uuids = {str(i): device_uuid(JOIN_SEED, replay.node, i, "nvidia") for i in range(play.gpus)}
    exporters.append(exporter := FakeExporter(replace_uuids(capture(file), uuids)))
    node: dict = {"name": replay.node, "model": play.model, "gpus": play.gpus, "workloads": [
        {"job": "gemm", "gpus": [int(d) if d.isdigit() else d for d in play.devices()], "dtype": "fp16",
         "phases": [{"kind": "compute", "mfu": 0.9, "duration_s": 3600,
                     "power_cap_w": round(0.8 * spec_by_key(play.model).tdp_w)}]}]}
    if play.mig:
        node["mig"] = {i: [p for _, p in layout] for i, layout in play.mig.items()}
        node["mig_ids"] = {i: [gi for gi, _ in layout] for i, layout in play.mig.items()}
    if play.vgpu:
        node["vgpu"] = play.vgpu
    scenario = tmp / f"{Path(file).stem}.yaml"
    scenario.write_text(yaml.safe_dump({"name": f"join-{Path(file).stem}", "seed": JOIN_SEED, "nodes": [node]}))
    port = free_port()
    log = tmp / f"{Path(file).stem}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(roofwatch_cmd("demo", "--backend", "nvml-virtual", "--scenario", str(scenario),
                                              "--dcgm-exporter-url", exporter.url, "--listen", f"127.0.0.1:{port}",
                                              "--interval", "0.2"),
                                stdout=sink, stderr=subprocess.STDOUT, text=True, env=clean_env(**JOIN_ENV))
    procs.append(proc)
    return Joined(file, play, f"http://127.0.0.1:{port}/", proc, log, uuids, scenario, exporter.url)


def stop_all(procs: list, exporters: list) -> None:
    """Every agent process terminated (killed after 15 s), then every stand-in exporter stopped."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for exporter in exporters:
        exporter.stop()
