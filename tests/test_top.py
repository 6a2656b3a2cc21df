"""``roofwatch top`` without a terminal or an agent: parsing, sorting, history, rendering.

Expected values are read from the golden exposition with a small line parser of the test's own
(tests/top_exposition.py), so the assertions follow the fixture instead of numbers copied by hand.
Fetching over HTTP, its errors and the command itself are in test_top_fetch.py.
"""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from agent.views import palette
from agent.views.top_render import (
    DOWN,
    EMPTY,
    ClassHistory,
    TopState,
    bar,
    gpu_id_key,
    handle_keys,
    next_sort,
    render_frame,
    render_table,
    sort_rows,
    sparkline,
)
from agent.views.top_source import GpuRow, TopSourceError, parse_exposition
from tests.top_exposition import LINE, per_gpu, series
from tests.top_exposition import text  # noqa: F401 (a fixture)

URL = "http://golden:9477/metrics"


# -- helpers --------------------------------------------------------------------------------


def without(text: str, name: str, gpu: str | None = None) -> str:
    """The exposition minus the samples of ``name`` (of one GPU, or all)."""
    keep = []
    for line in text.splitlines():
        match = LINE.match(line)
        if match and match["name"] == name and (gpu is None or f'gpu="{gpu}"' in (match["labels"] or "")):
            continue
        keep.append(line)
    return "\n".join(keep) + "\n"


def rendered(renderable, width: int = 200) -> str:
    console = Console(record=True, width=width, force_terminal=True, color_system="truecolor")
    console.print(renderable)
    return console.export_text()


def row_line(text: str, gpu: str) -> str:
    """The table line of one GPU (its id is the first cell)."""
    lines = [line for line in text.splitlines() if re.match(rf"^\s*{re.escape(gpu)}\s", line)]
    assert len(lines) == 1, text
    return lines[0]


def mini_exposition(*gpus: str, extra: str = "") -> str:
    """A minimal roofwatch exposition: info and up for each GPU, plus ``extra`` lines."""
    lines = [f'roofwatch_gpu_info{{gpu="{g}",model="NVIDIA H100 80GB HBM3",node="n",uuid="U{g}"}} 1.0' for g in gpus]
    lines += [f'roofwatch_gpu_up{{gpu="{g}",node="n",uuid="U{g}"}} 1.0' for g in gpus]
    return "\n".join(lines) + "\n" + extra


def row(gpu: str, **fields) -> GpuRow:
    fields.setdefault("up", True)
    return GpuRow(node="n", gpu=gpu, uuid=f"U{gpu}", **fields)


@pytest.fixture(scope="module")
def view(text):
    return parse_exposition(text, URL, fetched_at=0.0)


# -- parsing --------------------------------------------------------------------------------


def test_rows_match_the_fixture(text, view):
    infos = series(text, "roofwatch_gpu_info")
    assert len(view.rows) == len(infos) == 8
    by_gpu = {r.gpu: r for r in view.rows}
    for labels, _ in infos:
        r = by_gpu[labels["gpu"]]
        assert (r.node, r.uuid, r.model) == (labels["node"], labels["uuid"], labels["model"])
    checks = {
        "roofwatch_gpu_power_watts": "power_w", "roofwatch_gpu_power_limit_watts": "power_limit_w",
        "roofwatch_gpu_sm_active_ratio": "sm", "roofwatch_gpu_tensor_active_ratio": "tensor",
        "roofwatch_gpu_dram_active_ratio": "dram", "roofwatch_gpu_engine_active_ratio": "engine",
        "roofwatch_gpu_workload_confidence_ratio": "confidence",
        "roofwatch_gpu_memory_used_bytes": "mem_used_bytes", "roofwatch_gpu_memory_total_bytes": "mem_total_bytes",
    }
    for name, attr in checks.items():
        expected = per_gpu(text, name)
        assert expected and {g: getattr(by_gpu[g], attr) for g in expected} == pytest.approx(expected), name
    for name, attr in (("roofwatch_gpu_sm_clock_hertz", "sm_clock_mhz"), ("roofwatch_gpu_sm_clock_max_hertz", "sm_clock_max_mhz")):
        assert {g: getattr(by_gpu[g], attr) for g in by_gpu} == pytest.approx({g: v / 1e6 for g, v in per_gpu(text, name).items()})
    assert {g: r.up for g, r in by_gpu.items()} == {g: v == 1 for g, v in per_gpu(text, "roofwatch_gpu_up").items()}
    assert {g: r.throttled for g, r in by_gpu.items()} == {g: v == 1 for g, v in per_gpu(text, "roofwatch_gpu_throttled").items()}


