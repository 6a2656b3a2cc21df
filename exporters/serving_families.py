"""The serving families built from a snapshot's verdicts: one replica's figures on each of its GPUs.

Kept out of exporters/prometheus.py like the NIC and process families: these exist only for GPUs
that serve inference, and their label values (server, model) come from outside, so they are clipped.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from agent.model import NodeSnapshot
from exporters import metrics as m
from exporters.families import Families, add_known


def serving_families(fam: Families, node: str, snapshot: NodeSnapshot) -> list[Metric]:
    """The serving families; empty of samples on a node that serves nothing (the families stay described)."""
    info = fam.info(m.SERVING_INFO)
    floor, read, tpot, multiple, tokens, prefill, requests, possible, kv, preempt = (fam.gauge(d) for d in (
        m.DECODE_FLOOR, m.STEP_BYTES, m.TPOT, m.FLOOR_MULTIPLE, m.TOKENS_PER_GPU, m.PREFILL_SHARE, m.REQUESTS,
        m.POSSIBLE_BATCH, m.KV_USAGE, m.PREEMPTIONS))
    views = {v.gpu: v.serving for v in snapshot.verdicts if v.serving is not None}
    for device in snapshot.devices:
        view = views.get(device.info.gpu) if device.up else None
        if view is None:
            continue
        labels = fam.values(node, device)
        info.add_metric(labels, {"server": m.clip_label(view.server), "model": m.clip_label(view.model),
                                 "state": view.state, "advice": view.advice_code})
        add_known(floor, labels, view.floor_s)
        add_known(read, labels + ["weights"], view.weight_bytes)
        add_known(read, labels + ["kv_cache"], view.kv_bytes_read)
        add_known(tpot, labels, view.tpot_s)
        add_known(multiple, labels, view.floor_ratio)
        add_known(tokens, labels, view.tokens_per_s_per_gpu)
        add_known(prefill, labels, view.prefill_share)
        add_known(requests, labels + ["running"], view.batch)
        add_known(requests, labels + ["waiting"], view.waiting)
        add_known(possible, labels, view.possible_batch)
        add_known(kv, labels, view.kv_usage)
        add_known(preempt, labels, view.preemptions_per_s)
    return [info, floor, read, tpot, multiple, tokens, prefill, requests, possible, kv, preempt]
