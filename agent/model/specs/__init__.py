"""GPU peak-spec catalogue: dense vendor peaks, lookup by PCI id / name, run-time estimates.

Why a static table: tensor-core peaks cannot be read from NVML or amdsmi, and they are quoted at
a clock that is *not* the max clock the driver reports (H100 SXM: 989.4 TFLOP/s BF16 = 540,672
FLOP/clk x 1.83 GHz, while NVML reports 1.98 GHz). Everything here follows
../shared/reference/gpu-specs.md ("§2" etc. below), with these rules:

* Dense peaks only. Datasheets print "with sparsity" numbers that are 2x and would halve MFU.
* Per device: each MI250X GCD is its own device, so the module values are halved.
* A missing dtype key means unknown/unsupported, never zero, and nothing is guessed: a lookup that
  does not match returns None; estimates carry ``estimated=True`` and no tensor peaks.
* ``memory_bytes`` is the marketing size read as GiB (80 GB -> 80 GiB). Drivers report a little
  less (H100 80GB: 81559 MiB), so memory matching tolerates +-15%.
* PCI ids were checked against pci.ids (pciutils/pciids, version 2026.05.24) unless noted.
"""

from agent.model.specs.catalogue import CATALOGUE
from agent.model.specs.lookup import estimate_spec, lookup, normalise_name, resolve_spec, spec_by_key
from agent.model.specs.slices import (
    MIG_COMPUTE_SLICES,
    mig_compute_slices,
    mig_name_spec,
    mig_profile,
    mig_slice_spec,
    partition_slice_spec,
    scale_spec,
)
from agent.model.specs.throughput import achieved_flops, clock_factor

__all__ = ["CATALOGUE", "MIG_COMPUTE_SLICES", "achieved_flops", "clock_factor", "estimate_spec", "lookup",
           "mig_compute_slices", "mig_name_spec", "mig_profile", "mig_slice_spec", "normalise_name", "partition_slice_spec", "resolve_spec", "scale_spec",
           "spec_by_key"]