def test_class_reason_and_owner_labels(text, view):
    by_gpu = {r.gpu: r for r in view.rows}
    classes = {labels["gpu"]: labels["class"] for labels, v in series(text, "roofwatch_gpu_workload_class") if v == 1}
    assert {g: r.cls for g, r in by_gpu.items()} == classes
    assert len(set(classes.values())) > 3, "the demo shows several classes"
    for labels, _ in series(text, "roofwatch_gpu_workload_reason_info"):
        assert (by_gpu[labels["gpu"]].detail, by_gpu[labels["gpu"]].throttle) == (labels["detail"], labels["throttle"])
    jobs = {labels["gpu"]: labels["job_id"] for labels, _ in series(text, "roofwatch_gpu_job_info")}
    assert {g: r.job for g, r in by_gpu.items()} == jobs
    assert not series(text, "roofwatch_gpu_pod_info") and all(r.pod is None for r in view.rows)


def test_mfu_prefers_workload_over_counters(text, view):
    mfu: dict[str, dict[str, float]] = {}
    for labels, value in series(text, "roofwatch_gpu_mfu_ratio"):
        mfu.setdefault(labels["gpu"], {})[labels["source"]] = value
    assert any(len(s) == 2 for s in mfu.values()) and any(set(s) == {"counters"} for s in mfu.values())
    for r in view.rows:
        sources = mfu[r.gpu]
        source = "workload" if "workload" in sources else "counters"
        assert (r.mfu, r.mfu_source) == (sources[source], source)
    # the rule holds whichever order the series come in, and with the workload figure alone
    both = mini_exposition("0", "1", extra=(
        'roofwatch_gpu_mfu_ratio{gpu="0",node="n",source="workload",uuid="U0"} 0.3\n'
        'roofwatch_gpu_mfu_ratio{gpu="0",node="n",source="counters",uuid="U0"} 0.5\n'
        'roofwatch_gpu_mfu_ratio{gpu="1",node="n",source="workload",uuid="U1"} 0.25\n'
        'roofwatch_gpu_mbu_ratio{gpu="1",node="n",source="counters",uuid="U1"} 0.6\n'
    ))
    rows = {r.gpu: r for r in parse_exposition(both, URL).rows}
    assert (rows["0"].mfu, rows["0"].mfu_source) == (0.3, "workload")
    assert (rows["1"].mfu, rows["1"].mfu_source) == (0.25, "workload")
    assert (rows["1"].mbu, rows["1"].mbu_source, rows["0"].mbu) == (0.6, "counters", None)


def test_node_facts(text, view):
    assert view.nodes == tuple({labels["node"] for labels, _ in series(text, "roofwatch_gpu_info")})
    assert view.gpus_visible == int(series(text, "roofwatch_gpus_visible")[0][1])
    assert view.gpus_expected == int(series(text, "roofwatch_gpus_expected")[0][1])
    assert view.version == series(text, "roofwatch_build_info")[0][0]["version"]


def test_missing_metric_is_none_and_renders_a_dash(text):
    gpu = "2"
    parsed = parse_exposition(without(text, "roofwatch_gpu_tensor_active_ratio", gpu), URL)
    r = next(r for r in parsed.rows if r.gpu == gpu)
    assert r.tensor is None and r.sm is not None
    assert bar(r.tensor).plain == EMPTY
    # a GPU with nothing but identity: every measured cell is unknown, none is 0
    bare = parse_exposition(mini_exposition("0"), URL).rows[0]
    assert (bare.cls, bare.mfu, bare.sm, bare.power_w, bare.sm_clock_mhz, bare.job) == (None,) * 6
    line = row_line(rendered(render_table([bare], ClassHistory(), 200)), "0")
    assert line.count(EMPTY) >= 10 and "0%" not in line, line


