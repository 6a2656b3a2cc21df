"""The tree stays readable: few top-level rooms, no import cycles, no giant files, and
docs/architecture.md (and every doc that names a source path) matching what is on disk."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "exporters", "benchmarks", "dashboards", "tests")
MAX_TOP_LEVEL = 12
MAX_LINES = 450
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")
"""protoc output (agent/context/attribution/kubelet/podresources/v1): regenerated, never edited."""


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "node_modules" not in path.parts and not GENERATED.search(path.name):
                yield path


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, anywhere in the file (functions and TYPE_CHECKING too).

    ``from package import name`` points at ``package.name`` when that is a module, else at the
    package; an import of a package's submodule does not count as importing the package.
    """
    modules = {_module_name(p): p for p in paths}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")[: None if is_package else -1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            for target in targets:
                found = owner(target)
                if found is not None and found != module:
                    graph[module].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_and_a_self_contained_tree_has_none() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_import_graph_resolves_relative_lazy_and_type_checking_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import thing\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\nthing = 1\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    import pkg.c\n")
    (pkg / "c.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    graph = import_graph(sorted(pkg.glob("*.py")))
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a", "pkg.c"}, "pkg.c": set()}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


@pytest.fixture(scope="module")
def tree() -> dict[str, set[str]]:
    """The import graph of the whole tree, walked once for the tests that read it."""
    graph = import_graph(list(_sources()))
    assert "agent.model" in graph and "exporters.prometheus" in graph  # the walk saw the tree
    return graph


@pytest.mark.slow
def test_no_import_cycles_among_the_projects_modules(tree: dict[str, set[str]]) -> None:
    assert cycles(tree) == []


LAYERS: tuple[tuple[str, ...], ...] = (
    ("agent/__init__.py", "agent/model/", "agent/client/"),
    ("agent/context/",),
    ("agent/trace/", "agent/backends/base.py", "exporters/", "dashboards/"),
    ("agent/classifier/", "agent/virtual/"),
    ("agent/backends/",),
    ("agent/collector/", "agent/views/", "agent/diagnostics/"),
    ("agent/app/",),
)
"""The layer order of docs/architecture.md ("Dependencies point down the flow"), bottom first. A module
imports its own room and the rooms of lower layers only: never a room of its own layer, never one above.
A room is a folder or a file; a module belongs to the longest room that holds it (``agent/backends/base.py``,
the interface every source implements, sits below the simulated fleet that implements it too)."""
OUTSIDE = ("benchmarks/", "tests/")
"""Outside the layers: they may import anything, and nothing in the layers imports them."""


def room_of(path: str, rooms: Iterator[str] | tuple[str, ...]) -> str | None:
    """The longest room (a folder ending in ``/``, or a file) that holds ``path``; None when none does."""
    held = [room for room in rooms if path == room or (room.endswith("/") and path.startswith(room))]
    return max(held, key=len, default=None)


def climbs(graph: dict[str, set[str]], paths: dict[str, str],
           layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Every import that leaves its room for a room of the same layer or a higher one, or for a module in
    no layer at all; imports of modules in no layer (``OUTSIDE``) are not checked."""
    level = {room: number for number, layer in enumerate(layers, start=1) for room in layer}
    found = []
    for module, targets in graph.items():
        source = room_of(paths[module], tuple(level))
        if source is None:
            continue
        for target in sorted(targets):
            room = room_of(paths[target], tuple(level))
            if room is None:
                found.append(f"{module} -> {target}: {paths[target]} is in no layer")
            elif room != source and level[room] >= level[source]:
                where = "beside it" if level[room] == level[source] else "above it"
                found.append(f"{module} ({source}, layer {level[source]}) -> "
                             f"{target} ({room}, layer {level[room]}, {where})")
    return found


def _paths() -> dict[str, str]:
    return {_module_name(p): p.relative_to(REPO).as_posix() for p in _sources()}


def test_the_layer_check_flags_a_climb_and_an_import_beside_and_lets_a_descent_and_its_own_room_pass() -> None:
    layers = (("low/",), ("mid/a/base.py",), ("mid/a/", "mid/b/"), ("top/",))
    paths = {"low.x": "low/x.py", "mid.a.y": "mid/a/y.py", "mid.a.v": "mid/a/v.py", "mid.a.base": "mid/a/base.py",
             "mid.b.z": "mid/b/z.py", "top.w": "top/w.py", "tests.t": "tests/t.py"}
    down = {"top.w": {"mid.a.y", "low.x"}, "mid.a.y": {"mid.a.base", "mid.a.v", "low.x"}, "mid.b.z": {"mid.a.base"},
            "tests.t": {"top.w"}, "low.x": set(), "mid.a.base": {"low.x"}, "mid.a.v": set()}
    assert climbs(down, paths, layers) == []
    up = {"low.x": {"top.w"}, "mid.a.base": {"mid.a.y"}, "mid.b.z": {"mid.a.y"}, "mid.a.y": {"tests.t"}}
    assert climbs(up, paths, layers) == [
        "low.x (low/, layer 1) -> top.w (top/, layer 4, above it)",
        "mid.a.base (mid/a/base.py, layer 2) -> mid.a.y (mid/a/, layer 3, above it)",
        "mid.b.z (mid/b/, layer 3) -> mid.a.y (mid/a/, layer 3, beside it)",
        "mid.a.y -> tests.t: tests/t.py is in no layer",
    ]


def test_every_module_of_the_product_is_in_a_layer_and_the_suite_and_benchmarks_in_none() -> None:
    rooms = tuple(room for layer in LAYERS for room in layer)
    paths = _paths()
    assert len(paths) > 300
    outside = sorted(path for path in paths.values() if room_of(path, rooms) is None)
    assert outside and all(path.startswith(OUTSIDE) for path in outside), \
        "a new top-level package needs its place in LAYERS and in docs/architecture.md"
    assert not any(room_of(path, rooms) for path in paths.values() if path.startswith(OUTSIDE))


@pytest.mark.slow
def test_no_import_climbs_the_layer_order(tree: dict[str, set[str]]) -> None:
    """Counting imports inside functions and under TYPE_CHECKING, as the cycle test does: a lower layer
    that needs something from a higher one gets it handed down (docs/architecture.md says how)."""
    assert climbs(tree, _paths()) == []


def _layer_lines() -> list[str]:
    doc = _architecture_doc()
    section = doc[doc.index("Dependencies point down the flow"):]
    section = section[:section.index("\n## ")]
    return re.findall(r"^(\d+)\. (.*)$", section, re.M)


def test_the_architecture_doc_states_the_layer_order_the_test_holds() -> None:
    lines = _layer_lines()
    assert [int(number) for number, _ in lines] == list(range(1, len(LAYERS) + 1))
    stated = tuple(tuple(re.findall(r"`([^`]+)`", text.split(": ", 1)[0])) for _, text in lines)
    assert stated == LAYERS, "docs/architecture.md and LAYERS must list the same rooms in the same layers"


def test_no_hand_written_source_file_is_over_the_limit() -> None:
    sizes = {str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines()) for p in _sources()}
    assert len(sizes) > 100
    too_long = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert too_long == {}, f"split these along their seams (limit {MAX_LINES} lines)"


def _top_level_entries() -> list[str]:
    return sorted(p.name for p in (REPO / "agent").iterdir() if p.name != "__pycache__" and not p.name.startswith("."))


def _architecture_doc() -> str:
    return (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_agent_has_few_top_level_entries_and_the_architecture_doc_lists_each() -> None:
    entries = _top_level_entries()
    assert len(entries) <= MAX_TOP_LEVEL, entries
    doc = _architecture_doc()
    for entry in entries:
        named = f"agent/{entry}/" if (REPO / "agent" / entry).is_dir() else f"agent/{entry}"
        assert f"`{named}`" in doc, f"docs/architecture.md does not describe {named}"


SOURCE_PATH = re.compile(r"(?<![\w/.-])((?:agent|exporters|benchmarks|dashboards|deploy|tests)/[\w./-]*[\w/])")


def _named_paths(text: str) -> set[str]:
    """Repository paths written in a text; patterns such as ``roofwatch-{cluster,node}.json`` are skipped."""
    return {m.group(1) for m in SOURCE_PATH.finditer(text) if "{" not in text[m.end():m.end() + 2]}


def test_every_package_and_file_the_architecture_doc_names_exists() -> None:
    named = _named_paths(_architecture_doc())
    assert {"agent/model/", "agent/backends/", "agent/classifier/", "agent/context/"} <= named
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert missing == [], "docs/architecture.md names paths that are not in the tree"


def _markdown_docs() -> list[str]:
    skip = {".git", ".venv", "node_modules", ".pytest_cache", ".hypothesis"}
    return sorted(str(p.relative_to(REPO)) for p in REPO.rglob("*.md") if not skip & set(p.relative_to(REPO).parts))


@pytest.mark.parametrize("doc", _markdown_docs())
def test_docs_name_only_source_paths_that_exist(doc: str) -> None:
    text = (REPO / doc).read_text(encoding="utf-8")
    missing = sorted(path for path in _named_paths(text) if "*" not in path and not (REPO / path).exists())
    assert missing == [], f"{doc} names paths that moved or never existed"


def test_the_files_each_package_row_names_are_in_that_package() -> None:
    """A row of the package table names files by their short name (``engine.py``, ``nvml/``):
    each must exist somewhere under the row's package, so a rename cannot leave the table behind."""
    rows = [line for line in _architecture_doc().splitlines() if re.match(r"\| `(agent|exporters)/[\w/.]*` \|", line)]
    assert len(rows) >= MAX_TOP_LEVEL
    for row in rows:
        package = REPO / re.match(r"\| `([\w/.]+)`", row).group(1)
        if package.is_file():
            continue
        for name in re.findall(r"`([\w.]+\.py|[\w]+/)`", row.split("|")[2]):
            hits = list(package.rglob(name.rstrip("/")))
            assert hits, f"docs/architecture.md: {name} is not under {package.relative_to(REPO)}"


TEST_REFERENCE = re.compile(r"\b(test_\w+\.py)(?:::(test_\w+))?")


@pytest.mark.parametrize("doc", _markdown_docs())
def test_docs_cite_only_tests_that_exist(doc: str) -> None:
    """docs/reliability.md and others cite the test behind each promise: a moved test must be re-cited."""
    text = (REPO / doc).read_text(encoding="utf-8")
    tests = {p.name: p for p in (REPO / "tests").rglob("test_*.py")}
    stale = []
    for match in TEST_REFERENCE.finditer(text):
        name, function = match.groups()
        if name not in tests:
            stale.append(name)
        elif function and not re.search(rf"^(async )?def {function}\(", tests[name].read_text(encoding="utf-8"), re.M):
            stale.append(f"{name}::{function}")
    assert stale == [], f"{doc} cites tests that are not there"
