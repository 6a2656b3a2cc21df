"""``python -m benchmarks.series_per_gpu [--write]``: series each GPU costs a Prometheus, by family.

Renders the exposition of each virtual layout (the demo node, NVML's H100 node, amdsmi's MI300X
node) after three collection cycles, by default and with every ``optional_metrics`` group, and
counts series per GPU family by family (per-node series shared out over the node's GPUs).
``--write`` puts the table into docs/performance.md between its markers; tests/test_optional_metrics.py
holds the default under the budget (issue 36: 60 per GPU).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

LAYOUTS = (("virtual", "demo node (8 mixed GPUs)"), ("nvml-virtual", "NVML H100 node"),
           ("amd-virtual", "amdsmi MI300X node"))
DOC = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
START, END = "<!-- series-per-gpu:start (python -m benchmarks.series_per_gpu --write) -->", "<!-- series-per-gpu:end -->"


def snapshot_of(backend: str):
    from agent.app.assemble import make_collector, open_backend_or_fail
    from agent.app.config import Settings

    settings = Settings(backend=backend)
    collector = make_collector(settings, open_backend_or_fail(settings))
    try:
        for _ in range(3):
            snapshot = collector.collect_once()
    finally:
        collector.stop()
    return snapshot


def family_counts(snapshot, optional: tuple[str, ...] = ()) -> Counter[str]:
    """Series per family of one snapshot's exposition."""
    from exporters.encoding import encode_exposition
    from exporters.prometheus import SnapshotCollector

    text = encode_exposition(SnapshotCollector(lambda: snapshot, optional_metrics=optional), generate_latest).decode()
    return Counter({f.name: len(f.samples) for f in text_string_to_metric_families(text) if f.samples})


def breakdown() -> str:
    """The markdown table: families as rows, each layout's series per GPU by default and with all groups."""
    from exporters.metrics import OPTIONAL_GROUPS

    columns = []
    for backend, _ in LAYOUTS:
        snapshot = snapshot_of(backend)
        gpus = len(snapshot.devices)
        columns.append((gpus, family_counts(snapshot), family_counts(snapshot, tuple(OPTIONAL_GROUPS))))
    names = sorted({n for _, d, a in columns for n in (*d, *a)}, key=lambda n: (-max(a[n] / g for g, _, a in columns), n))
    head = "| family | " + " | ".join(f"{title}: default / all groups" for _, title in LAYOUTS) + " |"
    rows = [head, "|---|" + "---|" * len(LAYOUTS)]
    for name in names:
        cells = [f"{d[name] / g:.3g} / {a[name] / g:.3g}" if a[name] else "" for g, d, a in columns]
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    totals = [f"**{sum(d.values()) / g:.1f}** / {sum(a.values()) / g:.1f}" for g, d, a in columns]
    rows.append("| **series per GPU** | " + " | ".join(totals) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update the table in docs/performance.md")
    args = parser.parse_args(argv)
    text = breakdown()
    if not args.write:
        print(text)
        return 0
    doc = DOC.read_text(encoding="utf-8")
    before, start, rest = doc.partition(START)
    _, end, after = rest.partition(END)
    if not (start and end):
        print(f"{DOC} lacks the markers {START} ... {END}", file=sys.stderr)
        return 1
    DOC.write_text(f"{before}{START}\n{text}\n{END}{after}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
