"""What DCGM's status codes mean for the agent (agent.backends.base.Meaning).

Codes and their names are dcgm_structs.h / dcgm_structs.py's ``DCGM_ST_*`` (NVIDIA/DCGM 4.6.0);
which of them a profiling watch or read produces is taken from dcgm_agent.h and
testing/python3/tests/test_prof.py (PROFILING_NOT_SUPPORTED, NOT_SUPPORTED, MODULE_NOT_LOADED,
REQUIRES_ROOT, PROFILING_MULTI_PASS) and DcgmCacheManager.cpp (NO_DATA, NOT_WATCHED, and a
failed NVML call's code in a value's status, e.g. GPU_IS_LOST).
"""

from __future__ import annotations

from agent.backends.base import Meaning, meaning_in, value_code

NO_DATA, STALE_DATA, NOT_WATCHED, PAUSED, GPUS_DETACHED = -14, -15, -16, -54, -67
CONNECTION_NOT_VALID, UNINITIALIZED = -21, -10
GPU_IS_LOST, RESET_REQUIRED = -18, -19
NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, GPU_NOT_SUPPORTED = -6, -17, -20, -22
REQUIRES_ROOT, FIELD_UNSUPPORTED_BY_API, MODULE_NOT_LOADED = -29, -32, -33
PROFILING_NOT_SUPPORTED, PROFILING_MULTI_PASS, INSUFFICIENT_DRIVER_VERSION = -36, -38, -44
LIBRARY_NOT_FOUND = -25

_MEANINGS = {
    **dict.fromkeys((NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, GPU_NOT_SUPPORTED, REQUIRES_ROOT,
                     FIELD_UNSUPPORTED_BY_API, MODULE_NOT_LOADED, PROFILING_NOT_SUPPORTED, PROFILING_MULTI_PASS,
                     INSUFFICIENT_DRIVER_VERSION), Meaning.ABSENT),
    **dict.fromkeys((NO_DATA, STALE_DATA, NOT_WATCHED, PAUSED, GPUS_DETACHED), Meaning.NO_DATA),
    **dict.fromkeys((GPU_IS_LOST, RESET_REQUIRED), Meaning.DEVICE_LOST),
    **dict.fromkeys((CONNECTION_NOT_VALID, UNINITIALIZED), Meaning.LIBRARY),
}

_WHY = {
    REQUIRES_ROOT: "the host engine does not run as root, and profiling metrics before Hopper need it",
    PROFILING_NOT_SUPPORTED: "DCGM does not support profiling metrics on this GPU",
    MODULE_NOT_LOADED: "DCGM's profiling module is not loaded (libnvperf_dcgm_host.so missing?)",
    NOT_SUPPORTED: "not supported on this GPU",
    PROFILING_MULTI_PASS: "these profiling metrics cannot be read in one pass on this GPU",
    CONNECTION_NOT_VALID: "the connection to the host engine is lost (nv-hostengine stopped or restarted)",
}


code_of = value_code
"""The status code of the binding's exception, or None for anything else."""


def meaning_of_code(code: int) -> Meaning:
    return _MEANINGS.get(code, Meaning.FAILED)


def meaning(exc: BaseException) -> Meaning:
    return meaning_in(_MEANINGS, exc)


def describe_code(code: int, text: str | None = None) -> str:
    why = _WHY.get(code)
    name = f"DCGM_ST {code}"
    return f"{why} ({name})" if why else f"{text or 'error'} ({name})"


def describe(exc: BaseException) -> str:
    code = code_of(exc)
    try:
        text = str(exc)
    except Exception:  # a DCGMError whose library is gone
        text = type(exc).__name__
    return describe_code(code, text) if code is not None else text
