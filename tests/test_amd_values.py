"""The AMD backend's pure parts: "N/A" is unknown (never 0), status codes, and the import messages."""

from __future__ import annotations

import math

import pytest

from agent.backends.amd import values as v
from agent.backends.amd.errors import Meaning, describe, meaning_of_code
from agent.backends.amd.library import import_error_message, load_amdsmi
from agent.backends.base import BackendUnavailable


@pytest.mark.parametrize("raw, expected", [
    (42, 42.0), (0, 0.0), (3.5, 3.5), ("N/A", None), (None, None), (True, None), (math.nan, None),
    (math.inf, None), ("42", None), ([1], None),
])
def test_num_accepts_only_finite_numbers(raw, expected):
    assert v.num(raw) == expected


@pytest.mark.parametrize("raw, expected", [(0, 0.0), (100, 1.0), (37, 0.37), ("N/A", None), (101, None), (-1, None)])
def test_percent_is_a_ratio_and_out_of_range_is_unknown(raw, expected):
    assert v.percent(raw) == expected


@pytest.mark.parametrize("reader, raw, expected", [
    # all ones at every width, as some wrappers pass them through, and out-of-range readings
    (v.watts, 750, 750.0), (v.watts, 255, 255.0), (v.watts, 0xFFFF, None), (v.watts, 0xFFFE, None),
    (v.watts, 0xFFFFFFFF, None), (v.watts, 0xFFFFFFFFFFFFFFFF, None), (v.watts, -5, None), (v.watts, "N/A", None),
    (v.celsius, 45, 45.0), (v.celsius, 0xFF, None), (v.celsius, 0xFFFF, None), (v.celsius, -300, None),
    (v.mhz, 2100, 2100.0), (v.mhz, 0, None), (v.mhz, 0xFFFF, None), (v.mhz, 0xFFFFFFFF, None),
    (v.counter, 123, 123.0), (v.counter, 255, 255.0), (v.counter, 0xFFFF, 65535.0), (v.counter, 0xFFFFFFFF, None),
    (v.counter, 0xFFFFFFFFFFFFFFFF, None), (v.counter, -1, None), (v.counter, "N/A", None),
    (v.nbytes, 8 << 30, float(8 << 30)), (v.nbytes, 0xFFFFFFFFFFFFFFFF, None),
])
def test_sentinels_and_absurd_values_are_unknown(reader, raw, expected):
    assert reader(raw) == expected


def test_mean_percent_skips_unreadable_xccs_and_is_unknown_when_none_is_readable():
    assert v.mean_percent([50, "N/A", 100]) == pytest.approx(0.75)
    assert v.mean_percent(["N/A", "N/A"]) is None
    assert v.mean_percent([]) is None


def test_list_metrics_that_are_wholly_na_are_empty():
    assert v.listed("N/A") == ()
    assert list(v.listed([1, 2])) == [1, 2]
    assert v.max_number(["N/A", 71, 80, "N/A"]) == 80.0
    assert v.max_number(["N/A"]) is None


@pytest.mark.parametrize("mode, count", [("SPX", 1), ("DPX", 2), ("QPX", 4), ("CPX", 8), ("cpx", 8), ("N/A", 1), (None, 1)])
def test_partition_counts(mode, count):
    assert v.partition_count(mode) == count


def test_parent_bdf_drops_the_function_number():
    assert v.parent_bdf("0000:18:00.3") == "0000:18:00"
    assert v.parent_bdf("0000:18:00.0") == v.parent_bdf("0000:18:00.7")


@pytest.mark.parametrize("code, expected", [
    (2, Meaning.ABSENT), (3, Meaning.ABSENT), (10, Meaning.ABSENT), (40, Meaning.NO_DATA),
    (31, Meaning.DEVICE_LOST), (12, Meaning.DEVICE_LOST), (32, Meaning.LIBRARY), (8, Meaning.FAILED),
    (7, Meaning.FAILED), (4294967295, Meaning.FAILED),
])
def test_status_meanings(code, expected):
    assert meaning_of_code(code) is expected


def test_describe_never_shows_a_traceback_for_foreign_exceptions():
    assert describe(ValueError("boom")) == "ValueError: boom"


def test_import_messages_name_the_cause_and_the_fix():
    missing = import_error_message(KeyError("libamd_smi.so"))
    assert "libamd_smi.so not found" in missing and "amd-smi-lib" in missing
    skew = import_error_message(AttributeError("/opt/rocm/lib/libamd_smi.so: undefined symbol: amdsmi_get_cpu_affinity_with_scope"))
    assert "newer than the installed ROCm" in skew and "amdsmi_get_cpu_affinity_with_scope" in skew
    assert "/opt/rocm/share/amd_smi" in skew
    rocm_path = import_error_message(KeyError("ROCM_PATH"))  # the 6.2.0-6.2.2 wrappers, without ROCM_PATH
    assert "ROCM_PATH=/opt/rocm" in rocm_path and "libamd_smi.so not found" not in rocm_path


def test_the_real_amdsmi_import_without_rocm_is_one_clear_line(capsys):
    """This machine has the amdsmi wheel but no ROCm: exactly the KeyError trap, turned into a message."""
    with pytest.raises(BackendUnavailable) as info:
        load_amdsmi()
    assert "libamd_smi.so not found" in str(info.value)
    assert "Unable to find" not in capsys.readouterr().out  # the wrapper's own print is kept off stdout
