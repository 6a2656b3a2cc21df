"""Fake of DCGM's ``dcgm_fields`` binding module: field types, entity groups, the profiling field ids.

Facts from NVIDIA/DCGM ``testing/python3/dcgm_fields.py`` and ``dcgmlib/src/dcgm_fields.cpp``:

* field types are one-character codes stored in ``c_dcgmFieldValue_v1.fieldType`` as their ordinal;
* the profiling fields are 1001-1012; 1001-1008 are doubles (ratios 0..1), 1009-1012 int64
  (bytes per second of active PCIe / NVLink traffic);
* DCGM 4.6.0 renamed them (``DCGM_FI_PROF_SM_ACTIVE`` -> ``DCGM_FI_PROF_SM_UTIL_RATIO`` ...) and
  keeps the old names as deprecated aliases resolved by a module ``__getattr__`` (with a
  DeprecationWarning; an AttributeError when ``DCGM_DEPRECATED`` is 0). DCGM 3.x and 4.0-4.5 have
  the old names only. The ids never changed, which is why roofwatch asks by number.
* DCGM 4.6.0 added the cumulative counters 1084-1096 (``DCGM_FI_PROF_SM_CYCLES_ELAPSED_TOTAL`` ...), int64
  (testing/python3/dcgm_fields.py and dcgmlib/dcgm_fields.h at v4.6.0). The module is 4.6's; an older host
  engine does not offer them (:class:`agent.virtual.fake_dcgm.engine.FakeHostEngine`).
"""

import sys
import types
import warnings
from ctypes import c_uint32

DCGM_FT_BINARY = "b"
DCGM_FT_DOUBLE = "d"
DCGM_FT_INT64 = "i"
DCGM_FT_STRING = "s"
DCGM_FT_TIMESTAMP = "t"

DCGM_FE_NONE = 0
DCGM_FE_GPU = 1
DCGM_FE_VGPU = 2
DCGM_FE_SWITCH = 3
DCGM_FE_GPU_I = 4
DCGM_FE_GPU_CI = 5
DCGM_FE_LINK = 6
DCGM_FE_CPU = 7
DCGM_FE_CPU_CORE = 8
DCGM_FE_CONNECTX = 9

c_dcgm_field_eid_t = c_uint32

DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO = 1001
DCGM_FI_PROF_SM_UTIL_RATIO = 1002
DCGM_FI_PROF_SM_OCCUPANCY_RATIO = 1003
DCGM_FI_PROF_TENSOR_UTIL_RATIO = 1004
DCGM_FI_PROF_DRAM_UTIL_RATIO = 1005
DCGM_FI_PROF_FP64_UTIL_RATIO = 1006
DCGM_FI_PROF_FP32_UTIL_RATIO = 1007
DCGM_FI_PROF_FP16_UTIL_RATIO = 1008
DCGM_FI_PROF_PCIE_TX_BYTES = 1009
DCGM_FI_PROF_PCIE_RX_BYTES = 1010
DCGM_FI_PROF_NVLINK_TX_BYTES = 1011
DCGM_FI_PROF_NVLINK_RX_BYTES = 1012
DCGM_FI_PROF_SM_CYCLES_ELAPSED_TOTAL = 1084
DCGM_FI_PROF_SM_CYCLES_ACTIVE_TOTAL = 1085
DCGM_FI_PROF_MMA_CYCLES_ACTIVE_TOTAL = 1086
DCGM_FI_PROF_DMMA_CYCLES_ACTIVE_TOTAL = 1087
DCGM_FI_PROF_HMMA_CYCLES_ACTIVE_TOTAL = 1088
DCGM_FI_PROF_IMMA_CYCLES_ACTIVE_TOTAL = 1089
DCGM_FI_PROF_DFMA_CYCLES_ACTIVE_TOTAL = 1090
DCGM_FI_PROF_PCIE_TX_BYTES_TOTAL = 1091
DCGM_FI_PROF_PCIE_RX_BYTES_TOTAL = 1092
DCGM_FI_PROF_INT_CYCLES_ACTIVE_TOTAL = 1093
DCGM_FI_PROF_FP64_CYCLES_ACTIVE_TOTAL = 1094
DCGM_FI_PROF_FP32_CYCLES_ACTIVE_TOTAL = 1095
DCGM_FI_PROF_FP16_CYCLES_ACTIVE_TOTAL = 1096

DCGM_DEPRECATED = 1

_DEPRECATED_ALIASES = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
    "DCGM_FI_PROF_SM_ACTIVE": "DCGM_FI_PROF_SM_UTIL_RATIO",
    "DCGM_FI_PROF_SM_OCCUPANCY": "DCGM_FI_PROF_SM_OCCUPANCY_RATIO",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "DCGM_FI_PROF_FP64_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "DCGM_FI_PROF_FP32_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "DCGM_FI_PROF_FP16_UTIL_RATIO",
}

PROFILING_TYPES = {fid: (DCGM_FT_DOUBLE if fid <= 1008 else DCGM_FT_INT64) for fid in (*range(1001, 1013),
                                                                                     *range(1084, 1097))}
"""Field id -> type, as dcgm_fields.cpp registers them (the fake library reads this)."""


class _FieldsModule(types.ModuleType):
    def __getattr__(self, name):
        if name in _DEPRECATED_ALIASES:
            if DCGM_DEPRECATED == 0:
                raise AttributeError(f"{name} is deprecated and DCGM_DEPRECATED=0")
            warnings.warn(f"{name} is deprecated, use {_DEPRECATED_ALIASES[name]} instead", DeprecationWarning,
                          stacklevel=2)
            return getattr(self, _DEPRECATED_ALIASES[name])
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


sys.modules[__name__].__class__ = _FieldsModule
