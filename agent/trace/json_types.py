"""JSON types of a trace sample's known fields, checked before pydantic sees them.

pydantic's lax mode, which the reader needs (JSON arrays become tuples, an integral
``1.5e11`` fills an int field, as older writers produced), also turns ``true`` into 1.0 and
``"0.5"`` into 0.5. A trace that says ``"gr_active": true`` is broken. The contract says "number",
and replaying it as 100% busy would put a made-up verdict on the record. So a boolean or a
string where the contract has a number, or a number where it has a boolean, is an error
naming the field. Unknown fields are not looked at (the contract says to ignore them).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, Union

_NUMBER = "number"
_BOOL = "boolean"


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What JSON a field takes: a scalar kind, or nested objects of a dataclass (alone or in a list)."""

    scalar: str | None = None
    nested: type | None = None


def _unwrap(annotation: Any) -> list[Any]:
    """The members of ``X | None`` / ``Optional[X]`` / ``Union``, without None."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _shape(annotation: Any) -> _Shape:
    for member in _unwrap(annotation):
        if member is bool:
            return _Shape(scalar=_BOOL)
        if member in (int, float):
            return _Shape(scalar=_NUMBER)
        if dataclasses.is_dataclass(member):
            return _Shape(nested=member)
        if typing.get_origin(member) is tuple:
            inner = typing.get_args(member)[0]
            if dataclasses.is_dataclass(inner):
                return _Shape(nested=inner)
    return _Shape()


@cache
def field_shapes(cls: type) -> dict[str, _Shape]:
    hints = typing.get_type_hints(cls)
    return {f.name: _shape(hints[f.name]) for f in dataclasses.fields(cls)}


def json_type_error(obj: dict[str, Any], cls: type, path: str = "") -> str | None:
    """The first known field of ``obj`` (parsed JSON for a ``cls``) whose JSON type is wrong, described."""
    shapes = field_shapes(cls)
    for name, value in obj.items():
        shape = shapes.get(name)
        if shape is None or value is None:
            continue
        where = f"{path}{name}"
        if shape.scalar == _NUMBER and (isinstance(value, bool) or isinstance(value, str)):
            return f"field '{where}': must be a number, not {_json_repr(value)}"
        if shape.scalar == _BOOL and not isinstance(value, bool):
            return f"field '{where}': must be true or false, not {_json_repr(value)}"
        if shape.nested is not None:
            items = [(f"{where}[{i}].", v) for i, v in enumerate(value)] if isinstance(value, list) else [(f"{where}.", value)]
            for prefix, item in items:
                if isinstance(item, dict) and (error := json_type_error(item, shape.nested, prefix)):
                    return error
    return None


def _json_repr(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
