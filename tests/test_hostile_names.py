"""Names other people choose, shown to whoever runs ``roofwatch top``, opens the ``/`` page, reads a
``report`` or a ``snapshot`` table: job names, pod names, process environments, GPU models.

A job named ``[/]`` crashed ``top`` (rich markup); escape sequences in names went straight to the
terminal (a job could clear the operator's screen, retitle the window, or write to the clipboard
with OSC 52); bidi overrides reorder what a page shows. Names are shown as text, with control
characters replaced by U+FFFD so that something visibly stood there.
"""

from __future__ import annotations

import copy
import io
import json
import subprocess

import pytest
from rich.console import Console

from agent.app.assemble import make_collector, open_backend_or_fail
from agent.app.config import Settings
from agent.context.attribution.slurm import process_job
from agent.model.text import printable
from agent.views.snapshot_text import snapshot_table
from agent.views.status_page import status_page
from agent.views.top_render import TopState, render_frame
from agent.views.top_source import parse_exposition
from exporters.snapshot_json import snapshot_to_dict
from tests.agent_process import SLOW_MACHINE_SAMPLE_TIMEOUT_S, clean_env, roofwatch_cmd
from tests.test_attribution import write_proc

HOSTILE = {
    "osc52": "\x1b]52;c;cm0gLXJmIH4=\x07",  # writes the operator's clipboard
    "clear": "\x1b[2J\x1b[H",
    "title": "\x1b]0;owned\x1b\\",
    "c1-csi": "\x9b31m",
    "bidi": "job\u202egnp.exe",
    "nul-bel": "a\x00b\x07c",
    "line-sep": "a\u2028b\u2029c",
}
RAW = ("\x1b", "\x9b", "\x07", "\x00", "\u202e", "\u2028", "\u2029")


def clean(text: str) -> bool:
    return not any(c in text for c in RAW)


# -- the helper ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_printable_replaces_every_control_and_keeps_the_rest(name):
    shown = printable(name)
    assert clean(shown) and "\ufffd" in shown
    assert printable("résumé 模型 👩‍💻 [/] <b>") == "résumé 模型 👩‍💻 [/] <b>"  # text, emoji joiners and markup stay
    assert printable("a\udcffb") == "a\ufffdb"  # an undecodable byte as Python escapes it
    assert printable("x" * 500, limit=128) == "x" * 127 + "…"
    assert printable(None) == "None" and printable(42) == "42"


# -- roofwatch top ------------------------------------------------------------------------------


def quoted(value: str) -> str:
    """A label value as the text format writes it: backslash, quote and newline escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def exposition(job: str, model: str, gpu: str = "0") -> str:
    labels = f'gpu={quoted(gpu)},node="n1",uuid="GPU-1"'
    return "\n".join([
        "# TYPE roofwatch_build_info gauge", f"roofwatch_build_info{{version={quoted(HOSTILE['title'])}}} 1.0",
        "# TYPE roofwatch_gpu_info gauge", f"roofwatch_gpu_info{{{labels},model={quoted(model)}}} 1.0",
        "# TYPE roofwatch_gpu_up gauge", f"roofwatch_gpu_up{{{labels}}} 1.0",
        "# TYPE roofwatch_gpu_job_info gauge", f"roofwatch_gpu_job_info{{{labels},job_id={quoted(job)}}} 1.0",
        "# TYPE roofwatch_gpu_pod_info gauge",
        f"roofwatch_gpu_pod_info{{{labels},namespace=\"[bold]ns\",pod={quoted(HOSTILE['clear'])}}} 1.0", "",
    ])


def draw(text: str, width: int = 200) -> str:
    state = TopState(url="http://n1:9477/metrics")
    state.apply(parse_exposition(text, state.url))
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=True, color_system="truecolor").print(render_frame(state, width))
    return out.getvalue()


@pytest.mark.parametrize("job", ["[/]", "[bold]x[/bold", "[red]x[/]", "[link=x]y"])
def test_top_shows_a_markup_job_name_as_written(job):
    """``[/]`` raised rich's MarkupError and took the whole view down; now it is a job name like any."""
    state = TopState(url="http://n1:9477/metrics")
    state.apply(parse_exposition(exposition(job, "H100"), state.url))
    out = io.StringIO()
    Console(file=out, width=240, color_system=None).print(render_frame(state, 240))
    row = next(line for line in out.getvalue().splitlines() if line.lstrip().startswith("0 "))
    assert job in row


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_top_passes_no_escape_sequence_from_a_name_to_the_terminal(name):
    shown = draw(exposition(name, "NVIDIA " + name, gpu="0" + name))
    for hostile in (HOSTILE["osc52"], HOSTILE["clear"], HOSTILE["title"], "\x9b", "\x07", "\x00", "\u202e"):
        assert hostile not in shown, repr(hostile)


