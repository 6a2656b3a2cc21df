"""Opt-in attribution labels on GPU series: present when asked for, gone when the job or pod is."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.collector import Collector
from agent.model import Attribution, GpuSample
from exporters.metrics import ATTRIBUTION_LABELS
from exporters.prometheus import ExpositionCache
from tests.test_exporter import FullBackend

ATTRIBUTION_INFO = {"roofwatch_gpu_job_info", "roofwatch_gpu_pod_info"}


class ChangingBackend(FullBackend):
    """GPU 0's holder changes between cycles, as pods come and go."""

    def __init__(self) -> None:
        super().__init__()
        self.holder: Attribution | None = Attribution(job_id="a", namespace="ml", pod="trainer-a", container="main")

    def sample(self, gpu: str, now: float) -> GpuSample:
        sample = super().sample(gpu, now)
        return dataclasses.replace(sample, attribution=self.holder if gpu == "0" else None)


def scrape(collector: Collector, labels: tuple[str, ...]) -> str:
    return ExpositionCache(lambda: collector.snapshot, gpu_labels=labels).render(generate_latest, "text/plain").decode()


def gpu_samples(text: str) -> list:
    """Every per-GPU sample (they all carry the GPU's uuid)."""
    return [s for f in text_string_to_metric_families(text) for s in f.samples if "uuid" in s.labels]


@pytest.fixture
def collector():
    clock = {"t": 1_800_000_000.0}
    backend = ChangingBackend()
    c = Collector(backend, node="n1", interval_s=1.0, clock=lambda: clock["t"], monotonic=lambda: clock["t"])
    c.collect_once()
    yield c, backend, clock
    c.stop()


def test_chosen_labels_are_on_every_gpu_series_and_only_those(collector) -> None:
    c, _, _ = collector
    text = scrape(c, ("namespace", "pod"))
    samples = [s for s in gpu_samples(text) if not s.name.startswith(tuple(ATTRIBUTION_INFO))]
    assert samples
    for s in samples:
        assert {"namespace", "pod"} <= set(s.labels) and not {"container", "job_id"} & set(s.labels), s
    gpu0 = {(s.labels["namespace"], s.labels["pod"]) for s in samples if s.labels["gpu"] == "0"}
    gpu1 = {(s.labels["namespace"], s.labels["pod"]) for s in samples if s.labels["gpu"] == "1"}
    assert gpu0 == {("ml", "trainer-a")} and gpu1 == {("", "")}
    # The info series keep only node, gpu, uuid as their key: they are where the labels come from.
    pod_info = [s for s in gpu_samples(text) if s.name == "roofwatch_gpu_pod_info"]
    assert [s.labels for s in pod_info] == [{"node": "n1", "gpu": "0", "uuid": "GPU-0", "namespace": "ml",
                                            "pod": "trainer-a", "container": "main"}]


def test_the_default_adds_no_labels(collector) -> None:
    c, _, _ = collector
    for s in gpu_samples(scrape(c, ())):
        if not s.name.startswith(tuple(ATTRIBUTION_INFO)) and "pod" in s.labels:
            raise AssertionError(f"unexpected pod label on {s}")


def test_a_finished_pod_leaves_no_series_behind(collector) -> None:
    c, backend, clock = collector
    labels = tuple(ATTRIBUTION_LABELS)
    assert "trainer-a" in scrape(c, labels)
    backend.holder = Attribution(job_id="b", namespace="ml", pod="trainer-b", container="main")
    clock["t"] += 1.0
    c.collect_once()
    text = scrape(c, labels)
    assert "trainer-a" not in text and 'job_id="a"' not in text and "trainer-b" in text
    backend.holder = None
    clock["t"] += 1.0
    c.collect_once()
    text = scrape(c, labels)
    assert "trainer-" not in text and 'job_id="b"' not in text
    assert all(s.labels.get("pod", "") == "" for s in gpu_samples(text))


@pytest.mark.slow
def test_promtool_accepts_the_labelled_exposition(collector) -> None:
    c, _, _ = collector
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package 'prometheus')"
    result = subprocess.run([promtool, "check", "metrics"], input=scrape(c, tuple(ATTRIBUTION_LABELS)),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_an_unknown_label_is_refused(collector) -> None:
    c, _, _ = collector
    with pytest.raises(ValueError, match="gpu_labels"):
        scrape(c, ("hostname",))
