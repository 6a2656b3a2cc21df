"""Fake of DCGM's ``dcgm_agent`` binding module: the C API's Python wrappers that roofwatch calls.

Names, argument order, return values and the ctypes each passes are those of NVIDIA/DCGM
``testing/python3/dcgm_agent.py`` (4.6.0; the same in 3.3.9 unless noted): each wrapper looks its C
symbol up through ``dcgm_structs._dcgmGetFunctionPointer``, calls it, and turns a non-zero status
into a ``DCGMError`` subclass. str arguments are passed to C as UTF-8 bytes.

* ``dcgmStartEmbedded(opMode)`` / ``dcgmConnect_v2(ip, params)`` return the handle (a c_void_p);
  ``dcgmConnect_v3(connectionString, params)`` exists from DCGM 4.5 (``tcp://`` / ``unix://``
  strings); ``dcgmConnect_v2`` exists in 3.x and every 4.x, "host" or "host:port";
* ``dcgmGroupCreate(handle, type, name)`` / ``dcgmFieldGroupCreate(handle, fieldIds, name)`` return
  the new id (a c_void_p);
* ``dcgmWatchFields(handle, group, fieldGroup, updateFreq_us, maxKeepAge_s, maxKeepSamples)``;
* ``dcgmEntityGetLatestValues(handle, entityGroup, entityId, fieldIds)`` returns an array of
  ``c_dcgmFieldValue_v1``, one per field id, each with its own ``status``.
"""

import functools
from ctypes import byref, c_double, c_int, c_int32, c_int64, c_uint, c_uint16, c_void_p

import dcgm_fields
import dcgm_structs

dcgmFP = dcgm_structs._dcgmGetFunctionPointer


def _bytes_args(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args = tuple(a.encode("utf-8") if isinstance(a, str) else a for a in args)
        kwargs = {k: (v.encode("utf-8") if isinstance(v, str) else v) for k, v in kwargs.items()}
        return fn(*args, **kwargs)
    return wrapper


def _check(ret):
    dcgm_structs._dcgmCheckReturn(ret)
    return ret


@_bytes_args
def dcgmInit():  # noqa: N802
    return _check(dcgmFP("dcgmInit")(byref(c_void_p())))


@_bytes_args
def dcgmShutdown():  # noqa: N802
    return _check(dcgmFP("dcgmShutdown")())


@_bytes_args
def dcgmStartEmbedded(opMode):  # noqa: N802,N803
    handle = c_void_p()
    _check(dcgmFP("dcgmStartEmbedded")(opMode, byref(handle)))
    return handle


@_bytes_args
def dcgmStopEmbedded(dcgm_handle):  # noqa: N802
    return _check(dcgmFP("dcgmStopEmbedded")(dcgm_handle))


@_bytes_args
def dcgmConnect_v2(ip_address, connectParams, version=dcgm_structs.c_dcgmConnectV2Params_version):  # noqa: N802,N803
    connectParams.version = version
    handle = c_void_p()
    _check(dcgmFP("dcgmConnect_v2")(ip_address, byref(connectParams), byref(handle)))
    return handle


@_bytes_args
def dcgmConnect_v3(connection_string, connectParams, version=None):  # noqa: N802,N803
    if version is not None:
        connectParams.version = version
    handle = c_void_p()
    _check(dcgmFP("dcgmConnect_v3")(connection_string, byref(connectParams), byref(handle)))
    return handle


@_bytes_args
def dcgmDisconnect(dcgm_handle):  # noqa: N802
    return _check(dcgmFP("dcgmDisconnect")(dcgm_handle))


@_bytes_args
def dcgmGetAllSupportedDevices(dcgm_handle):  # noqa: N802
    count = c_uint()
    ids = (c_uint * dcgm_structs.DCGM_MAX_NUM_DEVICES)()
    _check(dcgmFP("dcgmGetAllSupportedDevices")(dcgm_handle, ids, byref(count)))
    return list(ids[0:int(count.value)])


@_bytes_args
def dcgmGetDeviceAttributes(dcgm_handle, gpuId, version=dcgm_structs.dcgmDeviceAttributes_version3):  # noqa: N802,N803
    if version != dcgm_structs.dcgmDeviceAttributes_version3:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_VER_MISMATCH)
    attributes = dcgm_structs.c_dcgmDeviceAttributes_v3()
    attributes.version = version
    _check(dcgmFP("dcgmGetDeviceAttributes")(dcgm_handle, c_int(gpuId), byref(attributes)))
    return attributes


