"""Hostile label values in a real Prometheus, through every source's queries of ``roofwatch fleet-report``.

A label value that enters a query was chosen by whoever runs the exporter (dcgm-exporter's ``UUID``,
AMD DME's ``hostname`` and ``gpu_id``, a scheduler's ``job_id``) or typed on the command line
(``--cluster``). Issue 42 found ``--source amd`` writing ``gpu_id`` into PromQL unquoted: a ``"`` broke
that host's queries (its GPUs dropped out) and ``0",hostname!="`` made a valid query with a filter the
label's author chose. Here one Prometheus (blocks from ``promtool tsdb create-blocks-from openmetrics``)
holds, for each source, GPUs (or jobs) named by every hostile value below (quotes, backslashes, a
matcher injection, a query injection reading another host, regex syntax, a newline, control
characters, unicode, a superscript digit, 10 kB) beside a plain "victim" elsewhere; each has its own
figure, planned here, which the real command, a child process, must report for it and it alone.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from agent.classifier.thresholds import Thresholds
from agent.model import WORKLOAD_CLASSES
from agent.views.fleet_report.amd import SERIES, collect_amd
from agent.views.fleet_report.data import Prices
from agent.views.fleet_report.dcgm import dcgm_step, dcgm_thresholds
from agent.views.fleet_report.promapi import Answer, PromClient
from agent.views.fleet_report.window import Window
from tests import amd_exporter_fixtures as amd
from tests import fleet_fixture as fx
from tests.fleet_stores import backfilled_prometheus, fleet_end, run_report

pytestmark = pytest.mark.slow

STEP = 60
RANGE = 7200
HOSTILE = [
    '0"',                                      # a lone quote: ended the string, the host's queries failed
    'a\\b\\',                                  # backslashes, one at the end (would escape the closing quote)
    '0",hostname!="',                          # the finding's matcher injection
    '.*|0',                                    # regex syntax: must match itself, not every GPU
    'line\nbreak',                             # a raw newline is "unterminated quoted string"
    'esc\x1b[31m\ttab\x7f',                    # control characters: sent as \\u escapes
    'ünï©ødé ☃ 😀',                            # unicode
    '²',                                       # a digit to str.isdigit(), not to int()
    'k' * 10_240,                              # 10 kB
]
VICTIM = "amd-0-victim"
"""A plain host, sorted before the others so that a query for another host, run after its own, would
overwrite its figures."""
INJECT = '0"}[60s]) or avg_over_time(gpu_gfx_activity{hostname="' + VICTIM
"""Written in unquoted, a valid query that also reads the victim host's gfx activity (97 %) as whatever
series is being read (its MFMA busy, its power...), so the victim's figures would be other numbers."""
CLUSTER = 'lab",cluster!="x\\'
"""The cluster of every hostile GPU and job (``--cluster`` takes it from the command line)."""


def om_labels(labels: dict[str, str]) -> str:
    """OpenMetrics label set, values escaped as the exposition format says (backslash, quote, newline)."""
    def esc(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items())) + "}"


def instants(end: int) -> range:
    """Every minute of the period and 10 minutes before it; a sample at t stands for (t - 60, t]."""
    return range(end - RANGE - 600, end + 1, STEP)


# -- AMD Device Metrics Exporter: hostname and gpu_id --------------------------------------------------

AMD_GPUS = [(CLUSTER, "amd-a", gpu, 10.0 * (i + 1)) for i, gpu in enumerate(HOSTILE)]
AMD_GPUS += [(CLUSTER, "amd-inject", INJECT, 35.0), (CLUSTER, 'amd-b",hostname!="', "0", 45.0),
             ("west", VICTIM, "0", 90.0)]
"""(cluster, hostname, gpu_id, MFMA busy %) of each GPU object; amd-a's nine make two query batches."""
UNREAD = ("gpu_xgmi_link_", "gpu_energy_consumed", "gpu_ecc_", "gpu_nodes_total", "gpu_prof_")


