"""NVIDIA entries of the peak-spec catalogue (Ampere, Hopper, Ada), each with its source.

Volta/Turing live in nvidia_volta_turing.py and Blackwell in nvidia_blackwell.py (one module per
file-size budget, not per rule: all entries follow the same datasheet conventions).
"""

from __future__ import annotations

from agent.model import GpuSpec
from agent.model.specs.datasheet import datasheet_spec as _spec

_FP64_NV = "FP64 = FP64 tensor peak from the NVIDIA datasheet (not in gpu-specs.md). "
_A100 = ("§2 (A100 datasheet r4). " + _FP64_NV + "ref clock derived: 312e12 / (108 SM x 2048 "
         "FLOP/clk) = 1410 MHz, the boost clock.")
_HOPPER = ("ref clock from §4: 989.4e12 = 540,672 FLOP/clk (132 SM x 4096) x 1.83 GHz; max boost "
           "1.98 GHz. " + _FP64_NV)
_GH200 = ("§2 (not confirmed). TDP unknown: 450-1000 W is the whole module. GPU-to-GPU NVLink "
          "depends on the system: unknown. " + _HOPPER)
_H800 = ("H800 = the H100 die with NVLink limited to 400 GB/s bidirectional (200 per direction) and "
         "FP64 to ~1 TF (third-party: aiwiki.ai/wiki/nvidia_h800, philisun.com; no NVIDIA PDF found). ")
_RTX_ADA_DENSE = ("Dense peaks derived as for rtx-6000-ada: the tensor figure (FP8 with sparsity) / 2 = FP8, "
                  "BF16 half of that (FP32 accumulate at full rate on RTX Ada), TF32 half of BF16. ")
_RTX_4000_ADA = (
    "NVIDIA RTX 4000 Ada Generation datasheet (scribd copy): 6,144 CUDA cores (48 SMs), 192 tensor cores, "
    "20 GB GDDR6; 26.7 TF FP32 and 130 W (huggingface.co/hardware/rtx-4000-ada), 160-bit bus at 360 GB/s "
    "(technical.city), boost 2175 MHz (siliconcat.net). Tensor 327.6 TF (FP8 with sparsity) recalled from "
    "NVIDIA's product page and quoted by a third-party MFU script, not re-read from the PDF: confirm. "
    + _RTX_ADA_DENSE + "327.6 implies 1666 MHz at 4096 sparse FP8 FLOP/clk/SM (the rate rtx-6000-ada and "
    "rtx-2000-ada fit at their boost clocks), not the 2175 MHz boost that FP32 26.7 = 48 x 256 x 2.175 GHz "
    "fits, so the ref clock is left unknown (no clock credit) rather than guessed. Bandwidth checked on the "
    "published linode capture: DCGM memory clock 9001 MHz x 2 (DDR) x 160 bit / 8 = 360 GB/s; the same "
    "capture reads 2310 MHz SM clock under load (past the rated boost). No NVLink.")
_RTX_2000_ADA = (
    "NVIDIA RTX 2000 Ada Generation datasheet (itcreations.com and svethardware.cz copies): 2,816 CUDA cores "
    "(22 SMs), 88 tensor cores, 16 GB GDDR6 on 128 bit at 224 GB/s, 12.0 TF FP32, 191.9 TF tensor (FP8 with "
    "sparsity), 70 W, boost 2130 MHz; all rated at the boost clock. " + _RTX_ADA_DENSE + "Check: 22 x 1024 "
    "FLOP/clk x 2.13 GHz = 47.98 TF BF16 and 22 x 256 x 2.13 GHz = 12.0 TF FP32, so ref = boost. PCI id "
    "28b0 is shared with the RTX 2000E Ada Generation (not catalogued: its peaks were not sourced), so it "
    "matches only with this driver name. No NVLink.")


