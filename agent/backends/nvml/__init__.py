"""NVIDIA GPUs through NVML (pynvml): discovery, GPM, batched fields, processes, XID events."""

from agent.backends.nvml.backend import NvmlBackend, init_message, load_pynvml

__all__ = ["NvmlBackend", "init_message", "load_pynvml"]
