"""End to end: ``roofwatch top`` in a real terminal (tmux) against a running demo agent.

tmux gives the view a pty of a fixed size, lets the test type keys, read the screen back
(``capture-pane``) and read the exit status of the process after it left (``remain-on-exit``).
Every wait polls the screen; nothing sleeps to synchronise.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from agent.model.waste import WASTED_CLASSES
from agent.views import palette
from tests.agent_process import AgentProcess, clean_env, poll, roofwatch_cmd, running_demo
from tests.prometheus_server import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
TMUX = shutil.which("tmux") or "/usr/bin/tmux"
ROW = re.compile(r"^\s*(\d+(?:/\d+)?)\s")
MFU = re.compile(r"\s(\d+\.\d)%")
_sockets = itertools.count()


@pytest.fixture(scope="module")
def demo():
    with running_demo() as agent:
        yield agent


class Tmux:
    """One private tmux server (own socket, no config) running one session, ``top``."""

    def __init__(self) -> None:
        assert os.access(TMUX, os.X_OK), "tmux is required (./dev.sh installs it)"
        self.socket = f"roofwatch-test-{os.getpid()}-{next(_sockets)}"
        env = clean_env(TERM="xterm-256color", LANG="C.UTF-8")
        self.env = {k: v for k, v in env.items() if k not in ("TMUX", "TMUX_PANE")}

    def __call__(self, *args: str, check: bool = True) -> str:
        result = subprocess.run([TMUX, "-u", "-L", self.socket, "-f", "/dev/null", *args],
                                capture_output=True, text=True, env=self.env, timeout=10)
        if check and result.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: {result.stderr}")
        return result.stdout

    def start(self, *command: str) -> None:
        # One command queue: remain-on-exit is set before the server reaps the child,
        # so even a process that exits at once leaves its status behind.
        self("new-session", "-d", "-x", "200", "-y", "50", "-s", "top", "-c", str(REPO),
             "--", "env", "TERM=xterm-256color", *command,
             ";", "set-option", "-g", "remain-on-exit", "on")

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def pane(self, fmt: str) -> str:
        return self("display-message", "-p", "-t", "top", fmt).strip()

    def exit_status(self) -> str | None:
        """The pane's exit status once its process has exited and been reaped, else None."""
        dead, _, status = self.pane("#{pane_dead} #{pane_dead_status}").partition(" ")
        if dead == "1" and not status:
            # tmux 3.3 now and then misses the SIGCHLD of a pane's process: the pty is closed
            # (pane_dead), the child stays an unreaped zombie and no status ever comes. One more
            # SIGCHLD makes the server reap every exited child and record the status.
            os.kill(int(self.pane("#{pid}")), signal.SIGCHLD)
        return status if dead == "1" and status else None

    def kill(self) -> None:
        socket_path = self("display-message", "-p", "#{socket_path}", check=False).strip()
        self("kill-server", check=False)
        if socket_path:  # the server leaves its socket file behind
            Path(socket_path).unlink(missing_ok=True)


@pytest.fixture
def tmux():
    session = Tmux()
    try:
        yield session
    finally:
        session.kill()


def top_in(tmux: Tmux, demo: AgentProcess) -> None:
    tmux.start(*roofwatch_cmd("top", demo.url, "--interval", "0.5"))


def rows(screen: str) -> list[str]:
    return [line for line in screen.splitlines() if ROW.match(line)]


def header(screen: str) -> str:
    return next((line for line in screen.splitlines() if line.startswith("roofwatch top")), "")


def gpu_ids(screen: str) -> list[str]:
    return [ROW.match(line).group(1) for line in rows(screen)]


def mfus(screen: str) -> list[float]:
    return [float(m.group(1)) for m in (MFU.search(line) for line in rows(screen)) if m]


def full_frame(tmux: Tmux, sort: str, gpus: int = 8):
    """The screen once it shows every GPU (each with an MFU) under the given sort order."""
    def ready():
        screen = tmux.screen()
        ok = f"sorted by {sort}" in header(screen) and len(rows(screen)) == gpus and len(mfus(screen)) == gpus
        return screen if ok else None
    return poll(ready, timeout=15, what=f"all {gpus} GPUs sorted by {sort} on screen")


def demo_classes(demo: AgentProcess) -> set[str]:
    status, body = demo.get("api/v1/snapshot")
    assert status == 200
    return {palette.class_label(v["class"]) for v in json.loads(body)["verdicts"]}


def test_shows_every_gpu_and_the_agents_classes(demo, tmux):
    top_in(tmux, demo)
    expected_gpus = [str(i) for i in range(8)]

    def matches():
        screen, classes = tmux.screen(), demo_classes(demo)
        ok = gpu_ids(screen) == expected_gpus and all(label in screen for label in classes)
        return (screen, classes) if ok else None

    screen, classes = poll(matches, timeout=15, what="8 GPUs and the demo's classes on screen")
    assert len(classes) >= 4, classes
    top = header(screen)
    assert "node demo-node" in top and "8/8 GPUs up" in top and f"{demo.url}metrics" in top and "sorted by gpu" in top
    assert "q quit · s sort: mfu" in screen
    assert tmux.pane("#{pane_dead}") == "0"


