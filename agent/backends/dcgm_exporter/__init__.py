"""dcgm-exporter as a telemetry source: joined to NVML by UUID, or read alone (``--backend dcgm-exporter``).

``exposition`` parses the exporter's text into per-GPU records, ``mapping`` turns a record into
sample fields, ``reader`` reads the URL in the background and judges freshness, ``backend`` is
the standalone backend and ``join`` completes an NVML backend's samples.
"""

from agent.backends.dcgm_exporter.backend import DcgmExporterBackend
from agent.backends.dcgm_exporter.join import DcgmExporterJoin
from agent.backends.dcgm_exporter.reader import ExporterReader

__all__ = ["DcgmExporterBackend", "DcgmExporterJoin", "ExporterReader"]
