"""``--backend virtual``: the simulated node, opened by the registry under this name.

The class lives in agent/virtual/backend.py since issue 43 (docs/architecture.md, layers): the fakes
of the vendor libraries play it, and they sit below the backends, so it sits with them. Edit it there;
this module only keeps the name the registry's ``virtual`` backend, the tests and the benchmarks use.
"""

from __future__ import annotations

from agent.virtual.backend import FaultWindow, VirtualBackend

__all__ = ["FaultWindow", "VirtualBackend"]