def test_s_cycles_the_sort_order_and_reorders_rows(demo, tmux):
    top_in(tmux, demo)
    screen = full_frame(tmux, "gpu")
    assert gpu_ids(screen) == [str(i) for i in range(8)]
    before = mfus(screen)
    assert before != sorted(before), f"the demo's MFU is not ascending by GPU id: {before}"

    tmux("send-keys", "-t", "top", "s")
    screen = poll(lambda: (s := full_frame(tmux, "mfu")) and mfus(s) == sorted(mfus(s)) and s,
                  timeout=15, what="rows in ascending MFU order")
    assert "s sort: class" in screen and sorted(gpu_ids(screen)) == [str(i) for i in range(8)]

    tmux("send-keys", "-t", "top", "s")
    wasted = {palette.class_label(c) for c in WASTED_CLASSES}  # the demo's idle GPU is held: every idle one is wasted

    def wasted_first():
        screen = full_frame(tmux, "class")
        flags = [any(f" {label} " in line for label in wasted) for line in rows(screen)]
        return screen if any(flags) and flags == sorted(flags, reverse=True) else None

    poll(wasted_first, timeout=15, what="wasted classes first")


@pytest.mark.parametrize("key", ["q", "C-c"])
def test_quit_key_exits_0_and_restores_the_terminal(demo, tmux, key):
    top_in(tmux, demo)
    full_frame(tmux, "gpu")
    assert tmux.pane("#{pane_dead} #{alternate_on}") == "0 1", "the live view runs on the alternate screen"
    tmux("send-keys", "-t", "top", key)
    assert poll(tmux.exit_status, timeout=10, what=f"top to exit after {key}") == "0"
    assert tmux.pane("#{alternate_on}") == "0", "the terminal is back on the normal screen"
    assert "Traceback" not in tmux.screen()


def test_agent_going_away_keeps_the_last_frame_and_shows_the_error(tmux):
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0")
    try:
        agent.wait_healthy()
        top_in(tmux, agent)
        full_frame(tmux, "gpu")
        agent.stop()

        def error_over_last_frame():
            # The error line moves the frame down one line; a capture taken while tmux is
            # still drawing that frame shows it torn (one row overwritten), so wait for a
            # whole one rather than judging the first capture that has the error.
            screen = tmux.screen()
            whole = (f"cannot reach {agent.url}metrics" in screen and "showing the last data" in screen
                     and len(rows(screen)) == 8)
            return screen if whole else None

        screen = poll(error_over_last_frame, timeout=15,
                      what="the fetch error in the header over the last frame's 8 rows")
        assert tmux.pane("#{pane_dead}") == "0" and "Traceback" not in screen
    finally:
        agent.kill()


def test_once_prints_one_frame(demo):
    result = subprocess.run(roofwatch_cmd("top", demo.url, "--once"), capture_output=True, text=True,
                            env=clean_env(), cwd=REPO, timeout=30)
    assert result.returncode == 0, result.stderr
    assert gpu_ids(result.stdout) == [str(i) for i in range(8)]
    assert "sorted by gpu" in header(result.stdout) and "q quit" not in result.stdout
    assert "\x1b[" not in result.stdout, "no escape codes into a pipe"


def test_once_against_a_closed_port_exits_1():
    port = free_port()  # nothing listens there
    result = subprocess.run(roofwatch_cmd("top", f"http://127.0.0.1:{port}", "--once"), capture_output=True,
                            text=True, env=clean_env(), cwd=REPO, timeout=30)
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("roofwatch top: ") and f"127.0.0.1:{port}/metrics" in lines[0]


def test_top_lists_the_holders_of_each_shared_gpu_of_a_real_agent(tmux):
    """issue 47: a real agent on the fake NVIDIA driver (``--backend nvml-virtual --scenario shared``): the
    time-sliced GPU's idle notebook is ``idle_held`` on screen, and GPU 1's clients, found through NVML's MPS
    client list, say ``mps``."""
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", "nvml-virtual", "--scenario", "shared")
    try:
        agent.wait_healthy(60)
        top_in(tmux, agent)
        idle = palette.class_label("idle_held")

        def holders_on_screen():
            screen = tmux.screen()
            lines = [line for line in screen.splitlines() if re.match(r"^GPU \d+  \S", line)]
            notebook = [line for line in lines if "research/notebook/main" in line and idle in line]
            clients = [line for line in lines if line.startswith("GPU 1  pid:") and "  mps  " in line]
            return (screen, lines) if "SHARED GPUS (3)" in screen and notebook and len(clients) == 4 else None

        screen, lines = poll(holders_on_screen, timeout=60, what="the shared GPUs' holders on screen")
        assert {line.split()[1] for line in lines} == {"0", "1", "2"}, "only the shared GPUs have holders"
        assert any(line.startswith("GPU 2  inference/chat-a/main  dra") for line in lines)
        assert "Traceback" not in screen
    finally:
        agent.kill()
