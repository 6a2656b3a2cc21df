"""A libnvidia-ml.so.1 that appears while the agent runs (tests/test_driver_wait.py).

Put on PYTHONPATH of an agent started by a test. pynvml loads its C library with
``CDLL("libnvidia-ml.so.1")`` on every nvmlInit until one load succeeds; here that load fails
the way the dynamic loader does (OSError) until the file named by ROOFWATCH_TEST_DRIVER_MARKER
exists, and then returns the fake driver playing the demo node. Everything above the loader
(pynvml, the NVML backend, the agent) is the real code.
"""

import os

import pynvml

_real_cdll = pynvml.CDLL


def _late_cdll(name, *args, **kwargs):
    if name != "libnvidia-ml.so.1":
        return _real_cdll(name, *args, **kwargs)
    if not os.path.exists(os.environ["ROOFWATCH_TEST_DRIVER_MARKER"]):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")
    from agent.backends.virtual import VirtualBackend
    from agent.virtual.fake_nvml import FakeNvmlLibrary

    return FakeNvmlLibrary(VirtualBackend("demo"))


pynvml.CDLL = _late_cdll
