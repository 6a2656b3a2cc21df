"""Files the settings point at that are not what they should be (issue 42, findings 9, 10 and 15).

* A YAML alias bomb, 9 levels of 9 aliases in a few hundred bytes: as the settings file it kept
  ``roofwatch run`` busy past 20 s at 1.6 GiB; a web config or a scenario was read the same way.
  Every YAML the agent reads goes through one loader (``agent/context/yaml_input.py``) that counts values
  as it composes them, an alias at its expanded size, and refuses the document past 20,000.
* A bcrypt cost of 31 in the web config: the agent never started (one check takes more than a day,
  and loading checked every hash). Costs outside 4..14 are refused at load, before any bcrypt work.
* A settings path that is ``/dev/zero``, a FIFO or a directory was "not found" (the settings file), read
  forever (``/dev/zero`` as a web config, token or scenario) or blocked the start in ``open`` (a FIFO).
  Each is named for what it is, and nothing but a regular file is opened for reading
  (``agent/context/file_input.py``).

The real-process tests run each command under a 1 GiB address-space limit and read its peak RSS from
``wait4``: a refusal must come before memory grows, not after.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import stat
import subprocess
import tempfile
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from agent.app.config import ConfigError, load_settings
from agent.virtual.scenario import ScenarioError, load_scenario, resolve_scenario
from exporters.web_config import WebConfigError, load_web_config
from tests.agent_process import clean_env, roofwatch_cmd

MEMORY_LIMIT = 1024 * 2**20
"""Address space for a command that should refuse its input at once (the interpreter takes ~300 MiB)."""
RSS_MAX_MIB = 150
"""Peak RSS of such a command: the interpreter and roofwatch's imports take about 45 MiB."""
TRACED_MAX_BYTES = 16 * 2**20
"""Python allocations while one bomb is refused in process: the loader stops after ~100 values."""
LEVELS = "abcdefghi"


def alias_bomb(under: str, levels: int = 9) -> str:
    """The "billion laughs": ``levels`` anchors of nine aliases each (9^9 values expanded at nine), then
    ``under:`` the last one."""
    names = LEVELS[:levels]
    lines = [f"x-a: &a [{', '.join(['lol'] * 9)}]"]
    for previous, current in zip(names, names[1:]):
        lines.append(f"x-{current}: &{current} [{', '.join(['*' + previous] * 9)}]")
    lines.append(f"{under}: *{names[-1]}")
    return "\n".join(lines) + "\n"


def cost_31_hash() -> str:
    """A well-formed bcrypt hash whose cost field says 31 (making a real one would take the day it costs)."""
    real = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    return real[:4] + "31" + real[6:]


@dataclass
class Finished:
    returncode: int
    stderr: str
    max_rss_mib: float


LAUNCHER = """
import os, resource, sys
limit, args = int(sys.argv[1]), sys.argv[2:]
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the command's stdout is not the launcher's report
    os.execv(args[0], args)
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, flush=True)
"""
"""Starts the command from a small process and reports its exit status and peak RSS. Why not from the test's own
process: Linux counts the memory a child had before ``exec`` in its peak (``ru_maxrss`` keeps the high-water mark of
the address space ``exec`` replaced), so a child forked from a pytest worker of 300 MiB "peaked" at 300 MiB
whatever it did; forked from this launcher, it starts from a few MiB."""


