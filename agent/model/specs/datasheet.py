"""One catalogue entry written in datasheet units (TFLOP/s, TB/s, GiB, GB/s per direction), stored in SI units.

Entries are typed the way the vendor prints them so each can be checked against its source by eye;
the conversion to the model's SI units happens once, here.
"""

from __future__ import annotations

from agent.model import GpuSpec, Vendor

TERA = 1e12


GIB = 2**30


def datasheet_spec(key: str, name: str, vendor: Vendor, *, bf16: float | None = None, fp8: float | None = None,
          fp16: float | None = None, tf32: float | None = None, fp32: float | None = None, fp64: float | None = None,
          hbm_tbs: float | None, mem_gib: float | None, tdp: float | None, sms: int | None,
          ref: float | None, max_clk: float | None, link_gbs: float | None = None,
          pci: tuple[int, ...] = (), notes: str = "") -> GpuSpec:
    """One entry in datasheet units (TFLOP/s, TB/s, GiB, GB/s per direction) -> SI units.

    FP16 equals BF16 unless given: gpu-specs.md §2 lists them as one "BF16/FP16 TC" column. Only
    GPUs without BF16 tensor cores (Volta, Turing) give ``fp16`` alone, and then have no BF16 peak.
    """
    tflops = {"fp8": fp8, "bf16": bf16, "fp16": bf16 if fp16 is None else fp16, "tf32": tf32,
              "fp32": fp32, "fp64": fp64}
    return GpuSpec(
        key=key, name=name, vendor=vendor,
        peak_flops={k: v * TERA for k, v in tflops.items() if v is not None},
        mem_bandwidth_bytes_per_s=hbm_tbs * TERA if hbm_tbs else None,
        memory_bytes=round(mem_gib * GIB) if mem_gib else None,
        tdp_w=tdp, sm_count=sms, ref_clock_mhz=ref, max_clock_mhz=max_clk,
        link_bandwidth_bytes_per_s=link_gbs * 1e9 if link_gbs else None,
        pci_device_ids=pci, notes=notes,
    )
