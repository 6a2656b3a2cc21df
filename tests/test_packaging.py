"""Installable as users install node agents (issue 45): one version, a wheel and an sdist, an installer
that installs what the user has, release and CI workflows, and the chart pulling what is built.

The quick tests read the files; the slow ones run the tools a release runs: ``python -m build`` and
``twine check`` once for the module, the wheel installed into a fresh virtualenv and run there,
``deploy/systemd/install.sh`` under ``ROOFWATCH_INSTALL_ROOT`` from a checkout, an unpacked release and
a directory that is neither, ``actionlint`` over the workflows and ``shellcheck`` over the scripts.
(The container image: tests/test_container_image.py.)
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from agent import __version__
from tests.agent_process import clean_env
from tests.helm_chart import only, render

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
CHART = yaml.safe_load((ROOT / "deploy" / "helm" / "roofwatch" / "Chart.yaml").read_text())
VALUES = yaml.safe_load((ROOT / "deploy" / "helm" / "roofwatch" / "values.yaml").read_text())
WORKFLOWS = ROOT / ".github" / "workflows"
INSTALL_SH = ROOT / "deploy" / "systemd" / "install.sh"
SCRIPTS = (ROOT / "dev.sh", ROOT / ".ci" / "run", INSTALL_SH)


def workflow(name: str) -> dict:
    document = yaml.safe_load((WORKFLOWS / name).read_text())
    document["on"] = document.pop(True, document.get("on"))  # YAML 1.1 reads the key `on` as true
    return document


def steps(document: dict) -> list[dict]:
    return [step for job in document["jobs"].values() for step in job.get("steps", [])]


# -- one version ------------------------------------------------------------------------------------------


def test_the_version_is_written_in_one_place():
    assert "version" not in PROJECT and PROJECT["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "agent.__version__"}
    assert re.search(r'^__version__ = "[0-9][0-9a-z.+]*"$', (ROOT / "agent" / "__init__.py").read_text(), re.M)


def test_the_charts_app_version_is_the_package_version():
    assert CHART["appVersion"] == __version__


def test_the_chart_pulls_the_tag_the_image_is_built_with_or_a_digest():
    def image(values: dict) -> str:
        (container,) = only(render(values), "DaemonSet")["spec"]["template"]["spec"]["containers"]
        return container["image"]

    repository = VALUES["image"]["repository"]
    assert image({}) == f"{repository}:{__version__}"
    assert image({"amd": {"enabled": True}}) == f"{repository}:{__version__}-amd"  # the [amd] variant's tag
    digest = "sha256:" + "0123456789abcdef" * 4
    assert image({"image": {"digest": digest}}) == f"{repository}@{digest}"


def test_the_chart_refuses_a_digest_that_is_not_one():
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError, match="digest"):
        render({"image": {"digest": "latest"}})


# -- workflows --------------------------------------------------------------------------------------------


def test_ci_runs_what_ci_run_runs_on_every_push_and_pull_request():
    ci = workflow("ci.yml")
    assert {"push", "pull_request"} <= set(ci["on"])
    assert any("bash .ci/run" in step.get("run", "") for step in steps(ci))
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("exec ./dev.sh test")


def test_a_version_tag_releases_wheel_sdist_and_both_images_where_the_chart_pulls():
    release = workflow("release.yml")
    assert release["on"] == {"push": {"tags": ["v*"]}}
    jobs = release["jobs"]
    assert jobs["test"]["uses"] == "./.github/workflows/ci.yml"
    build = "\n".join(step.get("run", "") for step in jobs["dist"]["steps"])
    assert "python -m build" in build and "twine check --strict dist/*" in build
    read = "\n".join(step.get("run", "") for step in jobs["version"]["steps"])
    assert "deploy/helm/roofwatch/values.yaml" in read and "agent/__init__.py" in read  # where the chart pulls
    (push,) = [s for s in jobs["image"]["steps"] if s.get("uses", "").startswith("docker/build-push-action")]
    assert set(push["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert push["with"]["push"] is True
    assert push["with"]["tags"].startswith("${{ needs.version.outputs.repository }}:${{ needs.version.outputs.version }}")
    assert [v["suffix"] for v in jobs["image"]["strategy"]["matrix"]["include"]] == ["", "-amd"]
    assert set(jobs["publish"]["needs"]) == {"dist", "image"}
    assert any("gh release create" in s.get("run", "") and "dist/*" in s["run"] for s in jobs["publish"]["steps"])


@pytest.mark.slow
def test_actionlint_passes_on_the_workflows():
    actionlint = shutil.which("actionlint") or str(Path(sys.executable).parent / "actionlint")
    assert os.access(actionlint, os.X_OK), "actionlint comes with the test extra (pyproject.toml): ./dev.sh setup"
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert len(files) == 2
    result = subprocess.run([actionlint, *files], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_the_shell_scripts_pass_shellcheck():
    assert shutil.which("shellcheck"), "shellcheck: Debian package shellcheck (./dev.sh test installs it)"
    result = subprocess.run(["shellcheck", *map(str, SCRIPTS)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# -- wheel and sdist --------------------------------------------------------------------------------------


def working_tree_copy(dest: Path) -> Path:
    """The files a clone of this working tree would have (tracked, and new ones git does not ignore), so
    the build writes its egg-info there, not into the checkout, and no other run's build races it."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The wheel and the sdist of this working tree, built as the release workflow builds them."""
    out = tmp_path_factory.mktemp("dist")
    tree = working_tree_copy(tmp_path_factory.mktemp("tree"))
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(tree)],
                           capture_output=True, text=True, timeout=600, env=clean_env())
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,), (sdist,) = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    return {"wheel": wheel, "sdist": sdist}


