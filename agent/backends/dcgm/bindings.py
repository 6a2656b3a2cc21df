"""Finding and importing NVIDIA's DCGM Python bindings, which are not on PyPI.

They ship with the DCGM packages (checked: ``pip download`` of pydcgm, dcgm, nvidia-dcgm,
dcgm-bindings and datacenter-gpu-manager finds no distribution): DCGM 4 installs them in
``/usr/share/datacenter-gpu-manager-4/bindings/python3`` (package datacenter-gpu-manager-4-core;
NVIDIA/DCGM scripts/verify_package_contents), DCGM 3 in ``/usr/local/dcgm/bindings/python3``
(package datacenter-gpu-manager). The modules import each other by top-level name
(``import dcgm_structs``), so they are loaded from the chosen directory under those names, in
dependency order, and that directory joins ``sys.path`` as NVIDIA's docs ask of users.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Sequence

from agent.backends.base import BackendUnavailable

DEFAULT_BINDINGS_PATHS = ("/usr/share/datacenter-gpu-manager-4/bindings/python3", "/usr/local/dcgm/bindings/python3")
INSTALL_HINT = ("install DCGM: package datacenter-gpu-manager-4-core (DCGM 4; Debian/Ubuntu and RHEL repositories "
                "of NVIDIA's CUDA network repo) or datacenter-gpu-manager (DCGM 3), or point dcgm_bindings_path at "
                "the directory holding dcgm_agent.py")
_ORDER = ("dcgmvalue", "dcgm_structs", "dcgm_fields", "dcgm_agent")
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class DcgmModules:
    """The binding modules roofwatch calls, and where they came from."""

    agent: ModuleType
    structs: ModuleType
    fields: ModuleType
    value: ModuleType
    path: Path


def find_bindings(paths: Sequence[str]) -> Path:
    """The first directory of ``paths`` holding dcgm_agent.py and dcgm_structs.py."""
    for p in paths:
        d = Path(p)
        if (d / "dcgm_agent.py").is_file() and (d / "dcgm_structs.py").is_file():
            return d
    where = ", ".join(paths) or "(no directory configured)"
    raise BackendUnavailable(f"DCGM: Python bindings (dcgm_agent.py) not found in {where}; {INSTALL_HINT}")


def load_bindings(paths: Sequence[str]) -> DcgmModules:
    """Import the bindings from the first directory of ``paths`` that has them.

    Raises BackendUnavailable naming the directories searched and the package to install. Loaded
    once per process and directory; another directory replaces them (tests, an upgrade)."""
    d = find_bindings(paths)
    with _lock:
        loaded = sys.modules.get("dcgm_structs")
        if loaded is None or Path(getattr(loaded, "__file__", "")).parent.resolve() != d.resolve():
            for name in _ORDER:
                sys.modules.pop(name, None)
            try:
                for name in _ORDER:
                    _load(name, d)
            except Exception as exc:  # a broken install: one line, not a traceback
                for name in _ORDER:
                    sys.modules.pop(name, None)
                raise BackendUnavailable(f"DCGM: the bindings in {d} do not import ({type(exc).__name__}: {exc}); "
                                         f"reinstall them: {INSTALL_HINT}") from None
            if str(d) not in sys.path:
                sys.path.append(str(d))
        m = sys.modules
        return DcgmModules(m["dcgm_agent"], m["dcgm_structs"], m["dcgm_fields"], m["dcgmvalue"], d)


def _load(name: str, directory: Path) -> None:
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"no {name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
