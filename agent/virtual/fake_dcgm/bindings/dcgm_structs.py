"""Fake of DCGM's ``dcgm_structs`` binding module: status codes, DCGMError classes, library loading, structs.

Facts from NVIDIA/DCGM ``testing/python3/dcgm_structs.py`` (4.6.0; 3.3.9 for the 3.x column):

* status codes are negative ints, ``DCGM_ST_OK`` = 0 to ``DCGM_ST_GPUS_DETACHED`` = -67;
  ``_dcgmCheckReturn`` raises ``DCGMError(code)``, whose ``__new__`` returns the subclass made
  for that code, named ``DCGMError_`` + the code's words capitalised (``DCGM_ST_CONNECTION_NOT_VALID``
  -> ``DCGMError_ConnectionNotValid``); ``dcgmExceptionClass(code)`` returns that subclass;
  the code is on ``.value``;
* the C library is the module global ``dcgmLib``; ``_dcgmInit(libDcgmPath)`` loads it once,
  looking for ``libdcgm.so.4`` (``libdcgm.so.3`` in DCGM 3.x) in the given directory, then in
  every ``LD_LIBRARY_PATH`` entry, ``/usr/lib/<machine>-linux-gnu/`` and ``/usr/lib64/``, and
  raises ``DCGMError_LibraryNotFound`` when none loads; a symbol the library lacks raises
  ``DCGMError_FunctionNotFound``; calls before loading raise ``DCGMError_Uninitialized``;
* versioned structs carry ``version = sizeof(struct) | (n << 24)``; string members read back as
  ``str`` (the bindings decode bytes on attribute access).

Setting ``dcgmLib`` to a :class:`agent.virtual.fake_dcgm.FakeDcgmLibrary` before ``_dcgmInit``
makes the bindings skip loading, as a real process would have loaded libdcgm.so.
"""

import os
import platform
import string
import sys
import threading
from ctypes import CDLL, Structure, Union, c_byte, c_char, c_double, c_int, c_int64, c_short, c_uint, c_uint32, \
    c_ushort, sizeof

DCGM_MAJOR_VERSION = 4
"""Which soname this copy of the bindings looks for (3 in the DCGM 3.x bindings)."""

DCGM_MAX_STR_LENGTH = 256
DCGM_MAX_NUM_DEVICES = 32
DCGM_MAX_BLOB_LENGTH = 4096
DCGM_MAX_NUM_GROUPS = 64
DCGM_OPERATION_MODE_AUTO = 1
DCGM_OPERATION_MODE_MANUAL = 2
DCGM_GROUP_DEFAULT = 0
DCGM_GROUP_EMPTY = 1
DCGM_GROUP_ALL_GPUS = 0x7FFFFFFF

DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_MEMORY = -4
DCGM_ST_NOT_CONFIGURED = -5
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_INIT_ERROR = -7
DCGM_ST_NVML_ERROR = -8
DCGM_ST_PENDING = -9
DCGM_ST_UNINITIALIZED = -10
DCGM_ST_TIMEOUT = -11
DCGM_ST_VER_MISMATCH = -12
DCGM_ST_UNKNOWN_FIELD = -13
DCGM_ST_NO_DATA = -14
DCGM_ST_STALE_DATA = -15
DCGM_ST_NOT_WATCHED = -16
DCGM_ST_NO_PERMISSION = -17
DCGM_ST_GPU_IS_LOST = -18
DCGM_ST_RESET_REQUIRED = -19
DCGM_ST_FUNCTION_NOT_FOUND = -20
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_GPU_NOT_SUPPORTED = -22
DCGM_ST_GROUP_INCOMPATIBLE = -23
DCGM_ST_MAX_LIMIT = -24
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_DUPLICATE_KEY = -26
DCGM_ST_GPU_IN_SYNC_BOOST_GROUP = -27
DCGM_ST_GPU_NOT_IN_SYNC_BOOST_GROUP = -28
DCGM_ST_REQUIRES_ROOT = -29
DCGM_ST_NVVS_ERROR = -30
DCGM_ST_INSUFFICIENT_SIZE = -31
DCGM_ST_FIELD_UNSUPPORTED_BY_API = -32
DCGM_ST_MODULE_NOT_LOADED = -33
DCGM_ST_IN_USE = -34
DCGM_ST_GROUP_IS_EMPTY = -35
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_ST_PROFILING_LIBRARY_ERROR = -37
DCGM_ST_PROFILING_MULTI_PASS = -38
DCGM_ST_DIAG_ALREADY_RUNNING = -39
DCGM_ST_DIAG_BAD_JSON = -40
DCGM_ST_DIAG_BAD_LAUNCH = -41
DCGM_ST_DIAG_UNUSED = -42
DCGM_ST_DIAG_THRESHOLD_EXCEEDED = -43
DCGM_ST_INSUFFICIENT_DRIVER_VERSION = -44
DCGM_ST_INSTANCE_NOT_FOUND = -45
DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND = -46
DCGM_ST_CHILD_NOT_KILLED = -47
DCGM_ST_3RD_PARTY_LIBRARY_ERROR = -48
DCGM_ST_INSUFFICIENT_RESOURCES = -49
DCGM_ST_PLUGIN_EXCEPTION = -50
DCGM_ST_NVVS_ISOLATE_ERROR = -51
DCGM_ST_NVVS_BINARY_NOT_FOUND = -52
DCGM_ST_NVVS_KILLED = -53
DCGM_ST_PAUSED = -54
DCGM_ST_ALREADY_INITIALIZED = -55
DCGM_ST_NVML_NOT_LOADED = -56
DCGM_ST_NVML_DRIVER_TIMEOUT = -57
DCGM_ST_NVVS_NO_AVAILABLE_TEST = -58
DCGM_ST_MNDIAG_CONNECTION_NOT_AVAILABLE = -59
DCGM_ST_MNDIAG_CONNECTION_UNAUTHORIZED = -60
DCGM_ST_REMOTE_SSH_CONNECTION_FAILED = -61
DCGM_ST_CHILD_SPAWN_FAILED = -62
DCGM_ST_FILE_IO_ERROR = -63
DCGM_ST_CHILD_SIGNAL_RECEIVED = -64
DCGM_ST_CALLER_ALREADY_STOPPED = -65
DCGM_ST_DIAG_STOPPED = -66
DCGM_ST_GPUS_DETACHED = -67

