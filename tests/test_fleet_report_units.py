"""The fleet report's pieces without a store: input checking (through the real command), the
window and step, prices, percentiles and the PromQL quoting."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.views.fleet_report.data import Prices, percentile, share_below
from agent.views.fleet_report.promql import any_of, string
from agent.views.fleet_report.queries import Queries
from agent.views.fleet_report.window import MAX_POINTS, Window, parse_duration, parse_time
from tests.prometheus_server import free_port

REPO = Path(__file__).resolve().parent.parent


def fleet_report(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.app.cli", "fleet-report", "--out", str(tmp / "f.html"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


@pytest.mark.slow
@pytest.mark.parametrize(("args", "flag", "code"), [
    (["--prometheus", "ftp://prom:9090"], "--prometheus", 2),
    (["--prometheus", "not a url"], "--prometheus", 2),
    (["--prometheus", "http://127.0.0.1:9090", "--range", "7q"], "--range", 2),
    (["--prometheus", "http://127.0.0.1:9090", "--range", "1m"], "--range", 2),
    (["--prometheus", "http://127.0.0.1:9090", "--end", "yesterday"], "--end", 2),
    (["--prometheus", "http://127.0.0.1:9090", "--cost-per-gpu-hour", "h100=cheap"], "--cost-per-gpu-hour", 2),
    (["--prometheus", "http://127.0.0.1:9090", "--header", "no colon"], "--header", 2),
    (["--prometheus", "http://127.0.0.1:9090", "--deadline", "0"], "--deadline", 2),
    (["--prometheus", "http://127.0.0.1:9090", "--deadline", "nan"], "--deadline", 2),
    (["--prometheus", "http://127.0.0.1:9090", "--bearer-token-file", "/nonexistent/token"], "--bearer-token-file", 2),
])
def test_bad_input_names_the_flag(args: list[str], flag: str, code: int, tmp_path: Path) -> None:
    done = fleet_report(*args, tmp=tmp_path)
    assert done.returncode == code, done.stderr
    assert flag in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "f.html").exists()


@pytest.mark.slow
def test_unreachable_server_is_one_clear_error(tmp_path: Path) -> None:
    port = free_port()  # bound and released: nothing listens there
    done = fleet_report("--prometheus", f"http://127.0.0.1:{port}", tmp=tmp_path)
    assert done.returncode == 1
    assert "--prometheus" in done.stderr and "cannot reach" in done.stderr and "Traceback" not in done.stderr


def test_durations_and_times() -> None:
    assert parse_duration("7d") == 7 * 86400 and parse_duration("1w2d") == 9 * 86400 and parse_duration("90m") == 5400
    for bad in ("", "7", "d7", "7d 2h", "-7d", "5m", "401d", "601s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert parse_time("2026-11-24T00:00:00Z") == parse_time("1795478400") == 1795478400.0
    with pytest.raises(ValueError):
        parse_time("0")


@pytest.mark.parametrize("range_s", [600, 7200, 86400, 7 * 86400, 30 * 86400, 400 * 86400])
def test_the_step_bounds_every_subquery(range_s: int) -> None:
    w = Window.pick(1795478437.5, range_s)
    assert w.points <= MAX_POINTS and range_s % w.step_s == 0 and w.step_s % 60 == 0
    assert w.end % w.step_s == 0 and 1795478437.5 - w.step_s < w.end <= 1795478437.5
    assert w.previous.end == w.start and w.subquery() == f"[{range_s - 1}s:{w.step_s}s]"


def test_prices_match_spec_or_model_and_default_is_flagged() -> None:
    prices = Prices.parse(["H100-SXM=3", "NVIDIA A100-SXM4-80GB=1.5"])
    assert prices.rate("NVIDIA H100 80GB HBM3", "h100-sxm") == (3.0, True)
    assert prices.rate("NVIDIA A100-SXM4-80GB", "") == (1.5, True)
    assert prices.rate("NVIDIA L4", "l4") == (2.0, False)
    assert Prices.parse(["default=0.8"]).rate("x", "y") == (0.8, True)
    for bad in ("h100", "=2", "h100=-1", "h100=inf", "h100=nan"):
        with pytest.raises(ValueError, match="MODEL=USD"):
            Prices.parse([bad])


def test_percentiles_of_a_whole_percent_histogram() -> None:
    histogram = {10: 1.0, 50: 3.0}
    assert percentile(histogram, 0.25) == pytest.approx(0.11)  # the top of the 10% bucket
    assert percentile(histogram, 0.5) == pytest.approx(0.50 + (2.0 - 1.0) / 3.0 / 100)
    assert share_below(histogram, 0.4) == pytest.approx(0.25) and percentile({}, 0.5) is None


def test_names_from_the_command_line_are_quoted_into_promql() -> None:
    q = Queries(Window.pick(1795478400, 7200), cluster='a"b\\c')
    assert 'cluster="a\\"b\\\\c"' in q.class_hours_fleet()
    jobs = q.class_hours_of_jobs(["job.1", 'x"|y'])
    assert 'job_id=~"job\\\\.1|x\\"\\\\|y"' in jobs


def test_promql_strings_escape_everything_go_would_misread() -> None:
    """Backslash, quote and newline break a query (or let a label pick its filter); other control
    characters go as ``\\uXXXX`` so a query is one printable line; unicode stays as it is."""
    assert string('a"b\\c\nd\re\tf\x00\x1b\x7f\x85') == '"a\\"b\\\\c\\nd\\re\\tf\\u0000\\u001b\\u007f\\u0085"'
    assert string("ünï ☃ 😀 ²") == '"ünï ☃ 😀 ²"'
    assert any_of("gpu_id", ['0"', ".*", "a\\b"]) == 'gpu_id=~"0\\"|\\\\.\\\\*|a\\\\\\\\b"'


def test_every_label_value_enters_promql_through_the_one_helper() -> None:
    """Issue 42: amd.py wrote ``gpu_id=~"{...}"`` itself, unescaped. In the modules that build queries,
    a quote opened right before an interpolation is a matcher written by hand; they use
    agent/views/fleet_report/promql.py instead (the render modules write HTML, escaped by ``esc``)."""
    package = REPO / "agent" / "views" / "fleet_report"
    by_hand = [f"{path.name}:{number}: {line.strip()}" for path in sorted(package.glob("*.py"))
               if path.name != "promql.py" and not path.name.startswith("render")
               for number, line in enumerate(path.read_text().splitlines(), 1) if re.search(r'[=~]"\{', line)]
    assert by_hand == []
