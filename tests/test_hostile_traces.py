"""Traces that other people wrote: timestamps far from now, gaps, lines too long to hold.

Each case runs the real ``roofwatch`` command in a child process with a wall-clock limit and an
address-space limit, so a hang or a runaway allocation fails the test instead of the machine.
"""

from __future__ import annotations

import gzip
import io
import json
import resource
import subprocess

import pytest

from agent.classifier.engine import Grid, Classifier, classify_samples
from agent.trace import TraceFormatError, TraceReader
from agent.trace.reader import MAX_LINE_BYTES
from tests.agent_process import clean_env, roofwatch_cmd

T0 = 1_800_000_000.0
MEMORY_LIMIT = 1536 * 2**20
"""Address space for one command: the interpreter and its libraries take about 400 MiB of it."""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The command with bounded time and memory: a hang raises TimeoutExpired, a blow-up fails it."""
    return subprocess.run(roofwatch_cmd(*args), capture_output=True, text=True, timeout=timeout, env=clean_env(),
                          preexec_fn=_limit_memory)


def busy(ts: float, gpu: str = "0") -> str:
    return json.dumps({"ts": ts, "gpu": gpu, "interval_s": 1.0, "gr_active": 0.9, "sm_active": 0.8,
                       "tensor_active": 0.5, "dram_active": 0.3})


def minute(start: float) -> list[str]:
    return [busy(start + i) for i in range(60)]


# -- timestamps ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("command", ["classify", "report"])
def test_a_first_sample_at_ts_0_is_replayed_in_bounded_time(tmp_path, command):
    """ts 0 is the epoch (hand-written traces count from there), so it is read; the 54-year gap to
    the next sample restarts the evaluation grid instead of filling it with 10^8 evaluations."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([busy(0.0)] + minute(T0)) + "\n")
    out = tmp_path / "r.html"
    extra = ("--out", str(out)) if command == "report" else ()
    result = run(command, str(trace), *extra, timeout=60)  # 10^8 evaluations would run past the timeout
    assert result.returncode == 0, result.stderr
    if command == "classify":
        verdicts = [json.loads(line) for line in result.stdout.splitlines()]
        late = [v for v in verdicts if v["window_end"] > T0]
        assert late and all(v["window_end"] <= T0 + 60 + 5 for v in late)
        assert len(verdicts) - len(late) <= 300 / 5 + 1, "a gap costs at most one long window of evaluations"


