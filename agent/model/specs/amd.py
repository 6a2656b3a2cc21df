"""AMD Instinct entries of the peak-spec catalogue (CDNA2/3/4, dense figures), each with its source."""

from __future__ import annotations

from agent.model import GpuSpec
from agent.model.specs.datasheet import datasheet_spec as _spec

AMD: tuple[GpuSpec, ...] = (
    # --- AMD CDNA2/3/4 (dense figures from AMD). XGMI per-direction bandwidth not confirmed: None.
    # pci.ids: 7408 "[Instinct MI250X]"; 740c "[Instinct MI250X/MI250]" is shared with the
    # uncatalogued MI250 (104 CUs per GCD), so lookup only trusts 740c with a CU count of 110.
    _spec("mi250x", "AMD Instinct MI250X (per GCD)", "amd", bf16=191.5, fp32=23.95, fp64=47.85,
          hbm_tbs=1.6, mem_gib=64, tdp=560, sms=110, ref=1700, max_clk=1700, pci=(0x7408, 0x740C),
          notes="§2 module values halved: each GCD is one device. No TF32 (FP32 matrix 95.7/module "
          "is not TF32). FP64 = FP64 matrix 95.7 TF/module (AMD MI200 table) halved. TDP = whole "
          "OAM (500-560 W; 560 for MI250X): power is read per package. ref derived: 191.5e12 / "
          "(110 CU x 1024 FLOP/clk) = 1700 MHz peak engine clock."),
    _spec("mi300x", "AMD Instinct MI300X", "amd", bf16=1307.4, fp8=2614.9, tf32=653.7,
          fp32=163.4, fp64=163.4, hbm_tbs=5.3, mem_gib=192, tdp=750, sms=304, ref=2100,
          max_clk=2100, pci=(0x74A1,),
          notes="§2 (AMD data sheet, recalled; cross-checked with MI325X = same compute). FP64 = "
          "FP64 matrix peak (AMD). ref derived: 1307.4e12 / (304 CU x 2048 FLOP/clk) = 2100 MHz "
          "peak engine clock."),
    _spec("mi325x", "AMD Instinct MI325X", "amd", bf16=1307.4, fp8=2614.9, tf32=653.7,
          fp32=163.4, fp64=163.4, hbm_tbs=6.0, mem_gib=256, tdp=1000, sms=304, ref=2100,
          max_clk=2100, pci=(0x74A5,),
          notes="§2 (AMD spec: FP8 2614.9, FP16 1307.4, TF32 653.7). Same compute as MI300X. "
          "FP64 = FP64 matrix peak (AMD). ref derived as for MI300X."),
    _spec("mi355x", "AMD Instinct MI355X", "amd", bf16=2500, fp8=5000, fp32=157.3, hbm_tbs=8.0,
          mem_gib=288, tdp=1400, sms=256, ref=2384, max_clk=2400, pci=(0x75A3,),
          notes="§2: BF16 ~2.5 PF / FP8 ~5 PF dense (ISSCC: 256 CU x 8192 FP8 FLOP/clk). ref "
          "derived: 5e15 / (256 x 8192) = 2384 MHz; max 2400 MHz. FP32 157.3 was recalled, not "
          "read from a source (unconfirmed). TF32 not listed (believed removed in CDNA4). FP64 "
          "omitted (unconfirmed)."),
)
