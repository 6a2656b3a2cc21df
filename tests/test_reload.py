"""SIGHUP re-reads the configuration: a bad file keeps the running one, a good one applies live
what can change live (logging, web config: new passwords and certificates) and names the rest."""

from __future__ import annotations

import base64
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import psutil
import pytest

from tests.agent_process import AgentProcess, http_get, poll
from tests.test_hostile_settings_files import alias_bomb, cost_31_hash

pytestmark = pytest.mark.slow


class LiveLog:
    """The agent's stderr, read line by line while it runs."""

    def __init__(self, agent: AgentProcess) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(agent,), daemon=True)
        self._thread.start()

    def _read(self, agent: AgentProcess) -> None:
        for line in agent.proc.stderr:
            self.lines.append(line)

    def wait_for(self, *words: str, after: int = 0) -> str:
        def found() -> str | None:
            return next((line for line in self.lines[after:] if all(w in line for w in words)), None)
        return poll(found, 20, what=f"a log line with {words}")


def _users(path: Path, password: str) -> None:
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    path.write_text(json.dumps({"basic_auth_users": {"prom": hashed}}))


def _status(url: str, password: str | None, timeout: float = 10.0) -> int:
    request = urllib.request.Request(url)
    if password is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"prom:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture
def agent(tmp_path):
    config, web = tmp_path / "roofwatch.yaml", tmp_path / "web.yml"
    _users(web, "first")
    config.write_text(f"log_level: info\nweb_config_file: {web}\n")
    proc = AgentProcess("demo", "--listen", "127.0.0.1:0", "--config", str(config))
    live = LiveLog(proc)
    proc.wait_healthy()
    yield proc, live, config, web
    proc.kill()


def _reload(proc: AgentProcess) -> None:
    proc.proc.send_signal(signal.SIGHUP)


def test_a_bad_config_keeps_the_running_one_and_says_which_field(agent):
    proc, live, config, web = agent
    config.write_text(f"log_level: info\ninterval_s: -1\nweb_config_file: {web}\n")
    mark = len(live.lines)
    _reload(proc)
    line = live.wait_for("reload failed", after=mark)
    assert "interval_s" in line and "keeping the running configuration" in line
    assert proc.proc.poll() is None and http_get(proc.url + "healthz")[0] == 200
    assert _status(proc.url + "metrics", "first") == 200


def test_a_bad_web_config_keeps_the_old_passwords(agent):
    proc, live, config, web = agent
    web.write_text(json.dumps({"basic_auth_users": {"prom": "plaintext"}}))
    mark = len(live.lines)
    _reload(proc)
    line = live.wait_for("reload failed", after=mark)
    assert "web_config_file" in line and "basic_auth_users" in line
    assert _status(proc.url + "metrics", "first") == 200


def test_passwords_rotate_and_restart_only_fields_are_named(agent):
    proc, live, config, web = agent
    assert _status(proc.url + "metrics", "first") == 200
    _users(web, "second")
    config.write_text(f"log_level: debug\ninterval_s: 2\nweb_config_file: {web}\n")
    mark = len(live.lines)
    _reload(proc)
    line = live.wait_for("msg=reloaded", after=mark)
    assert "log_level" in line and "interval_s" in line
    restart = live.wait_for("need a restart", after=mark)
    assert "interval_s" in restart and "log_level" not in restart
    assert _status(proc.url + "metrics", "second") == 200
    assert _status(proc.url + "metrics", "first") == 401
    assert _status(proc.url + "metrics", None) == 401
    assert _status(proc.url + "healthz", None) == 200
    # log_level debug took effect: the HTTP server's debug lines now appear
    live.wait_for("level=debug", after=mark)


def test_an_emptied_web_config_is_refused_and_auth_stays_on(agent):
    """`> web.yml` before the new text lands (a Secret or ConfigMap being rewritten), then SIGHUP."""
    proc, live, config, web = agent
    web.write_text("")
    mark = len(live.lines)
    _reload(proc)
    line = live.wait_for("reload failed", after=mark)
    assert "web_config_file" in line and "empty" in line
    assert _status(proc.url + "metrics", None) == 401, "no password, still refused"
    assert _status(proc.url + "metrics", "first") == 200
    # The partial web config that follows (users without their hashes' file being whole) is refused too.
    web.write_text("basic_auth_users:\n")
    _reload(proc)
    live.wait_for("reload failed", "basic_auth_users", after=mark)
    assert _status(proc.url + "metrics", None) == 401


def test_a_settings_file_cut_off_before_its_web_config_line_keeps_auth(agent):
    proc, live, config, web = agent
    config.write_text("log_level: info\n")  # the rest of the file not written yet
    mark = len(live.lines)
    _reload(proc)
    line = live.wait_for("reload refused", after=mark)
    assert "basic auth" in line and "allow_security_downgrade" in line and "level=error" in line
    assert _status(proc.url + "metrics", None) == 401
    assert _status(proc.url + "metrics", "first") == 200


