"""The two test tiers, kept honest by the quick run itself.

``./dev.sh test -m "not slow"`` is the quick tier a contributor runs while reading a diff; the
whole suite (``./dev.sh test``) is what CI runs. A test is ``slow`` when it starts an external
process (Prometheus, promtool, VictoriaMetrics, Chromium, tmux, node, a roofwatch process, any
child Python), listens for minutes, or sleeps for its answer. Nobody remembers a marker, so the
quick run checks it:

- an unmarked test that spends more than ``--quick-limit`` seconds (default 2) in setup, call and
  teardown together fails, naming the test and its three durations. Time its thread spent ready to
  run but waiting for a CPU (``/proc/thread-self/schedstat``, Linux) is not counted: a busy machine
  stretches every test, and the limit is about the test, not the machine;
- an unmarked test that starts a child process fails at once, naming the program it tried to run.

Both checks apply to the quick tier only (a marker expression containing ``not slow``): in the
whole suite a loaded machine may stretch any test, and slow tests start processes by design.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

QUICK_LIMIT_S = 2.0
_ITEM_KEY = pytest.StashKey[dict[str, float]]()
_WAIT_KEY = pytest.StashKey[float]()


def runqueue_wait_s() -> float:
    """Seconds this thread has spent runnable but not running (0 where the kernel does not say)."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class UnmarkedSlowTest(RuntimeError):
    """Raised inside an unmarked quick-tier test that starts a child process."""


class _ProcessGuard:
    """Refuses to start a child process while an unmarked test runs in the quick tier.

    ``subprocess.Popen._execute_child`` is the one place every ``subprocess`` helper (run,
    check_output, Popen) passes through before ``fork``/``exec``; refusing there costs nothing
    when no test starts a process. ``os.fork`` alone (no exec) is not guarded: a forked copy of
    the test process is cheap and is how the client's fork safety is tested.
    """

    def __init__(self) -> None:
        self.current: str | None = None  # node id of the unmarked test now running
        self._original = subprocess.Popen._execute_child  # type: ignore[attr-defined]
        guard = self

        def execute_child(popen: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> Any:
            if guard.current is not None:
                words = [args] if isinstance(args, (str, bytes)) else list(args)
                program = " ".join(str(word).split("\n")[0][:40] for word in words[:3])
                raise UnmarkedSlowTest(
                    f"{guard.current} starts a child process ({program!r}) but is not marked slow: "
                    "add @pytest.mark.slow (tests/tiers.py says what counts as slow)")
            return guard._original(popen, args, *rest, **kwargs)

        subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]

    def restore(self) -> None:
        subprocess.Popen._execute_child = self._original  # type: ignore[attr-defined]


_GUARD_KEY = pytest.StashKey[_ProcessGuard]()


def is_quick_run(config: pytest.Config) -> bool:
    """The quick tier is any run whose ``-m`` expression deselects slow tests."""
    return "not slow" in (config.getoption("markexpr", default="") or "")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick-limit", type=float, default=QUICK_LIMIT_S, metavar="SECONDS",
                     help="in the quick tier (-m 'not slow'), fail an unmarked test that takes longer than this "
                          f"(setup + call + teardown; default {QUICK_LIMIT_S:g})")


def pytest_configure(config: pytest.Config) -> None:
    """The ``slow`` marker itself is registered in pyproject.toml (``--strict-markers``)."""
    if is_quick_run(config):
        config.stash[_GUARD_KEY] = _ProcessGuard()


def pytest_unconfigure(config: pytest.Config) -> None:
    guard = config.stash.get(_GUARD_KEY, None)
    if guard is not None:
        guard.restore()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    guard = item.config.stash.get(_GUARD_KEY, None)
    if guard is not None and item.get_closest_marker("slow") is None:
        guard.current = item.nodeid
    item.stash[_WAIT_KEY] = runqueue_wait_s()
    try:
        return (yield)
    finally:
        if guard is not None:
            guard.current = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if not is_quick_run(item.config) or item.get_closest_marker("slow") is not None:
        return report
    phases = item.stash.setdefault(_ITEM_KEY, {})
    phases[report.when] = report.duration
    if report.when == "teardown":
        limit = item.config.getoption("quick_limit")
        total = sum(phases.values())
        start = item.stash.get(_WAIT_KEY, None)
        waited = max(0.0, runqueue_wait_s() - start) if start is not None else 0.0
        if total - waited > limit:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} took {total:.2f} s (setup {phases.get('setup', 0):.2f}, call "
                f"{phases.get('call', 0):.2f}, teardown {phases.get('teardown', 0):.2f}; {waited:.2f} of them waiting "
                f"for a CPU, not counted), more than the quick tier's {limit:g} s, and is not marked slow: make it "
                "faster or add @pytest.mark.slow (tests/tiers.py)")
    return report
