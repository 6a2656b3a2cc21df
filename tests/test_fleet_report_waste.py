"""``roofwatch fleet-report`` counts waste as agent/model/waste.py defines it, and finds stragglers by the rule
it states (issue 43). A real Prometheus (blocks from ``promtool tsdb create-blocks-from openmetrics``) holds a
small fleet whose every GPU's kind of waste is planned below by hand from waste.py's definition:

* idle and held: a process holds memory (detail ``idle_held``, no job) or a job holds it: wasted
  (``idle_held``, the idle-allocated hours), job or no job;
* idle and held by nobody (detail ``idle_free``): spare capacity, not waste;
* input-starved and communication-jittered: wasted, job or no job;
* compute-bound: not waste.

Before, the report counted waste only on GPUs a job held (``roofwatch_gpu_job_info``): the GPU a process held
idle without a scheduler, and the starved GPU without a job, were missing from every waste figure.

Stragglers: a job of two GPUs whose faster rank leads the median by 20 % (above the 15 % threshold) is not a
straggler by the lead rule, which needs three GPUs (GpuJobStraggler's); a job of three is. The classifier's
own straggler (reason detail ``straggler``, what the status page shows) is listed from two ranks.
"""

from __future__ import annotations

import pytest

from tests import fleet_fixture as fx
from tests.fleet_stores import backfilled_prometheus, fleet_end, run_report

pytestmark = pytest.mark.slow

STEP = 60
RANGE = 7200
CLUSTER = "lab"
# (gpu, class, reason detail, job, kind of waste by agent/model/waste.py's definition)
PLAN = [
    (0, "idle", "idle_held", None, "idle_held"),                # a process holds 20 GiB, no scheduler
    (1, "idle", "idle_free", None, "spare"),                    # nobody holds it
    (2, "idle", "idle_held", "notebook", "idle_held"),          # a job holds it
    (3, "input_starved", "dataloader", None, "input_starved"),  # no job attribution, still starved
    (4, "communication_jittered", "straggler_victim", "pair", "communication_jittered"),
    (5, "communication_jittered", "straggler", "pair", "communication_jittered"),
    (6, "compute_bound", "at_roof", "trio", "none"),
    (7, "compute_bound", "at_roof", "trio", "none"),
    (8, "compute_bound", "at_roof", "trio", "none"),
    (9, "compute_bound", "leaning", None, "none"),
]
LEAD = {5: 0.20, 8: 0.20}
"""Lead over the job's median tensor activity (roofwatch:gpu_straggler_lead:ratio), above 0.15: GPU 5 in the
two-GPU job ``pair``, GPU 8 in the three-GPU job ``trio``; every other GPU of those jobs 0.01."""
KINDS = ("idle_held", "input_starved", "communication_jittered")


def labels(gpu: int) -> str:
    return f'cluster="{CLUSTER}",gpu="{gpu}",node="n1",uuid="GPU-n1-{gpu:04d}"'


def openmetrics(end: int) -> str:
    lines = []
    for t in range(end - 2 * RANGE - 600, end + 1, STEP):
        for gpu, cls, detail, job, _ in PLAN:
            lab = labels(gpu)
            lines.append(f'roofwatch_gpu_info{{{lab},model="{fx.H100[0]}",spec="{fx.H100[1]}"}} 1 {t}')
            lines.append(f'roofwatch_gpu_workload_class{{{lab},class="{cls}"}} 1 {t}')
            lines.append(f'roofwatch_gpu_workload_reason_info{{{lab},class="{cls}",detail="{detail}",throttle="none"}} 1 {t}')
            if job:
                lines.append(f'roofwatch_gpu_job_info{{{lab},job_id="{job}",user="u-{job}"}} 1 {t}')
            if job in ("pair", "trio"):
                lines.append(f'roofwatch:gpu_straggler_lead:ratio{{{lab},job_id="{job}"}} {LEAD.get(gpu, 0.01)} {t}')
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    end = fleet_end()
    work = tmp_path_factory.mktemp("waste")
    server = backfilled_prometheus(work, {"waste": openmetrics(end)})
    try:
        done, data = run_report(server.base, work, end=end)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    return data, (work / "fleet.html").read_text()


def planned_hours(kind: str) -> float:
    return sum(RANGE / 3600 for *_, k in PLAN if k == kind)


def test_waste_is_the_one_definitions_whatever_holds_the_gpu(report) -> None:
    data, _ = report
    totals = data["totals"]
    wasted = sum(planned_hours(k) for k in KINDS)
    assert totals["wasted_gpu_hours"] == pytest.approx(wasted), "a GPU held by a process or starved without a job is waste"
    assert totals["idle_allocated_gpu_hours"] == pytest.approx(planned_hours("idle_held"))
    assert totals["spare_gpu_hours"] == pytest.approx(planned_hours("spare")), "an idle GPU nobody holds is spare"
    (cluster,) = data["clusters"]
    assert cluster["cluster"] == CLUSTER
    assert cluster["waste_hours"] == pytest.approx({k: planned_hours(k) for k in (*KINDS, "spare", "none")})
    assert cluster["wasted_cost_usd"] == pytest.approx(wasted * 2.0), "the assumed default price"
    assert totals["waste_measure"] == "windows"


def test_the_user_table_counts_the_gpus_jobs_held(report) -> None:
    data, _ = report
    users = {u["user"]: u for u in data["users"]}
    assert set(users) == {"u-notebook", "u-pair", "u-trio"}
    assert users["u-notebook"]["idle_allocated_hours"] == pytest.approx(RANGE / 3600)
    assert users["u-pair"]["waste_hours"]["communication_jittered"] == pytest.approx(2 * RANGE / 3600)
    assert users["u-trio"]["wasted_hours"] == pytest.approx(0.0)


def test_the_page_says_what_it_counts_and_in_which_measure(report) -> None:
    from agent.model.waste import MEASURES

    _, page = report
    assert MEASURES["windows"] in page, "each waste figure names its measure"
    assert "spare" in page and "idle_free" in page


def test_stragglers_by_the_lead_rule_need_three_gpus_the_classifiers_two(report) -> None:
    data, _ = report
    assert [(s["job_id"], s["gpu"]) for s in data["stragglers"]] == [("trio", "8")], "not the two-GPU job's GPU 5"
    assert data["stragglers"][0]["peak_lead"] == pytest.approx(LEAD[8])
    named = [(s["job_id"], s["gpu"], s["hours"]) for s in data["named_stragglers"]]
    assert named == [("pair", "5", pytest.approx(RANGE / 3600))]