class _Collect:
    """Stands in for the fixture module's exposition body: collects (name, labels, value) as given."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, str], str]] = []

    def add(self, name: str, labels: dict[str, str], value: str) -> None:
        self.lines.append((name, dict(labels), value))


def amd_series() -> list[tuple[str, str]]:
    """(series, value) of every GPU object: GPU 0's device series of the SPX fixture (the GEMM: gfx 97 %)
    with its labels renamed, and the profiler's series written for the object's own MFMA busy."""
    device = []
    for line in (amd.FIXTURES / "mi300x-spx-profiler.prom").read_text().splitlines():
        m = re.match(r'^(\w+)\{(.*)\} (\S+)$', line)
        if m and not m.group(1).startswith(UNREAD) and re.search(r'\bgpu_id="0"', m.group(2)):
            device.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))), m.group(3)))
    base = next(labels for name, labels, _ in device if name == "gpu_gfx_activity")
    out = []
    for n, (cluster, host, gpu, mfma) in enumerate(AMD_GPUS):
        own = {"cluster": cluster, "hostname": host, "gpu_id": gpu, "serial_number": f"SN-{n:04d}"}
        body = _Collect()
        amd.profiler(body, base, (mfma, *amd.GEMM[1:]))
        out += [(name + om_labels({**labels, **own}), value) for name, labels, value in device + body.lines]
    return out


def amd_mfu(mfma: float) -> float:
    """By hand: tensor activity = MFMA busy % x GUI-active % (the GEMM's 96 %); its 16-bit ops agree."""
    return mfma / 100 * amd.GEMM[2] / 100


# -- dcgm-exporter: UUID --------------------------------------------------------------------------------

DCGM_GPUS = [("dgx-h", str(i) if gpu != "²" else "²", gpu, 0.1 * (i + 1)) for i, gpu in enumerate(HOSTILE)]
DCGM_GPUS += [("dgx-victim", "0", "GPU-victim", 0.95)]
"""(Hostname, gpu, UUID, tensor pipe activity)."""


def dcgm_series() -> list[tuple[str, str]]:
    """The GEMM GPU of tests/fleet_fixture.py with its own tensor activity and an SM clock of 1980 MHz,
    above the 1830 MHz an H100's peaks are quoted at, so its counter MFU is its tensor activity."""
    out = []
    for host, gpu, uuid, tensor in DCGM_GPUS:
        labels = {"cluster": "lab", "Hostname": host, "gpu": gpu, "UUID": uuid, "modelName": fx.H100[0]}
        fields = {**fx.DCGM_GPUS[0], "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": tensor, "DCGM_FI_DEV_SM_CLOCK": 1980.0}
        out += [(name + om_labels(labels), f"{value:g}") for name, value in fields.items()]
    return out


# -- roofwatch agents: job_id and the cluster -------------------------------------------------------------

JOBS = [(CLUSTER, f"n{i}", job, 10 * (i + 1), (i + 1) / 20) for i, job in enumerate(HOSTILE)]
JOBS += [("west", "w1", "victim", 100, 0.9)]
"""(cluster, node, job_id, minutes idle at the start of the period, MFU while busy): one GPU per job."""


def roofwatch_samples(end: int) -> list[tuple[str, str, int]]:
    out = []
    for cluster, node, job, idle_minutes, mfu in JOBS:
        gpu = {"cluster": cluster, "node": node, "gpu": "0", "uuid": f"GPU-{node}"}
        for t in instants(end):
            cls = "idle" if t <= end - RANGE + idle_minutes * 60 else "compute_bound"
            out.append(("roofwatch_gpu_info" + om_labels({**gpu, "model": fx.H100[0], "spec": fx.H100[1]}), "1", t))
            out += [("roofwatch_gpu_workload_class" + om_labels({**gpu, "class": c}), str(int(c == cls)), t)
                    for c in WORKLOAD_CLASSES]
            out.append(("roofwatch_gpu_job_info" + om_labels({**gpu, "job_id": job, "user": f"u-{node}"}), "1", t))
            out.append(("roofwatch_gpu_mfu_ratio" + om_labels({**gpu, "dtype": "bf16", "source": "counters"}), f"{mfu:g}", t))
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    end = fleet_end()
    work: Path = tmp_path_factory.mktemp("hostile-labels")
    constant = amd_series() + dcgm_series()
    changing: dict[int, list[str]] = {}
    for series, value, t in roofwatch_samples(end):
        changing.setdefault(t, []).append(f"{series} {value} {t}\n")
    lines = [line for t in instants(end) for line in [f"{s} {v} {t}\n" for s, v in constant] + changing[t]]
    server = backfilled_prometheus(work, {"hostile": "".join(lines) + "# EOF\n"})
    yield server.base, end, work
    server.stop()


def _ok(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_amd_gpu_ids_and_hostnames_are_quoted_every_gpu_keeps_its_own_figures(store) -> None:
    base, end, work = store
    done, data = run_report(base, work, "--source", "amd", end=end)
    _ok(done)
    assert data["problems"] == [], "no query failed to parse or found nothing"
    gpus = {(g["node"], g["gpu"]): g for g in data["amd"]["gpus"]}
    assert set(gpus) == {(host, gpu) for _, host, gpu, _ in AMD_GPUS}, "every GPU object is in the report"
    for _, host, gpu, mfma in AMD_GPUS:
        got = gpus[(host, gpu)]
        assert got["profiler"] and got["mfu"] == pytest.approx(amd_mfu(mfma), abs=0.02), (host, gpu[:40], got["mfu"])
        assert got["class"] not in (None, "idle"), (host, gpu[:40])  # gfx activity 97 %: its series were read
    done, only = run_report(base, work, "--source", "amd", "--cluster", CLUSTER, end=end)
    _ok(done)
    assert {(g["node"], g["gpu"]) for g in only["amd"]["gpus"]} == {(h, g) for c, h, g, _ in AMD_GPUS if c == CLUSTER}


class Recording(PromClient):
    """The report's own client, keeping every range query and its answer."""

    def __init__(self, base: str) -> None:
        super().__init__(base)
        self.answers: list[tuple[str, Answer]] = []

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> Answer:
        answer = super().query_range(expr, start, end, step_s)
        self.answers.append((expr, answer))
        return answer


def test_no_amd_query_reads_another_hosts_series(store) -> None:
    """Each of ``--source amd``'s range queries is for one host's batch of GPU objects: in the real
    Prometheus, what it matches is that host's series only, whatever the gpu_id values hold."""
    base, end, _ = store
    client = Recording(base)
    window = Window.pick(end, RANGE)
    data, _, problems = collect_amd(client, window, cluster=None, prices=Prices(),
                                    thresholds=dcgm_thresholds(Thresholds(), dcgm_step(RANGE)))
    assert problems == [] and client.answers
    answered: Counter[str] = Counter()
    for expr, answer in client.answers:
        hosts = {s.labels.get("hostname", "") for s in answer}
        assert len(hosts) <= 1, (expr[:300], hosts)
        answered.update(hosts)
    objects = Counter(host for _, host, _, _ in AMD_GPUS)
    for host, count in answered.items():  # a host's answers: at most one per series and batch of 8 of its GPUs
        assert count <= len(SERIES) * math.ceil(objects[host] / 8), (host, count)
    read = {(s.labels["hostname"], s.labels["gpu_id"]) for _, answer in client.answers for s in answer}
    assert read == {(host, gpu) for _, host, gpu, _ in AMD_GPUS}


def test_dcgm_uuids_are_quoted_every_gpu_keeps_its_own_figures(store) -> None:
    base, end, work = store
    done, data = run_report(base, work, "--source", "dcgm", end=end)
    _ok(done)
    assert data["problems"] == []
    gpus = {g["uuid"]: g for g in data["dcgm"]["gpus"]}
    assert set(gpus) == {uuid for _, _, uuid, _ in DCGM_GPUS}
    for host, gpu, uuid, tensor in DCGM_GPUS:
        assert (gpus[uuid]["node"], gpus[uuid]["gpu"]) == (host, gpu)
        assert gpus[uuid]["mfu"] == pytest.approx(tensor, abs=0.005), (uuid[:40], gpus[uuid]["mfu"])


def test_job_ids_and_the_cluster_flag_are_quoted_every_job_keeps_its_own_figures(store) -> None:
    """The worst jobs' ids come from the store's answer and go back into three queries (their class
    hours, MFU and verdict reasons); each job's idle-allocated hours and MFU are its own."""
    base, end, work = store
    for extra, expected in (((), JOBS), (("--cluster", CLUSTER), [j for j in JOBS if j[0] == CLUSTER])):
        done, data = run_report(base, work, *extra, end=end)
        _ok(done)
        assert not [p for p in data["problems"] if not p["error"].startswith("no data")], data["problems"]
        jobs = {j["job_id"]: j for j in data["jobs"]}
        assert set(jobs) == {job for _, _, job, _, _ in expected}
        for cluster, _, job, idle_minutes, mfu in expected:
            assert jobs[job]["cluster"] == cluster
            assert jobs[job]["idle_allocated_hours"] == pytest.approx(idle_minutes / 60, abs=1e-5), job[:40]
            assert jobs[job]["wasted_hours"] == pytest.approx(idle_minutes / 60, abs=1e-5), job[:40]
            assert jobs[job]["mfu"] == pytest.approx(mfu, abs=1e-5), job[:40]
