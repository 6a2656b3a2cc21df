"""The container image the Helm chart runs: its Dockerfile (quick), and the image itself, built here (slow).

The image must agree with what it packages: its port, its entry point and the files the build reads
must match the agent and the chart, or a build that succeeds ships an agent that cannot start.

The slow half builds it as a user does, ``./dev.sh image default amd`` (mmdebstrap and buildah, as
root, from Debian's archive and the package registries: no container registry is reachable here),
unpacks each OCI archive with umoci and runs roofwatch inside it under chroot, as the image's own user
with its own entrypoint and environment: ``--version``, ``doctor`` over the virtual driver, and a demo
that serves /metrics. (``podman run`` is refused on these machines: setrlimit.) docs/deploy.md states
the image's size and what makes it up; a test holds those figures to the image built.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent import __version__
from agent.app.config import DEFAULT_PORT
from tests.agent_process import AgentProcess, clean_env, roofwatch_cmd

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
DOCKERIGNORE = (ROOT / ".dockerignore").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VALUES = yaml.safe_load((ROOT / "deploy" / "helm" / "roofwatch" / "values.yaml").read_text())
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
VARIANTS = {"default": "", "amd": "-amd"}
"""``./dev.sh image`` variants and the suffix of their tags (the Dockerfile's EXTRAS)."""
VIRTUAL_BACKEND = {"default": "nvml-virtual", "amd": "amd-virtual"}
"""The backend each variant proves it carries: NVML's code over the fake driver; amdsmi's (the [amd] extra)."""
IMAGE_TOOLS = ("mmdebstrap", "buildah", "umoci", "chroot")


def copied_sources() -> list[str]:
    return [src for line in re.findall(r"^COPY (?!--from)(.+?) \S+$", DOCKERFILE, re.MULTILINE) for src in line.split()]


def test_image_exposes_the_agents_default_port_and_the_charts():
    assert re.search(rf"^EXPOSE {DEFAULT_PORT}$", DOCKERFILE, re.MULTILINE)
    assert VALUES["port"] == DEFAULT_PORT


def test_image_runs_the_installed_console_script():
    assert 'ENTRYPOINT ["roofwatch"]' in DOCKERFILE
    assert "roofwatch" in PYPROJECT["project"]["scripts"]
    daemonset = (ROOT / "deploy" / "helm" / "roofwatch" / "templates" / "daemonset.yaml").read_text()
    assert 'command: ["roofwatch", "run"]' in daemonset


def test_image_copies_every_package_and_file_the_build_reads():
    copied = set(re.findall(r"^COPY (\w+) \./\1$", DOCKERFILE, re.MULTILINE))
    packages = {pattern.rstrip("*") for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages == copied
    read = {"pyproject.toml", PYPROJECT["project"]["readme"], *PYPROJECT["project"]["license-files"]}
    assert read | packages == set(copied_sources())


def test_the_build_context_lets_through_what_the_build_copies():
    """.dockerignore keeps everything else out (a context with .venv or traces is slow and leaks state)."""
    lines = [line for line in DOCKERIGNORE.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*"
    assert {line[1:] for line in lines if line.startswith("!")} == set(copied_sources())


def test_image_runs_unprivileged_by_default():
    assert re.search(r"^USER 65534:65534$", DOCKERFILE, re.MULTILINE)


def test_image_is_labelled_with_its_source_version_and_revision():
    for key, arg in (("version", "${VERSION}"), ("revision", "${REVISION}")):
        assert f'org.opencontainers.image.{key}="{arg}"' in DOCKERFILE
    assert f'org.opencontainers.image.source="{PYPROJECT["project"]["urls"]["Source"]}"' in DOCKERFILE


# -- the image, built ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Image:
    """One variant's OCI archive, unpacked."""

    archive: Path
    ref: str                    # the archive's org.opencontainers.image.ref.name
    config: dict                # the image configuration's "config": User, Entrypoint, Env, Labels, ...
    rootfs: Path

    def program(self) -> list[str]:
        """The image's entrypoint, run as its user with its environment and nothing of ours."""
        return ["env", "-i", *self.config["Env"], shutil.which("chroot"), f"--userspec={self.config['User']}",
                str(self.rootfs), *self.config["Entrypoint"]]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.program(), *args], capture_output=True, text=True, timeout=timeout)


def unpack(archive: Path, workdir: Path) -> Image:
    layout, bundle = workdir / "layout", workdir / "bundle"
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="tar")
    (manifest_ref,) = json.loads((layout / "index.json").read_text())["manifests"]
    ref = manifest_ref["annotations"]["org.opencontainers.image.ref.name"]

    def blob(digest: str) -> dict:
        return json.loads((layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_text())

    config = blob(blob(manifest_ref["digest"])["config"]["digest"])["config"]
    unpacked = subprocess.run(["umoci", "unpack", "--image", f"{layout}:{ref}", str(bundle)],
                              capture_output=True, text=True, timeout=600)
    assert unpacked.returncode == 0, unpacked.stderr
    return Image(archive, ref, config, bundle / "rootfs")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Image]:
    """``./dev.sh image default amd`` into a temporary directory, each archive unpacked."""
    missing = [tool for tool in IMAGE_TOOLS if not shutil.which(tool)]
    assert not missing, (f"the image checks need {', '.join(missing)}: ./dev.sh test installs them "
                         "(Debian packages mmdebstrap, buildah, umoci)")
    assert os.geteuid() == 0, "building the image needs root (mmdebstrap, buildah): run the suite as root, as CI does"
    out = tmp_path_factory.mktemp("image")
    built = subprocess.run(["./dev.sh", "image", *VARIANTS], cwd=ROOT, capture_output=True, text=True, timeout=2400,
                           env=clean_env(ROOFWATCH_IMAGE_OUT=str(out), ROOFWATCH_VENV=sys.prefix))
    assert built.returncode == 0, built.stderr[-4000:]
    return {variant: unpack(out / f"roofwatch-{__version__}{suffix}-oci.tar", tmp_path_factory.mktemp(variant))
            for variant, suffix in VARIANTS.items()}


