"""A serving job's own figures through the client: what ``report(serving=...)`` accepts and what the agent makes of it."""

from __future__ import annotations

import pytest

from agent.client.fields import SERVING_FIELDS, Invalid, JobDefaults, build_report
from agent.context.workload.report_schema import ReportRequest, to_workload_report

DEFAULTS = JobDefaults(rank=None, world_size=None, job=None, hints={})
NONE = dict(step_time_s=None, tokens=None, tokens_per_s=None, flops_per_token=None, dtype=None, model_bytes=None,
            rank=None, world_size=None, step=None, job=None, gpu=None)


def build(**kw):
    return build_report({**NONE, **kw}, DEFAULTS)


def test_serving_alone_is_a_report_and_becomes_the_workloads_serving_figures():
    item = build(serving={"running": 8, "waiting": 0, "kv_usage": 0.25, "tpot_s": 0.012, "prefill_share": 0.1},
                 model_bytes=16e9, job="chat-api", world_size=2)
    assert item["serving"] == {"running": 8.0, "waiting": 0.0, "kv_usage": 0.25, "tpot_s": 0.012, "prefill_share": 0.1}
    request = ReportRequest.model_validate({k: v for k, v in item.items() if k != "pid"})
    report = to_workload_report(request)
    s = report.serving
    assert (s.server, s.weight_bytes, s.running, s.kv_usage, s.tpot_s, s.gpus) == ("chat-api", 16e9, 8.0, 0.25, 0.012, 2)
    assert report.source == "client"


@pytest.mark.parametrize("serving, message", [
    ({"batch": 4}, "serving has no field 'batch'"),
    ({"kv_usage": 1.5}, "serving.kv_usage is a ratio"),
    ({"tpot_s": float("nan")}, "serving.tpot_s must be finite"),
    ({"running": True}, "serving.running must be a number"),
    ({"running": None}, "serving is empty"),
    ([("running", 1)], "serving must be a dict"),
])
def test_a_bad_serving_argument_is_refused_with_its_field_named(serving, message):
    with pytest.raises(Invalid, match=message):
        build(serving=serving)


def test_the_agent_schema_takes_every_field_the_client_sends():
    body = {"serving": {name: 0.5 for name in SERVING_FIELDS}}
    assert ReportRequest.model_validate(body).serving is not None
