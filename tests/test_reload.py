"""SIGHUP re-reads the configuration: a bad file keeps the running one, a good one applies live
what can change live (logging, web config: new passwords and certificates) and names the rest."""

from __future__ import annotations

import base64
import json
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from tests.agent_process import AgentProcess, http_get, poll

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


def _status(url: str, password: str | None) -> int:
    request = urllib.request.Request(url)
    if password is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"prom:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
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
