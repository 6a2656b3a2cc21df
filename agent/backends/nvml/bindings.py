"""What this nvidia-ml-py offers, decided once when the backend starts, with a fallback for each gap.

pyproject.toml accepts nvidia-ml-py 12.535 and newer, and the releases differ in the Python names
they define even where the C library underneath is the same (checked against every release in
tests/wheels.py; docs/nvidia.md, "Versions"):

==============================================  ==========  =====================================
name                                            first in    without it
==============================================  ==========  =====================================
``nvmlDeviceGetTemperatureV``                   12.570      ``nvmlDeviceGetTemperature`` (same C
                                                            reading, the unversioned call)
``nvmlDeviceGetComputeRunningProcesses_v2``     12.560      the C symbol of the same name through
                                                            ``_nvmlGetFunctionPointer``
``nvmlDeviceGetMPSComputeRunningProcesses_v2``  12.560      the same, for the MPS client list
``c_nvmlProcessInfo_v3_t``                      12.560      ``c_nvmlProcessInfo_t``: the same four
                                                            fields in every release
``NVMLLibraryMismatchError``                    12.560      nothing raises it there
``c_nvmlValue_t.usVal`` (field value type 6)    12.570      that field value is unknown
==============================================  ==========  =====================================

Nothing here is guessed from a version number: each name is looked up in the module itself, so a
later release that drops a name falls back the same way. What could not be replaced is listed in
:attr:`Bindings.missing` for ``roofwatch doctor``.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UPGRADE = "upgrade nvidia-ml-py (pip install -U nvidia-ml-py; 12.570 or newer has every name roofwatch uses)"


_V2_PROCESS_LISTS = (
    ("nvmlDeviceGetComputeRunningProcesses_v2", "on drivers before R510 the process list is read through the C "
     "symbol directly", "on drivers before R510 processes are unknown"),
    ("nvmlDeviceGetMPSComputeRunningProcesses_v2", "on drivers R470 to R505 the MPS client list is read through the "
     "C symbol directly", "on drivers R470 to R505 MPS clients are not told apart from other processes"),
)
"""The ``_v2`` wrappers 12.535 lacks: (name, what happens without it where C symbols can be called, where not)."""


@dataclass(frozen=True, slots=True)
class Bindings:
    """The optional names one pynvml module has, and the alternatives in use where it has not."""

    version: str | None
    """nvidia-ml-py's version as its own dist-info says (None for a copy without one)."""
    temperature_v: bool
    """``nvmlDeviceGetTemperatureV`` exists; else the unversioned ``nvmlDeviceGetTemperature``."""
    process_struct: str | None
    """The pynvml struct the process list is read into (v2 and v3 share the layout)."""
    function_pointer: bool
    """``_nvmlGetFunctionPointer`` exists, so C symbols can be called without a pynvml wrapper."""
    mismatch_error: tuple[type[BaseException], ...]
    """pynvml's NVMLLibraryMismatchError (raised instead of NVMLError by some unversioned wrappers)."""
    missing: dict[str, str] = field(default_factory=dict)
    """Name -> what the agent does without it (for doctor)."""
    lost: frozenset[str] = frozenset()
    """Missing names with no replacement: a reading is unknown because of them."""
    harmless: frozenset[str] = frozenset()
    """Missing names whose absence changes nothing the agent reads (nothing to fix)."""

    @classmethod
    def detect(cls, module: Any) -> "Bindings":
        missing: dict[str, str] = {}
        temperature_v = callable(getattr(module, "nvmlDeviceGetTemperatureV", None))
        if not temperature_v:
            missing["nvmlDeviceGetTemperatureV"] = "temperature is read with nvmlDeviceGetTemperature (same value)"
        struct = next((name for name in ("c_nvmlProcessInfo_v3_t", "c_nvmlProcessInfo_t", "c_nvmlProcessInfo_v2_t")
                       if isinstance(getattr(module, name, None), type)), None)
        if struct != "c_nvmlProcessInfo_v3_t":
            missing["c_nvmlProcessInfo_v3_t"] = f"processes are read into {struct or 'pynvml objects'} (same fields)"
        function_pointer = callable(getattr(module, "_nvmlGetFunctionPointer", None))
        lost: set[str] = set()
        direct = function_pointer and struct is not None
        for name, readable, unknown in _V2_PROCESS_LISTS:
            if not callable(getattr(module, name, None)):
                missing[name] = readable if direct else unknown
                if not direct:
                    lost.add(name)
        mismatch = getattr(module, "NVMLLibraryMismatchError", None)
        if not isinstance(mismatch, type):
            missing["NVMLLibraryMismatchError"] = "not needed: this release raises NVMLError for a missing symbol"
        value_type = getattr(module, "c_nvmlValue_t", None)
        if value_type is not None and not hasattr(value_type, "usVal"):
            missing["c_nvmlValue_t.usVal"] = "no field roofwatch reads has that value type (it would read as unknown)"
        return cls(version=_version_of(module), temperature_v=temperature_v, process_struct=struct,
                   function_pointer=function_pointer,
                   mismatch_error=(mismatch,) if isinstance(mismatch, type) else (), missing=missing,
                   lost=frozenset(lost), harmless=frozenset(missing) & {"NVMLLibraryMismatchError", "c_nvmlValue_t.usVal"})


def _version_of(module: Any) -> str | None:
    """The release of the pynvml.py this module was executed from, from the dist-info beside it.

    importlib.metadata would answer for whichever nvidia-ml-py comes first on sys.path, which need
    not be the file a private copy was loaded from (the fake driver's tests load several)."""
    origin = getattr(module, "__file__", None)
    if not origin:
        return None
    for info in sorted(Path(origin).parent.glob("nvidia_ml_py-*.dist-info")):
        match = re.fullmatch(r"nvidia_ml_py-(.+)\.dist-info", info.name)
        if match:
            return match.group(1)
    return None


def union_member(union_type: Any, member: str) -> bool:
    """Whether a ctypes union type has ``member`` (older pynvml unions lack the newest types)."""
    return isinstance(union_type, type) and issubclass(union_type, ctypes.Union) and \
        any(name == member for name, *_ in union_type._fields_)
