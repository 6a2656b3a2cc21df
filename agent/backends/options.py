"""What opening a backend needs from the agent's settings, as one frozen value.

The backends sit below the program (docs/architecture.md, layers): they must not import
``agent.app.config``. The app hands them this value instead, built from its ``Settings`` by
:meth:`BackendOptions.of` (``roofwatch run`` and the other collecting commands in
``agent.app.assemble``, ``doctor`` and ``selftest`` likewise), so the registry and the virtual node's
servers read plain fields and never a pydantic model, and a change to a setting the backends do not
read cannot reach them.

The names are the settings' own (``agent/app/config.py`` describes each); a test
(``tests/test_backend_options.py``) keeps every field a setting of that name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from agent.context.workload.inference.endpoint import InferenceEndpoint, ModelFacts


@dataclass(frozen=True)
class BackendOptions:
    """The settings :mod:`agent.backends.registry` and the virtual node's inference servers read."""

    backend: str
    """Which backend to open: ``auto``, a vendor (``nvml``, ``amd``), an exporter or a virtual one (``OPENERS``)."""
    node_name: str
    max_devices: int
    interval_s: float
    sysfs_root: str
    kubelet_socket: str | None
    kubelet_refresh_s: float
    inference_endpoints: tuple[InferenceEndpoint, ...]
    models: Mapping[str, ModelFacts]
    inference_interval_s: float
    inference_timeout_s: float
    dcgm: str
    dcgm_host: str
    dcgm_bindings_path: tuple[str, ...]
    dcgm_exporter_url: str | None
    dcgm_exporter_interval_s: float
    dcgm_exporter_timeout_s: float
    dcgm_exporter_stale_s: float
    amd_exporter_url: str | None
    amd_exporter_interval_s: float
    amd_exporter_timeout_s: float
    amd_exporter_stale_s: float
    amd_exporter_profiler_window_us: float
    specs: Mapping[str, Mapping[str, float | str]]
    """The config's ``specs:`` peak overrides by driver name (agent.model.specs.override)."""
    scenario: str
    virtual_node: str | None
    explicit: frozenset[str] = frozenset()
    """The names among these that the user set (flag, environment or file). Some defaults follow the node
    rather than the setting's default when not set: the node's name (an exporter's host label, a scenario's
    node), the kubelet socket (started only where it exists), the DCGM bindings (the fake ones on
    ``nvml-virtual``)."""

    @classmethod
    def of(cls, settings: Any) -> BackendOptions:
        """The backends' part of ``settings`` (the app's ``Settings``, read by these names); what the user set
        is pydantic's ``model_fields_set`` when ``settings`` has one."""
        names = [f.name for f in fields(cls) if f.name != "explicit"]
        values = {name: getattr(settings, name) for name in names}
        values["inference_endpoints"] = tuple(values["inference_endpoints"])
        values["dcgm_bindings_path"] = tuple(values["dcgm_bindings_path"])
        explicit = frozenset(getattr(settings, "model_fields_set", ())) & set(names)
        return cls(**values, explicit=explicit)

    def replace(self, **changes: Any) -> BackendOptions:
        """A copy with ``changes``, which count as set by the user (as pydantic's ``model_copy(update=...)`` did)."""
        return dataclasses.replace(self, **changes, explicit=self.explicit | set(changes))
