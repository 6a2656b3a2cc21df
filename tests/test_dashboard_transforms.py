"""What Grafana's frontend makes of the panels' data: the table and xychart panels reshape their
queries' frames with ``transformations`` (merge, organize, merges filtered by refId), and a wrong
assumption there shows an empty or broken panel although every query returns data.

test_dashboards runs the queries; this runs what comes next with Grafana's own code. The live
results become the DataFrames Grafana 11's Prometheus datasource builds for ``format: table``
(tests/grafana_frames.py), and the panel's transformations run through ``@grafana/data`` 11.6 in
Node (tests/grafana/). Like Grafana, every query of a panel is evaluated at the same instant.
"""

from __future__ import annotations

import time

import pytest

from dashboards import node
from tests import test_dashboards
from tests.grafana_frames import NodeMissing, ensure_installed, panel_frames, run_transformations, table_frames
from tests.prometheus_server import PrometheusServer
from tests.test_dashboards import MODULES, VIEWS, dashboards, panels, run_target, substitute, until_no_problems

fleet = test_dashboards.fleet
"""The four agents and Prometheus of test_dashboards (a fixture; this module gets its own)."""

pytestmark = pytest.mark.slow

TABLES = [(uid, panel["title"]) for uid, dashboard in dashboards().items() if uid in VIEWS
          for panel in panels(dashboard) if panel["type"] == "table" and panel["title"] not in MODULES[uid].MAY_BE_EMPTY]
"""The tables of the dashboards the fleet fills (the serving table: tests/test_dashboard_serving.py; the shared GPUs'
tables, empty on this fleet: tests/test_dashboard_shared.py)."""
ROOFLINE_VIEWS = {"demo-node": {**VIEWS[node.UID], "node": "demo-node"},
                  "node-a": {**VIEWS[node.UID], "node": "node-a"}}


@pytest.fixture(scope="module")
def grafana_js():
    """Node with @grafana/data installed (npm ci into tests/grafana the first time)."""
    try:
        ensure_installed()
    except NodeMissing as missing:
        pytest.skip(str(missing))


def panel(uid: str, title: str) -> dict:
    return next(p for p in panels(dashboards()[uid]) if p["title"] == title)


def fetch_at(prom: PrometheusServer, view: dict[str, str], at: float):
    """What the Prometheus datasource fetches for one target of a request made at ``at``: Grafana
    evaluates all instant queries of a panel at the range's end, so their Time values agree (and
    the merge transformation, which pairs rows on every field the frames share, can pair them)."""
    def fetch(target: dict) -> list[dict]:
        if not target.get("instant"):
            return run_target(prom, target, view)
        data = prom.api("query", query=substitute(target["expr"], view), time=f"{at:.3f}")
        assert data["resultType"] == "vector", data["resultType"]
        return data["result"]
    return fetch


def transformed(prom: PrometheusServer, the_panel: dict, view: dict[str, str]) -> tuple[list[dict], list[dict]]:
    """The panel's input frames, and what its transformations make of them."""
    frames = panel_frames(the_panel, fetch_at(prom, view, time.time()))
    return frames, run_transformations(frames, the_panel.get("transformations", []))


def describe(frames: list[dict], rows: int = 6) -> str:
    lines = []
    for frame in frames:
        names = [f.get("displayName", f["name"]) for f in frame["fields"]]
        length = len(frame["fields"][0]["values"]) if frame["fields"] else 0
        lines.append(f"  frame {frame.get('refId')}: {length} rows, columns {names}")
        for i in range(min(length, rows)):
            lines.append(f"    {[f['values'][i] for f in frame['fields']]}")
    return "\n".join(lines)


def every_query_has_data(seen: dict[str, list[dict]]) -> bool:
    frames = seen.get("frames")
    return bool(frames) and all(frame["fields"] and frame["fields"][0]["values"] for frame in frames)


# --- the DataFrames Grafana builds ----------------------------------------------------------

