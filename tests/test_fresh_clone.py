"""The quick tier passes on a fresh clone (issue 45 item 8).

The version-matrix tests load every nvidia-ml-py and amdsmi release we accept from ``.whl/``
(tests/wheels.py). On a fresh clone that directory is empty and each test fetched its release with
``pip download`` on first use, which the quick tier's guard forbids (tests/tiers.py: no child process
in an unmarked test): 127 failed and 192 errors, every one ``UnmarkedSlowTest``. ``./dev.sh test`` now
fetches them first (``python -m tests.wheels``), and a quick-tier test that still finds one missing
says what to run instead of blaming itself.

Here an empty cache (``ROOFWATCH_WHEEL_CACHE``) stands for the fresh clone, and an inner quick-tier run
of two matrix tests for the first command a contributor types.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_process import clean_env
from tests.wheels import AMDSMI, NVIDIA_ML_PY

ROOT = Path(__file__).resolve().parent.parent
DEV_SH = (ROOT / "dev.sh").read_text()
MATRIX_TESTS = ["tests/test_nvml_versions.py", "tests/test_amd_versions.py"]


def quick_tier(cache: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``pytest -m "not slow"`` over one test of each matrix file's oldest release, with ``cache`` as .whl/."""
    selected = f"{NVIDIA_ML_PY[0]} or {AMDSMI[0]}"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-m", "not slow", "-k", selected, *extra, *MATRIX_TESTS],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=clean_env(ROOFWATCH_WHEEL_CACHE=str(cache)))


def test_dev_sh_fetches_the_matrix_before_it_runs_pytest():
    test_branch = DEV_SH.split("\n    test)", 1)[1].split(";;", 1)[0]
    assert test_branch.index("ensure_test_wheels") < test_branch.index("-m pytest")
    assert '"$VENV/bin/python" -m tests.wheels' in DEV_SH


@pytest.mark.slow
def test_the_quick_tier_on_an_empty_cache_names_the_fetch_and_passes_once_it_ran(tmp_path):
    cache = tmp_path / "whl"
    before = quick_tier(cache)
    assert before.returncode == 1, before.stdout[-3000:]
    assert "python -m tests.wheels" in before.stdout
    assert "UnmarkedSlowTest" not in before.stdout.split("short test summary info")[-1]

    fetched = subprocess.run([sys.executable, "-m", "tests.wheels"], capture_output=True, text=True, timeout=900,
                             cwd=ROOT, env=clean_env(ROOFWATCH_WHEEL_CACHE=str(cache)))
    assert fetched.returncode == 0, fetched.stderr
    assert sorted(p.name for p in cache.iterdir() if (p / ".complete").exists()) == sorted(
        [f"nvidia-ml-py-{v}" for v in NVIDIA_ML_PY] + [f"amdsmi-{v}" for v in AMDSMI])

    after = quick_tier(cache)
    assert after.returncode == 0, after.stdout[-3000:]
    passed = re.search(r"(\d+) passed", after.stdout)
    assert passed and int(passed.group(1)) >= 2, after.stdout[-500:]
