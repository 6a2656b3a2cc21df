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
    # CDNA4 MI350X: the air-cooled MI355X sibling. pci.ids: 75a0 "Aqua Vanjaram [Instinct MI350X]".
    _spec("mi350x", "AMD Instinct MI350X", "amd", bf16=2306.9, fp8=4613.7, fp32=144.2, fp64=72.1,
          hbm_tbs=8.0, mem_gib=288, tdp=1000, sms=256, ref=2200, max_clk=2200, pci=(0x75A0,),
          notes="AMD Hot Chips 2025 (wccftech, thefilibusterblog copies): MI350X 1000 W TBP, max "
          "clock 2.2 GHz, 288 GB HBM3E at 8 TB/s, 256 CUs (8 XCDs). Peaks derived at that clock "
          "with the CDNA4 rates behind the MI355X entry: 256 CU x 4096 BF16 FLOP/clk x 2.2 GHz = "
          "2306.9 TF (AMD: 2.3 PF), x 8192 FP8 = 4613.7 TF, FP32 vector 256 x 256 x 2.2 GHz = "
          "144.2 TF, FP64 vector half of FP32 = 72.1 TF. No TF32 hardware in CDNA4 (emulated with "
          "BF16: webtagr.com, AMD interview). XGMI per-direction bandwidth not confirmed: None."),
    # CDNA3 MI308X: an MI300X-family part for China. pci.ids: 74a2 "Aqua Vanjaram [Instinct MI308X]".
    _spec("mi308x", "AMD Instinct MI308X", "amd", hbm_tbs=None, mem_gib=None, tdp=None, sms=80,
          ref=None, max_clk=None, pci=(0x74A2,),
          notes="No AMD data sheet found. 80 CUs (gfx942) from an amd-smi report of an MI308X node "
          "(third-party log). Memory size, peaks, bandwidth, clocks and TDP unknown: all FLOP peaks left out rather than scaled from "
          "MI300X (80/304 CUs x MI300X would be ~344 TF BF16 at 2.1 GHz, an unconfirmed guess). "
          "Set them with a `specs` override in the config once measured."),
)