def test_table_frames_follow_grafanas_prometheus_table_format():
    a = [{"metric": {"node": "n", "gpu": "1", "__name__": "m"}, "value": [100.5, "2"]},
         {"metric": {"node": "n", "gpu": "0", "dtype": "bf16", "__name__": "m"}, "value": [100.5, "NaN"]}]
    (frame,) = table_frames({"A": a})
    assert [f["name"] for f in frame["fields"]] == ["Time", "__name__", "gpu", "node", "dtype", "Value"]
    assert [f["type"] for f in frame["fields"]] == ["time", "string", "string", "string", "string", "number"]
    assert frame["fields"][0]["values"] == [100500.0, 100500.0]
    assert frame["fields"][4]["values"] == ["", "bf16"], "a label a series lacks is blank"
    assert frame["fields"][5]["values"] == [2.0, "NaN"]
    frames = table_frames({"A": a, "B": []})
    assert [f["fields"][-1]["name"] for f in frames] == ["Value #A", "Value #B"], "an empty query still counts"
    assert [f["name"] for f in frames[1]["fields"]] == ["Time", "Value #B"]
    assert table_frames({"A": []}) == [{"refId": "A", "fields": []}]


def test_grafanas_merge_organize_and_filtered_merge_run_in_node(grafana_js):
    """A smoke test of the bridge itself, on frames built by hand."""
    series = lambda name, gpu, v: {"metric": {"__name__": name, "gpu": gpu}, "value": [1, v]}  # noqa: E731
    frames = table_frames({"A": [series("x", "0", "1"), series("x", "1", "2")],
                           "B": [series("x", "0", "10"), series("x", "1", "20")],
                           "C": [series("y", "0", "5")]})
    out = run_transformations(frames, [
        {"id": "merge", "options": {}, "filter": {"id": "byRefId", "options": "/^(A|B)$/"}},
        {"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True},
                                       "indexByName": {"Value #B": 1, "gpu": 0},
                                       "renameByName": {"gpu": "GPU", "Value #A": "X"}}}])
    assert [f["refId"] for f in out] == ["merge-A-B", "C"]
    merged = out[0]
    assert [(f["name"], f["displayName"]) for f in merged["fields"]] == [
        ("gpu", "GPU"), ("Value #B", "Value #B"), ("Value #A", "X")]
    assert [f["values"] for f in merged["fields"]] == [["0", "1"], [10, 20], [1, 2]]
    with pytest.raises(RuntimeError, match="unknown transformation"):
        run_transformations(frames, [{"id": "no-such-transformation", "options": {}}])


# --- every table panel ----------------------------------------------------------------------

def table_problems(the_panel: dict, frames: list[dict], out: list[dict]) -> list[str]:
    where = the_panel["title"]
    organize = next((t["options"] for t in reversed(the_panel.get("transformations", []))
                     if t["id"] == "organize"), {})
    renames = organize.get("renameByName", {})
    hidden = {name for name, hide in organize.get("excludeByName", {}).items() if hide}
    columns = {f["name"] for frame in frames for f in frame["fields"]}
    problems = []
    for column in renames:
        if column not in columns:
            problems.append(f"{where}: renames {column!r}, which no frame has (frames have {sorted(columns)})")
    if len(out) != 1:
        return problems + [f"{where}: the table gets {len(out)} frames, not one (it shows one at a time)"]
    (table,) = out
    if table["length"] < 1:
        problems.append(f"{where}: the table is empty")
    shown = {f["name"]: f for f in table["fields"]}
    for column, title in renames.items():
        if column in columns and (column not in shown or shown[column]["displayName"] != title):
            problems.append(f"{where}: column {column!r} is not shown as {title!r}")
    values = {f["name"] for frame in frames for f in frame["fields"] if f["type"] == "number"}
    if not any(f["type"] == "number" for f in table["fields"]) and not values <= hidden:
        # (A panel that hides every value column by name is a list on purpose.)
        problems.append(f"{where}: no number column is left")
    for column in sorted(hidden & set(shown)):
        problems.append(f"{where}: shows {column!r}, which organize hides")
    for column in sorted(set(shown) - set(renames) - hidden):
        problems.append(f"{where}: shows {column!r}, which organize neither names nor hides")
    # One row per thing: rows whose label cells agree wherever both are filled in are one thing
    # that the merge split (the queries' frames did not pair up) or a query listed twice.
    labels = [f for f in table["fields"] if f["type"] == "string" and (f["name"] in renames or not renames)]
    rows = [tuple(f["values"][i] for f in labels) for i in range(table["length"])]
    blank = ("", None)
    for i, row in enumerate(rows if labels else []):
        twin = next((j for j in range(i + 1, len(rows))
                     if all(a == b or a in blank or b in blank for a, b in zip(row, rows[j]))), None)
        if twin is not None:
            problems.append(f"{where}: rows {i} and {twin} are the same {[f['displayName'] for f in labels]}: "
                            f"{[[f['values'][k] for f in table['fields']] for k in (i, twin)]}")
            break
    return problems


