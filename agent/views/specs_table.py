"""``roofwatch specs``: the peak-spec catalogue as an aligned table or as JSON, with ridge points."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from agent.model import DTYPES, GpuSpec
from agent.model.specs import CATALOGUE
from agent.model.specs.datasheet import GIB, TERA


def _fmt(value: float | None, scale: float, digits: int) -> str:
    return "—" if value is None else f"{value / scale:.{digits}f}"


_COLUMNS = ("key", "name", "BF16 TF/s", "FP8 TF/s", "TF32 TF/s", "FP32 TF/s", "HBM TB/s",
            "Mem GiB", "TDP W", "Ridge BF16", "PCI ids")


def _half(spec: GpuSpec) -> str:
    """BF16, or FP16 marked ``*`` on GPUs whose tensor cores have no BF16 (V100, T4)."""
    return "fp16" if "bf16" not in spec.peak_flops and "fp16" in spec.peak_flops else "bf16"


def _row(spec: GpuSpec) -> tuple[str, ...]:
    p, half = spec.peak_flops, _half(spec)
    mark = "*" if half == "fp16" else ""
    return (spec.key, spec.name + (" (estimated)" if spec.estimated else ""),
            _fmt(p.get(half), TERA, 1) + mark, _fmt(p.get("fp8"), TERA, 1), _fmt(p.get("tf32"), TERA, 1),
            _fmt(p.get("fp32"), TERA, 1), _fmt(spec.mem_bandwidth_bytes_per_s, TERA, 3),
            _fmt(spec.memory_bytes, GIB, 0), _fmt(spec.tdp_w, 1, 0),
            _fmt(spec.ridge_point(half), 1, 0) + mark,
            ",".join(f"{i:04x}" for i in spec.pci_device_ids) or "—")


def specs_table(specs: Sequence[GpuSpec] = CATALOGUE) -> str:
    """Aligned plain-text table for ``roofwatch specs`` (dense peaks; ridge in FLOP/byte; ``*``: FP16,
    the GPU has no BF16 tensor cores)."""
    rows = [_COLUMNS, *(_row(s) for s in specs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        text = (c.ljust(w) if i < 2 or i == len(cells) - 1 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(text).rstrip()

    return "\n".join([line(_COLUMNS), line(["-" * w for w in widths]), *(line(r) for r in rows[1:])])


def specs_json(specs: Sequence[GpuSpec] = CATALOGUE) -> list[dict[str, object]]:
    """JSON-serialisable catalogue in SI units, with ridge points (FLOP/byte) per known dtype."""
    out: list[dict[str, object]] = []
    for s in specs:
        entry = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
        entry["peak_flops"] = {d: s.peak_flops[d] for d in DTYPES if d in s.peak_flops}
        entry["pci_device_ids"] = [f"0x{i:04x}" for i in s.pci_device_ids]
        entry["ridge_points"] = {d: s.ridge_point(d) for d in DTYPES if d in s.peak_flops
                                 and s.ridge_point(d) is not None}
        out.append(entry)
    return out