def test_down_gpu_keeps_a_row(text):
    activity = ("roofwatch_gpu_sm_active_ratio", "roofwatch_gpu_tensor_active_ratio", "roofwatch_gpu_dram_active_ratio",
                "roofwatch_gpu_power_watts", "roofwatch_gpu_mfu_ratio")
    down = text.replace(
        next(line for line in text.splitlines() if line.startswith('roofwatch_gpu_up{gpu="3"')),
        next(line for line in text.splitlines() if line.startswith('roofwatch_gpu_up{gpu="3"'))[:-3] + "0.0",
    )
    for name in activity:
        down = without(down, name, "3")
    parsed = parse_exposition(down, URL, fetched_at=0.0)
    r = next(r for r in parsed.rows if r.gpu == "3")
    assert r.up is False and r.model and r.sm is None and r.mfu is None
    state = TopState(url=URL)
    state.apply(parsed)
    assert state.history.states(r.key) == (DOWN,)
    screen = rendered(render_frame(state))
    assert "DOWN" in row_line(screen, "3")
    assert f"{len(parsed.rows) - 1}/{parsed.gpus_expected} GPUs up" in screen
    assert "DOWN 1" in screen


# -- sorting --------------------------------------------------------------------------------


def test_gpu_ids_sort_numerically():
    ids = ["10", "2", "3/1", "3", "1", "0"]
    assert sorted(ids, key=gpu_id_key) == ["0", "1", "2", "3", "3/1", "10"]
    assert [r.gpu for r in sort_rows([row(g) for g in ids], "gpu")] == ["0", "1", "2", "3", "3/1", "10"]


def test_mfu_order_lowest_first_unknown_last():
    rows = [row("0", mfu=0.5), row("1", mfu=None), row("2", mfu=0.05), row("10", mfu=0.2),
            row("3", mfu=0.01, up=False), row("4", mfu=0.05)]
    assert [r.gpu for r in sort_rows(rows, "mfu")] == ["2", "4", "10", "0", "1", "3"]


def test_class_order_wasted_first():
    """Wasted GPUs first, by the exposition's waste label: a spare idle GPU (nobody holds it) is not among them."""
    rows = [row("0", cls="compute_bound", waste="none"), row("1", cls="idle", waste="idle_held"),
            row("2", cls="memory_bound", waste="none"), row("3", cls="communication_jittered", waste="communication_jittered"),
            row("4", cls="input_starved", waste="input_starved"), row("5", cls=None),
            row("6", cls="compute_bound", up=False), row("7", cls="idle", waste="spare")]
    ordered = [r.gpu for r in sort_rows(rows, "class")]
    assert ordered[:3] == ["1", "4", "3"]  # held idle, input-starved, comm-jittered: agent.model.waste's order
    assert set(ordered[3:6]) == {"0", "2", "7"}
    assert ordered[-2:] == ["5", "6"]  # unknown, then down


def test_power_order_highest_first(view):
    ordered = sort_rows(view.rows, "power")
    powers = [r.power_w for r in ordered]
    assert powers == sorted(powers, reverse=True) and powers[0] == max(r.power_w for r in view.rows)
    assert [r.gpu for r in sort_rows([row("0", power_w=None), row("1", power_w=100.0)], "power")] == ["1", "0"]


def test_sort_key_cycles_and_q_quits():
    assert [next_sort(o) for o in ("gpu", "mfu", "class", "power")] == ["mfu", "class", "power", "gpu"]
    assert handle_keys("s", "gpu") == (False, "mfu")
    assert handle_keys("ss", "gpu") == (False, "class")
    assert handle_keys("x\x1b[A", "power") == (False, "power")
    assert handle_keys("sq", "gpu") == (True, "mfu")


# -- history --------------------------------------------------------------------------------


def test_history_is_bounded_and_forgets_gone_gpus():
    history = ClassHistory(maxlen=5)
    for i in range(12):
        history.record([row("0", cls="compute_bound" if i < 9 else "idle"), row("1", cls="idle")])
    assert history.states(row("0").key) == ("compute_bound",) * 2 + ("idle",) * 3
    history.record([row("0", cls="idle")])
    assert history.states(row("1").key) == ()