NVIDIA: tuple[GpuSpec, ...] = (
    # --- NVIDIA Ampere: gpu-specs.md §2 A100 rows; link = NVLink3 600 GB/s bidirectional.
    _spec("a100-sxm-40gb", "NVIDIA A100 SXM4 40GB", "nvidia", bf16=312, tf32=156, fp32=19.5,
          fp64=19.5, hbm_tbs=1.555, mem_gib=40, tdp=400, sms=108, ref=1410, max_clk=1410,
          link_gbs=300, pci=(0x20B0,), notes=_A100),
    _spec("a100-sxm-80gb", "NVIDIA A100 SXM4 80GB", "nvidia", bf16=312, tf32=156, fp32=19.5,
          fp64=19.5, hbm_tbs=2.039, mem_gib=80, tdp=400, sms=108, ref=1410, max_clk=1410,
          link_gbs=300, pci=(0x20B2,), notes=_A100),
    # pci.ids lists both 20b1 and 20f1 as "GA100 [A100 PCIe 40GB]". NVLink bridge optional: None.
    _spec("a100-pcie-40gb", "NVIDIA A100 PCIe 40GB", "nvidia", bf16=312, tf32=156, fp32=19.5,
          fp64=19.5, hbm_tbs=1.555, mem_gib=40, tdp=250, sms=108, ref=1410, max_clk=1410,
          pci=(0x20F1, 0x20B1), notes=_A100),
    _spec("a100-pcie-80gb", "NVIDIA A100 PCIe 80GB", "nvidia", bf16=312, tf32=156, fp32=19.5,
          fp64=19.5, hbm_tbs=1.935, mem_gib=80, tdp=300, sms=108, ref=1410, max_clk=1410,
          pci=(0x20B5,), notes=_A100),
    # A30 (GA100, 56 SMs). pci.ids: 20b7 "GA100GL [A30 PCIe]" (20b9 A30X not catalogued); driver
    # README: "NVIDIA A30" 20B7. Link: NVLink3 bridge 200 GB/s bidirectional, between a pair only.
    _spec("a30", "NVIDIA A30", "nvidia", bf16=165, tf32=82, fp32=10.3, fp64=10.3, hbm_tbs=0.933,
          mem_gib=24, tdp=165, sms=56, ref=1440, max_clk=1440, link_gbs=100, pci=(0x20B7,),
          notes="NVIDIA A30 datasheet: BF16/FP16 165, TF32 82 TF (330/165 with sparsity), FP32 "
          "10.3, FP64 tensor 10.3 (FP64 vector 5.2), 24 GB HBM2 at 933 GB/s, 165 W, NVLink 200 "
          "GB/s. Tensor and bandwidth figures recalled from the datasheet, not re-read (no copy found): "
          "confirm; 24 GB, 10.32 TF FP32 and 165 W match huggingface.co/hardware/a30. 56 "
          "SMs; ref derived: 165e12 / (56 x 2048 FLOP/clk) = 1439 ~ 1440 MHz boost."),
    # A40 (GA102, 84 SMs). pci.ids: 2235 "GA102GL [A40]"; driver README: "NVIDIA A40" 2235.
    _spec("a40", "NVIDIA A40", "nvidia", bf16=149.7, tf32=74.8, fp32=37.4, hbm_tbs=0.696,
          mem_gib=48, tdp=300, sms=84, ref=1740, max_clk=1740, link_gbs=56.25, pci=(0x2235,),
          notes="NVIDIA A40 datasheet (ecer.com copy, '*' = with sparsity): BF16 149.7 | 299.4*, "
          "TF32 74.8 | 149.6*, FP32 37.4, 48 GB GDDR6 at 696 GB/s, 300 W, NVLink 112.5 GB/s "
          "bidirectional (a bridged pair) -> 56.25 per direction. 84 SMs; ref derived: 149.7e12 / "
          "(84 x 1024 FLOP/clk) = 1740 MHz boost. FP64 (1/32 rate) not in the datasheet: left out."),
    # --- NVIDIA Hopper: §2 + §3 (989.4 / 1978.9 precise values); NVLink4 900 GB/s bidirectional.
    _spec("h100-sxm", "NVIDIA H100 SXM5 80GB", "nvidia", bf16=989.4, fp8=1978.9, tf32=495,
          fp32=67, fp64=67, hbm_tbs=3.35, mem_gib=80, tdp=700, sms=132, ref=1830, max_clk=1980,
          link_gbs=450, pci=(0x2330,), notes=_HOPPER),
    _spec("h100-pcie", "NVIDIA H100 PCIe", "nvidia", bf16=756, fp8=1513, tf32=378, fp32=51,
          fp64=51, hbm_tbs=2.0, mem_gib=80, tdp=350, sms=114, ref=1619, max_clk=1755,
          pci=(0x2331,), notes="§2/§3. TDP 300-350 W configurable (upper bound kept). " + _FP64_NV
          + "ref clock derived: 756e12 / (114 SM x 4096 FLOP/clk) = 1619 MHz; max boost 1755 MHz "
          "agrees with FP32 51 TF = 114 x 256 x 1.75 GHz."),
    # Per GPU, not the bridged pair of the first datasheet (§1). pci.ids: 2321 "GH100 [H100L 94GB]"
    # (NVIDIA gpu-admin-tools devid_names.py: 0x2321 = H100). Link: NVLink bridge 600 GB/s bidi.
    _spec("h100-nvl", "NVIDIA H100 NVL", "nvidia", bf16=835, fp8=1671, tf32=418, fp32=60, fp64=60,
          hbm_tbs=3.9, mem_gib=94, tdp=400, sms=132, ref=1544, max_clk=1785, link_gbs=300,
          pci=(0x2321,), notes="§2, per GPU. TDP 350-400 W configurable (upper bound kept). "
          + _FP64_NV + "132 SMs (third-party spec pages, not vendor-confirmed); ref clock derived:"
          " 835e12 / (132 x 4096) = 1544 MHz; max boost 1785 MHz agrees with FP32 60 TF = 132 x 256 x "
          "1.78 GHz. Link = NVLink bridge between a pair only."),
    _spec("h200-sxm", "NVIDIA H200 SXM 141GB", "nvidia", bf16=989.4, fp8=1978.9, tf32=495,
          fp32=67, fp64=67, hbm_tbs=4.8, mem_gib=141, tdp=700, sms=132, ref=1830, max_clk=1980,
          link_gbs=450, pci=(0x2335,), notes="§2/§3: H100 compute with 141 GB HBM3e. " + _HOPPER),
    # H800: the H100 die with NVLink cut to 400 GB/s bidirectional and FP64 to ~1 TF (export
    # variant). pci.ids: 2324 "GH100 [H800]", 2322 "GH100 [H800 PCIe]"; driver README names "NVIDIA
    # H800" and "NVIDIA H800 PCIe". 233a "H800L 94GB" / "NVIDIA H800 NVL" is not catalogued.
    _spec("h800-sxm", "NVIDIA H800 SXM5 80GB", "nvidia", bf16=989.4, fp8=1978.9, tf32=495, fp32=67,
          fp64=1, hbm_tbs=3.35, mem_gib=80, tdp=700, sms=132, ref=1830, max_clk=1980, link_gbs=200,
          pci=(0x2324,), notes=_H800 + "SXM: the H100 SXM compute (§2/§3). " + _HOPPER.replace(
              _FP64_NV, "")),
    _spec("h800-pcie", "NVIDIA H800 PCIe", "nvidia", bf16=756, fp8=1513, tf32=378, fp32=51,
          hbm_tbs=2.0, mem_gib=80, tdp=350, sms=114, ref=1619, max_clk=1755, pci=(0x2322,),
          notes=_H800 + "PCIe: the H100 PCIe compute (§2/§3), ref/max clocks as for h100-pcie. FP64 "
          "(0.8 TF is quoted) not confirmed: left out. NVLink bridge optional: link unknown."),
    # H20: cut-down Hopper for China. pci.ids: 2329 "GH100 [H20]"; driver README: "NVIDIA H20".
    # 232c "H20 HBM3e" ("NVIDIA H20-3e", 141 GB) and 230e "H20 NVL16" are other SKUs: not catalogued.
    _spec("h20", "NVIDIA H20", "nvidia", bf16=148, fp8=296, tf32=74, fp32=44, fp64=1, hbm_tbs=4.0,
          mem_gib=96, tdp=None, sms=None, ref=None, max_clk=None, pci=(0x2329,),
          notes="Third-party copies of NVIDIA's H20 figures (zangshuxian.com, ke60.top; no NVIDIA "
          "PDF found): FP16/BF16 148 TF dense, FP8/INT8 296, TF32 74, FP32 44, FP64 1, 96 GB HBM3 "
          "at 4.0 TB/s. TDP (400 W) and NVLink (900 GB/s) are often quoted but no source was found: "
          "unknown, read the enforced power limit instead. SM count (78 per a Geekbench listing) does not fit the tensor peak at any "
          "Hopper clock, so the throttle is not a clock: SMs and clocks left unknown."),
    # GH200 (GPU part): §2 says "recalled, not confirmed". pci.ids: 2342 "GH200 120GB / 480GB"
    # (the 96 GB HBM3 module), 2348 "GH200 144G HBM3e". 132 SM @ 1980 MHz seen in an OpenCL dump
    # of "NVIDIA GH200 480GB". TDP is for the whole module (450-1000 W): GPU share unknown.
    _spec("gh200-96gb", "NVIDIA GH200 96GB HBM3", "nvidia", bf16=989.4, fp8=1978.9, tf32=495,
          fp32=67, fp64=67, hbm_tbs=4.0, mem_gib=96, tdp=None, sms=132, ref=1830, max_clk=1980,
          pci=(0x2342,), notes=_GH200),
    _spec("gh200-144gb", "NVIDIA GH200 144GB HBM3e", "nvidia", bf16=989.4, fp8=1978.9, tf32=495,
          fp32=67, fp64=67, hbm_tbs=4.9, mem_gib=144, tdp=None, sms=132, ref=1830, max_clk=1980,
          pci=(0x2348,), notes=_GH200),
    # --- NVIDIA Ada / Ampere GA102 PCIe cards (no NVLink). SM counts = CUDA cores / 128.
    _spec("l40s", "NVIDIA L40S", "nvidia", bf16=362, fp8=733, tf32=183, fp32=91.6, hbm_tbs=0.864,
          mem_gib=48, tdp=350, sms=142, ref=2520, max_clk=2520, pci=(0x26B9,),
          notes="§2 (GDDR6). 142 SMs; FP32 91.6 = 142 x 256 x 2.52 GHz. BF16 362 implies ~2490 MHz "
          "at 1024 FLOP/clk/SM, not exact, so ref clock = datasheet boost clock 2520 MHz."),
    # pci.ids: 26b1 "AD102GL [RTX 6000 Ada Generation]"; driver README: "NVIDIA RTX 6000 Ada Generation".
    _spec("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", "nvidia", bf16=364.2, fp8=728.5,
          tf32=182.1, fp32=91.1, hbm_tbs=0.96, mem_gib=48, tdp=300, sms=142, ref=2505,
          max_clk=2505, pci=(0x26B1,),
          notes="NVIDIA RTX 6000 Ada datasheet: 18,176 CUDA cores (142 SMs), FP32 91.1 TF, tensor "
          "1,457 TF (FP8 with sparsity), 48 GB GDDR6 at 960 GB/s, 300 W (grafikkarten.com and "
          "cputronic copies; boost 2505 MHz). Dense peaks derived: 1457 / 2 = 728.5 FP8, BF16 half "
          "of that (FP32 accumulate at full rate on RTX Ada), TF32 half of BF16; check: 142 x 1024 "
          "FLOP/clk x 2.505 GHz = 364.2 TF. No NVLink."),
    # pci.ids: 27b2 "AD104GL [RTX 4000 Ada Generation]"; 27b0 (RTX 4000 SFF Ada Generation, a 70 W card
    # with other clocks) and 27ba (the laptop GPU) are other SKUs: not catalogued. NVML name as the
    # published linode capture's modelName: "NVIDIA RTX 4000 Ada Generation".
    _spec("rtx-4000-ada", "NVIDIA RTX 4000 Ada Generation", "nvidia", bf16=81.9, fp8=163.8, tf32=40.95,
          fp32=26.7, hbm_tbs=0.36, mem_gib=20, tdp=130, sms=48, ref=None, max_clk=2175, pci=(0x27B2,),
          notes=_RTX_4000_ADA),
    # pci.ids: 28b0 "AD107GL [RTX 2000 / 2000E Ada Generation]": one id for two SKUs, so it matches only
    # together with the driver name (catalogue.NAME_CONFIRMED_PCI_IDS); the 2000E is not catalogued.
    _spec("rtx-2000-ada", "NVIDIA RTX 2000 Ada Generation", "nvidia", bf16=47.98, fp8=95.95, tf32=23.99,
          fp32=12.0, hbm_tbs=0.224, mem_gib=16, tdp=70, sms=22, ref=2130, max_clk=2130, pci=(0x28B0,),
          notes=_RTX_2000_ADA),
    _spec("l4", "NVIDIA L4", "nvidia", bf16=121, fp8=242.5, tf32=60, fp32=30.3, hbm_tbs=0.300,
          mem_gib=24, tdp=72, sms=58, ref=2040, max_clk=2040, pci=(0x27B8,),
          notes="§2 (GDDR6). 58 SMs; ref derived: 121e12 / (58 x 1024 FLOP/clk) = 2037 ~ 2040 MHz "
          "boost, matching FP32 30.3 = 58 x 256 x 2.04 GHz."),
    _spec("a10", "NVIDIA A10", "nvidia", bf16=125, tf32=62.5, fp32=31.2, hbm_tbs=0.600,
          mem_gib=24, tdp=150, sms=72, ref=1695, max_clk=1695, pci=(0x2236,),
          notes="§2 (GDDR6). 72 SMs; ref derived: 125e12 / (72 x 1024 FLOP/clk) = 1695 MHz boost, "
          "matching FP32 31.2 = 72 x 256 x 1.695 GHz."),
    # A10G: no public datasheet (§2). Decision: no FLOP peaks at all rather than a guess; the
    # memory side (the part that matters for memory-bound inference) is kept.
    _spec("a10g", "NVIDIA A10G", "nvidia", hbm_tbs=0.600, mem_gib=24, tdp=None, sms=None,
          ref=None, max_clk=None, pci=(0x2237,),
          notes="§2: AWS-only part with no public NVIDIA datasheet. Tensor peak unconfirmed "
          "(~70 TF is often quoted; lower than the A10 per Baseten) and FP32 only '~31' - all FLOP "
          "peaks left out (unknown) until measured on hardware. TDP '~150 W' unconfirmed: left "
          "unknown, read the enforced power limit instead."),
)
