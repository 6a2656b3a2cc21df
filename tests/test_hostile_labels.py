"""Label values that come from outside the agent (process names and owners, Slurm job ids, users and
partitions, Kubernetes namespaces, pods and containers) keep the exposition valid whatever they hold.

Anyone who can start a process on a GPU node picks its name; job ids and pod names come from users too.
One bad value must not break a scrape for the whole node, and no value may bloat every series index.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.registry import CollectorRegistry

from agent.model import Attribution, CollectorHealth, DeviceInfo, DeviceState, GpuSample, NodeSnapshot, ProcessSample
from exporters.metrics import ATTRIBUTION_LABELS, JOB_ID_MAX_LEN, clip_label
from exporters.prometheus import ExpositionCache, SnapshotCollector

TEXT = choose_encoder("")
OPENMETRICS = choose_encoder("application/openmetrics-text; version=1.0.0")
HOSTILE_LABELS = ("process", "user", "job_id", "partition", "namespace", "pod", "container")
"""Label names whose values come from processes, the scheduler or Kubernetes rather than from the agent."""
ROTATE = {"user": 1, "partition": 2, "namespace": 3, "pod": 4, "container": 5, "proc_user": 6}
"""Each value also turns up in other roles (shifted by this much), so every role sees every value."""

FIXED = [
    'quo"te', 'back\\slash', "new\nline", "\\n literal", '\\"', "}{", "a=b", 'x,y="z"}', "# HELP x", "# EOF",
    "roofwatch_gpu_up{", "\u202eRTL override\u202c", "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",
    "\U0001f525\U0001f4a5", "\U0001f469\u200d\U0001f469\u200d\U0001f467", "nul\x00byte", "cr\rlf", "tab\there",
    "\u2028\u2029", "\ufeffbom", "e\u0301\u0301\u0301", " ", "\x7f\x1b[31m", "python3\udcff\udcfe",
    "x" * 10_240, ('"\\\n}{=,\U0001f525\x00' * 1024)[:10_240],
]
"""Quotes, backslashes, newlines, braces, '=', RTL and emoji, NUL and escapes, undecodable bytes (as psutil
gives them: lone surrogates), and 10 kB values."""

hostile_char = st.sampled_from(list('"\\\n\r{}=,# \x00\u202e\u200d\ufeff\udcff')) | st.characters()
hostile_text = (st.lists(hostile_char, max_size=40).map("".join)  # (st.text would drop the lone surrogates)
                | st.sampled_from(FIXED)
                | st.lists(hostile_char, min_size=1, max_size=8).map(lambda t: ("".join(t) * 10_240)[:10_240]))


def snapshot_with(values: list[str]) -> NodeSnapshot:
    """GPU ``k`` has one process named ``values[k]`` and an attribution whose fields are values too."""
    n = len(values)
    devices = []
    for k, value in enumerate(values):
        def pick(role: str) -> str:
            return values[(k + ROTATE[role]) % n]

        sample = GpuSample(
            ts=1.0, gpu=str(k), power_w=100.0,
            processes=(ProcessSample(pid=1000 + k, name=value, user=pick("proc_user"), used_memory_bytes=k),),
            attribution=Attribution(job_id=value, user=pick("user"), partition=pick("partition"),
                                    namespace=pick("namespace"), pod=pick("pod"), container=pick("container")),
        )
        devices.append(DeviceState(info=DeviceInfo(gpu=str(k), uuid=f"GPU-{k}", vendor="nvidia", model="Test GPU"),
                                   up=True, sample=sample, last_success_ts=1.0))
    return NodeSnapshot(ts=1.0, node="n1", devices=tuple(devices), health=CollectorHealth(backend="test"),
                        expected_devices=n)


def expected_labels(values: list[str]) -> dict[tuple[str, str], dict[str, str]]:
    """``{(family, gpu): {label: exported value}}`` for the families that carry outside values."""
    n = len(values)
    out: dict[tuple[str, str], dict[str, str]] = {}
    for k, value in enumerate(values):
        def pick(role: str) -> str:
            return values[(k + ROTATE[role]) % n]

        gpu = str(k)
        out[("roofwatch_gpu_process_memory_used_bytes", gpu)] = {"pid": str(1000 + k), "process": clip_label(value)}
        if pick("proc_user"):
            out[("roofwatch_gpu_process_info", gpu)] = {"process": clip_label(value), "user": clip_label(pick("proc_user"))}
        if value:
            out[("roofwatch_gpu_job_info", gpu)] = {key: clip_label(v) for key, v in (
                ("job_id", value), ("user", pick("user")), ("partition", pick("partition"))) if v}
        if pick("pod"):
            out[("roofwatch_gpu_pod_info", gpu)] = {key: clip_label(pick(key)) for key in ("namespace", "pod", "container")
                                                    if pick(key)}
    return out


def render(snapshot: NodeSnapshot, encoder: Callable[..., bytes], content_type: str,
           gpu_labels: tuple[str, ...]) -> bytes:
    """The bytes /metrics serves (ExpositionCache: SnapshotCollector + our encoder), checked byte for byte
    against prometheus_client's own encoder over the same collector."""
    body = ExpositionCache(lambda: snapshot, max_processes_per_gpu=10_000, gpu_labels=gpu_labels).render(
        encoder, content_type)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot, max_processes_per_gpu=10_000, gpu_labels=gpu_labels))
    assert body == encoder(registry)
    return body


