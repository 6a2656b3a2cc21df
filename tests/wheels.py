"""Released wheels of the vendor bindings we support, unpacked once, for the version-matrix tests.

nvidia-ml-py and amdsmi are pure-Python wheels over a C library, so an older release can be
loaded beside the installed one: each is downloaded from PyPI (``pip download``, no install),
unpacked under ``.whl/<package>-<version>/`` (git-ignored, kept between runs) and imported from
there by path. The fakes then play the C library that release calls, so the matrix runs the
real binding code of every release we declare, not the newest one's.

A release that cannot be fetched is a test failure naming the command to run, never a skip:
the matrix is what proves the declared minimum versions.

``python -m tests.wheels`` fetches every release at once; ``./dev.sh test`` runs it before pytest, so
the quick tier, which starts no child process (tests/tiers.py), finds them unpacked on a fresh clone.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.tiers import UnmarkedSlowTest

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("ROOFWATCH_WHEEL_CACHE") or REPO / ".whl")
"""Where releases are unpacked; ROOFWATCH_WHEEL_CACHE moves it (tests/test_fresh_clone.py starts from an empty one)."""

NVIDIA_ML_PY = ("12.535.161", "12.560.30", "12.570.172", "12.575.51", "13.580.126", "13.615.71")
"""Every nvidia-ml-py line we accept, oldest first: the declared minimum, one release of each
driver branch since, and the newest we tested."""
AMDSMI = ("6.2.4", "6.3.3", "6.4.4", "7.0.2")
"""The amdsmi wrapper of each ROCm line we accept (the last release of each), oldest first."""


class WheelUnavailable(RuntimeError):
    """The release could not be downloaded (no network to PyPI?)."""


def unpacked(package: str, version: str) -> Path:
    """The directory holding ``package==version`` unpacked (its top-level modules directly inside).

    Safe to call from several test processes at once: one downloads, the others wait on a lock.
    """
    target = CACHE / f"{package}-{version}"
    done = target / ".complete"
    if done.exists():
        return target
    CACHE.mkdir(exist_ok=True)
    with open(CACHE / f".{package}-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return target
        download = CACHE / f".download-{package}-{version}"
        download.mkdir(exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                   "--no-deps", "--only-binary=:all:", "--dest", str(download), f"{package}=={version}"]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except UnmarkedSlowTest:
            raise WheelUnavailable(f"{package}=={version} is not in {CACHE} yet, and the quick tier starts no "
                                   "download: run 'python -m tests.wheels' once (./dev.sh test does)") from None
        wheels = sorted(download.glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise WheelUnavailable(f"cannot download {package}=={version} (run: {' '.join(command)}): "
                                   f"{result.stderr.strip()[-500:]}")
        target.mkdir(exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as archive:
            archive.extractall(target)
        done.touch()
    return target


def module_file(package: str, version: str, relative: str) -> Path:
    """A file inside the unpacked release, e.g. ``module_file("nvidia-ml-py", v, "pynvml.py")``."""
    path = unpacked(package, version) / relative
    if not path.exists():
        raise FileNotFoundError(f"{package}=={version} has no {relative}")
    return path


def releases() -> list[tuple[str, str]]:
    """Every (package, version) the version-matrix tests load."""
    return [("nvidia-ml-py", v) for v in NVIDIA_ML_PY] + [("amdsmi", v) for v in AMDSMI]


def main() -> int:
    """Fetch and unpack every release (a few at a time: each is one small download); 1 if any failed."""
    def fetch(release: tuple[str, str]) -> str | None:
        try:
            unpacked(*release)
        except (WheelUnavailable, OSError, subprocess.SubprocessError, zipfile.BadZipFile) as err:
            return str(err).splitlines()[0] if str(err) else repr(err)
        return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        errors = [e for e in pool.map(fetch, releases()) if e]
    for error in errors:
        print(f"tests.wheels: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
