"""AMD's Device Metrics Exporter (ROCm/device-metrics-exporter) as a telemetry source (``--backend amd-exporter``).

``names`` maps every release's series names (1.3.x, 1.4.x, 1.5.x, an operator's prefix) onto one,
``exposition`` reads a body into one record per GPU or partition, ``mapping`` turns a record into
sample fields (profiler windows into FLOP/s and bytes/s, partitions kept apart), ``backend`` is the
standalone backend over the shared reader (:mod:`agent.backends.exporter_reader`).
"""

from agent.backends.amd_exporter.backend import AmdExporterBackend, amd_exporter_reader

__all__ = ["AmdExporterBackend", "amd_exporter_reader"]
