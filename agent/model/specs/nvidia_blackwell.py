"""NVIDIA Blackwell entries of the peak-spec catalogue (B200, GB200, B300, GB300, RTX PRO 6000), each with its source.

NVIDIA prints Blackwell tensor rows "with sparsity" (gpu-specs.md §1): every tensor figure here is
the printed one halved. The data-centre parts' tensor peaks do not divide into a power-of-two
FLOP/clk per SM at a published clock, so their reference clocks are left unknown (the clock credit
in throughput.clock_factor is then 1) rather than guessed. Links are NVLink5: 1.8 TB/s
bidirectional, 900 GB/s per direction.
"""

from __future__ import annotations

from agent.model import GpuSpec
from agent.model.specs.datasheet import datasheet_spec as _spec

_ULTRA = ("Per-GPU dense table of the Blackwell Ultra datasheet, via verda.com (GB300 vs B300 vs "
          "GB200 vs B200, 'without sparsity'); FP64 near zero on Blackwell Ultra. SM count and clocks "
          "not published by NVIDIA: unknown. ")
_RTX_PRO = ("NVIDIA RTX PRO 6000 Blackwell (GTC 2025; topcpu.net and gpu.name copies): 188 SMs "
            "(24,064 CUDA cores), 96 GB GDDR7 at 1,792 GB/s, 125 TF FP32 and 4,000 AI TOPS (FP4 with "
            "sparsity), the same core specs for every edition (yottalabs lists 1,792 GB/s for the "
            "Server Edition too). TDP 600 W is the Workstation Edition's; the Server Edition's is "
            "assumed equal (not confirmed). Dense tensor peaks derived: 4000 / 2 (sparsity) / 2 "
            "(FP4->FP8) = ~1000 TF FP8, BF16 half of that (FP32 accumulate at full rate on RTX PRO), "
            "TF32 half of BF16; ref clock derived: 503.8e12 / (188 SM x 1024 FLOP/clk) = 2617 MHz, "
            "matching FP32 125.95 = 188 x 256 x 2.617 GHz (hmc-tech's derived table). FP64 (1/64) "
            "not listed. No NVLink. The Max-Q Workstation Edition (2bb4, 300 W, lower clocks) is not "
            "catalogued.")


NVIDIA_BLACKWELL: tuple[GpuSpec, ...] = (
    # §2 B200 (HGX). pci.ids: 2901 "GB100 [B200]" (2909 "HGX B200 168GB" is another SKU).
    _spec("b200", "NVIDIA B200", "nvidia", bf16=2250, fp8=4500, tf32=1100, fp32=75,
          hbm_tbs=7.7, mem_gib=180, tdp=1000, sms=148, ref=1980, max_clk=1980, link_gbs=900,
          pci=(0x2901,), notes="§2 (HGX B200). 148 SMs @ 1980 MHz from third-party spec pages, "
          "consistent with FP32 75 TF = 148 x 256 x 1.98 GHz. The tensor peak does not divide "
          "into a power-of-two FLOP/clk, so ref clock = boost clock (an estimate). FP64 omitted "
          "(37 vs 40 TF quoted by different sources)."),
    # GB200: one Blackwell GPU of a Grace-Blackwell superchip. pci.ids 2941 "GB100 [HGX GB200]";
    # NVIDIA driver README 595.45.04: "NVIDIA GB200" 2941.
    _spec("gb200", "NVIDIA GB200 (per GPU)", "nvidia", bf16=2500, fp8=5000, tf32=1250, fp32=80,
          fp64=40, hbm_tbs=8.0, mem_gib=186, tdp=1200, sms=None, ref=None, max_clk=None,
          link_gbs=900, pci=(0x2941,),
          notes="NVIDIA GB200 NVL72 table, 'Individual Blackwell GPU Specifications' (zdszero.github.io "
          "copy): FP16/BF16 5 PF, FP8 10 PF, TF32 2.5 PF (all with sparsity, halved here), FP32 80 "
          "TF, FP64 40 TF, 186 GB HBM3E at 8 TB/s, TDP configurable up to 1,200 W (the upper bound "
          "kept). SM count and clocks not published: unknown."),
    # B300: the HGX (air-cooled board) part. pci.ids 3182 "GB110 [B300 SXM6 AC]"; NVML name from the
    # NVIDIA driver README: "NVIDIA B300 SXM6 AC".
    _spec("b300", "NVIDIA B300 SXM6 AC", "nvidia", bf16=2250, fp8=4500, tf32=1100, fp32=75,
          fp64=1.25, hbm_tbs=8.0, mem_gib=270, tdp=1100, sms=None, ref=None, max_clk=None,
          link_gbs=900, pci=(0x3182,),
          notes=_ULTRA + "B300: BF16 2.25 PF, FP8 4.5 PF, TF32 1.1 PF dense, FP32 75 TF, 270 GB "
          "HBM3E, 1.1 kW. FP64 1.25 TF from the HGX B300 table (glennklockwood.com/garden/processors/"
          "B300: 10 TF per HGX board). Bandwidth: 8 TB/s (glennklockwood; verda lists 7.7)."),
    # GB300: one Blackwell Ultra GPU of a Grace-Blackwell Ultra superchip (NVL72). pci.ids 31c2 and
    # 31c3 "GB110 [GB300]" (31a1 "GB300 MaxQ" not catalogued); driver README: "NVIDIA GB300" 31C2.
    _spec("gb300", "NVIDIA GB300 (per GPU)", "nvidia", bf16=2500, fp8=5000, tf32=1250, fp32=80,
          hbm_tbs=8.0, mem_gib=279, tdp=1400, sms=None, ref=None, max_clk=None, link_gbs=900,
          pci=(0x31C2, 0x31C3),
          notes=_ULTRA + "GB300: BF16 2.5 PF, FP8 5 PF, TF32 1.25 PF dense, FP32 80 TF, 279 GB HBM3E "
          "at 8 TB/s, 1.4 kW (NVL72: 576 TB/s / 72 GPUs = 8 TB/s). FP64 not given per GPU: unknown."),
    # RTX PRO 6000 Blackwell (GB202). pci.ids: 2bb1 "Workstation Edition", 2bb5 "Server Edition".
    _spec("rtx-pro-6000-blackwell", "NVIDIA RTX PRO 6000 Blackwell", "nvidia", bf16=503.8,
          fp8=1007.6, tf32=251.9, fp32=125.95, hbm_tbs=1.792, mem_gib=96, tdp=600, sms=188,
          ref=2617, max_clk=2617, pci=(0x2BB1, 0x2BB5), notes=_RTX_PRO),
)
