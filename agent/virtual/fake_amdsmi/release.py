"""Which amdsmi release the fake libamd_smi plays: the release of the Python wrapper loaded over it.

A ROCm release ships libamd_smi.so and the amdsmi wrapper together, and the wrapper is generated
from that release's amdsmi.h: the C symbols it binds (``_libraries['libamd_smi.so'].amdsmi_*``) are
exactly the ones that release's library exports. So the fake learns what to export from the
wrapper file itself, and the few behaviours that changed between releases (enum values, a
version struct with a year, the 7.0 socket power) from the package version, read where pip puts
it (``amdsmi-<version>.dist-info`` beside the package) or where ROCm's copy keeps it (its
``setup.py``). Struct layouts need no table at all: the fake fills whatever structure the wrapper
hands it (:func:`agent.virtual.fake_amdsmi.arguments.put`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_BOUND = re.compile(r"_libraries\['libamd_smi\.so'\]\.(amdsmi_\w+)")
_SETUP_VERSION = re.compile(r"""version\s*=\s*["'](\d+)\.(\d+)\.(\d+)""")
_METADATA_VERSION = re.compile(r"^Version:\s*(\d+)\.(\d+)\.(\d+)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Release:
    """One amdsmi release: its version and the C symbols its libamd_smi.so exports.

    ``None`` fields mean "not known": the fake then behaves as the newest release it models
    and exports every symbol anyone asks for (the fake's behaviour before it knew releases).
    """

    version: tuple[int, int, int] | None = None
    symbols: frozenset[str] | None = None

    def at_least(self, major: int, minor: int) -> bool:
        """This release is ``major.minor`` or newer (an unknown version counts as the newest)."""
        return self.version is None or self.version[:2] >= (major, minor)

    @property
    def text(self) -> str:
        return ".".join(str(p) for p in self.version) if self.version else "unknown"


NEWEST = Release()


def release_of(package_dir: Path) -> Release:
    """The release of the amdsmi package in ``package_dir`` (the directory holding ``amdsmi_wrapper.py``)."""
    wrapper = package_dir / "amdsmi_wrapper.py"
    symbols = frozenset(_BOUND.findall(wrapper.read_text(encoding="utf-8"))) if wrapper.exists() else None
    return Release(version=package_version(package_dir), symbols=symbols or None)


def package_version(package_dir: Path) -> tuple[int, int, int] | None:
    """``amdsmi-X.Y.Z.dist-info`` beside the package (pip, unpacked wheels), else its ``setup.py``."""
    for dist in sorted(package_dir.parent.glob("amdsmi-*.dist-info")):
        metadata = dist / "METADATA"
        if metadata.exists():
            found = _METADATA_VERSION.search(metadata.read_text(encoding="utf-8", errors="replace"))
            if found:
                return tuple(int(p) for p in found.groups())  # type: ignore[return-value]
    setup = package_dir / "setup.py"
    if setup.exists():
        found = _SETUP_VERSION.search(setup.read_text(encoding="utf-8", errors="replace"))
        if found:
            return tuple(int(p) for p in found.groups())  # type: ignore[return-value]
    return None
