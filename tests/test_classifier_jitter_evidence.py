"""Communication jitter from what every GPU and job gives (agent.classifier.fabric, agent.classifier.jobs).

Unit tests of the pieces, on hand-made sample sequences: step times without step ids, power and
memory falling as fabric bytes rise, the ranks of one node moving in lockstep, the verdict's basis,
and a collective's spin not read as compute. The recall on labelled traces drawn from published
ranges is in tests/test_published_jitter_classification.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.classifier.engine import classify_samples
from agent.classifier.fabric import fabric_evidence, fabric_bytes, pearson
from agent.classifier.features import step_statistics, step_times, window_features
from agent.classifier.jobs import MAX_LOCKSTEP_GPUS, job_contexts
from agent.classifier.thresholds import DEFAULT_THRESHOLDS as T
from agent.model import GpuSample, WorkloadReport

T0 = 1_800_000_000.0


def sample(i: int, *, gpu: str = "0", node: str = "n", power: float = 300.0, fabric: float | None = 1e9,
           gr: float = 1.0, mem: float = 0.3, report: WorkloadReport | None = None) -> GpuSample:
    half = None if fabric is None else fabric / 2
    return GpuSample(ts=T0 + i, gpu=gpu, node=node, vendor="nvidia", model="NVIDIA A100-SXM4-80GB", interval_s=1.0,
                     gr_active=gr, mem_busy=mem, power_w=power, power_limit_w=400.0,
                     net_tx_bytes_per_s=half, net_rx_bytes_per_s=half, workload=report)


def waits_every(period: int, wait_s: int, n: int = 20, **kw) -> list[GpuSample]:
    """A rank that computes at 330 W and then waits ``wait_s`` of every ``period`` seconds at 140 W
    while its NIC carries the collective (values in the A100 ranges of traces/published/sources.yaml)."""
    out = []
    for i in range(n):
        waiting = i % period >= period - wait_s
        out.append(sample(i, power=140.0 if waiting else 330.0, fabric=3.6e10 if waiting else 8e9,
                          mem=0.08 if waiting else 0.4, **kw))
    return out


def test_reports_without_step_ids_give_step_times_by_their_changes():
    lengths = [2.0, 2.0, 2.6, 1.9, 3.4, 2.0]
    reports = []
    for length in lengths:  # each step's time is repeated in the reports sent while the next step runs
        reports += [WorkloadReport(job="j", world_size=8, step_time_s=length)] * 2
    samples = [sample(i, report=r) for i, r in enumerate(reports)]
    times, inferred = step_times(samples)
    assert inferred
    assert times == [2.0, 2.6, 1.9, 3.4, 2.0], "a repeated report is one step; an equal next step merges (said in the doc)"
    numbered = [sample(i, report=WorkloadReport(job="j", step=k, step_time_s=2.0)) for i, k in enumerate([1, 1, 2, 3])]
    assert step_times(numbered) == ([2.0, 2.0, 2.0], False), "with ids, equal steps stay distinct"
    cv, count = step_statistics(times, 10, 5)
    assert count == 5 and cv is not None and cv > 0.2


def test_power_falling_as_fabric_rises_is_counted_as_waiting_on_the_fabric():
    window = waits_every(4, 2)
    evidence = fabric_evidence(window, window, None, T)
    assert evidence.power_r is not None and evidence.power_r < -0.9
    assert evidence.memory_r is not None and evidence.memory_r < -0.9
    assert evidence.wait_fraction == 0.5
    assert evidence.working_power_ratio == 330.0 / 400.0, "the waits do not count in the power of the compute parts"


def test_steady_overlapped_traffic_is_not_waiting_and_no_fabric_counter_gives_no_evidence():
    steady = [sample(i, power=320.0 + (i % 3), fabric=1.0e10 + 1e8 * (i % 5)) for i in range(20)]
    evidence = fabric_evidence(steady, steady, None, T)
    assert evidence.wait_fraction == 0.0, "power does not fall as bytes rise: no wait is counted"
    blind = [sample(i, fabric=None) for i in range(20)]
    assert fabric_evidence(blind, blind, None, T).wait_fraction is None
    assert fabric_bytes(blind[0]) is None
    quiet = [sample(i, power=300.0 - 100.0 * (i % 2), fabric=1e6 * (1 + i % 2)) for i in range(20)]
    assert fabric_evidence(quiet, quiet, None, T).wait_fraction is None, "heartbeat traffic is not a collective"


def test_pearson_is_none_for_flat_or_short_series():
    assert pearson([1.0] * 10, list(range(10))) is None
    assert pearson([1.0, 2.0], [2.0, 1.0]) is None
    assert math.isclose(pearson([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]), -1.0)


@dataclass
class _Track:
    node: str
    gpu: str


def _features(window):
    return window_features(window, window, None, T)


def test_ranks_of_one_node_that_rise_and_fall_together_are_one_job_and_others_are_not():
    ranks = [waits_every(4, 2, gpu=str(g)) for g in range(4)]
    lone = [sample(i, gpu="9", power=200.0 + 90.0 * ((i * 7) % 5 == 0), fabric=2e10 - 1e10 * (i % 3 == 0)) for i in range(20)]
    items = [(_Track("n", w[0].gpu), w, _features(w)) for w in ranks + [lone]]
    contexts = job_contexts(items)
    assert {key: c.lockstep for key, c in contexts.items()} == {("n", str(g)): 4 for g in range(4)}
    crowd = [waits_every(4, 2, gpu=str(g)) for g in range(MAX_LOCKSTEP_GPUS + 1)]
    assert job_contexts([(_Track("n", w[0].gpu), w, _features(w)) for w in crowd]) == {}, \
        "more GPUs than a node holds are not compared pairwise"


def test_reported_step_times_that_differ_between_ranks_give_the_step_spread():
    def rank(gpu: str, length: float) -> list[GpuSample]:
        return [sample(i, gpu=gpu, report=WorkloadReport(job="j", rank=int(gpu), world_size=2, step_time_s=length))
                for i in range(20)]
    a, b = rank("0", 2.0), rank("1", 2.6)
    contexts = job_contexts([(_Track("n", "0"), a, _features(a)), (_Track("n", "1"), b, _features(b))])
    assert math.isclose(contexts[("n", "0")].step_spread, 0.6 / 2.3)
    assert contexts[("n", "0")].ranks_seen == 2 and contexts[("n", "0")].rank_skew is None, "no compute counter: no skew"


def _job(seconds: int, compute_s: int, wait_s, gpus: int = 4) -> list[GpuSample]:
    """Four ranks in lockstep with no reports; each step computes ``compute_s`` and waits ``wait_s(step)``."""
    out, step = [], 0
    schedule: list[bool] = []
    while len(schedule) < seconds:
        schedule += [False] * compute_s + [True] * wait_s(step)
        step += 1
    for g in range(gpus):
        for i in range(seconds):
            waiting = schedule[i]
            out.append(sample(i, gpu=str(g), power=140.0 if waiting else 330.0, fabric=3.6e10 if waiting else 8e9,
                              mem=0.08 if waiting else 0.4))
    return out


def test_a_counterless_job_without_reports_whose_waits_vary_is_jittered_and_says_why():
    uneven = [1, 4, 2, 1, 5, 1, 3, 1, 1, 4]
    verdicts = [v for v in classify_samples(_job(240, 2, lambda k: uneven[k % len(uneven)]))
                if v.window_end - T0 >= 120 and v.gpu == "0"]
    assert verdicts and all(v.cls == "communication_jittered" for v in verdicts), {v.cls for v in verdicts}
    last = verdicts[-1]
    assert last.basis == "fabric_and_power"
    text = " ".join(last.reasons)
    assert "power falls as fabric and NIC bytes rise" in text and "between 5 s blocks (no step reports)" in text
    assert "4 GPUs of this node rise and fall together" in text


def test_a_steady_job_with_the_same_traffic_but_even_waits_is_not_jittered_and_its_spin_is_not_small_kernels():
    verdicts = [v for v in classify_samples(_job(240, 2, lambda k: 3)) if v.window_end - T0 >= 120]
    assert verdicts and not any(v.cls == "communication_jittered" for v in verdicts)
    # Mean power is 54% of the limit (neither heavy nor light); the 83% drawn between the waits decides.
    assert {v.cls for v in verdicts} == {"compute_bound"}, {v.cls for v in verdicts}


def test_step_time_means_do_not_overflow_on_extreme_reports():
    """A report of 1e308 s per step (the fuzzer's find): the mean stays finite instead of raising."""
    from agent.classifier.jobs import _mean

    assert math.isclose(_mean([1.7e308, 1.7e308, 1.7e308]), 1.7e308)
    assert math.isclose(_mean([1.0, 2.0, 3.0]), 2.0)
