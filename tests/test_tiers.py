"""The quick tier's own checks (tests/tiers.py), run on a small suite in an inner pytest session.

The inner session runs in this process (pytester's in-process run), so these tests start no child
process and stay in the quick tier themselves.
"""

from __future__ import annotations

import textwrap

import pytest

INNER_SUITE = textwrap.dedent("""
    import subprocess
    import time

    import pytest

    def test_fast():
        assert True

    def test_unmarked_and_slow():
        time.sleep(0.4)  # the point of this test is to take longer than the limit

    @pytest.mark.slow
    def test_marked_and_slow():
        time.sleep(0.4)

    def test_starts_a_process():
        subprocess.run(["true"], check=True)
""")


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_inner=INNER_SUITE)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    return pytester


def test_the_quick_run_fails_an_unmarked_test_over_the_limit_naming_it(inner: pytest.Pytester) -> None:
    result = inner.runpytest_inprocess("-p", "tests.tiers", "-m", "not slow", "--quick-limit", "0.2",
                                       "-k", "not process")
    result.assert_outcomes(passed=2, errors=1, deselected=2)  # the error is the slow test's teardown
    result.stdout.fnmatch_lines([
        "*test_inner.py::test_unmarked_and_slow took * s (setup *, call 0.4*, teardown *), more than the quick "
        "tier's 0.2 s, and is not marked slow*"])
    assert "test_fast took" not in result.stdout.str()


def test_time_spent_waiting_for_a_cpu_is_not_counted(inner: pytest.Pytester, monkeypatch) -> None:
    """A busy machine stretches every test; what counts is the time the test itself took. The kernel's
    run-queue figure is stood in for: the slow test's thread 'waited' 0.3 s of its 0.4 s for a CPU."""
    import tests.tiers

    readings = iter([0.0, 0.3] * 2)  # start and end of each test that runs
    monkeypatch.setattr(tests.tiers, "runqueue_wait_s", lambda: next(readings))
    result = inner.runpytest_inprocess("-p", "tests.tiers", "-m", "not slow", "--quick-limit", "0.2",
                                       "-k", "not process")
    result.assert_outcomes(passed=2, deselected=2)


def test_the_quick_run_refuses_a_child_process_in_an_unmarked_test(inner: pytest.Pytester) -> None:
    result = inner.runpytest_inprocess("-p", "tests.tiers", "-m", "not slow", "-k", "process")
    result.assert_outcomes(failed=1, deselected=3)
    result.stdout.fnmatch_lines(["*test_inner.py::test_starts_a_process starts a child process ('true') but is not "
                                 "marked slow*"])


def test_the_whole_suite_applies_no_limit(inner: pytest.Pytester) -> None:
    """A loaded CI machine may stretch any test in the whole run; only the quick tier is held to the limit."""
    result = inner.runpytest_inprocess("-p", "tests.tiers", "--quick-limit", "0.2", "-k", "not process")
    result.assert_outcomes(passed=3)


def test_a_marked_test_is_left_to_the_whole_suite(inner: pytest.Pytester) -> None:
    result = inner.runpytest_inprocess("-p", "tests.tiers", "-m", "slow", "--collect-only", "-q")
    assert "test_inner.py::test_marked_and_slow" in result.stdout.str()
    assert "test_unmarked_and_slow" not in result.stdout.str()
