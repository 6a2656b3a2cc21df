"""What an amdsmi status code means for the agent, decided once here instead of at every call site.

amdsmi raises ``AmdSmiLibraryException`` (and its subclasses for RETRY and TIMEOUT) carrying the
C status code; every private copy of the package has its own classes, so the decision is made on
the number from ``get_error_code()``, which is the same everywhere.
"""

from __future__ import annotations

from agent.backends.base import Meaning

# amdsmi_status_t (amdsmi.h); amdsmi exposes the same numbers as amdsmi_wrapper.AMDSMI_STATUS_*.
SUCCESS = 0
INVAL = 1
NOT_SUPPORTED = 2
NOT_YET_IMPLEMENTED = 3
FAIL_LOAD_MODULE = 4
FAIL_LOAD_SYMBOL = 5
DRM_ERROR = 6
API_FAILED = 7
TIMEOUT = 8
RETRY = 9
NO_PERM = 10
IO = 12
FILE_ERROR = 14
INIT_ERROR = 18
BUSY = 30
NOT_FOUND = 31
NOT_INIT = 32
DRIVER_NOT_LOADED = 34
NO_DATA = 40
UNEXPECTED_SIZE = 42
"""rocm_smi maps EIO to it: a sysfs read of a GPU whose reset is under way."""
UNEXPECTED_DATA = 43
"""rocm_smi maps ENXIO ("no such device or address") to it."""
AMDGPU_RESTART_ERR = 54

_MEANINGS = {
    NOT_SUPPORTED: Meaning.ABSENT,
    NOT_YET_IMPLEMENTED: Meaning.ABSENT,
    NO_PERM: Meaning.ABSENT,
    FAIL_LOAD_SYMBOL: Meaning.ABSENT,
    NO_DATA: Meaning.NO_DATA,
    # A GPU that fell off the bus or was reset: its sysfs and DRM nodes vanish under the handle.
    NOT_FOUND: Meaning.DEVICE_LOST,
    DRM_ERROR: Meaning.DEVICE_LOST,
    IO: Meaning.DEVICE_LOST,
    FILE_ERROR: Meaning.DEVICE_LOST,
    AMDGPU_RESTART_ERR: Meaning.DEVICE_LOST,
    NOT_INIT: Meaning.LIBRARY,
    INIT_ERROR: Meaning.LIBRARY,
}

LOST_WHEN_CORE = frozenset({NOT_SUPPORTED, UNEXPECTED_SIZE, UNEXPECTED_DATA})
"""How a lost or resetting GPU answers through amdsmi, whose handles outlive the GPU: its sysfs files
are gone (ENOENT: NOT_SUPPORTED) or fail (EIO: UNEXPECTED_SIZE). On an optional reading these
mean "not here" or "not now"; on the core reading, which every GPU supports, they mean the GPU."""

_NAMES = {
    INVAL: "invalid argument", NOT_SUPPORTED: "not supported", NOT_YET_IMPLEMENTED: "not implemented in this ROCm",
    FAIL_LOAD_SYMBOL: "symbol missing in libamd_smi", DRM_ERROR: "DRM error", API_FAILED: "API call failed",
    TIMEOUT: "timeout", RETRY: "device busy, retry", NO_PERM: "no permission", IO: "I/O error",
    FILE_ERROR: "sysfs file error", INIT_ERROR: "initialisation error", BUSY: "busy", NOT_FOUND: "device not found",
    NOT_INIT: "amdsmi not initialised", DRIVER_NOT_LOADED: "amdgpu driver not loaded", NO_DATA: "no data",
    UNEXPECTED_SIZE: "I/O error reading sysfs (GPU in reset?)", UNEXPECTED_DATA: "no such device",
    AMDGPU_RESTART_ERR: "amdgpu restart failed",
}


def code_of(exc: BaseException) -> int | None:
    """The amdsmi status code of an amdsmi library exception, or None for anything else."""
    get = getattr(exc, "get_error_code", None)
    if get is None:
        return None
    try:
        code = get()
    except Exception:  # noqa: BLE001 - a half-built exception must not hide the original failure
        return None
    return code if isinstance(code, int) else None


def meaning_of_code(code: int) -> Meaning:
    return _MEANINGS.get(code, Meaning.FAILED)


def meaning(exc: BaseException) -> Meaning:
    code = code_of(exc)
    return Meaning.FAILED if code is None else meaning_of_code(code)


def describe_code(code: int) -> str:
    return _NAMES.get(code) or f"amdsmi status {code}"


def describe(exc: BaseException) -> str:
    """A short text for logs and ``doctor``: the status name, never a traceback."""
    code = code_of(exc)
    return f"{type(exc).__name__}: {exc}" if code is None else describe_code(code)
