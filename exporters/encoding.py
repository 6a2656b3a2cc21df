"""prometheus_client's text and OpenMetrics 1.0 encodings, written directly for our families.

The agent renders its exposition once per collection cycle. prometheus_client's encoders are
general: for every label of every sample they run a regex over the label name, pick an escaping
scheme and format through ``str.format``, which was ~80% of a render (about 7 µs a series,
1,500+ series on an 8-GPU node). Our families only ever hold plain gauge, counter and info
samples with legacy-valid names, so for those the same bytes are written directly; anything
else falls back to the encoder given. tests/test_encoding.py checks the bytes are identical to
prometheus_client's for both formats, including label values with quotes, backslashes,
newlines and non-ASCII text.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Iterable

from prometheus_client import exposition as text_format
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as openmetrics_format
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_SAFE_ESCAPINGS = (openmetrics_format.UNDERSCORES, openmetrics_format.ALLOWUTF8)
"""Escapings that leave a legacy-valid name as it is (``dots`` and ``values`` rewrite every name)."""
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
"""Names every escaping above writes unchanged, as metric names, label names and sample names."""
_MAX_REMEMBERED = 1024
"""Label and metric names come from the code, so a few dozen; the bound only guards against a bug."""
_PLAIN_LABELS: set[str] = set()
"""Label names already checked by :func:`_admit_label_name`."""
_TEXT_TYPES = {"gauge": "gauge", "counter": "counter", "info": "gauge"}
"""Family types reproduced, and the TYPE the Prometheus text format gives each."""
_SUFFIXES = {"gauge": "", "counter": "_total", "info": "_info"}
_SAMPLE_FIELDS = ("name", "labels", "value", "timestamp", "exemplar", "native_histogram")


class _Unsupported(Exception):
    """A family or sample outside what :func:`_encode` writes exactly as prometheus_client does."""


def encode_exposition(collector: Collector, encoder: Callable[[Collector], bytes]) -> bytes:
    """``encoder(collector)``, byte for byte, without its per-label overhead when it is one of
    prometheus_client's own text or OpenMetrics 1.0 encoders (what ``choose_encoder`` hands out)."""
    openmetrics = _recognised(encoder)
    if openmetrics is None:
        return encoder(collector)
    try:
        return _encode(collector.collect(), openmetrics=openmetrics)
    except _Unsupported:
        return encoder(collector)  # collecting is pure, so the second pass sees the same families


def _recognised(encoder: Callable[[Collector], bytes]) -> bool | None:
    """True for the OpenMetrics 1.0 encoder, False for the text one, None for anything else."""
    func, kwargs = encoder, {}
    if isinstance(encoder, functools.partial):
        if encoder.args:
            return None
        func, kwargs = encoder.func, encoder.keywords
    if kwargs.get("escaping", openmetrics_format.UNDERSCORES) not in _SAFE_ESCAPINGS or Sample._fields != _SAMPLE_FIELDS:
        return None
    if func is text_format.generate_latest and kwargs.keys() <= {"escaping"}:
        return False
    if func is openmetrics_format.generate_latest and kwargs.keys() <= {"escaping", "version"} \
            and kwargs.get("version", "1.0.0") == "1.0.0":
        return True
    return None


def _encode(families: Iterable[Metric], *, openmetrics: bool) -> bytes:
    """The exposition of ``families`` as prometheus_client writes it; :class:`_Unsupported` if it cannot."""
    out: list[str] = []
    append = out.append
    escaped: dict[str, str] = {}  # node, gpu and uuid recur in every series: escape each value once
    plain_labels = _PLAIN_LABELS
    for family in families:
        line_name = _line_name(family)
        append(_header(family, line_name, openmetrics))
        for name, labels, value, timestamp, exemplar, native in family.samples:
            if name != line_name or value is None or timestamp is not None or exemplar is not None or native is not None:
                raise _Unsupported(name)
            number = floatToGoString(value)
            if not labels:
                append(f"{name} {number}\n")
                continue
            pairs = []
            for key, text in sorted(labels.items()):
                if key not in plain_labels:
                    _admit_label_name(key)
                value_text = escaped.get(text)
                if value_text is None:
                    value_text = escaped[text] = _escape_value(text)
                pairs.append(f'{key}="{value_text}"')
            append(f"{name}{{{','.join(pairs)}}} {number}\n")
    if openmetrics:
        append("# EOF\n")
    return "".join(out).encode("utf-8")


def _line_name(family: Metric) -> str:
    """The name every sample of ``family`` must carry (``_total`` / ``_info`` appended)."""
    suffix = _SUFFIXES.get(family.type)
    if suffix is None or not _plain(family.name):
        raise _Unsupported(family.name)
    return family.name + suffix


def _header(family: Metric, line_name: str, openmetrics: bool) -> str:
    if openmetrics:
        unit = f"# UNIT {family.name} {family.unit}\n" if family.unit else ""
        return f"# HELP {family.name} {_escape_value(family.documentation)}\n# TYPE {family.name} {family.type}\n{unit}"
    help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {line_name} {help_text}\n# TYPE {line_name} {_TEXT_TYPES[family.type]}\n"


def _escape_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _admit_label_name(key: str) -> None:
    """Remember a label name that every safe escaping writes as it is; refuse any other.

    ``__``-prefixed names are reserved: prometheus_client quotes them under ``allow-utf-8``.
    """
    if not _plain(key) or key.startswith("__"):
        raise _Unsupported(key)
    if len(_PLAIN_LABELS) < _MAX_REMEMBERED:
        _PLAIN_LABELS.add(key)


@functools.lru_cache(maxsize=_MAX_REMEMBERED)
def _plain(name: str) -> bool:
    return _PLAIN_NAME.fullmatch(name) is not None
