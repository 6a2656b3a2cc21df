"""Writing the collector's live samples to a trace (``roofwatch run --record``, ``roofwatch record``).

A simulated scenario's trace is written by agent.virtual.recording, above this package.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agent import __version__
from agent.model import NodeSnapshot
from agent.trace import TraceWriteError, TraceWriter

log = logging.getLogger("roofwatch.recorder")


class SnapshotRecorder:
    """A collector listener that appends each cycle's fresh samples to a trace.

    A write failure (disk full, file removed) is logged once and ends recording; collection
    and export carry on, because losing a debug trace must never cost the node its metrics.
    """

    def __init__(self, path: str | Path, *, node: str) -> None:
        self.path = Path(path)
        self._writer: TraceWriter | None = TraceWriter(self.path, node=node, agent_version=__version__)
        self._last_ts: dict[str, float] = {}
        self.count = 0
        self.error: str | None = None

    def __call__(self, snapshot: NodeSnapshot) -> None:
        if self._writer is None:
            return
        try:
            for device in snapshot.devices:
                sample = device.sample
                if sample is None or not device.up or self._last_ts.get(device.info.gpu) == sample.ts:
                    continue
                self._writer.write(sample)
                self._last_ts[device.info.gpu] = sample.ts
                self.count += 1
            self._writer.flush()
        except TraceWriteError as exc:
            self.error = str(exc)
            log.error("trace recording stopped; metrics export continues", extra={"path": str(self.path), "error": str(exc)})
            self._abandon()

    def _abandon(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except (TraceWriteError, OSError):
                pass

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except TraceWriteError as exc:
                self.error = str(exc)
                log.error("closing trace failed", extra={"path": str(self.path), "error": str(exc)})

