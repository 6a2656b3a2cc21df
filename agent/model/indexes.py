"""Whether text another program wrote is an index: one rule for every source the agent reads.

A GPU index or MIG instance id in a dcgm-exporter label, a ``gpu_id``, partition id or link, XCC, HBM or clock
index in AMD's Device Metrics Exporter, a device index in a job's ``CUDA_VISIBLE_DEVICES`` or Slurm's
``SLURM_STEP_GPUS``: each comes from text someone else controls, and each ends in ``int()`` or is compared with an
index the agent made. ``str.isdigit`` is not the test. ``"²"`` is a digit to it and no number to ``int()``: one
such label failed a whole read, kept the agent from starting and, once running, took every GPU down. ``"٣"``
(ARABIC-INDIC DIGIT THREE) is read as 3 by ``int()``, a second GPU 3 under another name; 4,301 digits are more
than ``int()`` converts. So an index is ASCII digits, at most :data:`MAX_INDEX_DIGITS` of them, and without a
leading zero where the writer prints none (the exporters: ``"07"`` would be a second name for GPU 7).

Backends, attribution, report intake and the views (ordering GPUs) import this; it imports nothing of ours, so it sits in the model,
below all of them.
"""

from __future__ import annotations

import re

MAX_INDEX_DIGITS = 5
"""No node numbers its GPUs, partitions or links past five digits; a longer "index" is garbage or an attack."""
_INDEX = re.compile(r"0|[1-9][0-9]{0,%d}" % (MAX_INDEX_DIGITS - 1))  # [0-9], never \d: \d matches "٣"
_PADDED = re.compile(r"[0-9]{1,%d}" % MAX_INDEX_DIGITS)


def is_index(text: object, *, leading_zeros: bool = False) -> bool:
    """Whether ``text`` is an index: a str of ASCII digits, at most :data:`MAX_INDEX_DIGITS`, no leading zero
    unless ``leading_zeros`` (a job's environment, where CUDA reads ``01`` as 1). None and non-str are not."""
    if not isinstance(text, str):
        return False
    return (_PADDED if leading_zeros else _INDEX).fullmatch(text) is not None


def index_value(text: object, *, leading_zeros: bool = False) -> int | None:
    """``int(text)`` when :func:`is_index` holds, else None: the one way a label becomes a number."""
    return int(text) if is_index(text, leading_zeros=leading_zeros) else None  # type: ignore[arg-type]


def gpu_order(gpu: str) -> tuple[tuple[int, int, str], ...]:
    """The order every view lists GPUs in: numeric where a part is an index ("2" < "10", "3" < "3/1" < "4"),
    after the indexes and by text where it is not (a GPU named ``"²"`` by a trace or an exporter sorts, it
    does not crash a view). Parts are split at ``/`` (MIG instance, AMD partition), ``.``, ``:`` and ``-``."""
    return tuple((0, number, "") if (number := index_value(part)) is not None else (1, 0, part)
                 for part in re.split(r"[/.:-]", gpu))
