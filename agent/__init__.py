"""roofwatch agent: GPU telemetry with roofline verdicts and MFU, exported to Prometheus."""

__version__ = "0.1.0"
"""The one place the version is written. pyproject.toml reads it (``[tool.setuptools.dynamic]``), so
the wheel, the sdist and ``roofwatch --version`` agree, and a source tree that was never installed
still knows its version; the image labels, the chart's appVersion and the release tag are checked
against it (tests/test_packaging.py, .github/workflows/release.yml)."""