def test_turning_auth_off_on_purpose_takes_the_setting_and_is_logged_at_warning(agent):
    proc, live, config, web = agent
    web.write_text("{}\n")
    config.write_text(f"log_level: info\nweb_config_file: {web}\nallow_security_downgrade: true\n")
    mark = len(live.lines)
    _reload(proc)
    line = live.wait_for("web config changed", after=mark)
    assert "level=warning" in line and "basic auth users removed: prom" in line
    assert _status(proc.url + "metrics", None) == 200


def test_an_added_user_is_logged_at_warning_with_its_name_only(agent):
    proc, live, config, web = agent
    hashed = bcrypt.hashpw(b"other", bcrypt.gensalt(rounds=4)).decode()
    first = json.loads(web.read_text())["basic_auth_users"]
    web.write_text(json.dumps({"basic_auth_users": {**first, "grafana": hashed}}))
    mark = len(live.lines)
    _reload(proc)
    line = live.wait_for("web config changed", after=mark)
    assert "level=warning" in line and "basic auth users added: grafana" in line and "$2" not in line
    assert _status(proc.url + "metrics", "first") == 200


SCRAPE_TIMEOUT_S = 5.0
"""Each scrape's deadline while a reload runs: half Prometheus's default scrape_timeout."""
MEMORY_MAX_MIB = 256
"""The systemd unit's and the chart's memory limit."""


class Scraper:
    """Scrapes /metrics with the password, one scrape after another, from a thread, and samples the
    agent's RSS between scrapes: what a reload costs the agent's readers."""

    def __init__(self, agent: AgentProcess, password: str) -> None:
        self.answered: list[float] = []
        self.failures: list[str] = []
        self.rss_mib: list[float] = []
        self._agent, self._password = agent, password
        self._process = psutil.Process(agent.proc.pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.stopped = 0.0

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * SCRAPE_TIMEOUT_S)
        self.stopped = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = _status(self._agent.url + "metrics", self._password, timeout=SCRAPE_TIMEOUT_S)
            except OSError as exc:  # a scrape past its deadline, or refused
                status = f"{type(exc).__name__}: {exc}"
            if status == 200:
                self.answered.append(time.monotonic())
            else:
                self.failures.append(str(status))
            self.rss_mib.append(self._process.memory_info().rss / 2**20)

    def longest_gap_s(self) -> float:
        """The longest time between two answered scrapes, or from the last one to the end."""
        times = self.answered + [self.stopped]
        return max(later - earlier for earlier, later in zip(times, times[1:]))


def test_an_alias_bomb_at_sighup_is_refused_while_every_scrape_is_answered(agent):
    """Issue 42, finding 9: a 1.1 KB settings file expanding to 387 million values stopped the running agent's
    scrapes for 10 s and took it to 1.9 GiB (OOM-killed under the unit's 256 MiB) before it was refused."""
    proc, live, config, web = agent
    with Scraper(proc, "first") as scraper:
        poll(lambda: len(scraper.answered) >= 3, 20, what="scrapes before the reload")
        config.write_text(alias_bomb("gpu_labels") + f"web_config_file: {web}\n")
        mark = len(live.lines)
        _reload(proc)
        line = live.wait_for("reload failed", after=mark)
        before = len(scraper.answered)
        poll(lambda: len(scraper.answered) >= before + 3, 20, what="scrapes after the reload")
    print(f"\n  {len(scraper.answered)} scrapes, longest gap {scraper.longest_gap_s() * 1e3:.0f} ms, "
          f"peak RSS {max(scraper.rss_mib):.0f} MiB")
    assert str(config) in line and "alias bomb" in line and "keeping the running configuration" in line, line
    assert scraper.failures == [], scraper.failures[:5]
    assert scraper.longest_gap_s() < SCRAPE_TIMEOUT_S
    assert max(scraper.rss_mib) < MEMORY_MAX_MIB
    assert _status(proc.url + "metrics", None) == 401, "the running web config stayed"
    assert proc.proc.poll() is None and _status(proc.url + "metrics", "first") == 200


def test_a_web_config_with_cost_31_at_sighup_is_refused_naming_user_and_cost(agent):
    """Issue 42, finding 10: loading checked every hash with bcrypt, and one check at cost 31 takes more
    than a day: the reload never ended (and the same file at start kept the agent from ever listening)."""
    proc, live, config, web = agent
    web.write_text(json.dumps({"basic_auth_users": {"prom": cost_31_hash()}}))
    mark = len(live.lines)
    _reload(proc)
    line = live.wait_for("reload failed", after=mark)
    assert "web_config_file" in line and "'prom'" in line and "cost 31" in line, line
    assert _status(proc.url + "metrics", "first") == 200, "the old password still works"
    assert _status(proc.url + "metrics", None) == 401