dcgmLib = None
libLoadLock = threading.Lock()
_dcgmGetFunctionPointer_cache = {}


class DCGMError(Exception):
    """A DCGM status code as an exception; ``DCGMError(code)`` is an instance of that code's subclass."""

    _valClassMapping = {}

    def __new__(typ, value):
        if typ == DCGMError:
            typ = DCGMError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.info = None
        obj.value = value
        return obj

    def __str__(self):
        try:
            text = _dcgmErrorString(self.value)
        except Exception:  # the library is not loaded: the code is all there is
            text = None
        msg = text or "DCGM Error with code %d" % self.value
        return msg if self.info is None else "%s: '%s'" % (msg, self.info)

    def __eq__(self, other):
        return self.value == other.value

    def __hash__(self):
        return hash(self.value)

    def SetAdditionalInfo(self, msg):  # noqa: N802 - the binding's name
        self.info = msg


def dcgmExceptionClass(error_code):  # noqa: N802
    return DCGMError._valClassMapping.get(error_code)


def _make_error_classes():
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("DCGM_ST_")]:
        code = getattr(module, name)
        cls_name = "DCGMError_" + string.capwords(name[len("DCGM_ST_"):], "_").replace("_", "")

        def new(typ, _code=code):
            return DCGMError.__new__(typ, _code)

        cls = type(cls_name, (DCGMError,), {"__new__": new, "__module__": __name__})
        setattr(module, cls_name, cls)
        DCGMError._valClassMapping[code] = cls


_make_error_classes()


def _dcgmCheckReturn(ret):  # noqa: N802
    if ret != DCGM_ST_OK:
        raise DCGMError(ret)
    return ret


def _dcgmGetFunctionPointer(name):  # noqa: N802
    if name in _dcgmGetFunctionPointer_cache:
        return _dcgmGetFunctionPointer_cache[name]
    with libLoadLock:
        if dcgmLib is None:
            raise DCGMError(DCGM_ST_UNINITIALIZED)
        try:
            fn = getattr(dcgmLib, name)
        except AttributeError:
            raise DCGMError(DCGM_ST_FUNCTION_NOT_FOUND) from None
        _dcgmGetFunctionPointer_cache[name] = fn
        return fn