@pytest.mark.slow
@pytest.mark.parametrize("ts", ["-1e308", "1e308", "-1", "4102444801", "1e10"])
@pytest.mark.parametrize("command", ["classify", "report"])
def test_an_implausible_timestamp_is_refused_with_file_and_line(tmp_path, ts, command):
    trace = tmp_path / "t.jsonl"
    bad = busy(0.0, gpu="1").replace('"ts": 0.0', f'"ts": {ts}')  # a GPU of its own: no order to break
    trace.write_text("\n".join(minute(T0)) + "\n" + bad + "\n")
    extra = ("--out", str(tmp_path / "r.html")) if command == "report" else ()
    result = run(command, str(trace), *extra, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stdout[-300:], result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"{trace}:61:" in lines[0] and "'ts'" in lines[0], lines
    assert "1970-01-01" in lines[0] and "2100-01-01" in lines[0]
    assert not (tmp_path / "r.html").exists()


def test_a_gap_restarts_the_grid_after_one_long_window():
    """Unit view of the same rule: every evaluation the gap costs happens while old samples remain."""
    grid = Grid(Classifier())
    first = next(iter(TraceReader(io.StringIO(busy(T0)))))
    assert grid.feed(first) == []
    later = next(iter(TraceReader(io.StringIO(busy(T0 + 10 * 365 * 86400)))))
    due = grid.feed(later)
    assert 1 <= len(due) <= 300 / 5 + 1 and all(len(v) <= 1 for v in due)
    assert grid.next_eval == grid.first_after(later.ts)


def test_a_sample_after_the_gap_is_classified_like_a_fresh_trace():
    fresh = [s for s in TraceReader(io.StringIO("\n".join(minute(T0 + 86400))))]
    old = [s for s in TraceReader(io.StringIO("\n".join(minute(T0))))]
    alone = [v.to_json() for v in classify_samples(fresh)]
    after_gap = [v.to_json() for v in classify_samples(old + fresh) if v.window_end > T0 + 86400]
    assert after_gap == alone


# -- line length --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_line_longer_than_the_cap_is_refused_without_holding_it(tmp_path):
    """A 64 MiB line (16 x the cap) under a 1.5 GiB address-space limit: refused by file and line."""
    trace = tmp_path / "t.jsonl"
    with trace.open("w") as f:
        f.write("\n".join(minute(T0)) + "\n")
        f.write('{"ts": 1800000100, "gpu": "0", "model": "')
        chunk = "x" * 2**20
        for _ in range(64):
            f.write(chunk)
        f.write('"}\n')
    result = run("classify", str(trace), timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"{trace}:61:" in result.stderr and f"longer than {MAX_LINE_BYTES // 2**20} MiB" in result.stderr


@pytest.mark.slow
def test_a_long_line_is_skipped_whole_when_skipping(tmp_path):
    """With --skip-bad-lines the rest of the line is read past in chunks; the lines after it count."""
    trace = tmp_path / "t.jsonl.gz"
    with gzip.open(trace, "wt") as f:
        f.write("\n".join(minute(T0)) + "\n")
        f.write('{"ts": 1800000100, "gpu": "1", "model": "' + "y" * (MAX_LINE_BYTES * 3) + '"}\n')
        f.write("\n".join(busy(T0 + 200 + i, "1") for i in range(30)) + "\n")
    result = run("classify", "--skip-bad-lines", str(trace), timeout=60)
    assert result.returncode == 0, result.stderr
    gpus = {json.loads(line)["gpu"] for line in result.stdout.splitlines()}
    assert gpus == {"0", "1"}
    warning = result.stderr.splitlines()
    assert len(warning) == 1 and "skipped 1 bad line" in warning[0] and f"{trace}:61:" in warning[0]


def test_the_reader_names_the_long_line_and_goes_on_when_not_strict():
    text = busy(T0) + "\n" + '{"ts": 1, "gpu": "0", "x": "' + "z" * (MAX_LINE_BYTES + 10) + '"}\n' + busy(T0 + 1) + "\n"
    reader = TraceReader(io.BytesIO(text.encode()), strict=False)
    got = list(reader)
    assert [s.ts for s in got] == [T0, T0 + 1]
    assert [(e.line, "longer than" in e.reason) for e in reader.errors] == [(2, True)]
    with pytest.raises(TraceFormatError, match=r"<stream>:2: line longer than"):
        list(TraceReader(io.BytesIO(text.encode())))


# -- bad lines: strict by default, skipped and counted on request ---------------------------------


@pytest.mark.slow
def test_bad_lines_exit_2_naming_the_first_and_suggest_skipping(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(minute(T0)) + "\n{not json\n" + busy(T0 + 100) + "\n")
    result = run("classify", str(trace))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and f"{trace}:61: not valid JSON" in result.stderr
    assert "--skip-bad-lines" in result.stderr
    skipped = run("report", "--skip-bad-lines", str(trace), "--out", str(tmp_path / "r.html"))
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped 1 bad line of 62" in skipped.stderr and (tmp_path / "r.html").is_file()


@pytest.mark.slow
def test_a_truncated_recording_survives_with_skip(tmp_path):
    """A recorder killed mid-write leaves a cut gzip stream: the samples before the cut are replayed."""
    whole = gzip.compress(("\n".join(minute(T0)) + "\n").encode())
    trace = tmp_path / "cut.jsonl.gz"
    trace.write_bytes(whole[: len(whole) - 30])
    assert run("classify", str(trace)).returncode == 2
    result = run("classify", "--skip-bad-lines", str(trace))
    assert result.returncode == 0 and result.stdout and "skipped 1 bad line" in result.stderr


def test_the_classifier_survives_a_subnormal_interval_the_reader_would_refuse():
    """Found by tests/test_fuzz_hostile_traces.py: interval_s 5e-324 made round(span / interval) overflow."""
    from agent.model import GpuSample

    samples = [GpuSample(ts=T0 + i, gpu="0", interval_s=5e-324, gr_active=0.9) for i in range(30)]
    verdicts = list(classify_samples(samples))
    assert verdicts and all(v.gpu == "0" for v in verdicts)
    with pytest.raises(TraceFormatError, match="'interval_s'"):
        list(TraceReader(io.StringIO('{"ts": 1800000000, "gpu": "0", "interval_s": 5e-324}\n')))


# -- many GPUs: a limit per command, named by file, line and flag -----------------------------------


MANY_GPUS = 400_000
GPU_MEMORY_LIMIT = 2**30
"""1 GiB of address space: the command itself takes about 400 MiB; replaying 400 000 GPUs took 2 GB."""


def _limit_memory_1g() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (GPU_MEMORY_LIMIT, GPU_MEMORY_LIMIT))


@pytest.fixture(scope="module")
def many_gpus(tmp_path_factory) -> str:
    """A 2.3 MB .jsonl.gz naming 400 000 distinct GPUs, two samples each (all GPUs at T0, then at T0 + 1)."""
    trace = tmp_path_factory.mktemp("many") / "many-gpus.jsonl.gz"
    with gzip.open(trace, "wt", compresslevel=1) as f:
        for ts in (T0, T0 + 1):
            f.write("".join(f'{{"ts":{ts},"gpu":"{g}","interval_s":1.0,"gr_active":0.9,"sm_active":0.8}}\n'
                            for g in range(MANY_GPUS)))
    return str(trace)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["classify", "report", "report --skip-bad-lines"])
