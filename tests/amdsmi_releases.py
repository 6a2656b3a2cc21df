"""The amdsmi releases the AMD tests run over: each one's real package, unpacked from its wheel.

Every release in :data:`tests.wheels.AMDSMI` is downloaded once into ``.whl/`` and loaded over the
fake libamd_smi, which then plays that release (its C symbols, its structures). A release that
cannot be downloaded fails the test that asked for it (:class:`tests.wheels.WheelUnavailable`);
it is never skipped, since the matrix is what proves the declared minimum.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.wheels import AMDSMI, unpacked

OLDEST, NEWEST = AMDSMI[0], AMDSMI[-1]


def package(version: str) -> Path:
    """The ``amdsmi`` package directory of release ``version``."""
    return unpacked("amdsmi", version) / "amdsmi"


def version_of(text: str) -> tuple[int, int]:
    major, minor, *_ = (int(p) for p in text.split("."))
    return major, minor


@pytest.fixture(params=AMDSMI)
def release(request: pytest.FixtureRequest) -> str:
    """Each amdsmi release in turn, oldest first."""
    return request.param
