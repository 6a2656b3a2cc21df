"""Every YAML document the agent reads (settings, web config, scenarios) goes through :func:`load_yaml`.

YAML aliases let a small file describe a huge tree: nine levels of nine aliases (the "billion
laughs", 1.1 KB) is 387 million values once expanded. PyYAML builds it as a shared graph in
milliseconds, but whatever walks it afterwards (pydantic, the settings sources, an error message
quoting the input) walks every copy: ``roofwatch run`` sat at 100% CPU past 20 s and 1.6 GiB, and a
SIGHUP stopped the running agent's scrapes for 10 s before it was OOM-killed.

So the loader counts values as it composes them, an alias counting as the whole tree it stands
for, and stops at :data:`MAX_NODES` before anything is built or walked: the bomb is refused after
reading about eighty values. Aliases stay legal within the budget (scenarios share phase lists
through ``x-`` anchors, as docker-compose files do); an alias inside its own anchor (a recursive
structure) is refused. The same budget bounds a flat file: a MiB of ``[0,0,0,...]`` is half a
million values, and the settings took 88 s and 910 MiB to refuse it. Whatever goes wrong is one line naming the file.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

MAX_NODES = 20_000
"""Values in one document, aliases counted at their expanded size. The largest YAML shipped with the
agent (a scenario, a labelled trace's scenario, the chart's values) holds under 300; a settings file
with dozens of inference endpoints and spec overrides a few thousand. 20,000 values compose in about
half a second and 12 MiB on one core, far inside the unit's 256 MiB."""


SHOWN_CHARS = 60
"""Longest a value or a key is echoed in an error: enough to recognise it, never a 4301-digit number."""


class YamlInputError(ValueError):
    """A document that cannot be read; the message is one line naming the file (and line, or setting)."""


class _OverBudget(Exception):
    """Raised by the loader the moment the document passes its budget; the message says where."""


class _BudgetLoader(yaml.SafeLoader):
    """PyYAML's safe loader, counting the values it composes (an alias at its anchor's expanded size)."""

    def __init__(self, text: str, max_nodes: int) -> None:
        super().__init__(text)
        self._max_nodes = max_nodes
        self._nodes = 0
        self._sizes: dict[str, int] = {}
        """Expanded size of each anchored value, known once it is composed."""
        self._open: set[str] = set()
        """Anchors whose value is being composed: an alias to one of them would be recursive."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark else 0
        if isinstance(event, yaml.AliasEvent):
            alias = printable_name(event.anchor)
            if event.anchor in self._open:
                raise _OverBudget(f"the alias *{alias} at line {line} sits inside its own anchor "
                                  "(a recursive structure): refused")
            if self._over(self._sizes.get(event.anchor, 1)):
                raise _OverBudget(f"aliases expand to more than {self._max_nodes} YAML values (*{alias} at "
                                  f"line {line}): refused as an alias bomb")
            return super().compose_node(parent, index)  # an undefined alias is PyYAML's error
        before = self._nodes
        if self._over(1):
            raise _OverBudget(f"more than {self._max_nodes} YAML values (at line {line}): too large to be read")
        anchor = event.anchor
        if anchor is None:
            return super().compose_node(parent, index)
        self._open.add(anchor)
        node = super().compose_node(parent, index)
        self._open.discard(anchor)
        self._sizes[anchor] = self._nodes - before
        return node

    def _over(self, nodes: int) -> bool:
        """Count ``nodes`` more values; True once the document is past its budget."""
        self._nodes += nodes
        return self._nodes > self._max_nodes


def load_yaml(text: str, where: str, max_nodes: int = MAX_NODES) -> Any:
    """The one YAML document in ``text``, as ``yaml.safe_load`` gives it, within ``max_nodes`` values.

    ``where`` starts every error (``config file /etc/roofwatch.yaml``). :class:`YamlInputError` for
    invalid YAML, a document past the budget (an alias bomb), nesting past the interpreter's
    recursion limit, and a value that cannot be built (a number past Python's digit limit: the
    setting holding it is named)."""
    loader = _BudgetLoader(text, max_nodes)
    try:
        return loader.get_single_data()
    except _OverBudget as exc:
        raise YamlInputError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise YamlInputError(f"{where}: invalid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise YamlInputError(f"{where}: nested too deeply to be read") from None
    except ValueError as exc:  # raised while constructing a value: a number past the digit limit
        raise YamlInputError(f"{where}: {_path_of_long_number(text, max_nodes) or 'a value'}: "
                             f"{value_problem(exc)}") from None
    finally:
        loader.dispose()


def value_problem(exc: BaseException) -> str:
    """One short line for a value Python would not build: a number past the digit limit, a bad date."""
    if "digits" in str(exc):
        return f"a number of more than {sys.get_int_max_str_digits()} digits"
    return " ".join(str(exc).split())[:120]


def _path_of_long_number(text: str, max_nodes: int) -> str | None:
    """The dotted path of the first integer too long to parse, found without constructing values
    (the document has already composed within the budget once)."""
    loader = _BudgetLoader(text, max_nodes)
    try:
        root = loader.get_single_node()
    except (yaml.YAMLError, _OverBudget, RecursionError):
        return None
    finally:
        loader.dispose()
    limit = sys.get_int_max_str_digits()
    stack: list[tuple[Any, str]] = [(root, "")]
    seen: set[int] = set()
    while stack:
        node, where = stack.pop()
        if id(node) in seen:  # an alias: the same node again
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            stack.extend((value, f"{where}.{_key(key)}" if where else _key(key)) for key, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.ScalarNode) and node.tag.endswith(":int") and sum(c.isdigit() for c in node.value) > limit:
            return where or None
    return None


def printable_name(part: object) -> str:
    """A key of a settings path as an error may show it: a name from a file can hold anything."""
    text = str(part)
    text = text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
    return text if text.isprintable() else repr(text)[1:-1]


def _key(node: Any) -> str:
    return printable_name(node.value) if isinstance(node, yaml.ScalarNode) else "?"
