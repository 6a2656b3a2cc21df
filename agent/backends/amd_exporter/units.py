"""The units of the Device Metrics Exporter series this backend reads, and which values cannot be converted from them.

DME prints VRAM in MB (amdsmi's MB: MiB), XGMI link data in KB (1024 bytes), profiler sizes in KiB and counts per
window (``agent.backends.amd_exporter.mapping`` has the sources). On the way into a sample each is multiplied into
bytes, bytes per second or operations per second, and some become integers (``int(vram * MIB)``). A value that is
finite in the exposition can still be past what that product holds: ``gpu_total_vram 1e308`` is ``inf`` bytes, and
``int(inf)`` raised ``OverflowError`` at start-up (every GPU lost with it) or, for ``gpu_used_vram``, on every cycle
(the GPU marked down for as long as the value lasted). NaN cannot become a count at all.

So the parser asks :func:`unconvertible` for each series it reads and skips a line whose value cannot be converted,
counting it with the series named (the exposition's skipped lines, which ``doctor`` shows), like a line whose index
label is no index; every other reading of that GPU is kept. A value that converts but is absurd (1e308 W) is not
judged here: that is the physical bounds every backend's samples pass through.
"""

from __future__ import annotations

import math

from agent.backends.amd.values import COMPUTE_PARTITION_COUNTS
from agent.backends.amd_exporter.names import READ

MIB = 1024 * 1024
"""DME's (amdsmi's) MB of VRAM, in bytes."""
KIB = 1024
"""DME's KB of XGMI data and the profiler's kilobytes, in bytes."""
MIN_WINDOW_US = 1.0
"""The shortest profiler window the setting ``amd_exporter_profiler_window_us`` allows: counts are divided by it."""
_PER_SECOND = 1e6 / MIN_WINDOW_US

LARGEST_FACTOR: dict[str, tuple[float, str]] = {
    "gpu_total_vram": (MIB * max(COMPUTE_PARTITION_COUNTS.values()), "bytes (x a GPU's partitions)"),
    "gpu_used_vram": (MIB, "bytes"),
    "gpu_free_vram": (MIB, "bytes"),
    "gpu_xgmi_link_rx": (KIB, "bytes"),
    "gpu_xgmi_link_tx": (KIB, "bytes"),
    **{f"gpu_prof_total_{bits}_ops": (_PER_SECOND, "operations per second") for bits in (16, 32, 64)},
    "gpu_prof_fetch_size": (2 * KIB * _PER_SECOND, "HBM bytes per second (fetched + written)"),
    "gpu_prof_write_size": (2 * KIB * _PER_SECOND, "HBM bytes per second (fetched + written)"),
}
"""Series -> the largest factor the mapping multiplies it by, and what it becomes. Every other series read keeps its
unit or shrinks (percent to a ratio, uJ to J): only a non-finite value of those cannot be converted."""


def unconvertible(name: str, value: float) -> str | None:
    """Why the value of series ``name`` (a 1.4+ name, prefix taken off) cannot become a sample field, or None when
    it can (or the backend does not read the series)."""
    if name not in READ:
        return None
    if not math.isfinite(value):
        return f"{name} {value}: not a finite number"
    factor, unit = LARGEST_FACTOR.get(name, (1.0, ""))
    if not math.isfinite(value * factor):
        return f"{name} {value:g}: too large to convert to {unit}"
    return None
