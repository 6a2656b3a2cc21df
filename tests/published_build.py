"""traces/published/build.py loaded as a module (the folder is not a package): one loader for the tests
that check the published traces and their source table."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

PUBLISHED = Path(__file__).resolve().parent.parent / "traces" / "published"


def load_build(name: str = "published_build") -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, PUBLISHED / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