def test_top_error_line_from_a_server_is_printable():
    state = TopState(url="http://n1/metrics")
    state.apply(RuntimeError("n1 answered HTTP 500 " + HOSTILE["clear"] + HOSTILE["osc52"]))
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=True).print(render_frame(state, 200))
    assert HOSTILE["clear"] not in out.getvalue() and HOSTILE["osc52"] not in out.getvalue()


# -- the status page, the snapshot table --------------------------------------------------------


@pytest.fixture(scope="module")
def data():
    settings = Settings(backend="virtual", sample_timeout_s=SLOW_MACHINE_SAMPLE_TIMEOUT_S)
    collector = make_collector(settings, open_backend_or_fail(settings))
    collector.collect_once()
    yield snapshot_to_dict(collector.snapshot)
    collector.stop()


def hostile_snapshot(data: dict) -> dict:
    data = copy.deepcopy(data)
    data["node"] = HOSTILE["clear"] + "node"
    device = data["devices"][0]
    device["info"]["model"] = HOSTILE["bidi"]
    device["info"]["gpu"] = "0" + HOSTILE["osc52"]
    device["sample"]["attribution"] = {"job_id": HOSTILE["title"] + "\udcff", "user": HOSTILE["nul-bel"],
                                       "pod": HOSTILE["line-sep"], "namespace": HOSTILE["c1-csi"]}
    data["verdicts"][0]["gpu"] = device["info"]["gpu"]
    data["verdicts"][0]["reasons"] = ["job " + HOSTILE["clear"]]
    return data


def test_the_status_page_shows_names_as_text(data):
    page = status_page(hostile_snapshot(data))
    assert clean(page) and page.encode("utf-8")  # no control character, nothing UTF-8 cannot encode
    assert "\ufffd" in page and "job\ufffdgnp.exe" in page


def test_the_snapshot_table_shows_names_as_text(data):
    table = snapshot_table(hostile_snapshot(data))
    assert clean(table) and "\ufffd" in table


# -- the HTML report ----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_report_of_a_trace_with_hostile_names_is_written_and_shows_them_as_text(tmp_path):
    lines = [json.dumps({"ts": 1_800_000_000 + i, "gpu": "0", "interval_s": 1.0, "gr_active": 0.9,
                         "model": HOSTILE["bidi"],
                         "attribution": {"job_id": HOSTILE["osc52"] + "\udcff" + "[/]"}}) for i in range(30)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.html"
    result = subprocess.run(roofwatch_cmd("report", str(trace), "--out", str(out), "--title", HOSTILE["clear"]),
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    assert clean(page) and "[/]" in page and "\ufffd" in page


# -- Slurm values from other users' environments -------------------------------------------------


@pytest.mark.parametrize("env, expected", [
    (b"SLURM_JOB_ID=4242\0SLURM_JOB_USER=alice\0SLURM_JOB_PARTITION=gpu-a100\0", ("4242", "alice", "gpu-a100")),
    (b"SLURM_JOB_ID=4242\0SLURM_JOB_USER=dom\\alice@corp.example\0", ("4242", None, None)),
    (b"SLURM_JOB_ID=4242_7\0SLURM_JOB_USER=alice@corp.example\0", ("4242_7", "alice@corp.example", None)),
    (b"SLURM_JOB_ID=\x1b[2J\0SLURM_JOB_USER=alice\0", (None, None, None)),
    (b"SLURM_JOB_ID=" + b"9" * 10_000 + b"\0", (None, None, None)),
    (b"SLURM_JOB_ID=42 43\0", (None, None, None)),
    (b"SLURM_JOB_ID=42\0SLURM_JOB_USER=" + b"a" * 300 + b"\0SLURM_JOB_PARTITION=<b>\0", ("42", None, None)),
    (b"SLURM_JOB_ID=42\0SLURM_JOB_USER=al\xffice\0", ("42", None, None)),
])
def test_slurm_values_are_bounded_before_they_become_labels(tmp_path, env, expected):
    write_proc(tmp_path, 30, cgroup="0::/user.slice\n", environ=env)
    job = process_job(30, tmp_path)
    assert (job.job_id, job.user, job.partition) == expected


def test_a_huge_environment_is_read_only_so_far(tmp_path):
    """Another user's process may carry a gigabyte of environment: the read stops at a bound, and
    what lies past it is unknown (a real job's Slurm variables sit in its first kilobytes)."""
    write_proc(tmp_path, 31, cgroup="", environ=b"X=" + b"y" * (8 * 2**20) + b"\0SLURM_JOB_ID=7\0")
    assert process_job(31, tmp_path).job_id is None
    write_proc(tmp_path, 32, cgroup="", environ=b"SLURM_JOB_ID=7\0X=" + b"y" * (8 * 2**20) + b"\0")
    assert process_job(32, tmp_path).job_id == "7"