def samples(text: str, name: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def git_head() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_archive_is_the_image_the_chart_pulls(images, variant):
    image = images[variant]
    assert image.ref == f"{VALUES['image']['repository']}:{__version__}{VARIANTS[variant]}"
    assert image.config["User"] == "65534:65534"
    assert image.config["Entrypoint"] == ["roofwatch"] and image.config["Cmd"] == ["run"]
    assert f"{DEFAULT_PORT}/tcp" in image.config["ExposedPorts"]
    labels = image.config["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.revision"].startswith(git_head())
    assert labels["org.opencontainers.image.source"] == PYPROJECT["project"]["urls"]["Source"]
    assert labels["io.roofwatch.extras"] == ("" if variant == "default" else variant)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_roofwatch_inside_says_its_version_and_its_doctor_agrees_with_the_checkouts(images, variant):
    """Inside, doctor over the variant's virtual backend finds what this checkout's doctor finds (the same
    verdict on the node and exit status: the AMD one says counters are missing, by design), and the
    variant carries the vendor library it is built for."""
    image = images[variant]
    version = image.run("--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"roofwatch {__version__}"), version.stderr
    backend = VIRTUAL_BACKEND[variant]
    inside = image.run("doctor", "--backend", backend)
    here = subprocess.run(roofwatch_cmd("doctor", "--backend", backend), capture_output=True, text=True, timeout=120,
                          env=clean_env(), cwd=ROOT)
    assert inside.stdout.strip().splitlines()[-1] == here.stdout.strip().splitlines()[-1], inside.stdout + inside.stderr
    assert inside.returncode == here.returncode
    assert ("amdsmi not installed" in inside.stdout) == (variant == "default")


IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
import agent, exporters
absent = set(sys.argv[1:])
for package in (agent, exporters):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as exc:
            if exc.name not in absent:
                print(module.name, repr(exc))
        except Exception as exc:
            print(module.name, repr(exc))
"""
ABSENT_BY_DESIGN = {"default": ("amdsmi",), "amd": ()}
"""Vendor libraries a variant leaves out on purpose: the default image has no amdsmi wrapper."""


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_module_imports_inside_the_image(images, variant):
    """What a DaemonSet reaches only on a real node (the kubelet's gRPC pod-resources client, DRA names) must
    load inside the image too: grpc's compiled core needs libstdc++, which a bare Debian base lacks."""
    image = images[variant]
    python = ["env", "-i", *image.config["Env"], shutil.which("chroot"), f"--userspec={image.config['User']}",
              str(image.rootfs), "/opt/roofwatch/bin/python", "-c", IMPORT_EVERY_MODULE, *ABSENT_BY_DESIGN[variant]]
    done = subprocess.run(python, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_demo_inside_serves_metrics(images, variant):
    agent = AgentProcess("demo", "--backend", VIRTUAL_BACKEND[variant], "--listen", "127.0.0.1:0",
                         program=images[variant].program())
    try:
        agent.wait_healthy(timeout=60)
        text = agent.metrics()
    finally:
        agent.kill()
    built = samples(text, "roofwatch_build_info")
    assert [s.labels["version"] for s in built] == [__version__]
    assert [s.value for s in samples(text, "roofwatch_gpus_visible")] == [8.0]


@pytest.mark.slow
def test_the_image_holds_no_installer_build_tool_or_cache(images):
    rootfs = images["default"].rootfs
    venv = rootfs / "opt" / "roofwatch"
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    leftovers = [p for p in (venv / "bin" / "pip", site / "pip", site / "setuptools", site / "wheel",
                             rootfs / "src", rootfs / "wheelhouse", rootfs / "root" / ".cache",
                             rootfs / "usr" / "bin" / "gcc", rootfs / "usr" / "bin" / "cc", rootfs / "usr" / "bin" / "make")
                 if p.exists() or p.is_symlink()]
    assert leftovers == []
    assert [p.name for p in (rootfs / "var" / "lib" / "apt" / "lists").glob("*") if p.is_file() and p.name != "lock"] == []
    assert [p for p in (rootfs / "var" / "cache" / "apt").rglob("*.deb")] == []
    # the agent's user cannot rewrite the agent
    assert venv.stat().st_uid == 0 and not venv.stat().st_mode & 0o022 and not (site / "agent").stat().st_mode & 0o022


def documented_size_mb() -> tuple[int, int]:
    """(unpacked, archive) in MB as docs/deploy.md states them."""
    match = re.search(r"(\d+) MB unpacked, (\d+) MB as the OCI archive", DEPLOY_DOC.read_text())
    assert match, "docs/deploy.md states the image's size as '<N> MB unpacked, <M> MB as the OCI archive'"
    return int(match.group(1)), int(match.group(2))


@pytest.mark.slow
def test_the_image_is_the_size_docs_deploy_md_states(images):
    image = images["default"]
    unpacked = sum(p.lstat().st_size for p in image.rootfs.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6
    archive = image.archive.stat().st_size / 1e6
    stated_unpacked, stated_archive = documented_size_mb()
    assert abs(unpacked - stated_unpacked) <= 0.15 * stated_unpacked, (unpacked, stated_unpacked)
    assert abs(archive - stated_archive) <= 0.15 * stated_archive, (archive, stated_archive)
