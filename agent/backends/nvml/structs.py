"""Reading numeric fields of pynvml structs on the hot path.

pynvml's structs override ``__getattribute__`` to turn ``bytes`` into ``str`` on every attribute
read, a Python call per field. The per-interval reads (GPM metrics, field values) touch a few
hundred numeric fields per GPU per interval, none of them strings, so they read through the plain
ctypes descriptor instead: the same value, without the hook.
"""

from __future__ import annotations

import ctypes
from typing import Any

plain = ctypes.Structure.__getattribute__
"""``plain(struct, "field")``: the ctypes value of a numeric field (not for char arrays)."""


def plain_union(union: Any, member: str) -> Any:
    return ctypes.Union.__getattribute__(union, member)
