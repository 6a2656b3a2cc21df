"""One GPU reads the same whichever names and units its exporter prints.

DCGM 4.6.0 renamed the fields (``dcgmlib/dcgm_fields.h``: ``DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO`` for
``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ``DCGM_FI_DEV_BOARD_POWER_WATTS`` for ``DCGM_FI_DEV_POWER_USAGE``,
...); dcgm-exporter prints whatever names its CSV lists, some re-exporters lower-case them, and newer
releases are reported to move units. The A100 fixture is rewritten each of those ways and must give
the same samples and verdicts as the original; before, the 4.6 spelling read as a GPU with no
counters at all (``unknown``).
"""

from __future__ import annotations

import re

import pytest

from agent.backends.dcgm_exporter.exposition import read_records
from agent.backends.dcgm_exporter.mapping import sample_values
from agent.backends.dcgm_exporter.names import PERCENTS, PROFILING_RATIOS, RENAMED, canonical
from agent.classifier.engine import classify_samples
from agent.model import GpuSample
from tests.dcgm_exporter_server import fixture

OLD_TO_NEW = {old: new for new, old in RENAMED.items()}
LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<labels>\{.*\})?\s+(?P<value>\S+)(?P<rest>.*)$")


def rewrite(body: str, *, rename: bool = False, lower: bool = False, percent_ratios: bool = False,
            ratio_percents: bool = False) -> str:
    """The body with its names and units changed the way newer exporters change them."""
    out = []
    for line in body.splitlines():
        if line.startswith("# "):
            words = line.split(" ")
            if len(words) > 2 and words[1] in ("HELP", "TYPE"):
                words[2] = spell(words[2], rename, lower)
            out.append(" ".join(words))
            continue
        match = LINE.match(line)
        if not match or not match["name"].startswith("DCGM_FI_"):
            out.append(line)
            continue
        name, value = match["name"], float(match["value"])
        if percent_ratios and name in PROFILING_RATIOS:
            value *= 100.0
        if ratio_percents and name in PERCENTS and OLD_TO_NEW.get(name, "").endswith("_RATIO"):
            value /= 100.0
        out.append(f"{spell(name, rename, lower)}{match['labels'] or ''} {value!r}{match['rest']}")
    return "\n".join(out) + "\n"


def spell(name: str, rename: bool, lower: bool) -> str:
    name = OLD_TO_NEW.get(name, name) if rename else name
    return name.lower() if lower else name


def samples_of(body: str) -> dict[str, dict]:
    return {key: sample_values(record) for key, record in read_records(body).records.items()}


VARIANTS = {
    "DCGM 4.6 names": dict(rename=True),
    "4.6 names, profiling ratios in percent, utilization as ratios": dict(rename=True, percent_ratios=True,
                                                                          ratio_percents=True),
    "lower-cased re-export": dict(lower=True),
    "old names, profiling in percent": dict(percent_ratios=True),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_same_a100_values_under_any_names_and_units_give_the_same_samples(variant):
    original = fixture("a100-8x-pods.prom")
    body = rewrite(original, **VARIANTS[variant])
    assert body != original
    expected, got = samples_of(original), samples_of(body)
    assert sorted(got) == sorted(expected)
    for gpu, values in expected.items():
        assert set(got[gpu]) == set(values), (gpu, set(values) ^ set(got[gpu]))
        for field, value in values.items():
            assert got[gpu][field] == pytest.approx(value, rel=1e-9, abs=1e-12), (gpu, field)
    assert "gr_active" in got["0"] and "tensor_active" in got["0"] and "power_w" in got["0"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_and_the_same_verdicts(variant):
    def verdicts(body: str) -> dict[str, tuple[str, str]]:
        records = read_records(body).records
        samples = [GpuSample(ts=1000.0 + t, gpu=key, node="n", uuid=r.uuid, vendor="nvidia", model=r.model,
                             interval_s=1.0, **sample_values(r)) for t in range(90) for key, r in records.items()]
        last: dict[str, tuple[str, str]] = {}
        for v in classify_samples(samples):
            last[v.gpu] = (v.cls, v.detail)
        return last

    original = verdicts(fixture("a100-8x-pods.prom"))
    assert len(original) == 8 and "unknown" not in {c for c, _ in original.values()}
    assert verdicts(rewrite(fixture("a100-8x-pods.prom"), **VARIANTS[variant])) == original


def test_a_moved_unit_is_said_once_per_family_for_doctor():
    body = rewrite(fixture("a100-8x-pods.prom"), rename=True, percent_ratios=True, ratio_percents=True)
    units = read_records(body).units
    assert any(u.startswith("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO reads up to") and "a percentage" in u for u in units)
    assert not any(u.startswith("DCGM_FI_DEV_GPU_UTIL_RATIO") for u in units), \
        "printed with a decimal point it is DCGM 4.7's double ratio, as the name says: nothing to correct"
    assert read_records(fixture("a100-8x-pods.prom")).units == ()


@pytest.mark.parametrize(("spelled", "read_as"), [
    ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    ("dcgm_fi_prof_gr_engine_active", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    ("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
    ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED"),  # not renamed in 4.6
    ("process_cpu_seconds_total", None),
])
def test_canonical_names(spelled, read_as):
    assert canonical(spelled) == read_as


def test_whole_percent_values_under_a_ratio_name_stay_percent_as_dcgm_types_them():
    """DCGM_FI_DEV_GPU_UTIL is an int64 percent; under its 4.6 name an idle node's 0 and 1 are percent."""
    body = ('DCGM_FI_DEV_GPU_UTIL_RATIO{gpu="0",UUID="GPU-a"} 1\n'
            'DCGM_FI_DEV_GPU_UTIL_RATIO{gpu="1",UUID="GPU-b"} 0\n')
    values = samples_of(body)
    assert values["0"]["gr_active"] == pytest.approx(0.01) and values["1"]["gr_active"] == 0.0
