"""roofwatch agent: GPU telemetry with roofline verdicts and MFU, exported to Prometheus."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("roofwatch")
except _metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"