def test_sparkline_shows_a_class_change():
    states = ["compute_bound"] * 4 + ["input_starved"] * 3 + [DOWN]
    line = sparkline(states, 10)
    assert len(line.plain) == 10 and line.plain.startswith("  ")
    colours = [str(span.style) for span in line.spans]
    assert colours[:4] == [palette.class_colour("compute_bound")] * 4
    assert colours[4:7] == [palette.class_colour("input_starved")] * 3
    assert palette.DOWN_COLOUR in colours[7]
    assert sparkline(states, 3).plain.endswith("✕") and len(sparkline(states, 3).plain) == 3
    # and the same colours come out of a terminal render
    history = ClassHistory()
    for cls in ("compute_bound", "compute_bound", "input_starved"):
        history.record([row("0", cls=cls)])
    console = Console(record=True, width=200, force_terminal=True, color_system="truecolor")
    console.print(render_table([row("0", cls="input_starved")], history, 200))
    html = console.export_html(inline_styles=True)
    assert html.index(palette.class_colour("compute_bound")) < html.rindex(palette.class_colour("input_starved"))


# -- rendering ------------------------------------------------------------------------------


def test_frame_shows_every_gpu_class_and_mfu(text, view):
    state = TopState(url=URL)
    state.apply(view)
    screen = rendered(render_frame(state))
    header = screen.splitlines()[0]
    assert URL in header and "sorted by gpu" in header and view.nodes[0] in header
    assert f"{len(view.rows)}/{view.gpus_expected} GPUs up" in header
    assert "s sort: mfu" in screen.splitlines()[-1]
    for r in view.rows:
        line = row_line(screen, r.gpu)
        assert palette.class_label(r.cls) in line
        assert f"{r.mfu * 100:.1f}%" in line
        assert (f"{r.mfu * 100:.1f}% est." in line) == (r.mfu_source == "counters")
        assert ("⚠ throttled" in line) == bool(r.throttled)
        assert r.job in line and f"{r.power_w:.0f}/{r.power_limit_w:.0f} W" in line
    wasted = sum(1 for labels, _ in series(text, "roofwatch_gpu_workload_reason_info")
                 if labels["waste"] in ("idle_held", "input_starved", "communication_jittered"))
    assert wasted == 4, "the golden demo: held idle, input-starved and two comm-jittered GPUs"
    mean = sum(r.mfu for r in view.rows) / len(view.rows)
    assert f"wasted {wasted}/{len(view.rows)}" in screen and f"mean MFU {mean * 100:.1f}%" in screen
    assert all(len(line) <= 200 for line in screen.splitlines())


@pytest.mark.parametrize("width", [60, 100, 140])
def test_narrow_terminal_drops_columns_not_the_verdict(view, width):
    state = TopState(url=URL)
    state.apply(view)
    screen = rendered(render_frame(state, width), width)
    assert all(len(line) <= width for line in screen.splitlines())
    table_header = next(line for line in screen.splitlines() if line.startswith("GPU"))
    assert "CLASS" in table_header and "MFU" in table_header and "MODEL" not in table_header
    for r in view.rows:
        line = row_line(screen, r.gpu)
        assert palette.class_label(r.cls) in line and f"{r.mfu * 100:.1f}%" in line and "…" not in line


def test_frame_in_mfu_order_lists_rows_by_mfu(view):
    state = TopState(url=URL, sort="mfu")
    state.apply(view)
    screen = rendered(render_frame(state))
    shown = [line.split()[0] for line in screen.splitlines() if re.match(r"^\s*\d", line)]
    assert shown == [r.gpu for r in sorted(view.rows, key=lambda r: (r.mfu, gpu_id_key(r.gpu)))]
    assert "sorted by mfu" in screen and "s sort: class" in screen


def test_failed_poll_keeps_the_data_and_shows_the_error(view):
    state = TopState(url=URL)
    state.apply(TopSourceError(f"cannot reach {URL}: refused"))
    screen = rendered(render_frame(state))
    assert f"cannot reach {URL}" in screen and "GPU" not in screen
    state.apply(view)
    assert state.error is None
    state.apply(TopSourceError(f"cannot reach {URL}: refused"))
    screen = rendered(render_frame(state))
    assert f"cannot reach {URL}" in screen and "showing the last data" in screen
    assert all(row_line(screen, r.gpu) for r in view.rows)
    assert state.history.states(view.rows[0].key) == (view.rows[0].cls,), "a failed poll adds no history"


def test_once_frame_has_no_key_footer(view):
    state = TopState(url=URL)
    state.apply(view)
    assert "q quit" not in rendered(render_frame(state, interactive=False))