def _LoadDcgmLibrary(libDcgmPath=None):  # noqa: N802,N803
    global dcgmLib
    with libLoadLock:
        if dcgmLib is not None:
            return
        soname = "libdcgm.so.%d" % DCGM_MAJOR_VERSION
        paths = [os.path.join(libDcgmPath, soname)] if libDcgmPath else []
        paths += [os.path.join(p, soname) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
        paths += ["/usr/lib/%s-linux-gnu/%s" % (platform.machine(), soname), "/usr/lib64/" + soname]
        for path in paths:
            if os.path.isfile(path):
                try:
                    dcgmLib = CDLL(path)
                    break
                except OSError:
                    continue
    if dcgmLib is None:
        _dcgmCheckReturn(DCGM_ST_LIBRARY_NOT_FOUND)


def _dcgmInit(libDcgmPath=None):  # noqa: N802,N803
    _LoadDcgmLibrary(libDcgmPath)


def _dcgmErrorString(result):  # noqa: N802
    text = _dcgmGetFunctionPointer("dcgmErrorString")(result)
    return text.decode() if isinstance(text, bytes) else text


def make_dcgm_version(struct, ver):
    return sizeof(struct) | (ver << 24)


class _DcgmStructure(Structure):
    """Strings read back as str, as the real bindings' structures do."""

    def __getattribute__(self, key):
        value = super().__getattribute__(key)
        return value.decode("utf-8") if isinstance(value, bytes) else value


class c_dcgmConnectV2Params_v1(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint), ("persistAfterDisconnect", c_uint)]


class c_dcgmConnectV2Params_v2(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint), ("persistAfterDisconnect", c_uint), ("timeoutMs", c_uint),
                ("addressIsUnixSocket", c_uint)]


c_dcgmConnectV2Params_version1 = make_dcgm_version(c_dcgmConnectV2Params_v1, 1)
c_dcgmConnectV2Params_version2 = make_dcgm_version(c_dcgmConnectV2Params_v2, 2)
c_dcgmConnectV2Params_version = c_dcgmConnectV2Params_version2


class c_dcgmDeviceIdentifiers_v1(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint), ("brandName", c_char * DCGM_MAX_STR_LENGTH),
                ("deviceName", c_char * DCGM_MAX_STR_LENGTH), ("pciBusId", c_char * DCGM_MAX_STR_LENGTH),
                ("serial", c_char * DCGM_MAX_STR_LENGTH), ("uuid", c_char * DCGM_MAX_STR_LENGTH),
                ("vbios", c_char * DCGM_MAX_STR_LENGTH), ("inforomImageVersion", c_char * DCGM_MAX_STR_LENGTH),
                ("pciDeviceId", c_uint32), ("pciSubSystemId", c_uint32),
                ("driverVersion", c_char * DCGM_MAX_STR_LENGTH), ("virtualizationMode", c_uint32)]


class c_dcgmDeviceAttributes_v3(_DcgmStructure):  # noqa: N801
    """Only ``identifiers`` of the real struct's members (clock sets, thermals, power limits, memory
    usage and settings precede and follow it there): the fake fills what roofwatch reads."""

    _fields_ = [("version", c_uint), ("identifiers", c_dcgmDeviceIdentifiers_v1)]


dcgmDeviceAttributes_version3 = make_dcgm_version(c_dcgmDeviceAttributes_v3, 3)


class c_dcgmFieldValue_v1_value(Union):  # noqa: N801
    _fields_ = [("i64", c_int64), ("dbl", c_double), ("str", c_char * DCGM_MAX_STR_LENGTH),
                ("blob", c_byte * DCGM_MAX_BLOB_LENGTH)]


class c_dcgmFieldValue_v1(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint), ("fieldId", c_ushort), ("fieldType", c_short), ("status", c_int),
                ("ts", c_int64), ("value", c_dcgmFieldValue_v1_value)]


dcgmFieldValue_version1 = make_dcgm_version(c_dcgmFieldValue_v1, 1)

DCGM_PROF_MAX_NUM_GROUPS_V2 = 10
DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2 = 64


class c_dcgmProfMetricGroupInfo_v2(_DcgmStructure):  # noqa: N801
    _fields_ = [("majorId", c_ushort), ("minorId", c_ushort), ("numFieldIds", c_uint32),
                ("fieldIds", c_ushort * DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2)]


class c_dcgmProfGetMetricGroups_v3(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint32), ("unused", c_uint32), ("gpuId", c_uint32), ("numMetricGroups", c_uint32),
                ("metricGroups", c_dcgmProfMetricGroupInfo_v2 * DCGM_PROF_MAX_NUM_GROUPS_V2)]


dcgmProfGetMetricGroups_version3 = make_dcgm_version(c_dcgmProfGetMetricGroups_v3, 3)


class c_dcgmVersionInfo_v2(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint32), ("rawBuildInfoString", c_char * (DCGM_MAX_STR_LENGTH * 2))]


dcgmVersionInfo_version2 = make_dcgm_version(c_dcgmVersionInfo_v2, 2)
dcgmVersionInfo_version = dcgmVersionInfo_version2
