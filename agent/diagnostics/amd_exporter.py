"""``roofwatch doctor`` over AMD's Device Metrics Exporter (DME): what its exposition says about the boards and
partitions, beyond whether the profiler is on (``AmdExporterBackend.profiler_state``).

Two things in DME's output silently cost verdicts, so doctor names them with the fix:

* **A board roofwatch does not know.** DME names a GPU only by its board part number (``card_model``, amdsmi's
  ``model_number``) and optionally its product name (``card_series``); a board that neither
  :mod:`agent.backends.amd_exporter.boards` nor the catalogue knows has no FLOP peaks, so no MFU and no roofline.
  Doctor prints the value it saw and the ``specs:`` entry, keyed by that exact ``card_model``, to paste.
* **Partition rows missing or repeated.** On a partitioned GPU (DPX/QPX/CPX) some DME releases list only
  partition 0 of each GPU (ROCm/device-metrics-exporter issue #495: v1.4.1 and v1.5.0 on MI355X DPX/NPS1, 8 series
  instead of 16) or repeat a partition id. Doctor says so, and what the agent does: it reports the rows listed,
  each held to its 1/N share of the GPU's peaks; the partitions not listed are not watched at all.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from agent.model.indexes import gpu_order
from agent.diagnostics.findings import Finding
from agent.diagnostics.spec_advice import IMPACT

PARTITIONS = "amd-exporter partitions"
JOIN = "amd-exporter join"


def specs_snippet(card_model: str) -> str:
    """The ``specs:`` entry for a board DME names ``card_model`` (the whole GPU's dense peaks; ``vendor: amd``,
    which a part number does not say)."""
    return (f"specs: {{{json.dumps(card_model)}: {{vendor: amd, bf16_tflops: <dense TFLOP/s>, "
            "fp32_tflops: <TFLOP/s>, mem_bandwidth_tbs: <TB/s>}}")


def board_findings(records: Mapping[str, Any], infos: Mapping[str, Any]) -> list[Finding]:
    """One warning per board value without FLOP peaks: the ``card_model``/``card_series`` seen and the entry to add."""
    out: list[Finding] = []
    seen: set[str] = set()
    for gpu, info in infos.items():
        spec = info.spec
        if spec is not None and not spec.estimated and spec.peak_flops:
            continue
        record = records.get(gpu)
        model = getattr(record, "model", None)
        series = getattr(record, "series", None)
        name = model or series
        if name in seen:
            continue
        seen.add(name or "")
        shown = ", ".join(f"{label} {value!r}" for label, value in (("card_model", model), ("card_series", series))
                          if value) or "no card_model label"
        gpus = sorted(g for g, r in records.items() if getattr(r, "model", None) == model
                      and getattr(r, "series", None) == series)
        detail = (f"{shown} on GPU(s) {', '.join(gpus)}: not a board roofwatch knows (agent/backends/amd_exporter/"
                  "boards.py) and no catalogue name matches, so these GPUs have no FLOP peaks")
        fix = ("add the whole GPU's dense datasheet peaks (no sparsity) to the config, keyed by the exact card_model "
               "value, and restart the agent (a partition is then held to its share): " + specs_snippet(name)
               if name else "DME printed no card_model or card_series (an SR-IOV guest leaves them empty: DME "
               "docs/knownissues.md), so no specs: entry can name the board: run the amdsmi backend, which reads "
               "the ASIC's own name")
        out.append(Finding("peak specs", "warn", detail, IMPACT, fix, gpu=gpus[0] if len(gpus) == 1 else None))
    return out


def _physical(key: str, record: Any) -> str:
    return f"serial {record.serial}" if record.serial else f"GPU {key.split('/')[0]}"


def partition_findings(records: Mapping[str, Any]) -> list[Finding]:
    """A warning per kind of partition fault: partitioned GPUs listing fewer partitions than their mode has, or one
    partition id twice. Grouped by board serial (shared by a GPU's partitions), else by the agent's GPU index."""
    groups: dict[str, list[tuple[str, Any]]] = {}
    for key, record in records.items():
        if record.partitions > 1:
            groups.setdefault(_physical(key, record), []).append((key, record))
    missing, repeated = [], []
    for physical, members in sorted(groups.items()):
        ids = [r.partition if r.partition is not None else 0 for _, r in members]
        expected = members[0][1].partitions
        mode = (members[0][1].partition_type or f"{expected}x").upper()
        doubled = sorted({i for i in ids if ids.count(i) > 1})
        if doubled:
            repeated.append(f"{physical} ({mode}): partition id {', '.join(map(str, doubled))} on gpu_id "
                            f"{', '.join(r.gpu_id for _, r in members if (r.partition or 0) in doubled)}")
        if len(set(ids)) < expected and not doubled:
            listed = ", ".join(map(str, sorted(set(ids))))
            missing.append(f"{physical} ({mode}) lists partition(s) {listed} of 0-{expected - 1}")
    out = []
    if missing:
        out.append(Finding(
            PARTITIONS, "warn", f"{len(missing)} partitioned GPU(s) list fewer partitions than their mode has: "
            f"{_first(missing)}. This is the exporter fault of ROCm/device-metrics-exporter issue #495 (only "
            "gpu_partition_id 0 of each GPU; v1.4.1 and v1.5.0 on MI355X DPX/NPS1). The agent reports the partitions "
            "listed, each held to its 1/N share of the GPU's peaks, with the whole GPU's power and activity on "
            "partition 0; the partitions not listed are not watched (no sample, no verdict)",
            "every metric and verdict of the partitions not listed",
            "compare with `amd-smi list` (one entry per partition) and upgrade the exporter to a release that lists "
            "them all; meanwhile run the amdsmi backend (backend amd lists every partition itself) with "
            "amd_exporter_url set, so the listed partitions still get the profiler counters"))
    if repeated:
        out.append(Finding(
            PARTITIONS, "warn", f"a partition id repeats within one GPU: {_first(repeated)}. Such rows cannot be told "
            "apart by partition: standalone, each is reported as a GPU of its own held to 1/N of the peaks; beside "
            "amdsmi they are matched by gpu_id (amdsmi's enumeration order)",
            "which partition each row's readings belong to",
            "compare with `amd-smi list` and upgrade the exporter; the amdsmi backend names partitions by KFD's "
            "partition id itself"))
    return out


def match_findings(backend: Any) -> list[Finding]:
    """How amdsmi devices were matched to DME's (agent.backends.amd_exporter.join): a line unless all by serial."""
    matched_by = backend.matched_by()
    if matched_by == "serial+gpu_id":
        return [Finding(JOIN, "info", "board serials shared by several exporter devices (an MI250X's GCDs may read "
                        "one board FRU): those are told apart by gpu_id, amdsmi's enumeration order",
                        "a GCD's profiler counters may be its sibling's if the exporter enumerates differently")]
    if matched_by == "serial":
        return []
    found, error, _ = backend.bdf.state()
    url = backend.bdf.url
    missing = "board serials are missing (amdsmi product_serial or the exporter's serial_number label)"
    if matched_by == "bdf":
        return [Finding(JOIN, "info", f"{missing}: devices are matched by PCI address (BDF): amdsmi's against "
                        f"{url} ({len(found.bdfs) if found else 0} gpu_id(s) with a PCIeBusId)")]
    rules = backend.fallback_rules()
    by_index = sorted((g for g, rule in rules.items() if rule == "gpu_id"), key=gpu_order)
    if matched_by == "bdf+gpu_id":
        return [Finding(JOIN, "warn", f"{missing}: devices are matched by PCI address through {url}, but it does "
                        f"not list the address of {len(by_index)} device(s), matched by gpu_id (amdsmi's enumeration "
                        f"order) instead: GPU(s) {_first(by_index, 8)}", "those devices' profiler counters may be "
                        "another device's "
                        "if the exporter enumerates differently", "make the board serial readable "
                        "(amdsmi_get_gpu_board_info)")]
    why = f"{url}: {error}" if error else f"{url} lists none of these devices' PCI addresses"
    return [Finding(JOIN, "warn", f"{missing}: devices are matched by gpu_id, amdsmi's enumeration order "
                    f"(no PCI address to match: {why})", "a device's profiler counters may be another device's "
                    "if the exporter enumerates differently", "make the board serial readable "
                    "(amdsmi_get_gpu_board_info), or run Device Metrics Exporter 1.4.0 or later, whose /gpumetrics "
                    "gives each gpu_id's PCI address")]


def skipped_findings(reader: Any) -> list[Finding]:
    """The lines of the latest exposition the parser skipped (unreadable, an id label that is no index, a value
    that cannot be converted: ``gpu_total_vram 1e308``), counted, with the first and why: one info line."""
    status = reader.status()
    if not status.skipped_lines:
        return []
    return [Finding("amd-exporter", "info", f"{status.skipped_lines} line(s) of {status.url} skipped (unreadable, "
                    f"an index label that is no index, or a value that cannot be converted), the rest read; first "
                    f"{status.first_bad_line}", "the readings on the lines skipped")]


def _first(items: Iterable[str], n: int = 4) -> str:
    items = list(items)
    return "; ".join(items[:n]) + (f"; and {len(items) - n} more" if len(items) > n else "")


def standalone_findings(backend: Any) -> tuple[list[Finding], int]:
    """``--backend amd-exporter``: how many devices, then the board and partition findings of its exposition."""
    infos = backend.devices
    records = backend.reader.records()
    out = [Finding("amd-exporter backend", "ok", f"{len(infos)} GPU(s)")]
    out.extend(skipped_findings(backend.reader))
    out.extend(board_findings(records, infos))
    out.extend(partition_findings(records))
    return out, len(infos)
