"""Kubernetes attribution without the kubelet: a process's pod from its /proc cgroup file.

Every cgroup layout of the drivers and runtimes we support, processes outside Kubernetes, and the
namespace and pod name read from the process when privileges allow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.context.attribution.kubelet import PodRef, parse_cgroup, pod_from_cgroup

POD_UID = "4e7c1a2b-3d4f-4a5b-8c6d-7e8f9a0b1c2d"
CID = "a3f1c0d2e4b5968778695a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d"


@pytest.mark.parametrize(
    "cgroup",
    [
        # cgroupfs driver, cgroup v1, Burstable and Guaranteed
        f"12:memory:/kubepods/burstable/pod{POD_UID}/{CID}\n11:cpu,cpuacct:/kubepods/burstable/pod{POD_UID}/{CID}\n",
        f"5:devices:/kubepods/pod{POD_UID}/{CID}\n",
        # cgroupfs driver, cgroup v2, CRI-O
        f"0::/kubepods/besteffort/pod{POD_UID}/crio-{CID}\n",
        # systemd driver, cgroup v2: containerd, CRI-O, Docker
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_UID.replace('-', '_')}.slice/docker-{CID}.scope\n",
        # systemd driver, cgroup v1 (hybrid: a v2 line for systemd too)
        f"1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n0::/\n",
        # nested under a kind/kubelet cgroup root
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
    ],
    ids=["v1-cgroupfs-burstable", "v1-cgroupfs-guaranteed", "v2-cgroupfs-crio", "v2-systemd-containerd",
         "v2-systemd-crio-guaranteed", "v2-systemd-docker", "v1-systemd-containerd", "v2-kind"],
)
def test_cgroup_layouts(cgroup):
    assert parse_cgroup(cgroup) == (POD_UID, CID)


def test_cgroup_outside_kubernetes_and_pod_level():
    assert parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert parse_cgroup("0::/system.slice/slurmstepd.scope/job_42/step_0\n") is None
    assert parse_cgroup("garbage\n\n") is None
    assert parse_cgroup(f"0::/kubepods/burstable/pod{POD_UID}\n") == (POD_UID, None)
    assert parse_cgroup(f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/crio-conmon-{CID}.scope\n") == (POD_UID, None)
    static = "0d8b0f1c2e3a4b5c6d7e8f9a0b1c2d3e"  # static pods use a 32-hex config hash as UID
    assert parse_cgroup(f"0::/kubepods/burstable/pod{static}/{CID}\n") == (static, CID)


def write_proc(root: Path, pid: int, cgroup: str, environ: bytes | None = None, namespace: str | None = None) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "cgroup").write_text(cgroup)
    if environ is not None:
        (base / "environ").write_bytes(environ)
    if namespace is not None:
        ns_file = base / "root/var/run/secrets/kubernetes.io/serviceaccount/namespace"
        ns_file.parent.mkdir(parents=True)
        ns_file.write_text(namespace + "\n")


def test_pod_from_cgroup_with_privileges(tmp_path):
    cgroup = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
    write_proc(tmp_path, 4242, cgroup, environ=b"PATH=/usr/bin\0HOSTNAME=trainer-0\0HOME=/root\0", namespace="ml")
    assert pod_from_cgroup(4242, proc_root=tmp_path) == PodRef(
        namespace="ml", pod="trainer-0", container=None, pod_uid=POD_UID, container_id=CID
    )


def test_pod_from_cgroup_without_privileges(tmp_path):
    write_proc(tmp_path, 7, f"0::/kubepods/pod{POD_UID}/{CID}\n")  # environ and root unreadable/absent
    assert pod_from_cgroup(7, proc_root=tmp_path) == PodRef(
        namespace=None, pod=None, container=None, pod_uid=POD_UID, container_id=CID
    )


def test_pod_from_cgroup_never_raises(tmp_path):
    assert pod_from_cgroup(999, proc_root=tmp_path) is None  # process gone
    write_proc(tmp_path, 8, "0::/user.slice\n", environ=b"HOSTNAME=laptop\0")
    assert pod_from_cgroup(8, proc_root=tmp_path) is None  # not in a pod
    base = tmp_path / "9"
    base.mkdir()
    (base / "cgroup").mkdir()  # reading a directory raises IsADirectoryError
    assert pod_from_cgroup(9, proc_root=tmp_path) is None
