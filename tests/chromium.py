"""Headless Chromium (Debian package ``chromium``) for the tests of the HTML views.

Chromium runs the page's own script under its CSP, so a page that renders here renders for a
person; ``--virtual-time-budget`` lets timers (the status page's refresh) run without the test
waiting in real time. The wrapper script and dbus print noise on stderr; only the exit code counts.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from PIL import Image

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1")


def binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    assert found, "headless Chromium is needed: apt-get install chromium (./dev.sh test installs it)"
    return found


def _run(args: list[str], profile: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([binary(), *FLAGS, f"--user-data-dir={profile}", *args],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"chromium exited {result.returncode}: {result.stderr[-2000:]}"
    return result


def dump_dom(url: str, profile: Path, *, budget_ms: int = 2000) -> str:
    """The DOM after the page's scripts ran for ``budget_ms`` of virtual time."""
    return _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], profile).stdout


def screenshot(url: str, out: Path, profile: Path, *, size: tuple[int, int], budget_ms: int = 1000) -> Image.Image:
    _run([f"--virtual-time-budget={budget_ms}", f"--window-size={size[0]},{size[1]}", f"--screenshot={out}", url], profile)
    image = Image.open(out)
    image.load()
    return image.convert("RGB")


def pixels_near(image: Image.Image, colour: str, *, box: tuple[int, int, int, int] | None = None, tolerance: int = 12) -> int:
    """How many pixels (in ``box``) are within ``tolerance`` of the hex ``colour`` on every channel."""
    target = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    region = image.crop(box) if box else image
    return sum(count for count, rgb in region.getcolors(maxcolors=1 << 24)
               if all(abs(a - b) <= tolerance for a, b in zip(rgb, target)))
