"""NVIDIA Volta and Turing entries of the peak-spec catalogue (V100, T4), each with its source.

Both generations have FP16 tensor cores but no BF16, TF32 or FP8: their entries carry an ``fp16``
peak and no ``bf16`` one, so MFU needs ``dtype: fp16`` (the default ``bf16`` reads unknown, which
is right: a BF16 GEMM on a V100 runs on the FP32 pipes, not the tensor cores). Volta and Turing
have no structured sparsity, so the datasheet tensor figures are already dense.
"""

from __future__ import annotations

from agent.model import GpuSpec
from agent.model.specs.datasheet import datasheet_spec as _spec

_V100 = ("NVIDIA Tesla V100 datasheet: {tensor} TF tensor (FP16 multiply, FP32 accumulate), "
         "{fp32} TF FP32, {fp64} TF FP64, 900 GB/s HBM2, {tdp} W. 80 SMs (Volta whitepaper table, "
         "via techrival/xenon copies). ref clock derived: {tensor}e12 / (80 SM x 8 tensor cores x "
         "64 FMA x 2) = {ref} MHz, the {boost} MHz boost clock within rounding (ref = boost).")
_V100_SXM2 = _V100.format(tensor=125, fp32=15.7, fp64=7.8, tdp=300, ref=1526, boost=1530) + (
    " Link: NVLink2 300 GB/s bidirectional -> 150 GB/s per direction.")
_V100_PCIE = _V100.format(tensor=112, fp32=14, fp64=7, tdp=250, ref=1367, boost=1380) + (
    " PCIe card: no NVLink. Boost 1380 MHz (third-party; io-tech: ~1370 MHz for 112 TF tensor).")


NVIDIA_VOLTA_TURING: tuple[GpuSpec, ...] = (
    # --- Volta GV100. pci.ids 2026.08.22: 1db1 and 1df5 "Tesla V100 SXM2 16GB", 1db5 "Tesla V100
    # SXM2 32GB", 1db4 "Tesla V100 PCIe 16GB", 1db6 "Tesla V100 PCIe 32GB". V100S (1df6, 130 TF,
    # 1134 GB/s), SXM3 (1db8) and DGXS (1db2/1db7) differ in clocks or bandwidth: not catalogued.
    _spec("v100-sxm2-16gb", "NVIDIA Tesla V100 SXM2 16GB", "nvidia", fp16=125, fp32=15.7, fp64=7.8,
          hbm_tbs=0.9, mem_gib=16, tdp=300, sms=80, ref=1530, max_clk=1530, link_gbs=150,
          pci=(0x1DB1, 0x1DF5), notes=_V100_SXM2),
    _spec("v100-sxm2-32gb", "NVIDIA Tesla V100 SXM2 32GB", "nvidia", fp16=125, fp32=15.7, fp64=7.8,
          hbm_tbs=0.9, mem_gib=32, tdp=300, sms=80, ref=1530, max_clk=1530, link_gbs=150,
          pci=(0x1DB5,), notes=_V100_SXM2),
    _spec("v100-pcie-16gb", "NVIDIA Tesla V100 PCIe 16GB", "nvidia", fp16=112, fp32=14, fp64=7,
          hbm_tbs=0.9, mem_gib=16, tdp=250, sms=80, ref=1380, max_clk=1380, pci=(0x1DB4,),
          notes=_V100_PCIE),
    _spec("v100-pcie-32gb", "NVIDIA Tesla V100 PCIe 32GB", "nvidia", fp16=112, fp32=14, fp64=7,
          hbm_tbs=0.9, mem_gib=32, tdp=250, sms=80, ref=1380, max_clk=1380, pci=(0x1DB6,),
          notes=_V100_PCIE),
    # --- Turing TU104. pci.ids: 1eb8 "Tesla T4"; NVIDIA driver README: "Tesla T4" 1EB8.
    _spec("t4", "NVIDIA Tesla T4", "nvidia", fp16=65, fp32=8.1, hbm_tbs=0.32, mem_gib=16, tdp=70,
          sms=40, ref=1590, max_clk=1590, pci=(0x1EB8,),
          notes="NVIDIA T4 datasheet: 65 TF mixed precision (FP16/FP32 tensor), 8.1 TF FP32, 16 GB "
          "GDDR6 at 320 GB/s, 70 W (copies: geektopia, tomshardware, sysrqmts). 40 SMs, boost 1590 "
          "MHz (third-party spec pages); ref derived: 65e12 / (40 SM x 1024 FLOP/clk) = 1587 MHz. "
          "FP64 (1/32 rate, ~0.25 TF) is not in the datasheet: left out. No NVLink."),
)