def run_measured(*args: str, env: dict[str, str] | None = None, timeout: float = 30.0) -> Finished:
    """A ``roofwatch`` command under :data:`MEMORY_LIMIT`; its exit status, stderr and its own peak RSS."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(MEMORY_LIMIT), *roofwatch_cmd(*args)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True,
                                env=clean_env(**(env or {})), start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the command: one session of their own
            proc.communicate()
            err.seek(0)
            raise AssertionError(f"still running after {timeout} s: {err.read()[-2000:]!r}") from None
        status, max_rss_kib = (int(x) for x in out.split())
        err.seek(0)
        return Finished(status, err.read().decode(errors="replace"), max_rss_kib / 1024)


def refused_in_one_line(result: Finished, status: int, *words: str) -> str:
    """The one line a refusal prints: the exit status, no traceback, ``words`` in it, memory never grown."""
    lines = result.stderr.splitlines()
    assert result.returncode == status, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert all(word in lines[0] for word in words) and len(lines[0]) < 400, (words, lines[0])
    assert result.max_rss_mib < RSS_MAX_MIB, f"peak RSS {result.max_rss_mib:.0f} MiB"
    return lines[0]


def refused_within_memory(load) -> str:
    """The message ``load()`` refuses with, failing when refusing allocated more than TRACED_MAX_BYTES."""
    tracemalloc.start()
    try:
        with pytest.raises((ConfigError, WebConfigError, ScenarioError)) as info:
            load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < TRACED_MAX_BYTES, f"{peak / 2**20:.0f} MiB allocated while refusing"
    return str(info.value)


# -- finding 9: alias bombs in every YAML the agent reads ----------------------------------------------


def _settings(path: Path):
    return lambda: load_settings(path)


def _web_config(path: Path):
    return lambda: load_web_config(path)


def _scenario(path: Path):
    return lambda: load_scenario(path)


@pytest.mark.parametrize(("reader", "under"), [(_settings, "gpu_labels"), (_web_config, "basic_auth_users"),
                                               (_scenario, "nodes")])
def test_an_alias_bomb_is_refused_as_it_composes_in_every_yaml_the_agent_reads(tmp_path, reader, under):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(under, levels=7))  # 4.8 million values expanded
    message = refused_within_memory(reader(path))
    assert str(path) in message and "alias bomb" in message and "line" in message, message
    assert "\n" not in message and len(message) < 400


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("gpu_labels: &loop [job_id, *loop]\n")
    message = refused_within_memory(_settings(path))
    assert str(path) in message and "*loop" in message and "its own anchor" in message, message


def test_a_document_past_the_budget_without_aliases_is_refused_too(tmp_path):
    """Past the budget is past it, aliases or not (the real-process test below has the 1 MiB case)."""
    path = tmp_path / "flat.yaml"
    path.write_text("gpu_labels: [" + ", ".join(["job_id"] * 30_000) + "]\n")
    with pytest.raises(ConfigError) as info:  # (not traced: tracing would slow 20,000 values tenfold)
        load_settings(path)
    message = str(info.value)
    assert str(path) in message and "more than 20000 YAML values" in message, message


def test_anchors_within_the_budget_still_work(tmp_path):
    """Aliases are YAML, and the shipped scenarios share their phase lists through ``x-`` anchors."""
    config = tmp_path / "roofwatch.yaml"
    config.write_text("dcgm_exporter_interval_s: &every 7\namd_exporter_interval_s: *every\n")
    settings = load_settings(config)
    assert settings.dcgm_exporter_interval_s == settings.amd_exporter_interval_s == 7
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: &same '{hashed}'\n  grafana: *same\n")
    assert sorted(load_web_config(web).auth.users) == ["grafana", "prom"]
    for name in ("cluster", "fleet"):
        scenario = resolve_scenario(name)
        phases = [w.phases for node in scenario.nodes for w in node.workloads if w.job.startswith("pretrain")]
        assert len(phases) >= 2 and all(p == phases[0] for p in phases), name


@pytest.mark.slow
def test_an_alias_bomb_as_the_settings_file_stops_the_start_in_one_line(tmp_path):
    config = tmp_path / "roofwatch.yaml"
    config.write_text(alias_bomb("gpu_labels"))
    result = run_measured("run", "--backend", "virtual", "--listen", "127.0.0.1:0", "--config", str(config))
    refused_in_one_line(result, 2, str(config), "alias bomb")


@pytest.mark.slow
def test_an_alias_bomb_as_the_web_config_stops_the_start_in_one_line(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(alias_bomb("basic_auth_users"))
    result = run_measured("run", "--backend", "virtual", "--listen", "127.0.0.1:0", "--web-config-file", str(web))
    refused_in_one_line(result, 2, "web_config_file", str(web), "alias bomb")


@pytest.mark.slow
def test_a_settings_file_of_half_a_million_values_is_refused_before_they_are_composed(tmp_path):
    """Within the 1 MiB file cap, ``[0,0,0,...]`` is 520,000 values: the settings were composed twice and
    validated, 88 s and 910 MiB before the one line came."""
    config = tmp_path / "roofwatch.yaml"
    config.write_text("gpu_labels: [" + ",".join(["0"] * 520_000) + "]\n")
    result = run_measured("run", "--backend", "virtual", "--listen", "127.0.0.1:0", "--config", str(config))
    refused_in_one_line(result, 2, str(config), "more than 20000 YAML values")


WIDE_PHASE = ("{kind: comm_jitter, duration_s: 300, mfu: 0.45, compute_s: 1.8, comm_s: 0.9, stall_prob: 0.25, "
              "stall_s: 2.0, straggler_rank: 1, straggler_slowdown: 1.25, link_util: 0.55}")


def wide_scenario(aliases: int = 250_000) -> str:
    """A scenario whose one phase is listed by alias 250,000 times: 750 KB, three million values to validate
    (the nested bomb is refused by the schema at its first element; this one is what the schema accepts)."""
    return (f"name: wide\nx-phase: &p {WIDE_PHASE}\nnodes:\n  - name: n\n    model: h100-sxm\n    gpus: 8\n"
            f"    workloads:\n      - {{job: j, gpus: [0, 1], phases: [{', '.join(['*p'] * aliases)}]}}\n")


@pytest.mark.slow
@pytest.mark.parametrize("text", [alias_bomb("nodes"), wide_scenario()], ids=["nested", "wide"])
def test_a_scenario_whose_aliases_expand_past_the_budget_stops_the_start_in_one_line(tmp_path, text):
    scenario = tmp_path / "bomb.yaml"
    scenario.write_text(text)
    result = run_measured("run", "--backend", "virtual", "--listen", "127.0.0.1:0", "--scenario", str(scenario))
    refused_in_one_line(result, 1, str(scenario), "alias bomb")  # a scenario that cannot be played: status 1


# -- finding 10: bcrypt cost 31 ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_web_config_with_cost_31_stops_the_start_at_once_naming_user_and_cost(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(json.dumps({"basic_auth_users": {"prometheus": cost_31_hash()}}))
    result = run_measured("run", "--backend", "virtual", "--listen", "127.0.0.1:0", "--web-config-file", str(web))
    line = refused_in_one_line(result, 2, "web_config_file", "'prometheus'", "cost 31", "14")
    assert cost_31_hash()[7:] not in line, "the hash itself is never printed"


# -- finding 15: a path that is a device, a FIFO, a directory or a socket ------------------------------


def _block_device() -> Path | None:
    return next((p for p in sorted(Path("/dev").iterdir()) if stat.S_ISBLK(p.stat().st_mode)), None)


@pytest.fixture
def not_a_file(tmp_path, monkeypatch):
    """Makes a path of a given kind: ``not_a_file("a FIFO")``."""
    sockets: list[socket.socket] = []

    def make(kind: str) -> Path:
        if kind == "a character device":
            return Path("/dev/null")
        if kind == "a block device":
            device = _block_device()
            if device is None:
                pytest.skip("no block device node in /dev here")
            return device
        if kind == "a directory":
            return tmp_path
        if kind == "a FIFO":
            os.mkfifo(tmp_path / "fifo")
            return tmp_path / "fifo"
        monkeypatch.chdir(tmp_path)  # a socket's path must be short: bind it by a relative name
        sockets.append(socket.socket(socket.AF_UNIX))
        sockets[-1].bind("sock")
        return tmp_path / "sock"

    yield make
    for listener in sockets:
        listener.close()


def _read_token(path: Path) -> None:
    load_settings(report_token_file=str(path)).read_report_token()


READERS = {"config file": lambda p: load_settings(p), "web_config_file": load_web_config,
           "report_token_file": _read_token, "scenario": load_scenario}


@pytest.mark.parametrize("kind", ["a character device", "a block device", "a directory", "a socket"])
@pytest.mark.parametrize("setting", sorted(READERS))
def test_a_path_that_is_not_a_regular_file_is_named_for_what_it_is(not_a_file, setting, kind):
    """A FIFO is the real-process test below: on the code before, opening one blocked for good."""
    path = not_a_file(kind)
    with pytest.raises((ConfigError, WebConfigError, ScenarioError)) as info:
        READERS[setting](path)
    message = str(info.value)
    assert str(path) in message and f"is {kind}, not a regular file" in message, message
    assert "not found" not in message and "\n" not in message


FILE_SETTINGS = {
    "config file": (2, lambda p: ("run", "--backend", "virtual", "--config", str(p)), {}),
    "web_config_file": (2, lambda p: ("run", "--backend", "virtual", "--web-config-file", str(p)), {}),
    "report_token_file": (2, lambda p: ("run", "--backend", "nvml"), {"ROOFWATCH_REPORT_TOKEN_FILE": None}),
    "scenario": (1, lambda p: ("run", "--backend", "virtual", "--scenario", str(p)), {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["a FIFO", "a character device"])
@pytest.mark.parametrize("setting", sorted(FILE_SETTINGS))
def test_a_fifo_or_dev_zero_as_any_file_setting_is_refused_at_once(not_a_file, setting, kind):
    """Opening a FIFO with no writer blocked the start for good; ``/dev/zero`` was read until memory ran out."""
    path = Path("/dev/zero") if kind == "a character device" else not_a_file(kind)
    status, command, env = FILE_SETTINGS[setting]
    result = run_measured(*command(path), "--listen", "127.0.0.1:0", env={k: str(path) for k in env})
    refused_in_one_line(result, status, str(path), f"is {kind}, not a regular file")