@pytest.mark.slow
def test_twine_accepts_the_wheel_and_the_sdist(dist):
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(dist["wheel"]), str(dist["sdist"])],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2


@pytest.mark.slow
def test_the_wheels_metadata_is_complete(dist):
    assert dist["wheel"].name == f"roofwatch-{__version__}-py3-none-any.whl"
    assert dist["sdist"].name == f"roofwatch-{__version__}.tar.gz"
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        info = f"roofwatch-{__version__}.dist-info"
        meta = email.parser.Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
        assert f"{info}/licenses/LICENSE" in wheel.namelist()
        assert "agent/virtual/scenarios/demo.yaml" in wheel.namelist()  # package data travels
    assert (meta["Name"], meta["Version"]) == ("roofwatch", __version__)
    assert meta["License-Expression"] == "Apache-2.0" and meta["License-File"] == "LICENSE"
    assert meta["Requires-Python"] == ">=3.10" and meta["Description-Content-Type"] == "text/markdown"
    urls = {url.split(",")[0] for url in meta.get_all("Project-URL")}
    assert {"Homepage", "Source", "Issues", "Documentation"} <= urls
    classifiers = meta.get_all("Classifier")
    versions = sorted(c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert versions and versions[0] == meta["Requires-Python"].removeprefix(">="), "the oldest Python named is the one required"
    assert any(c.startswith("License") for c in classifiers) is False  # PEP 639: the expression, not a classifier
    assert set(meta.get_all("Provides-Extra")) == set(PROJECT["optional-dependencies"])
    plain = {str(Requirement(r)) for r in meta.get_all("Requires-Dist") if "extra ==" not in r}
    assert plain == {str(Requirement(r)) for r in PROJECT["dependencies"]}


@pytest.mark.slow
def test_the_sdist_is_a_release_tree(dist):
    with tarfile.open(dist["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for path in ("pyproject.toml", "LICENSE", "README.md", "deploy/systemd/install.sh", "deploy/systemd/roofwatch.service",
                 "deploy/helm/roofwatch/Chart.yaml", "docs/deploy.md", "docs/trace-format.md", "agent/__init__.py"):
        assert path in names, path
    assert not [n for n in names if n.startswith(("tests/", "traces/", "benchmarks/")) or "__pycache__" in n]


def borrow_dependencies(venv: Path) -> None:
    """The agent's dependencies, taken from the test interpreter through a .pth file: a fresh virtualenv
    gets the wheel itself (--no-deps); the image test installs everything from wheels for real."""
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


@pytest.mark.slow
def test_the_wheel_installs_and_runs_in_a_fresh_virtualenv(dist, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                                str(dist["wheel"])], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    borrow_dependencies(venv)
    roofwatch = str(venv / "bin" / "roofwatch")
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import agent; print(agent.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=clean_env())
    assert where.stdout.strip().startswith(str(venv)), where
    version = subprocess.run([roofwatch, "--version"], capture_output=True, text=True, cwd=tmp_path, env=clean_env())
    assert version.stdout.strip() == f"roofwatch {__version__}", version.stderr
    doctor = subprocess.run([roofwatch, "doctor", "--backend", "nvml-virtual"], capture_output=True, text=True,
                            cwd=tmp_path, env=clean_env(), timeout=120)
    assert doctor.returncode == 0 and "node: fully usable" in doctor.stdout, doctor.stdout + doctor.stderr


# -- install.sh -------------------------------------------------------------------------------------------


def install(script: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(ROOFWATCH_INSTALL_ROOT=str(root), ROOFWATCH_NO_SYSTEMCTL="1", ROOFWATCH_PYTHON=sys.executable,
                    ROOFWATCH_PIP_ARGS="--no-deps", ROOFWATCH_EXTRAS="")
    return subprocess.run(["sh", str(script), *args], capture_output=True, text=True, timeout=600, env=env,
                          cwd=root.parent)


def installed_version(root: Path) -> str:
    venv = root / "opt" / "roofwatch"
    borrow_dependencies(venv)
    out = subprocess.run([str(venv / "bin" / "roofwatch"), "--version"], capture_output=True, text=True, env=clean_env())
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def checkout_copy(dest: Path, version: str) -> Path:
    """What a checkout holds for an install, with its own version (so nothing else can pass for it)."""
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(ROOT / name, dest / name)
    for tree in ("agent", "exporters", "deploy/systemd"):
        shutil.copytree(ROOT / tree, dest / tree, ignore=shutil.ignore_patterns("__pycache__"))
    init = dest / "agent" / "__init__.py"
    init.write_text(re.sub(r'^__version__ = ".*"$', f'__version__ = "{version}"', init.read_text(), flags=re.M))
    return dest / "deploy" / "systemd" / "install.sh"


@pytest.mark.slow
def test_install_sh_without_argument_installs_the_checkout_it_sits_in(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    script = checkout_copy(checkout, f"{__version__}+checkout")
    root = tmp_path / "root"
    result = install(script, root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"installing roofwatch {__version__}+checkout from {checkout}" in result.stdout
    assert installed_version(root) == f"roofwatch {__version__}+checkout"


@pytest.mark.slow
def test_install_sh_without_argument_installs_an_unpacked_release_or_the_wheel_beside_it(dist, tmp_path):
    with tarfile.open(dist["sdist"]) as sdist:
        sdist.extractall(tmp_path, filter="tar")
    release = tmp_path / f"roofwatch-{__version__}"
    script = release / "deploy" / "systemd" / "install.sh"
    root = tmp_path / "root"
    result = install(script, root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"installing roofwatch {__version__} from {release}" in result.stdout
    assert installed_version(root) == f"roofwatch {__version__}"

    beside = script.parent / dist["wheel"].name
    shutil.copy(dist["wheel"], beside)
    again = install(script, root)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"installing roofwatch {__version__} from {beside}" in again.stdout
    assert "keeping existing" in again.stdout  # an upgrade in place keeps the node's settings


@pytest.mark.slow
def test_install_sh_outside_a_release_installs_nothing_and_says_what_to_pass(tmp_path):
    """No argument never means a name looked up in an index (that name is not ours on PyPI)."""
    lone = tmp_path / "lone" / "deploy" / "systemd"
    shutil.copytree(INSTALL_SH.parent, lone, ignore=shutil.ignore_patterns("__pycache__"))
    root = tmp_path / "root"
    result = install(lone / "install.sh", root)
    assert result.returncode == 1
    assert "nothing to install" in result.stderr and "install.sh SOURCE" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (root / "opt").exists(), "no virtualenv, no pip run"