def assert_one_named_table(prom: PrometheusServer, the_panel: dict, view: dict[str, str]) -> None:
    """Polls until the table panel's queries have data, then holds it to :func:`table_problems` (also used by
    tests/test_dashboard_shared.py for the tables this fleet leaves empty)."""
    seen: dict[str, list[dict]] = {}

    def check() -> list[str]:
        seen["frames"], seen["out"] = transformed(prom, the_panel, view)
        return table_problems(the_panel, seen["frames"], seen["out"])

    problems = until_no_problems(check, lambda: every_query_has_data(seen))
    assert problems == [], "\n".join(problems + ["Grafana's input frames:", describe(seen["frames"]),
                                                 "after the transformations:", describe(seen["out"])])


@pytest.mark.parametrize("uid, title", TABLES, ids=[f"{uid}/{title}" for uid, title in TABLES])
def test_table_panel_shows_one_table_with_its_named_columns(fleet, grafana_js, uid, title):
    assert_one_named_table(fleet, panel(uid, title), VIEWS[uid])


# --- the roofline (xychart) -----------------------------------------------------------------

def numbers(frame: dict) -> list[str]:
    return [f["name"] for f in frame["fields"] if f["type"] == "number"]


def roofline_problems(out: list[dict]) -> list[str]:
    """xychart's "auto" mapping takes, in each frame, the first number field as x and the next
    as y: the GPU points need intensity (#A) then FLOP/s (#B) on the same rows, the roof its three
    corners (#C, #D) in order of x."""
    if len(out) != 2:
        return [f"Roofline: {len(out)} frames after the transformations, not 2 (GPU points, roof)"]
    problems = []
    for x, y, what in (("Value #A", "Value #B", "GPU points"), ("Value #C", "Value #D", "roof")):
        frame = next((f for f in out if x in numbers(f) or y in numbers(f)), None)
        if frame is None:
            problems.append(f"Roofline: no frame has {x} or {y} ({what})")
            continue
        if numbers(frame) != [x, y]:
            problems.append(f"Roofline {what}: number fields {numbers(frame)}; xychart would plot "
                            f"{numbers(frame)[:1]} as x, not {x}")
            continue
        xs, ys = (next(f["values"] for f in frame["fields"] if f["name"] == n) for n in (x, y))
        pairs = [(a, b) for a, b in zip(xs, ys) if a is not None and b is not None]
        if what == "GPU points" and not pairs:
            problems.append(f"Roofline: no row has both {x} and {y}, so no GPU is drawn "
                            f"({len(xs)} rows: {list(zip(xs, ys))[:4]}...)")
        if what == "roof":
            if frame["length"] != 3 or len(pairs) != 3:
                problems.append(f"Roofline roof: {frame['length']} rows {list(zip(xs, ys))}, "
                                "not three corners with both x and y")
            elif not xs[0] < xs[1] < xs[2]:
                problems.append(f"Roofline roof: x is not increasing: {xs}")
    return problems


@pytest.mark.parametrize("view", ROOFLINE_VIEWS)
def test_roofline_frames_feed_the_xychart(fleet, grafana_js, view):
    roofline = panel(node.UID, "Roofline")
    seen: dict[str, list[dict]] = {}

    def check() -> list[str]:
        seen["frames"], seen["out"] = transformed(fleet, roofline, ROOFLINE_VIEWS[view])
        return roofline_problems(seen["out"])

    problems = until_no_problems(check, lambda: every_query_has_data(seen))
    assert problems == [], "\n".join(problems + ["Grafana's input frames:", describe(seen["frames"], 3),
                                                 "after the transformations:", describe(seen["out"], 10)])
