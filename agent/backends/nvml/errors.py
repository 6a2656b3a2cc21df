"""What an NVML error means for the agent, decided once here instead of at every call site.

pynvml raises one ``NVMLError`` subclass per return code. Every copy of the module (the real
one, or the copies the tests load over a fake driver) has its own classes, so the decision is
made on the numeric ``value``, which is the C return code and the same everywhere.
"""

from __future__ import annotations

from agent.backends.base import Meaning, meaning_in, value_code

# nvmlReturn_t codes (nvml.h); pynvml exposes the same numbers as NVML_ERROR_*.
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
NO_DATA = 21
DEPRECATED = 26


_MEANINGS = {
    SUCCESS: Meaning.NO_DATA,  # pynvml raises NVMLError(0) when a size probe finds nothing to return
    NOT_SUPPORTED: Meaning.ABSENT,
    FUNCTION_NOT_FOUND: Meaning.ABSENT,
    NO_PERMISSION: Meaning.ABSENT,
    DEPRECATED: Meaning.ABSENT,
    NOT_FOUND: Meaning.NO_DATA,
    NO_DATA: Meaning.NO_DATA,
    GPU_IS_LOST: Meaning.DEVICE_LOST,
    RESET_REQUIRED: Meaning.DEVICE_LOST,
    UNINITIALIZED: Meaning.LIBRARY,
    LIB_RM_VERSION_MISMATCH: Meaning.LIBRARY,
}

_NAMES = {
    NOT_SUPPORTED: "not supported", FUNCTION_NOT_FOUND: "function not found in this driver",
    NO_PERMISSION: "no permission", DEPRECATED: "deprecated", NOT_FOUND: "not found", NO_DATA: "no data",
    GPU_IS_LOST: "GPU is lost", RESET_REQUIRED: "GPU requires a reset", UNINITIALIZED: "NVML not initialised",
    LIB_RM_VERSION_MISMATCH: "NVML/driver version mismatch (driver upgraded without a reboot?)",
    DRIVER_NOT_LOADED: "driver not loaded", LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 not found", TIMEOUT: "timeout",
    INVALID_ARGUMENT: "invalid argument",
}


code_of = value_code
"""The status code of the binding's exception, or None for anything else."""


def meaning_of_code(code: int) -> Meaning:
    return _MEANINGS.get(code, Meaning.FAILED)


def meaning(exc: BaseException) -> Meaning:
    return meaning_in(_MEANINGS, exc)


def describe_code(code: int) -> str:
    """A short text for an NVML return code (also the per-field and per-metric ones)."""
    return _NAMES.get(code) or f"NVML error {code}"


def describe(exc: BaseException) -> str:
    """A short text for logs and ``doctor``: the NVML name, never a traceback."""
    code = code_of(exc)
    return f"{type(exc).__name__}: {exc}" if code is None else describe_code(code)


