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


@pytest.mark.slow
def test_no_import_cycles_among_the_projects_modules() -> None:
    graph = import_graph(list(_sources()))
    assert "agent.model" in graph and "exporters.prometheus" in graph  # the walk saw the tree
    assert cycles(graph) == []


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
