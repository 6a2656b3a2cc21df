"""Which scheduler job a GPU process belongs to, read from /proc: Slurm first, as its job id.

The cgroup path is world-readable and set by slurmd for every task, so it works for other
users' processes without privileges; the environment (SLURM_JOB_ID) covers setups without
Slurm's cgroup plugin but is only readable for our own user or with CAP_SYS_PTRACE +
CAP_DAC_READ_SEARCH (docs/deploy.md). Failures mean "unknown", never an error: a process may
exit between NVML listing it and us reading its files.
"""

from __future__ import annotations

import re
from pathlib import Path

_SLURM_JOB_IN_PATH = re.compile(r"/job_(\d+)(?:/|$)")
_ENV_KEYS = (b"SLURM_JOB_ID=", b"SLURM_JOBID=")


def slurm_job_from_cgroup(text: str) -> str | None:
    """The job id in a ``/proc/<pid>/cgroup`` text, for cgroup v1 and v2 layouts.

    v1: ``4:memory:/slurm/uid_1000/job_4242/step_0/task_0``;
    v2: ``0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0``.
    """
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "slurm" not in path:
            continue
        match = _SLURM_JOB_IN_PATH.search(path)
        if match:
            return match.group(1)
    return None


def slurm_job_from_environ(raw: bytes) -> str | None:
    """SLURM_JOB_ID (or the older SLURM_JOBID) from a NUL-separated ``/proc/<pid>/environ``."""
    for entry in raw.split(b"\0"):
        for key in _ENV_KEYS:
            if entry.startswith(key):
                value = entry[len(key):].decode("ascii", "replace").strip()
                if value:
                    return value
    return None


def process_job_id(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The scheduler job of process ``pid``, or None when it has none or we cannot tell."""
    base = proc_root / str(pid)
    try:
        job = slurm_job_from_cgroup((base / "cgroup").read_text(errors="replace"))
    except OSError:
        job = None
    if job is not None:
        return job
    try:
        return slurm_job_from_environ((base / "environ").read_bytes())
    except OSError:  # gone, another PID namespace, or another user's without the capabilities
        return None
