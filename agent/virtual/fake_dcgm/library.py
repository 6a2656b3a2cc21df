"""FakeDcgmLibrary: the C functions of libdcgm.so that roofwatch's DCGM source calls, in Python.

The binding modules (``agent/virtual/fake_dcgm/bindings``, the same module names and calling
conventions as NVIDIA's ``testing/python3`` bindings) look symbols up on ``dcgm_structs.dcgmLib``;
set it to one of these (:func:`agent.virtual.fake_dcgm.install`) and they call the methods below
with the same ctypes arguments the real C functions receive: handles as ``c_void_p``, out
parameters through ``byref``, arrays as ctypes arrays. Each returns a ``dcgmReturn_t`` status.

Which symbols exist follows the release (``dcgmConnect_v3`` from 4.5.0: NVIDIA/DCGM tags v4.4.2 and
v4.5.0 of testing/python3/dcgm_agent.py); ``dcgmConnect_v2`` takes ``"host"`` or ``"host:port"``
(port 5555 by default, dcgm_agent.h) or, with ``addressIsUnixSocket``, a socket path. Calls before
``dcgmInit`` answer ``DCGM_ST_UNINITIALIZED`` (dcgm_agent.h).
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Any

from agent.virtual.fake_dcgm.engine import BLANK, DOUBLE_FIELDS, FakeHostEngine

DEFAULT_PORT = 5555
OK, BADPARAM, NOT_SUPPORTED, UNINITIALIZED, CONNECTION_NOT_VALID = 0, -1, -6, -10, -21
PROFILING_NOT_SUPPORTED = -36
FP64_BLANK, INT64_BLANK = 140737488355328.0, 0x7FFFFFFFFFFFFFF0
FT_DOUBLE, FT_INT64 = ord("d"), ord("i")

MESSAGES = {
    0: "Success", -1: "Bad parameter passed to function", -3: "Generic unspecified error",
    -6: "Feature not supported", -10: "Object is in an undefined state", -14: "No data is available",
    -16: "Field is not being updated", -17: "Not permissioned", -18: "GPU is unreachable",
    -19: "GPU requires a reset", -20: "Unable to find function",
    -21: "The connection to the host engine is not valid any longer", -25: "DCGM library could not be found",
    -29: "Host engine is running as non-root", -33: "This request is serviced by a module of DCGM that is not "
    "currently loaded", -34: "The requested operation could not be completed because the affected resource is in use",
    -36: "Profiling is not supported for this group of GPUs or GPU",
}
"""dcgmErrorString's answers for the codes the fake produces (short paraphrases)."""


def _out(ref: Any) -> Any:
    """The object behind a ``byref(...)`` argument."""
    return ref._obj


def _value(arg: Any) -> Any:
    return arg.value if hasattr(arg, "value") else arg


