"""AMD GPUs through amdsmi: discovery with compute partitions, per-interval reading, recovery."""

from agent.backends.amd.backend import AmdBackend
from agent.backends.amd.library import load_amdsmi

__all__ = ["AmdBackend", "load_amdsmi"]
