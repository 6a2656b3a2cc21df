"""A fake libamd_smi.so, in Python, driven by the virtual GPU engine.

The real (unmodified) amdsmi package runs on top of it, so an amdsmi backend can be tested and
demoed without an AMD GPU, including what is hard to reach on hardware: compute partitions,
missing or older libraries, unsupported and forbidden calls, firmware fields left N/A, lost
GPUs and hangs. It plays the libamd_smi of whichever amdsmi release is loaded over it (6.2 to
7.0: that release's C symbols and structures), and fails the way the real one does (a lost GPU
keeps its handle; what amdsmi computes from the metrics table fails with it)::

    from agent.virtual.backend import VirtualBackend
    from agent.virtual.fake_amdsmi import FakeAmdSmiLibrary, load_amdsmi

    amdsmi = load_amdsmi(FakeAmdSmiLibrary(VirtualBackend("mi300x")))  # or load_amdsmi(lib, "<dir>/amdsmi")
    amdsmi.amdsmi_init()
    handle = amdsmi.amdsmi_get_processor_handles()[0]
    amdsmi.amdsmi_get_gpu_metrics_info(handle)

Modules: ``library`` (shared state, faults, dispatch), ``handles`` (the processor list of an
amdsmi_init and what a lost GPU does to it), ``release`` (which amdsmi release is played),
``api_system``, ``api_identity``, ``api_metrics``, ``api_power``, ``api_memory``, ``api_bus``,
``api_process`` (the C functions by area), ``metrics_table`` (the gpu_metrics table), ``device``
(sockets, partitions and their integrals), ``asic`` (per-model facts), ``arguments`` (argument
marshalling with amdsmi status codes, and filling each release's structures), ``codes``
(amdsmi.h constants), ``loader`` (private amdsmi copies, of any release).
"""

from agent.virtual.fake_amdsmi.library import FakeAmdSmiLibrary
from agent.virtual.fake_amdsmi.loader import load_amdsmi

__all__ = ["FakeAmdSmiLibrary", "load_amdsmi"]
