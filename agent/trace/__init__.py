"""Read and write roofwatch traces (JSON Lines, format version 1; see docs/trace-format.md).

A trace is what the agent saw, one GPU sample per line, so that a person can read it and
``roofwatch classify`` can replay it. Writing sits in the collector's hot path, so the writer
walks the dataclasses by hand instead of building pydantic models; reading validates every
line with pydantic because traces come from users, other tools and hand edits, and a bad
value must be reported by file, line and field rather than silently classified.
"""

from agent.trace.format import FORMAT_NAME, FORMAT_VERSION, TraceFormatError, TraceWriteError
from agent.trace.reader import TraceReader, read_trace
from agent.trace.writer import TraceWriter, sample_to_dict

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "TraceFormatError", "TraceReader", "TraceWriteError",
           "TraceWriter", "read_trace", "sample_to_dict"]
