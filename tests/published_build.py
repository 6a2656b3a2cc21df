"""traces/published/build.py loaded as a module (the folder is not a package): one loader for the tests
that check the published traces and their source table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PUBLISHED = Path(__file__).resolve().parent.parent / "traces" / "published"
FAMILIES_BUILD = PUBLISHED / "families" / "build.py"
"""The builder of issue 44's four families (quiet, checkpoint, straggler, MoE)."""


def load_build(name: str = "published_build", path: Path = PUBLISHED / "build.py") -> ModuleType:
    """``path`` (a build script of traces/published or of its families/ folder) loaded as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module
