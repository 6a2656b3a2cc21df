"""One report from several stores: ``--prometheus`` given once per cluster when there is no global store.

Each store answers the same queries (the per-GPU report, or ``--source aggregates``) over the same window, under
the command's one deadline; their answers are merged here. Every figure of a report is additive over
disjoint sets of GPUs (GPU-hours per class and per waste label, their cost, energy, the MFU histogram's busy
GPU-hours per bucket), except the means, which are weighted back together by the busy GPU-hours they are means
over, and the ranked tables, which are re-ranked and cut to ``--top``. So a fleet split across stores gives
the report of one store holding all of it (tests/test_fleet_report_global.py), provided each cluster's series
are in one store only (a cluster in two stores would count twice).

A store that does not answer does not stop the others: it is listed on the page as a problem naming the store
(its URL without credentials), and the figures are those of the stores that answered.
"""

from __future__ import annotations

from agent.views.fleet_report.collect import FleetReport, _totals
from agent.views.fleet_report.data import Group, Problem, percentile, share_below

RANKED = ("stragglers", "named_stragglers", "jitter", "alerts")


def merge(reports: list[FleetReport], failed: list[Problem], top: int) -> FleetReport:
    """``reports`` (at least one: their window, prices and source are the first's) as one, with ``failed``
    (the stores that did not answer) listed among the problems."""
    first = reports[0]
    out = FleetReport(window=first.window, cluster=first.cluster, prices=first.prices, source=first.source,
                      generated=first.generated)
    for report in reports:
        out.fleet += report.fleet
        out.held += report.held
        out.users += report.users
        out.namespaces += report.namespaces
        out.accounts += report.accounts
        out.jobs += report.jobs
        out.problems += report.problems
        out.queries += report.queries
        out.not_run += report.not_run
        for name in RANKED:
            getattr(out, name).extend(getattr(report, name))
        for section, note in report.notes.items():
            out.notes.setdefault(section, note)
    out.problems += failed
    out.deadline_s = first.deadline_s
    for tables in (out.fleet, out.held, out.users, out.namespaces, out.accounts):
        tables.sort(key=_by_waste)
    out.jobs = sorted(out.jobs, key=_by_waste)[:top]
    for name in RANKED:
        setattr(out, name, sorted(getattr(out, name), key=lambda r: -float(r["hours"]))[:top])  # type: ignore[arg-type]
    if any(r.namespaces for r in reports):  # one store outside Kubernetes is not the fleet's note
        out.notes.pop("Waste by namespace", None)
    if any(r.accounts for r in reports):  # nor one store outside Slurm
        out.notes.pop("Bill by account", None)
    out.mfu = _mfu([r.mfu for r in reports])
    out.energy = _energy([r.energy for r in reports])
    out.previous = _previous([r.previous for r in reports])
    return out


def _by_waste(group: Group) -> tuple[float, float, tuple[str, ...]]:
    return (-group.wasted_cost, -group.wasted, tuple(group.key.values()))


def _weighted(pairs: list[tuple[object, object]]) -> float | None:
    """The mean of means ``(mean, weight)``, weighted; None where no mean has weight."""
    known = [(float(m), float(w)) for m, w in pairs if isinstance(m, (int, float)) and isinstance(w, (int, float)) and w > 0]
    total = sum(w for _, w in known)
    return round(sum(m * w for m, w in known) / total, 6) if total > 0 else None


def _mfu(parts: list[dict[str, object]]) -> dict[str, object]:
    histogram: dict[int, float] = {}
    by_cluster: dict[str, object] = {}
    for part in parts:
        for bucket, hours in dict(part.get("histogram") or {}).items():  # type: ignore[call-overload]
            histogram[int(bucket)] = histogram.get(int(bucket), 0.0) + float(hours)
        by_cluster.update(dict(part.get("by_cluster") or {}))  # type: ignore[call-overload]
    busy = sum(float(p.get("busy_gpu_hours") or 0.0) for p in parts)  # type: ignore[arg-type]
    merged = {**(parts[0] if parts else {}), "busy_gpu_hours": round(busy, 6), "by_cluster": by_cluster,
              "histogram": {str(b): round(h, 6) for b, h in sorted(histogram.items())},
              "mean": _weighted([(p.get("mean"), p.get("busy_gpu_hours")) for p in parts])}
    if histogram:
        merged.update({"p10": _round(percentile(histogram, 0.1)), "p50": _round(percentile(histogram, 0.5)),
                       "p90": _round(percentile(histogram, 0.9)),
                       "below_target_share": _round(share_below(histogram, float(merged.get("target") or 0.4)))})
    return merged


def _energy(parts: list[dict[str, object]]) -> dict[str, object]:
    answered = [p for p in parts if "kwh" in p]
    if not answered:
        return {}
    by_cluster: dict[str, object] = {}
    for part in answered:
        by_cluster.update(dict(part.get("by_cluster") or {}))  # type: ignore[call-overload]
    return {"kwh": round(sum(float(p["kwh"]) for p in answered), 6), "by_cluster": by_cluster}  # type: ignore[arg-type]


ADDITIVE = ("gpu_hours", "held_gpu_hours", "wasted_gpu_hours", "idle_allocated_gpu_hours", "spare_gpu_hours",
            "wasted_cost_usd", "cost_usd", "useful_gpu_hours")


def _previous(parts: list[dict[str, object]]) -> dict[str, object]:
    """The previous period's totals, summed; its busy MFU weighted by each store's useful GPU-hours (the
    previous period keeps no histogram), and kWh per useful GPU-hour from the sums."""
    answered = [p for p in parts if p]
    if not answered:
        return {}
    out: dict[str, object] = {"start": answered[0].get("start"), "end": answered[0].get("end")}
    out.update(_totals([], [], {}, {}))
    for key in ADDITIVE:
        out[key] = round(sum(float(p.get(key) or 0.0) for p in answered), 6)  # type: ignore[arg-type]
    classes: dict[str, float] = {}
    for part in answered:
        for cls, hours in dict(part.get("gpu_hours_by_class") or {}).items():  # type: ignore[call-overload]
            classes[cls] = classes.get(cls, 0.0) + float(hours)
    out["gpu_hours_by_class"] = {c: round(h, 6) for c, h in classes.items()}
    energies = [p.get("energy_kwh") for p in answered if isinstance(p.get("energy_kwh"), (int, float))]
    out["energy_kwh"] = round(sum(energies), 6) if energies else None  # type: ignore[arg-type]
    useful = float(out["useful_gpu_hours"])  # type: ignore[arg-type]
    out["kwh_per_useful_gpu_hour"] = (round(float(out["energy_kwh"]) / useful, 6)  # type: ignore[arg-type]
                                      if out["energy_kwh"] is not None and useful > 0 else None)
    out["mfu_mean"] = _weighted([(p.get("mfu_mean"), p.get("useful_gpu_hours")) for p in answered])
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