def test_a_trace_naming_too_many_gpus_is_refused_at_the_first_past_the_limit(tmp_path, many_gpus, command):
    """Under 1 GiB: the first sample of GPU 4097 stops the command with one line naming file:line and
    the flag, skipping or not (a replay of part of the GPUs would pass for the whole trace)."""
    out = tmp_path / "r.html"
    extra = ("--out", str(out)) if command.startswith("report") else ()
    result = subprocess.run(roofwatch_cmd(*command.split(), many_gpus, *extra), capture_output=True, text=True,
                            timeout=120, env=clean_env(), preexec_fn=_limit_memory_1g)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"{many_gpus}:4097:" in lines[0], lines
    assert "more than 4096 distinct GPUs" in lines[0] and "gpu '4096'" in lines[0] and "--max-gpus" in lines[0]
    assert result.stdout == "" and not out.exists()


def _six_gpus(path) -> None:
    path.write_text("".join(busy(T0 + i, str(g)) + "\n" for i in range(60) for g in range(6)))


@pytest.mark.slow
@pytest.mark.parametrize("command", ["classify", "report"])
def test_max_gpus_sets_the_limit_and_a_trace_within_it_is_replayed_as_usual(tmp_path, command):
    trace = tmp_path / "six.jsonl"
    _six_gpus(trace)
    out = tmp_path / "r.html"
    extra = ("--out", str(out)) if command == "report" else ()
    refused = run(command, "--max-gpus", "5", str(trace), *extra)
    assert refused.returncode == 2 and f"{trace}:6: more than 5 distinct GPUs" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1 and "--max-gpus" in refused.stderr
    result = run(command, "--max-gpus", "6", str(trace), *extra)
    assert result.returncode == 0, result.stderr
    if command == "classify":
        verdicts = [json.loads(line) for line in result.stdout.splitlines()]
        assert {v["gpu"] for v in verdicts} == {str(g) for g in range(6)}
        assert {v["class"] for v in verdicts[-6:]} == {"compute_bound"}
    else:
        assert "of 6 GPUs" in result.stdout and out.is_file()


@pytest.mark.slow
def test_max_gpus_must_be_a_positive_number(tmp_path):
    trace = tmp_path / "six.jsonl"
    _six_gpus(trace)
    for bad in ("0", "-3", "many"):
        result = run("classify", "--max-gpus", bad, str(trace))
        assert result.returncode == 2 and "--max-gpus" in result.stderr and "Traceback" not in result.stderr


def test_the_reader_counts_gpus_by_node_and_shares_the_limit_between_traces():
    from agent.trace.reader import TooManyGpus

    first = "".join(busy(T0, g) + "\n" for g in ("0", "1"))
    second = busy(T0 + 1, "1") + "\n" + json.dumps({"ts": T0 + 1, "gpu": "1", "node": "n2"}) + "\n"
    seen: set[tuple[str, str]] = set()
    assert len(list(TraceReader(io.StringIO(first), max_gpus=3, gpus=seen))) == 2
    with pytest.raises(TooManyGpus, match=r"<stream>:2: more than 2 distinct GPUs .* gpu '1' on node 'n2'"):
        list(TraceReader(io.StringIO(second), max_gpus=2, gpus=seen))
    assert seen == {("local", "0"), ("local", "1")}, "the same GPU in the next trace is not counted again"
    with pytest.raises(TooManyGpus, match=r":2: more than 1 distinct GPUs"):
        list(TraceReader(io.StringIO(first), max_gpus=1, strict=False))  # skipping does not skip the limit
    assert len(list(TraceReader(io.StringIO(first), max_gpus=None))) == 2


# -- GPU names that look like digits ------------------------------------------------------------


@pytest.mark.slow
def test_gpu_names_that_are_digits_only_to_isdigit_are_ordered_not_a_crash(tmp_path):
    """``"²"`` and ``"٣"`` are digits to ``str.isdigit`` and no number (or another number) to ``int``; the
    report ordered GPUs with ``int(p) if p.isdigit()`` and ended in a ValueError traceback on ``"²"``."""
    names = ["10", "²", "2", "٣", "3/1", "3"]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(busy(T0 + i, gpu) for i in range(60) for gpu in names) + "\n")
    out = tmp_path / "r.html"
    result = run("report", str(trace), "--out", str(out), timeout=120)
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    assert "Traceback" not in result.stderr
    for name in names:
        assert f">{name}<" in page or f"GPU {name}" in page, name


def test_every_view_orders_gpus_by_the_one_rule():
    from agent.model.indexes import gpu_order
    from agent.views.top_render import gpu_id_key

    names = ["10", "²", "2", "٣", "3/1", "3", "0", "3-1"]
    ordered = sorted(names, key=gpu_order)
    assert ordered[:6] == ["0", "2", "3", "3/1", "3-1", "10"], ordered
    assert set(ordered[6:]) == {"²", "٣"}, "names that are no index come after the indexes"
    assert gpu_id_key is gpu_order
