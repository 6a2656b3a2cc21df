"""The real tools of the fleet benchmark: promtool's two backfills and a Prometheus over the blocks.

Debian's ``prometheus`` package (2.42) provides both binaries. The server scrapes nothing; the
recording rules' history is backfilled (``promtool tsdb create-blocks-from rules``), and the rule
file is evaluated live where the history reaches past now (``Server(rules=...)``), else timed as
instant queries at the end of the history.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil

from benchmarks.own_port import listening_port


def tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise SystemExit(f"{name} is required (Debian package 'prometheus'; ./dev.sh test installs it)")
    return path


def backfill_openmetrics(source: Path, data: Path) -> None:
    """Turn one OpenMetrics file into TSDB blocks under ``data`` (promtool maps the file: no pipe)."""
    run = subprocess.run([tool("promtool"), "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(data)],
                         capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"promtool openmetrics backfill failed: {run.stderr[-2000:]}")


def backfill_rules(rule_file: Path, url: str, start: int, end: int, eval_s: int, data: Path, scratch: Path) -> None:
    """Evaluate ``rule_file``'s recording rules over [start, end] against ``url``; move the blocks to ``data``.

    promtool exits 0 having written nothing when every rule's query came back empty (it writes a
    block only for samples it got), which is what a server that is not the one holding ``data``
    answers: so no block at all is an error here, not an empty level."""
    shutil.rmtree(scratch, ignore_errors=True)
    run = subprocess.run([tool("promtool"), "tsdb", "create-blocks-from", "rules", f"--url={url}",
                          f"--start={start}", f"--end={end}", f"--eval-interval={eval_s}s",
                          f"--output-dir={scratch}", str(rule_file)], capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"promtool rules backfill failed: {run.stderr[-2000:]}")
    blocks = [block for block in scratch.iterdir() if block.is_dir()] if scratch.is_dir() else []
    if not blocks:
        raise RuntimeError(f"promtool wrote no block for {rule_file.name} over {start}..{end}: every rule's "
                           f"query to {url} came back empty (is it the server holding the data?); "
                           f"promtool said: {run.stderr[-1500:].strip() or 'nothing'}")
    for block in blocks:
        shutil.move(str(block), data / block.name)


def api_get(base_url: str, path: str, params: dict, timeout_s: float) -> object:
    """GET <base_url>/api/v1/<path>, the HTTP API Prometheus and VictoriaMetrics both speak; raises
    with the server's error text unless it succeeds."""
    url = f"{base_url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            body = json.loads(answer.read())
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"{path} {params}: {err.read()[:500]!r}") from None
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {body}")
    return body["data"]


def timed_get(base_url: str, path: str, params: dict, timeout_s: float) -> tuple[float, object]:
    """Seconds the whole request took (query, JSON encoding, transfer), and its data."""
    started = time.perf_counter()
    data = api_get(base_url, path, params, timeout_s)
    return time.perf_counter() - started, data


class Server:
    """One Prometheus over ``data``, no scrape targets; stopped with ``stop``.

    With ``rules`` it evaluates that file live every ``eval_s`` (:meth:`group_timings` reads each
    group's evaluations), over blocks whose history reaches past now. Its head then starts after the
    last block, so rule results at now would be refused as out of bounds: the out-of-order window
    (2.39+) takes them, as it would take a late sample."""

    def __init__(self, workdir: Path, data: Path, rules: Path | None = None, eval_s: float = 30.0) -> None:
        self.config = workdir / "prometheus.yml"
        self._write_config(rules, eval_s)
        config = self.config
        self.data = data
        self.log = (workdir / "prometheus.log").open("a")
        self.process = subprocess.Popen(
            [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
             "--storage.tsdb.retention.time=30d", "--web.listen-address=127.0.0.1:0",
             "--query.max-samples=200000000", "--query.timeout=10m", "--log.level=warn", "--web.enable-lifecycle"],
            stdout=self.log, stderr=self.log)
        try:
            self.url = f"http://127.0.0.1:{listening_port(self.process, 'Prometheus')}"  # its own choice: benchmarks/own_port.py
            self._poll(lambda: self._ok("/-/ready"), 600, "Prometheus ready")
            served = self.api("status/flags").get("storage.tsdb.path")
            if served != str(data):
                raise RuntimeError(f"{self.url} serves {served!r}, not {data}: it is not the Prometheus started here")
        except BaseException:
            self.stop()
            raise

    def _write_config(self, rules: Path | None, eval_s: float) -> None:
        text = f"global: {{scrape_interval: 15s, evaluation_interval: {int(eval_s)}s}}\n"
        text += "storage: {tsdb: {out_of_order_time_window: 1d}}\n"
        if rules:
            text += f"rule_files: [{json.dumps(str(rules))}]\n"
        self.config.write_text(text)

    def drop_rules(self) -> None:
        """Stop evaluating rules (config reload without rule files): queries are timed alone."""
        self._write_config(None, 30)
        request = urllib.request.Request(self.url + "/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=120) as answer:
            answer.read()

    def group_timings(self, evaluations: int, timeout_s: float, poll_s: float = 0.5) -> dict[str, list[float]]:
        """Each rule group's evaluation seconds as Prometheus measured them (``/api/v1/rules``
        ``evaluationTime``, one per new ``lastEvaluation``), until every group has ``evaluations``
        after the first one seen (dropped: it may straddle start-up) or ``timeout_s`` passes."""
        seen: dict[str, str] = {}
        out: dict[str, list[float]] = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for group in self.api("rules")["groups"]:
                name, last = group["name"], group.get("lastEvaluation", "")
                if last.startswith("0001-") or seen.get(name) == last:
                    continue
                if name in seen:
                    out.setdefault(name, []).append(float(group["evaluationTime"]))
                else:
                    out.setdefault(name, [])
                seen[name] = last
            if out and all(len(v) >= evaluations for v in out.values()):
                break
            time.sleep(poll_s)
        return out

    def rule_errors(self) -> list[str]:
        return sorted({f"{g['name']}: {r['name']}: {r['lastError']}" for g in self.api("rules")["groups"]
                       for r in g["rules"] if r.get("lastError")})

    def _ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    def _poll(self, check, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if self.process.poll() is not None:
                raise RuntimeError(f"Prometheus exited ({self.process.returncode}) waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not reached in {timeout_s:.0f} s")
            time.sleep(0.5)

    def api(self, path: str, **params: object) -> object:
        return api_get(self.url, path, params, 900)

    def timed(self, path: str, **params: object) -> tuple[float, object]:
        return timed_get(self.url, path, params, 900)

    def own_metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as answer:
            text = answer.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + " ") or line.startswith(name + "{"))

    def settle(self, first_tick_s: float = 75.0) -> None:
        """Wait for the compaction that merges backfilled blocks (its first tick is a minute after
        start) and until the block count holds still: measurements must not race it."""
        deadline = time.monotonic() + first_tick_s
        start = self.own_metric("prometheus_tsdb_compactions_triggered_total")
        while time.monotonic() < deadline and self.own_metric("prometheus_tsdb_compactions_triggered_total") == start:
            time.sleep(2)
        last = None
        while True:
            now = (self.own_metric("prometheus_tsdb_blocks_loaded"), self.own_metric("prometheus_tsdb_compactions_total"),
                   self.own_metric("prometheus_tsdb_vertical_compactions_total"))
            if now == last:
                return
            last = now
            time.sleep(10)

    def rss_bytes(self) -> int:
        return psutil.Process(self.process.pid).memory_info().rss

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