class FakeDcgmLibrary:
    """libdcgm.so for one node: embedded mode and connections to the node's fake nv-hostengine."""

    def __init__(self, engine: FakeHostEngine, *, listen: tuple[str, ...] = ("localhost:5555", "127.0.0.1:5555"),
                 socket_path: str | None = "/run/nvidia-dcgm/dcgm.sock") -> None:
        self.engine = engine
        self.listen = {self._normalise(a) for a in listen}
        self.socket_path = socket_path
        self.initialised = 0
        self._handles: dict[int, int] = {}
        """handle value -> engine generation it was made in (0: embedded, valid until stopped)."""
        self._ids = itertools.count(0x7D000001)
        self.connect_attempts = 0
        if tuple(int(x) for x in engine.version.split(".")[:2]) < (4, 5):
            self.dcgmConnect_v3 = None  # the symbol does not exist before 4.5.0

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if value is None and name.startswith("dcgm"):
            raise AttributeError(name)
        return value

    @staticmethod
    def _normalise(address: str) -> str:
        host, _, port = address.partition(":")
        return f"{host}:{port or DEFAULT_PORT}"

    def _valid(self, handle: Any) -> int:
        """OK, or the status a call on this handle gets."""
        if not self.initialised:
            return UNINITIALIZED
        generation = self._handles.get(_value(handle) or 0)
        if generation is None:
            return BADPARAM
        if generation and (generation != self.engine.generation or not self.engine.running):
            return CONNECTION_NOT_VALID
        return OK

    # ------------------------------------------------------------------ init and connections

    def dcgmErrorString(self, code: int) -> bytes:  # noqa: N802
        return MESSAGES.get(code, f"Unknown error code {code}").encode()

    def dcgmInit(self, _handle: Any = None) -> int:  # noqa: N802
        self.initialised += 1
        return OK

    def dcgmShutdown(self) -> int:  # noqa: N802
        self.initialised = max(0, self.initialised - 1)
        return OK

    def dcgmStartEmbedded(self, op_mode: int, handle_ref: Any) -> int:  # noqa: N802
        if not self.initialised:
            return UNINITIALIZED
        if _value(op_mode) not in (1, 2):
            return BADPARAM
        value = next(self._ids)
        self._handles[value] = 0
        _out(handle_ref).value = value
        return OK

    def dcgmStopEmbedded(self, handle: Any) -> int:  # noqa: N802
        return OK if self._handles.pop(_value(handle) or 0, None) is not None else BADPARAM

    def dcgmConnect_v2(self, address: bytes, params_ref: Any, handle_ref: Any) -> int:  # noqa: N802
        if not self.initialised:
            return UNINITIALIZED
        self.connect_attempts += 1
        params = _out(params_ref)
        text = address.decode() if isinstance(address, bytes) else str(address)
        if getattr(params, "addressIsUnixSocket", 0):
            reachable = text == self.socket_path
        else:
            reachable = self._normalise(text) in self.listen
        with self.engine.lock:
            if not reachable or not self.engine.running:
                return CONNECTION_NOT_VALID
            value = next(self._ids)
            self._handles[value] = self.engine.generation
        _out(handle_ref).value = value
        return OK

    def dcgmConnect_v3(self, connection: bytes, params_ref: Any, handle_ref: Any) -> int:  # noqa: N802
        text = connection.decode()
        if text.startswith("unix://"):
            return self.dcgmConnect_v2(text[7:].encode(), ctypes.byref(_UnixParams()), handle_ref)
        if text.startswith("tcp://"):
            return self.dcgmConnect_v2(text[6:].encode(), params_ref, handle_ref)
        return BADPARAM

    def dcgmDisconnect(self, handle: Any) -> int:  # noqa: N802
        return OK if self._handles.pop(_value(handle) or 0, None) is not None else BADPARAM

    def dcgmVersionInfo(self, msg_ref: Any) -> int:  # noqa: N802
        _out(msg_ref).rawBuildInfoString = f"version:{self.engine.version};arch:x86_64;buildtype:Release".encode()
        return OK

    # ------------------------------------------------------------------ devices, groups, watches

    def dcgmGetAllSupportedDevices(self, handle: Any, ids: Any, count_ref: Any) -> int:  # noqa: N802
        if (st := self._valid(handle)) != OK:
            return st
        for i in range(len(self.engine.devices)):
            ids[i] = i
        _out(count_ref).value = len(self.engine.devices)
        return OK

    def dcgmGetDeviceAttributes(self, handle: Any, gpu_id: Any, attrs_ref: Any) -> int:  # noqa: N802
        if (st := self._valid(handle)) != OK:
            return st
        g = _value(gpu_id)
        if not 0 <= g < len(self.engine.devices):
            return BADPARAM
        info, ident = self.engine.devices[g], _out(attrs_ref).identifiers
        ident.uuid, ident.deviceName = info.uuid.encode(), info.model.encode()
        ident.pciBusId = (info.pci_bus_id or "").encode()
        ident.brandName = b"Nvidia"
        return OK

    def dcgmGroupCreate(self, handle: Any, kind: int, name: bytes, group_ref: Any) -> int:  # noqa: N802
        if (st := self._valid(handle)) != OK:
            return st
        with self.engine.lock:
            gid = self.engine.new_id()
            self.engine.groups[gid] = list(range(len(self.engine.devices))) if _value(kind) == 0 else []
        _out(group_ref).value = gid
        return OK

    def dcgmGroupDestroy(self, handle: Any, group: Any) -> int:  # noqa: N802
        if (st := self._valid(handle)) != OK:
            return st
        return OK if self.engine.groups.pop(_value(group), None) is not None else BADPARAM

    def dcgmGroupAddDevice(self, handle: Any, group: Any, gpu_id: Any) -> int:  # noqa: N802
        if (st := self._valid(handle)) != OK:
            return st
        members = self.engine.groups.get(_value(group))
        g = _value(gpu_id)
        if members is None or not 0 <= g < len(self.engine.devices):
            return BADPARAM
        members.append(g)
        return OK

    def dcgmFieldGroupCreate(self, handle: Any, count: Any, ids_ref: Any, name: bytes, fg_ref: Any) -> int:  # noqa: N802
        if (st := self._valid(handle)) != OK:
            return st
        ids = list(_out(ids_ref))[: _value(count)]
        if not ids:
            return BADPARAM
        with self.engine.lock:
            fid = self.engine.new_id()
            self.engine.field_groups[fid] = ids
        _out(fg_ref).value = fid
        return OK

    def dcgmFieldGroupDestroy(self, handle: Any, field_group: Any) -> int:  # noqa: N802
        if (st := self._valid(handle)) != OK:
            return st
        return OK if self.engine.field_groups.pop(_value(field_group), None) is not None else BADPARAM

    def dcgmWatchFields(self, handle: Any, group: Any, field_group: Any, update_us: Any, keep_age: Any,  # noqa: N802
                        keep_samples: Any) -> int:
        if (st := self._valid(handle)) != OK:
            return st
        with self.engine.lock:
            members = self.engine.groups.get(_value(group))
            ids = self.engine.field_groups.get(_value(field_group))
            if members is None or ids is None or _value(update_us) <= 0:
                return BADPARAM
            return self.engine.watch(members, ids, _value(update_us) / 1e6)

    def dcgmUnwatchFields(self, handle: Any, group: Any, field_group: Any) -> int:  # noqa: N802
        if (st := self._valid(handle)) != OK:
            return st
        with self.engine.lock:
            for g in self.engine.groups.get(_value(group), []):
                self.engine.watches.pop(g, None)
        return OK

    def dcgmUpdateAllFields(self, handle: Any, wait: Any) -> int:  # noqa: N802
        return self._valid(handle)

    def dcgmEntityGetLatestValues(self, handle: Any, entity_group: Any, entity_id: Any, ids: Any,  # noqa: N802
                                  count: Any, values: Any) -> int:
        if (st := self._valid(handle)) != OK:
            return st
        g = _value(entity_id)
        if _value(entity_group) != 1 or not 0 <= g < len(self.engine.devices):
            return BADPARAM
        with self.engine.lock:
            for i in range(_value(count)):
                fid = ids[i]
                status, ts, value = self.engine.latest(g, fid)
                fv = values[i]
                fv.version, fv.fieldId, fv.status, fv.ts = 0x01001010, fid, status, ts
                if fid in DOUBLE_FIELDS:
                    fv.fieldType, fv.value.dbl = FT_DOUBLE, FP64_BLANK if value is BLANK else float(value)
                else:
                    fv.fieldType, fv.value.i64 = FT_INT64, INT64_BLANK if value is BLANK else int(value)
        return OK

    # ------------------------------------------------------------------ profiling

    def dcgmProfGetSupportedMetricGroups(self, handle: Any, msg_ref: Any) -> int:  # noqa: N802
        if (st := self._valid(handle)) != OK:
            return st
        msg = _out(msg_ref)
        if not 0 <= msg.gpuId < len(self.engine.devices):
            return BADPARAM
        fields = self.engine.supported_fields(msg.gpuId)
        if not fields:
            return PROFILING_NOT_SUPPORTED
        msg.numMetricGroups = 1
        group = msg.metricGroups[0]
        group.majorId, group.minorId, group.numFieldIds = 1, 0, len(fields)
        for i, fid in enumerate(fields):
            group.fieldIds[i] = fid
        return OK

    def dcgmProfPause(self, handle: Any) -> int:  # noqa: N802
        return self._pause(handle, True)

    def dcgmProfResume(self, handle: Any) -> int:  # noqa: N802
        return self._pause(handle, False)

    def _pause(self, handle: Any, paused: bool) -> int:
        if (st := self._valid(handle)) != OK:
            return st
        if self.engine.devices and all(self.engine.is_gpm(g) for g in range(len(self.engine.devices))):
            return NOT_SUPPORTED
        self.engine.paused = paused
        return OK


class _UnixParams(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("persistAfterDisconnect", ctypes.c_uint), ("timeoutMs", ctypes.c_uint),
                ("addressIsUnixSocket", ctypes.c_uint)]

    def __init__(self) -> None:
        super().__init__(0, 0, 0, 1)
