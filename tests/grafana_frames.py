"""What Grafana 11's frontend does with Prometheus results before a panel draws them.

Two steps, each as Grafana does it:

* ``table_frames``: the Prometheus datasource turns the results of ``format: table`` targets into
  DataFrames. The facts it mirrors (Grafana 11.6, ``pkg/promlib/converter/prom.go``,
  ``pkg/promlib/querydata/response.go`` and the frontend's ``result_transformer.ts``
  ``transformDFToTable``/``getValueText``):

  - the backend makes one frame per series (a time field and a value field whose labels are the
    series' ``metric``, ``__name__`` included), and one empty frame for a query with no series;
  - the frontend groups those frames by refId, in query order, into one frame per query: a time
    field "Time" (milliseconds), then one string field per label (each series' label names
    sorted, new names appended in the order they first appear; "" where a series lacks one),
    then a number field "Value #<refId>" when the response holds more than one query (an empty
    query counts, through its empty frame), else "Value";
  - a response that is a single empty frame is passed on as it is (no fields).

* ``run_transformations``: the panel's ``transformations`` run through Grafana's own code
  (``@grafana/data``, pinned in tests/grafana/package.json) in Node, via tests/grafana/transform.mjs.
"""

from __future__ import annotations

import fcntl
import json
import math
import shutil
import subprocess
from pathlib import Path

GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"
TRANSFORM = GRAFANA_DIR / "transform.mjs"
INSTALLED = GRAFANA_DIR / "node_modules" / "@grafana" / "data" / "package.json"


class NodeMissing(RuntimeError):
    """node or npm is not installed (./dev.sh test installs the Debian packages nodejs and npm)."""


def _sample(value: str) -> float | str:
    """A Prometheus sample value as a JSON-safe number; NaN and the infinities stay strings, which
    transform.mjs turns back into numbers (Grafana's parseSampleValue does the same)."""
    number = float(value)
    return number if math.isfinite(number) else value


def _series_samples(series: dict) -> list[list]:
    if "value" in series:
        return [series["value"]]
    return list(series.get("values", []))


def table_frames(results: dict[str, list[dict]]) -> list[dict]:
    """The frames Grafana builds for ``format: table`` targets.

    ``results`` maps each refId, in the panel's query order, to the ``data.result`` list of the
    Prometheus query API (instant vector or range matrix). Returns frames as transform.mjs takes
    them: ``{"refId", "fields": [{"name", "type", "values", "config"}]}``.
    """
    if len(results) == 1 and not next(iter(results.values())):
        # One query, no series: the single empty frame the backend sent, unchanged.
        return [{"refId": next(iter(results)), "fields": []}]
    value_name = (lambda ref: f"Value #{ref}") if len(results) > 1 else (lambda ref: "Value")
    frames = []
    for ref, result in results.items():
        labels: list[str] = []
        for series in result:
            for name in sorted(series["metric"]):
                if name not in labels:
                    labels.append(name)
        rows: list[tuple[float, dict, float | str]] = []
        for series in result:
            for timestamp, value in _series_samples(series):
                rows.append((float(timestamp) * 1000, series["metric"], _sample(value)))
        times = [row[0] for row in rows]
        if any(later < earlier for earlier, later in zip(times, times[1:])):
            rows.sort(key=lambda row: row[0])  # sortDataFrame(frame, 0), stable
        fields = [{"name": "Time", "type": "time", "config": {}, "values": [row[0] for row in rows]}]
        fields += [{"name": name, "type": "string", "config": {"filterable": True},
                    "values": [row[1].get(name, "") for row in rows]} for name in labels]
        fields.append({"name": value_name(ref), "type": "number", "config": {},
                       "values": [row[2] for row in rows]})
        frames.append({"refId": ref, "fields": fields})
    return frames


def panel_frames(panel: dict, fetch) -> list[dict]:
    """The frames Grafana hands ``panel``'s transformations: ``fetch(target)`` returns the
    Prometheus result for one target. Hidden targets are not sent; only table format is modelled."""
    targets = [t for t in panel["targets"] if not t.get("hide")]
    for target in targets:
        if target.get("format") != "table":
            raise NotImplementedError(f"{panel['title']} [{target['refId']}]: only format: table is modelled")
    return table_frames({t["refId"]: fetch(t) for t in targets})


def ensure_installed() -> str:
    """The path of node, with tests/grafana's node_modules installed (``npm ci`` the first time)."""
    node = shutil.which("node")
    if node is None:
        raise NodeMissing("node missing: apt-get install nodejs npm (./dev.sh test does)")
    if INSTALLED.exists():
        return node
    npm = shutil.which("npm")
    if npm is None:
        raise NodeMissing("npm missing: apt-get install npm (./dev.sh test does)")
    with open(GRAFANA_DIR / ".npm-ci.lock", "w") as lock:  # parallel workers: one installs, the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not INSTALLED.exists():
            done = subprocess.run([npm, "ci", "--prefix", str(GRAFANA_DIR), "--no-audit", "--no-fund"],
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0 or not INSTALLED.exists():
                raise RuntimeError(f"npm ci in {GRAFANA_DIR} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return node


def run_transformations(frames: list[dict], transformations: list[dict]) -> list[dict]:
    """The frames a panel gets after Grafana's ``transformDataFrame`` ran its transformations:
    ``[{"refId", "name", "length", "fields": [{"name", "type", "displayName", "config", "labels",
    "values"}]}]``."""
    node = ensure_installed()
    request = json.dumps({"frames": frames, "transformations": transformations})
    done = subprocess.run([node, str(TRANSFORM)], input=request, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"transform.mjs failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)["frames"]
