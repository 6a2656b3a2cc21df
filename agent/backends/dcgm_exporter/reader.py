"""Reading a dcgm-exporter in the background: the shared reader (:mod:`agent.backends.exporter_reader`,
where the staleness rules are written down) with dcgm-exporter's parser and DCGM's energy and power
fields."""

from __future__ import annotations

import time
from typing import Callable

from agent.backends.dcgm_exporter.exposition import MAX_GPUS, read_records
from agent.backends.exporter_reader import DEFAULT_MAX_BYTES, Dialect, Fetch, ReaderStatus, listed
from agent.backends.exporter_reader import ExporterReader as _Reader

__all__ = ["DCGM", "ENERGY", "POWER", "ExporterReader", "ReaderStatus", "listed"]

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
POWER = "DCGM_FI_DEV_POWER_USAGE"

DCGM = Dialect(source="dcgm-exporter", parse=read_records, energy=ENERGY, power=POWER,
               no_gpu="the exposition has DCGM series but none names a GPU (no gpu label)",
               stopped="DCGM stopped updating (host engine hung or restarted)")


class ExporterReader(_Reader):
    """One dcgm-exporter endpoint, read in the background and answered from memory."""

    def __init__(self, url: str, *, interval_s: float = 5.0, timeout_s: float = 2.0, stale_s: float = 120.0,
                 max_bytes: int = DEFAULT_MAX_BYTES, fetch: Fetch | None = None,
                 clock: Callable[[], float] = time.time, max_gpus: int = MAX_GPUS) -> None:
        super().__init__(url, interval_s=interval_s, timeout_s=timeout_s, stale_s=stale_s, max_bytes=max_bytes,
                         fetch=fetch, clock=clock, max_gpus=max_gpus, dialect=DCGM)
