"""Which scheduler job a GPU process belongs to, and which GPUs that job was given, read from /proc.

Slurm first: the cgroup path is world-readable and set by slurmd for every task, so it works for
other users' processes without privileges (v1 paths also carry the job owner's uid); the
environment (``SLURM_JOB_ID``, ``SLURM_JOB_USER``, ``SLURM_JOB_PARTITION``, ``SLURM_JOB_ACCOUNT``: the
account a job is billed to, which no cgroup path carries) covers setups without
Slurm's cgroup plugin but is only readable for our own user or with CAP_SYS_PTRACE +
CAP_DAC_READ_SEARCH (docs/deploy.md).

The environment also says which GPUs the job holds, including GPUs it never launched a kernel
on: ``SLURM_JOB_GPUS``/``SLURM_STEP_GPUS`` (node-global indices), and the visible-device lists
``CUDA_VISIBLE_DEVICES``, ``NVIDIA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES``,
``HIP_VISIBLE_DEVICES``. UUIDs there are global; plain indices are not (inside a container or a
Slurm step with constrained devices they count from 0 over what the process can see), so
indices from those lists are trusted only for processes outside Slurm and outside containers.

Failures mean "unknown", never an error: a process may exit between the driver listing it and
us reading its files.
"""

from __future__ import annotations

import pwd
import re
from dataclasses import dataclass
from pathlib import Path

from agent.model.indexes import is_index

_SLURM_JOB_IN_PATH = re.compile(r"/job_([0-9]{1,20})(?:/|$)")  # [0-9], never \d: \d matches "٣", which int() reads
_SLURM_UID_IN_PATH = re.compile(r"/uid_([0-9]{1,10})(?:/|$)")
_CONTAINER_IN_PATH = re.compile(r"kubepods|docker|containerd|crio|libpod")
_JOB_KEYS = ("SLURM_JOB_ID", "SLURM_JOBID")
_GLOBAL_INDEX_KEYS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
_VISIBLE_KEYS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
MAX_VISIBLE = 64
"""Longest device list taken from an environment (a node has at most a few dozen GPUs)."""

MAX_ENVIRON_BYTES = 1 << 20
"""How much of a process's environment is read. Another user's process may carry a huge one to cost
us memory; Slurm's variables sit in its first kilobytes, and what lies past the bound is unknown."""

_LABEL_VALUES = {
    "job_id": re.compile(r"[0-9A-Za-z][0-9A-Za-z_.+:-]{0,63}"),
    "user": re.compile(r"[A-Za-z_][A-Za-z0-9_.@-]{0,63}\$?"),
    "partition": re.compile(r"[0-9A-Za-z][0-9A-Za-z_.-]{0,63}"),
    "account": re.compile(r"[0-9A-Za-z][0-9A-Za-z_.-]{0,63}"),
}
"""What a job id (Slurm's are digits; arrays and het jobs add ``_`` and ``+``), a user name (POSIX
portable names, and ``user@domain`` as sssd writes directory users), a partition name and an account name
(sacctmgr's: letters, digits, ``_``, ``.``, ``-``; Slurm lower-cases it) may look like. These
values come from other users' environments and become metric labels and page text, so anything
else (escape sequences, spaces, markup, 10 kB) is unknown rather than shown."""


@dataclass(frozen=True, slots=True)
class ProcessJob:
    """What /proc says about one GPU process's job. ``None`` means unknown."""

    job_id: str | None = None
    user: str | None = None
    partition: str | None = None
    account: str | None = None
    """The Slurm account the job is billed to (``SLURM_JOB_ACCOUNT``; only the environment carries it)."""
    owner: str | None = None
    """The process's owner (its real uid's user name, else the uid): a plain process holder's user."""
    gpus: tuple[str, ...] = ()
    """GPUs the job holds: ``uuid:<UUID>`` or ``index:<n>`` (node-global index) references."""
    in_container: bool = False


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