def promtool_check(text: bytes) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package 'prometheus'; ./dev.sh test installs it)"
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), \
        (result.stdout + result.stderr).decode(errors="replace")[:2000]


def samples_by_gpu(families: Any) -> dict[str, list[tuple[str, dict[str, str]]]]:
    """``{family: [(gpu, labels), ...]}`` of a parsed exposition."""
    out: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for family in families:
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels.get("gpu", ""), dict(sample.labels)))
    return out


def check_round_trip(values: list[str], parsed: dict[str, list[tuple[str, dict[str, str]]]],
                     gpu_labels: tuple[str, ...]) -> None:
    """Every outside value reads back as exported (clip_label), within the bound, on the right GPU."""
    expected = expected_labels(values)
    for (name, gpu), labels in expected.items():
        found = [got for g, got in parsed.get(name, []) if g == gpu]
        assert len(found) == 1, (name, gpu, found)
        for key, value in labels.items():
            assert found[0][key] == value, (name, gpu, key)
        if name.endswith("_info"):  # an unknown (empty) info label is left out, not exported as ""
            present = {k for k in found[0] if k in HOSTILE_LABELS}
            assert present - set(labels) <= set(gpu_labels), (name, gpu, found[0])
    for name, series in parsed.items():
        for gpu, labels in series:
            for key in HOSTILE_LABELS:
                if key in labels:
                    assert len(labels[key]) <= JOB_ID_MAX_LEN, (name, key)
                    labels[key].encode("utf-8")  # raises on a lone surrogate: the value must be valid UTF-8
    if gpu_labels:
        up = dict(parsed["roofwatch_gpu_up"])
        for k, value in enumerate(values):
            who = {"job_id": value, **{key: values[(k + ROTATE[key]) % len(values)] for key in ("namespace", "pod", "container")}}
            assert {key: up[str(k)][key] for key in gpu_labels} == {key: clip_label(who[key]) for key in gpu_labels}


def check_exposition(values: list[str], gpu_labels: tuple[str, ...]) -> None:
    snapshot = snapshot_with(values)
    text = render(snapshot, *TEXT, gpu_labels)
    promtool_check(text)
    check_round_trip(values, samples_by_gpu(parse_text(text.decode("utf-8"))), gpu_labels)
    openmetrics = render(snapshot, *OPENMETRICS, gpu_labels)
    assert openmetrics.endswith(b"# EOF\n")
    check_round_trip(values, samples_by_gpu(parse_openmetrics(openmetrics.decode("utf-8"))), gpu_labels)


@pytest.mark.slow
@pytest.mark.parametrize("gpu_labels", [(), ATTRIBUTION_LABELS], ids=["info-only", "labels-on-every-series"])
def test_fixed_hostile_values_keep_the_exposition_valid(gpu_labels: tuple[str, ...]) -> None:
    """The catalogue above, all in one exposition: promtool accepts it, both formats parse back, values round-trip."""
    check_exposition(FIXED, gpu_labels)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(values=st.lists(hostile_text, min_size=1, max_size=24), with_labels=st.booleans())
def test_generated_hostile_values_keep_the_exposition_valid(values: list[str], with_labels: bool) -> None:
    """Generated values, batched: one exposition (and one promtool run) per example."""
    check_exposition(values, ATTRIBUTION_LABELS if with_labels else ())


@settings(max_examples=200, deadline=None)
@given(value=st.none() | st.text(st.characters() | st.sampled_from(["\udc80", "\udcff", "\ud800", "\udfff"]), max_size=300))
def test_clip_label_bound(value: str | None) -> None:
    """The documented rule: "" when unknown, at most JOB_ID_MAX_LEN characters, a prefix of the value,
    and always encodable as UTF-8 (a lone surrogate becomes U+FFFD, one for one)."""
    clipped = clip_label(value)
    assert len(clipped) == min(len(value or ""), JOB_ID_MAX_LEN)
    clipped.encode("utf-8")
    for got, original in zip(clipped, value or ""):
        assert got == original or ("\ud800" <= original <= "\udfff" and got == "\ufffd")


def test_undecodable_process_name_does_not_break_the_scrape() -> None:
    """psutil decodes a binary named with invalid UTF-8 (``b"train\\xff"``) as ``"train\\udcff"``: that used to make
    encoding the whole exposition raise UnicodeEncodeError, so /metrics failed for every GPU on the node."""
    snapshot = snapshot_with(["train\udcff", "ok"])
    text = render(snapshot, *TEXT, ()).decode("utf-8")
    names = {labels["process"] for _, labels in samples_by_gpu(parse_text(text))["roofwatch_gpu_process_memory_used_bytes"]}
    assert names == {"train\ufffd", "ok"}


def test_long_process_name_is_cut_like_attribution_values() -> None:
    """The ``process`` label is open-ended like a job id, so it is bounded the same way."""
    snapshot = snapshot_with(["p" * 10_240])
    text = render(snapshot, *TEXT, ()).decode("utf-8")
    series = samples_by_gpu(parse_text(text))["roofwatch_gpu_process_memory_used_bytes"]
    assert [labels["process"] for _, labels in series] == ["p" * JOB_ID_MAX_LEN]
    assert len(text) < 50_000  # 10 kB per series would be ~10 kB x every process family
