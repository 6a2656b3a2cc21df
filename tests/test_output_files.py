"""Files the commands write whole: ``report --out``.

``report`` wrote through a predictable ``.<out>.partial``: anyone who could create files in the
target directory (``/tmp``) could put a symbolic link there and have the report written wherever
the user may write. It also replaced whatever stood at ``--out``, device nodes included
(``--out /dev/full`` as root turned the device into a file). Now the temporary file is made by
``mkstemp`` (unpredictable name, ``O_EXCL``), and an existing target that is not a regular file is
refused. ``record --out`` writes in place and never renames or replaces anything, so neither hazard
applies to it: a device or a FIFO there is written into as any Unix tool would (the disk-full tests
record into /dev/full), see docs/security.md.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.agent_process import clean_env, roofwatch_cmd

pytestmark = pytest.mark.slow

T0 = 1_800_000_000


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(roofwatch_cmd(*args), capture_output=True, text=True, timeout=timeout, env=clean_env())


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "in" / "t.jsonl"
    path.parent.mkdir()
    path.write_text("".join(f'{{"ts": {T0 + i}, "gpu": "0", "interval_s": 1.0, "gr_active": 0.9}}\n' for i in range(30)))
    return path


def test_report_never_writes_through_a_link_planted_at_the_old_partial_name(tmp_path, trace):
    out_dir = tmp_path / "shared"
    out_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out_dir / ".r.html.partial").symlink_to(victim)  # what another user could do in /tmp
    result = run("report", str(trace), "--out", str(out_dir / "r.html"))
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "precious\n"
    out = out_dir / "r.html"
    assert not out.is_symlink() and stat.S_ISREG(out.lstat().st_mode) and "<html" in out.read_text()
    assert sorted(p.name for p in out_dir.iterdir()) == [".r.html.partial", "r.html"], "no temporary file left"


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_report_refuses_a_target_that_is_not_a_regular_file(tmp_path, trace, kind):
    target = tmp_path / "target"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        target.symlink_to(victim)
    else:
        target.mkdir()
    before = target.lstat()
    result = run("report", str(trace), "--out", str(target), timeout=30)
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and str(target) in lines[0] and "not a regular file" in lines[0], lines
    after = target.lstat()
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), "left exactly as it was"
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "target", "victim.txt"]


def test_report_replaces_a_regular_file_with_the_usual_permissions(tmp_path, trace):
    out = tmp_path / "r.html"
    out.write_text("old")
    os.chmod(out, 0o600)
    result = run("report", str(trace), "--out", str(out))
    assert result.returncode == 0, result.stderr
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask, "not mkstemp's 0600: a report is meant to be shared"
    assert "<html" in out.read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_report_leaves_a_device_node_a_device_node(tmp_path, trace):
    """The issue's ``--out /dev/full`` as root, on a private copy of /dev/full's node."""
    device = tmp_path / "full"
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    result = run("report", str(trace), "--out", str(device))
    assert result.returncode == 2 and "not a regular file" in result.stderr
    assert stat.S_ISCHR(device.lstat().st_mode)