def slurm_uid_from_cgroup(text: str) -> int | None:
    """The job owner's uid in a v1 Slurm cgroup path (``/slurm/uid_1000/job_…``); v2 paths carry none."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "slurm" in path and (match := _SLURM_UID_IN_PATH.search(path)):
            return int(match.group(1))
    return None


def label_value(kind: str, value: str | None) -> str | None:
    """``value`` when it looks like a ``kind`` (job_id, user, partition, account) should, else None (unknown)."""
    if value is None or _LABEL_VALUES[kind].fullmatch(value) is None:
        return None
    return value


def parse_environ(raw: bytes) -> dict[str, str]:
    """A NUL-separated ``/proc/<pid>/environ``, keeping only the keys attribution reads."""
    wanted = set(_JOB_KEYS + _GLOBAL_INDEX_KEYS + _VISIBLE_KEYS + ("SLURM_JOB_USER", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT"))
    env = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key.decode("ascii", "replace") in wanted:
            env[key.decode("ascii")] = value.decode("utf-8", "replace").strip()
    return env


def slurm_job_from_environ(raw: bytes) -> str | None:
    """SLURM_JOB_ID (or the older SLURM_JOBID) from a NUL-separated ``/proc/<pid>/environ``;
    None when absent or not shaped like a job id."""
    env = parse_environ(raw)
    return label_value("job_id", next((env[key] for key in _JOB_KEYS if env.get(key)), None))


def _read_environ(path: Path) -> bytes:
    """At most ``MAX_ENVIRON_BYTES`` of it; an entry cut by the bound is dropped, not half-read."""
    with path.open("rb") as f:
        raw = f.read(MAX_ENVIRON_BYTES + 1)
    if len(raw) > MAX_ENVIRON_BYTES:
        raw = raw[: raw.rfind(b"\0", 0, MAX_ENVIRON_BYTES) + 1]
    return raw


def _device_list(value: str) -> list[str]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    return items[:MAX_VISIBLE]


def job_gpus(env: dict[str, str], *, trust_indices: bool) -> tuple[str, ...]:
    """GPU references a process's environment names (see the module docstring for which to trust)."""
    refs: list[str] = []
    for key in _GLOBAL_INDEX_KEYS:
        if env.get(key):
            refs += [f"index:{item}" for item in _device_list(env[key]) if is_index(item)]
            break
    for key in _VISIBLE_KEYS:
        for item in _device_list(env.get(key, "")):
            if item.upper().startswith(("GPU-", "MIG-")):
                refs.append(f"uuid:{item.upper()}")
            elif is_index(item) and trust_indices and not any(r.startswith("index:") for r in refs):
                refs.append(f"index:{item}")
    return tuple(dict.fromkeys(refs))


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _owner_uid(status: str) -> int | None:
    """The real uid on the ``Uid:`` line of a ``/proc/<pid>/status`` text (world-readable, no privileges)."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) > 1 and fields[1].isascii() and fields[1].isdigit():
                return int(fields[1])
    return None


def process_job(pid: int, proc_root: Path = Path("/proc")) -> ProcessJob:
    """The scheduler job of process ``pid`` and the GPUs it holds; empty when unknown."""
    base = proc_root / str(pid)
    try:
        cgroup = (base / "cgroup").read_text(errors="replace")
    except OSError:
        cgroup = ""
    try:
        env = parse_environ(_read_environ(base / "environ"))
    except OSError:  # gone, another PID namespace, or another user's without the capabilities
        env = {}
    job = slurm_job_from_cgroup(cgroup) or label_value("job_id", next((env[k] for k in _JOB_KEYS if env.get(k)), None))
    uid = slurm_uid_from_cgroup(cgroup)
    user = label_value("user", env.get("SLURM_JOB_USER")) or (_user_name(uid) if uid is not None else None)
    in_container = bool(_CONTAINER_IN_PATH.search(cgroup))
    gpus = job_gpus(env, trust_indices=job is None and not in_container)
    partition = label_value("partition", env.get("SLURM_JOB_PARTITION"))
    account = label_value("account", env.get("SLURM_JOB_ACCOUNT"))
    try:
        owner_uid = _owner_uid((base / "status").read_text(errors="replace"))
    except OSError:
        owner_uid = None
    name = _user_name(owner_uid) if owner_uid is not None else None
    owner = label_value("user", name) or (name if name is not None and name.isdigit() else None)
    return ProcessJob(job_id=job, user=user if job else None, partition=partition if job else None,
                      account=account if job else None, owner=owner, gpus=gpus, in_container=in_container)


def process_job_id(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The scheduler job of process ``pid``, or None when it has none or we cannot tell."""
    return process_job(pid, proc_root).job_id
