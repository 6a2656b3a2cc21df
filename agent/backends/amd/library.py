"""Importing amdsmi, whose failures are not ImportErrors, and saying how to fix each one.

The ``amdsmi`` wrapper binds every C symbol of ``libamd_smi.so`` when it is imported:

* without ROCm the library is missing: the wrapper prints a hint and the import raises
  ``KeyError: 'libamd_smi.so'``;
* with a wrapper newer than the installed ROCm a symbol is missing: ``AttributeError ...
  undefined symbol: amdsmi_...`` (the PyPI wheel is newer than most installed ROCm releases);
* the 6.2.0, 6.2.1 and 6.2.2 wrappers read ``os.environ["ROCM_PATH"]`` unconditionally, so without
  that variable the import raises ``KeyError: 'ROCM_PATH'`` (6.2.4 defaults it to /opt/rocm).

Each becomes :class:`BackendUnavailable` with the fix, never a traceback.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path
from typing import Any, Mapping

from agent.backends.amd.errors import DRIVER_NOT_LOADED, NO_PERM, NOT_INIT, code_of, describe
from agent.backends.base import BackendUnavailable

MATCH_ROCM = ("install the amdsmi wrapper that ships with your ROCm: pip install /opt/rocm/share/amd_smi "
              "(or pin the PyPI wheel to your ROCm version, e.g. pip install 'amdsmi==6.4.*' on ROCm 6.4)")


def import_error_message(exc: BaseException) -> str:
    """What to tell a person when ``import amdsmi`` failed with ``exc``."""
    text = str(exc)
    if isinstance(exc, KeyError) and exc.args == ("ROCM_PATH",):
        return ("AMD: this amdsmi wrapper (ROCm 6.2.0 to 6.2.2) needs the ROCM_PATH environment variable: "
                "set ROCM_PATH=/opt/rocm (where ROCm is installed), or use amdsmi 6.2.4 or newer")
    if isinstance(exc, KeyError) or "libamd_smi" in text and "undefined symbol" not in text:
        return ("AMD: libamd_smi.so not found: ROCm (package amd-smi-lib) is not installed here, or ROCM_PATH "
                "does not point at it; in a container, mount /opt/rocm or use a ROCm base image")
    if "undefined symbol" in text:
        symbol = text.rsplit("undefined symbol:", 1)[-1].strip()
        return (f"AMD: the amdsmi Python package is newer than the installed ROCm library "
                f"(libamd_smi.so has no {symbol}); {MATCH_ROCM}")
    return f"AMD: amdsmi could not be imported ({type(exc).__name__}: {exc}); {MATCH_ROCM}"


def load_amdsmi() -> Any:
    """The real ``amdsmi`` module, or :class:`BackendUnavailable` saying what is wrong."""
    hint = io.StringIO()
    try:
        with contextlib.redirect_stdout(hint):  # the wrapper prints its own hint on failure
            import amdsmi  # type: ignore[import-not-found]
    except ImportError as exc:
        if getattr(exc, "name", None) == "amdsmi":
            raise BackendUnavailable("AMD: the amdsmi package is not installed; " + MATCH_ROCM) from None
        raise BackendUnavailable(import_error_message(exc)) from None
    except Exception as exc:  # noqa: BLE001 - KeyError / AttributeError / OSError from the ctypes wrapper
        raise BackendUnavailable(import_error_message(exc)) from None
    return amdsmi


def init_message(exc: BaseException) -> str:
    """What to tell a person when amdsmi_init fails."""
    code = code_of(exc)
    if code == DRIVER_NOT_LOADED:
        return "amdsmi: the amdgpu kernel driver is not loaded (check `lsmod | grep amdgpu` and `dmesg | grep amdgpu`)"
    if code == NO_PERM:
        return ("amdsmi: no permission to open /dev/kfd or /dev/dri/renderD* (add the user to the video and "
                "render groups, or give the container those devices)")
    if code == NOT_INIT:
        return "amdsmi: initialisation failed (is another process holding the rocm_smi lock in /dev/shm?)"
    return f"amdsmi: initialisation failed: {describe(exc)}"


ROCM_VERSION_FILES = ("{root}/.info/version",)
"""Where a ROCm installation writes its own version (``6.2.4-120``), under ``$ROCM_PATH`` or ``/opt/rocm``."""
_VERSION = re.compile(r"^\s*(\d+\.\d+(?:\.\d+)?)")


def rocm_version(from_amdsmi: str | None, refusal: str | None,
                 environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """(version, note): what amdsmi said (6.4+ loads librocm-core.so for it), else the version file of the
    installation at ``$ROCM_PATH``/``$ROCM_HOME`` or ``/opt/rocm``; the note says where it came from, or
    why it is unknown (the agent needs only libamd_smi, whose version doctor shows beside it)."""
    if from_amdsmi:
        return from_amdsmi, "from librocm-core (amdsmi_get_rocm_version)"
    environ = os.environ if environ is None else environ
    roots = [r for r in (environ.get("ROCM_PATH"), environ.get("ROCM_HOME"), "/opt/rocm") if r]
    for root in dict.fromkeys(roots):
        for pattern in ROCM_VERSION_FILES:
            path = Path(pattern.format(root=root))
            try:
                found = _VERSION.match(path.read_text(encoding="utf-8", errors="replace")[:64])
            except OSError:
                continue
            if found:
                return found.group(1), f"from {path}"
    why = refusal or "amdsmi did not say"
    return None, f"{why}; no {' or '.join(str(Path(ROCM_VERSION_FILES[0].format(root=r))) for r in dict.fromkeys(roots))}"
