"""VictoriaMetrics (Debian package ``victoria-metrics``) as test fixtures: the single-node server,
vmagent and vmalert, each a real child process on a loopback port.

The server is started with ``-search.disableCache`` because the tests write samples into the past
(imports, vmalert's replay) and then query them: VictoriaMetrics caches range results on the
assumption that the past does not change, which backfilling breaks (its own advice for backfills).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.agent_process import http_get, poll
from tests.prometheus_server import free_port

PACKAGE_HINT = "Debian package 'victoria-metrics'; ./dev.sh test installs it"


def binary(name: str) -> str:
    """The path of one of the package's programs, or a failure that says how to get it."""
    path = shutil.which(name)
    assert path, f"{name} is required ({PACKAGE_HINT})"
    return path


def available() -> bool:
    return all(shutil.which(name) for name in ("victoria-metrics", "vmagent", "vmalert"))


class _Process:
    """A child process whose stderr goes to a file, so a long run cannot fill a pipe and stall."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._log_file = log.open("w")
        self.process = subprocess.Popen(argv, stdout=self._log_file, stderr=subprocess.STDOUT, text=True)

    def stop(self) -> str:
        """Stop the process; returns what it logged, for failure messages."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()
        return self.log.read_text()


class VictoriaMetrics(_Process):
    """The single-node server: remote write on /api/v1/write, imports, the Prometheus query API."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        super().__init__([binary("victoria-metrics"), f"-httpListenAddr=127.0.0.1:{port}",
                          f"-storageDataPath={workdir / 'vm-data'}", "-retentionPeriod=100y",
                          "-search.disableCache", "-loggerLevel=WARN", *extra], workdir / "victoria-metrics.log")
        try:
            poll(lambda: http_get(self.base + "/health")[0] == 200, timeout=30, what="victoria-metrics /health")
        except BaseException:
            print(self.stop())
            raise

    def import_prometheus(self, lines: list[str]) -> None:
        """Samples in the text exposition format with millisecond timestamps (one per line)."""
        request = urllib.request.Request(self.base + "/api/v1/import/prometheus",
                                         data="\n".join(lines).encode() + b"\n", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 204, response.read()

    def api(self, path: str, **params: str) -> object:
        status, body = http_get(f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}",
                                timeout=30)
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", (path, params, data)
        return data["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr} if at is None else {"query": expr, "time": str(at)}
        return self.api("query", **params)["result"]

    def export(self, selector: str, start: float, end: float) -> list[dict]:
        """The raw samples of ``selector`` in [start, end] (seconds): no lookback, no rollup."""
        status, body = http_get(f"{self.base}/api/v1/export?" + urllib.parse.urlencode(
            {"match[]": selector, "start": str(start), "end": str(end)}), timeout=30)
        assert status == 200, body
        return [json.loads(line) for line in body.decode().splitlines() if line.strip()]

    def series_names(self) -> set[str]:
        return set(self.api("label/__name__/values"))


class VmAgent(_Process):
    """vmagent scraping with a Prometheus ``scrape_configs`` file and remote-writing to ``write_url``."""

    def __init__(self, workdir: Path, config: Path, write_url: str, *extra: str) -> None:
        """``extra``: more flags, say a second ``-remoteWrite.url`` with its ``-remoteWrite.urlRelabelConfig``."""
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        super().__init__([binary("vmagent"), f"-promscrape.config={config}", f"-remoteWrite.url={write_url}",
                          f"-remoteWrite.tmpDataPath={workdir / 'vmagent-queue'}", "-remoteWrite.flushInterval=200ms",
                          f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN", *extra], workdir / "vmagent.log")
        try:
            poll(lambda: http_get(self.base + "/health")[0] == 200, timeout=30, what="vmagent /health")
        except BaseException:
            print(self.stop())
            raise


class VmAlert(_Process):
    """vmalert evaluating rule files live against ``vm``, writing results back to it."""

    def __init__(self, workdir: Path, rules: list[Path], vm: VictoriaMetrics, notifier_url: str,
                 interval: str = "2s", write_url: str | None = None) -> None:
        """``write_url``: where the results go instead of ``vm`` (a vmagent that forwards them)."""
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        super().__init__([binary("vmalert"), *[f"-rule={r}" for r in rules], f"-datasource.url={vm.base}",
                          f"-remoteWrite.url={write_url or vm.base}", "-remoteWrite.flushInterval=200ms",
                          f"-notifier.url={notifier_url}", f"-evaluationInterval={interval}",
                          f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN"], workdir / "vmalert.log")
        try:
            poll(lambda: http_get(self.base + "/health")[0] == 200, timeout=30, what="vmalert /health")
        except BaseException:
            print(self.stop())
            raise

    def rules(self) -> list[dict]:
        status, body = http_get(self.base + "/api/v1/rules")
        assert status == 200, body
        return [rule for group in json.loads(body)["data"]["groups"] for rule in group["rules"]]


def vmalert_replay(rules: list[Path], vm: VictoriaMetrics, start: str, end: str, *,
                   interval: str = "1m", max_points: int = 10000,
                   rules_delay: str = "2s") -> subprocess.CompletedProcess[str]:
    """vmalert's replay mode: every group over [start, end] (RFC 3339) at ``interval``, results
    (recording series, ALERTS and ALERTS_FOR_STATE) remote-written to ``vm``. Groups run in file
    order and rules one by one, with a pause after each rule so that the next, chained rule reads
    what the last one wrote: 2 s by default, as VictoriaMetrics 1.79 makes new series searchable about a
    second after they arrive, and a query that comes earlier is answered empty (seen here: with
    vmalert's default of 1 s the straggler rule, which reads the rule just before it, recorded
    nothing). Rules that read nothing recorded in the same run need no pause: :func:`replay_by_level`
    replays them that way, a level at a time. The query step is the interval too: by default vmalert 1.79 sends
    step=5m (``-datasource.queryStep``), and in a range query that is also the spacing of the
    evaluations, so a replay at 1m would evaluate every fifth minute."""
    return subprocess.run(
        [binary("vmalert"), *[f"-rule={r}" for r in rules], f"-datasource.url={vm.base}",
         f"-remoteWrite.url={vm.base}", "-remoteWrite.flushInterval=100ms", f"-replay.rulesDelay={rules_delay}",
         f"-replay.timeFrom={start}", f"-replay.timeTo={end}", f"-evaluationInterval={interval}",
         f"-datasource.queryStep={interval}",
         f"-replay.maxDatapointsPerQuery={max_points}", "-replay.disableProgressBar", "-loggerLevel=WARN"],
        capture_output=True, text=True, timeout=600,
    )


_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def rule_levels(document: dict) -> list[dict]:
    """The rule file split into levels: level 1 reads only stored series, level n reads recordings of
    levels below n. Each level is a rule file of its own with the same groups (name, interval, every
    option) holding only that level's rules, in file order; empty groups are left out."""
    recorded = {rule["record"] for group in document["groups"] for rule in group["rules"] if "record" in rule}
    level: dict[str, int] = {}

    def level_of(expr: str) -> int:
        return 1 + max((level[name] for name in _NAME.findall(expr) if name in recorded), default=0)

    for _ in range(len(recorded) + 1):  # to the fixed point, whatever order the file lists them in
        before = dict(level)
        for group in document["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    level[rule["record"]] = level_of(rule["expr"])
        if level == before:
            break
    levels: list[dict] = []
    for group in document["groups"]:
        for rule in group["rules"]:
            n = level_of(rule["expr"])
            while len(levels) < n:
                levels.append({"groups": []})
            groups = levels[n - 1]["groups"]
            if not groups or groups[-1]["name"] != group["name"]:
                groups.append({**{k: v for k, v in group.items() if k != "rules"}, "rules": []})
            groups[-1]["rules"].append(rule)
    return levels


def replay_by_level(document: dict, vm: VictoriaMetrics, workdir: Path, start: str, end: str,
                    **options: Any) -> list[subprocess.CompletedProcess[str]]:
    """:func:`vmalert_replay` of a rule file a level at a time (:func:`rule_levels`): within a level no
    rule reads another's output, so no pause between rules; between levels VictoriaMetrics is told to
    make what arrived searchable (``/internal/force_flush``). The same evaluations as one replay with a
    pause after every rule, which is a pause per rule (over two minutes for the shipped file)."""
    results = []
    for n, level in enumerate(rule_levels(document), start=1):
        path = workdir / f"rules-level-{n}.yml"
        path.write_text(yaml.safe_dump(level, sort_keys=False))
        result = vmalert_replay([path], vm, start, end, rules_delay="100ms", **options)
        results.append(result)
        if result.returncode != 0:
            break
        status, body = http_get(vm.base + "/internal/force_flush")
        assert status == 200, body
    return results
