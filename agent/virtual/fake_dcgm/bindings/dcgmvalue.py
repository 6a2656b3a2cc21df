"""Fake of DCGM's ``dcgmvalue`` binding module: the blank sentinels and their tests.

Facts from NVIDIA/DCGM ``testing/python3/dcgmvalue.py`` (4.6.0, same in 3.3.9): DCGM stores
"no value" as sentinels at the top of each type's range, not as zero. Anything at or above the
BLANK value is blank; BLANK+1 means not found, +2 not supported, +3 not permissioned. Strings
are blank when they look like ``<<<...>>>``.
"""

DCGM_INT8_BLANK = 0x70
DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0
DCGM_STR_BLANK = "<<<NULL>>>"

DCGM_INT32_NOT_FOUND = DCGM_INT32_BLANK + 1
DCGM_INT64_NOT_FOUND = DCGM_INT64_BLANK + 1
DCGM_FP64_NOT_FOUND = DCGM_FP64_BLANK + 1.0
DCGM_INT32_NOT_SUPPORTED = DCGM_INT32_BLANK + 2
DCGM_INT64_NOT_SUPPORTED = DCGM_INT64_BLANK + 2
DCGM_FP64_NOT_SUPPORTED = DCGM_FP64_BLANK + 2.0
DCGM_INT32_NOT_PERMISSIONED = DCGM_INT32_BLANK + 3
DCGM_INT64_NOT_PERMISSIONED = DCGM_INT64_BLANK + 3
DCGM_FP64_NOT_PERMISSIONED = DCGM_FP64_BLANK + 3.0


def DCGM_INT32_IS_BLANK(val):  # noqa: N802 - the binding's name
    return val >= DCGM_INT32_BLANK


def DCGM_INT64_IS_BLANK(val):  # noqa: N802
    return val >= DCGM_INT64_BLANK


def DCGM_FP64_IS_BLANK(val):  # noqa: N802
    return val >= DCGM_FP64_BLANK


def DCGM_STR_IS_BLANK(val):  # noqa: N802
    return val.startswith("<<<") and ">>>" in val
