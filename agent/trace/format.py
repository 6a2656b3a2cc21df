"""The trace file's fixed terms: its name and version in the header line, and the errors reading and writing raise."""

from __future__ import annotations

import os

FORMAT_NAME = "roofwatch-trace"


FORMAT_VERSION = 1


MEM_BUSY_HEADER_KEY = "mem_busy"
"""Header key (``true``) of traces written with the optional ``mem_busy`` field: their NVIDIA
``dram_active`` is a bandwidth share. Readers move an older trace's NVML-only ``dram_active``
(which was utilization.memory) to ``mem_busy`` (agent.trace.reader.move_legacy_mem_busy)."""


GZIP_MAGIC = b"\x1f\x8b"


class TraceWriteError(OSError):
    """Writing a trace failed (disk full, permissions, ...). The agent logs it and keeps exporting."""

    def __init__(self, path: str, exc: OSError) -> None:
        reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
        super().__init__(f"cannot write trace {path}: {reason}")
        self.errno = exc.errno
        self.path = path


class TraceFormatError(ValueError):
    """A trace line breaks the contract. ``line`` is 1-based and counts the header and blank lines."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.reason = message
