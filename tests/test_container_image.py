"""The Dockerfile cannot be built here (no Docker), so check that it agrees with what it packages.

The image is what the Helm chart runs: its port, its entry point and the packages it copies
must match the agent and the chart, or a build that succeeds ships an agent that cannot start.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from agent.app.config import DEFAULT_PORT

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VALUES = yaml.safe_load((ROOT / "deploy" / "helm" / "roofwatch" / "values.yaml").read_text())


def test_image_exposes_the_agents_default_port_and_the_charts():
    assert re.search(rf"^EXPOSE {DEFAULT_PORT}$", DOCKERFILE, re.MULTILINE)
    assert VALUES["port"] == DEFAULT_PORT


def test_image_runs_the_installed_console_script():
    assert 'ENTRYPOINT ["roofwatch"]' in DOCKERFILE
    assert "roofwatch" in PYPROJECT["project"]["scripts"]
    daemonset = (ROOT / "deploy" / "helm" / "roofwatch" / "templates" / "daemonset.yaml").read_text()
    assert 'command: ["roofwatch", "run"]' in daemonset


def test_image_copies_every_package_the_wheel_needs():
    copied = set(re.findall(r"^COPY (\w+) \./\1$", DOCKERFILE, re.MULTILINE))
    packages = {pattern.rstrip("*") for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages == copied
    assert "COPY pyproject.toml README.md ./" in DOCKERFILE  # the build reads both (readme = README.md)


def test_image_runs_unprivileged_by_default():
    assert re.search(r"^USER 65534:65534$", DOCKERFILE, re.MULTILINE)
