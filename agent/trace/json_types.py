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
    wrong = _first_wrong(obj, cls)
    if wrong is None:
        return None
    where, value, expected = wrong
    return f"field '{path}{where}': must be {expected}, not {_json_repr(value)}"


def _first_wrong(obj: dict[str, Any], cls: type) -> tuple[str, Any, str] | None:
    """``(field path, value, what it must be)`` of the first wrong field. Runs for every sample of a
    trace, so nothing is formatted until something is wrong."""
    shapes = field_shapes(cls)
    for name, value in obj.items():
        if value is None:
            continue
        shape = shapes.get(name)
        if shape is None:
            continue
        if shape.scalar == _NUMBER:
            if isinstance(value, (bool, str)):
                return name, value, "a number"
        elif shape.scalar == _BOOL:
            if not isinstance(value, bool):
                return name, value, "true or false"
        elif shape.nested is not None:
            items = enumerate(value) if isinstance(value, list) else ((None, value),)
            for i, item in items:
                if isinstance(item, dict) and (inner := _first_wrong(item, shape.nested)) is not None:
                    prefix = name if i is None else f"{name}[{i}]"
                    return f"{prefix}.{inner[0]}", inner[1], inner[2]
    return None


def _json_repr(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