@_bytes_args
def dcgmGroupCreate(dcgm_handle, type, groupName):  # noqa: N802,N803,A002
    group = c_void_p()
    _check(dcgmFP("dcgmGroupCreate")(dcgm_handle, type, groupName, byref(group)))
    return group


@_bytes_args
def dcgmGroupDestroy(dcgm_handle, group_id):  # noqa: N802
    return _check(dcgmFP("dcgmGroupDestroy")(dcgm_handle, group_id))


@_bytes_args
def dcgmGroupAddDevice(dcgm_handle, group_id, gpu_id):  # noqa: N802
    return _check(dcgmFP("dcgmGroupAddDevice")(dcgm_handle, group_id, gpu_id))


@_bytes_args
def dcgmFieldGroupCreate(dcgm_handle, fieldIds, fieldGroupName):  # noqa: N802,N803
    field_group = c_void_p()
    ids = (c_uint16 * len(fieldIds))(*fieldIds)
    _check(dcgmFP("dcgmFieldGroupCreate")(dcgm_handle, c_int32(len(fieldIds)), byref(ids), fieldGroupName,
                                          byref(field_group)))
    return field_group


@_bytes_args
def dcgmFieldGroupDestroy(dcgm_handle, fieldGroupId):  # noqa: N802,N803
    return _check(dcgmFP("dcgmFieldGroupDestroy")(dcgm_handle, fieldGroupId))


@_bytes_args
def dcgmWatchFields(dcgm_handle, groupId, fieldGroupId, updateFreq, maxKeepAge, maxKeepSamples):  # noqa: N802,N803
    return _check(dcgmFP("dcgmWatchFields")(dcgm_handle, groupId, fieldGroupId, c_int64(updateFreq),
                                            c_double(maxKeepAge), c_int32(maxKeepSamples)))


@_bytes_args
def dcgmUnwatchFields(dcgm_handle, groupId, fieldGroupId):  # noqa: N802,N803
    return _check(dcgmFP("dcgmUnwatchFields")(dcgm_handle, groupId, fieldGroupId))


@_bytes_args
def dcgmUpdateAllFields(dcgm_handle, waitForUpdate):  # noqa: N802,N803
    return _check(dcgmFP("dcgmUpdateAllFields")(dcgm_handle, c_int(waitForUpdate)))


@_bytes_args
def dcgmEntityGetLatestValues(dcgmHandle, entityGroup, entityId, fieldIds):  # noqa: N802,N803
    values = (dcgm_structs.c_dcgmFieldValue_v1 * len(fieldIds))()
    ids = (c_uint16 * len(fieldIds))(*fieldIds)
    _check(dcgmFP("dcgmEntityGetLatestValues")(dcgmHandle, c_uint(entityGroup), dcgm_fields.c_dcgm_field_eid_t(entityId),
                                               ids, c_uint(len(fieldIds)), values))
    return values


@_bytes_args
def dcgmProfGetSupportedMetricGroups(dcgmHandle, gpuId):  # noqa: N802,N803
    msg = dcgm_structs.c_dcgmProfGetMetricGroups_v3()
    msg.version = dcgm_structs.dcgmProfGetMetricGroups_version3
    msg.gpuId = gpuId
    _check(dcgmFP("dcgmProfGetSupportedMetricGroups")(dcgmHandle, byref(msg)))
    return msg


@_bytes_args
def dcgmProfPause(dcgmHandle):  # noqa: N802,N803
    return _check(dcgmFP("dcgmProfPause")(dcgmHandle))


@_bytes_args
def dcgmProfResume(dcgmHandle):  # noqa: N802,N803
    return _check(dcgmFP("dcgmProfResume")(dcgmHandle))


@_bytes_args
def dcgmVersionInfo():  # noqa: N802
    msg = dcgm_structs.c_dcgmVersionInfo_v2()
    msg.version = dcgm_structs.dcgmVersionInfo_version2
    _check(dcgmFP("dcgmVersionInfo")(byref(msg)))
    return msg