# -- holders of shared GPUs (issue 47) ----------------------------------------------------------


def holder_lines(gpu: str, holder: str, *, via: str, sm: float, memory: float, power: float, cls: str | None = None) -> str:
    labels = f'gpu="{gpu}",holder="{holder}",node="n",uuid="U{gpu}"'
    lines = [f'roofwatch_gpu_holder_info{{{labels},kind="pod",via="{via}"}} 1.0',
             f"roofwatch_gpu_holder_sm_share_ratio{{{labels}}} {sm}",
             f"roofwatch_gpu_holder_memory_used_bytes{{{labels}}} {memory}",
             f"roofwatch_gpu_holder_power_watts{{{labels}}} {power}",
             f"roofwatch_gpu_holder_energy_joules_total{{{labels}}} 1234.0"]
    if cls:
        lines.append(f'roofwatch_gpu_holder_class{{{labels},class="{cls}"}} 1.0')
    return "\n".join(lines) + "\n"


def test_the_holders_of_a_shared_gpu_are_listed_under_the_table_largest_first(text, view):
    extra = (holder_lines("0", "research/notebook/main", via="time-slicing", sm=0.0, memory=20 * 2**30, power=9.0,
                          cls="idle_held")
             + holder_lines("0", "ml/trainer-0/main", via="time-slicing", sm=0.8, memory=40 * 2**30, power=400.0,
                            cls="compute_bound")
             + 'roofwatch_gpu_holder_power_watts{gpu="0",holder="unattributed",node="n",uuid="U0"} 3.0\n'
             + holder_lines("10", "pid:4242", via="mps", sm=0.25, memory=8 * 2**30, power=90.0)
             + holder_lines("2", "pid:77", via="mps", sm=0.5, memory=2**30, power=50.0))
    shared = parse_exposition(mini_exposition("0", "2", "10", extra=extra), URL, fetched_at=0.0)
    assert [(h.gpu, h.holder) for h in shared.holders] == [
        ("0", "ml/trainer-0/main"), ("0", "research/notebook/main"), ("0", "unattributed"), ("2", "pid:77"),
        ("10", "pid:4242")], "GPUs in index order, the largest holder first, the remainder last"
    state = TopState(url=URL)
    state.apply(shared)
    screen = rendered(render_frame(state))
    lines = [line for line in screen.splitlines() if re.match(r"^GPU \S+  \S", line)]
    assert "SHARED GPUS (3)" in screen
    assert lines[0].startswith("GPU 0  ml/trainer-0/main  time-slicing  SM 80% · 40.0 GiB · 400 W")
    assert palette.class_label("compute_bound") in lines[0]
    assert lines[1].startswith("GPU 0  research/notebook/main  time-slicing  SM 0% · 20.0 GiB · 9 W")
    assert palette.class_label("idle_held") in lines[1]
    assert lines[2].startswith("GPU 0  unattributed") and "3 W" in lines[2]
    assert lines[4].startswith("GPU 10  pid:4242  mps  SM 25% · 8.0 GiB · 90 W")
    plain = TopState(url=URL)
    plain.apply(view)
    assert view.holders == () and "SHARED GPUS" not in rendered(render_frame(plain)), "no shared GPU, no section"


def test_a_holder_line_is_printable_and_never_wraps() -> None:
    name = "ns/\x1b[31m\u202e" + "p" * 300 + "/c"  # raw ESC and a bidi override inside the label value
    extra = holder_lines("0", name, via="time-slicing", sm=0.1, memory=2**30, power=5.0)
    extra += 'roofwatch_gpu_holder_sm_share_ratio{gpu="0",holder="other",node="n",uuid="U0"} NaN\n'
    shared = parse_exposition(mini_exposition("0", extra=extra), URL, fetched_at=0.0)
    state = TopState(url=URL)
    state.apply(shared)
    screen = rendered(render_frame(state, 80), 80)
    assert all(len(line) <= 80 for line in screen.splitlines())
    other = next(line for line in screen.splitlines() if line.startswith("GPU 0  other"))
    assert f"SM {EMPTY}" in other, "an absent figure is a dash, not 0"
    assert shared.holders[0].holder == name, "the parser hands the ESC through: the line must not"
    assert "\x1b" not in screen and "\u202e" not in screen and "ns/\ufffd" in screen
