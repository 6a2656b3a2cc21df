"""Write the roofwatch dashboards as Grafana 11 JSON, or check that the committed JSON is current.

    python -m dashboards.generate          # rewrite dashboards/*.json
    python -m dashboards.generate --check  # write nothing; exit 1 naming the stale files

The JSON is committed so that users can import it without Python; the test suite runs --check's
logic so the JSON never drifts from this code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders.dashboard import Dashboard

from dashboards import cluster, job, node
from dashboards.common import encode

DIRECTORY = Path(__file__).resolve().parent
BUILDERS: dict[str, Callable[[], Dashboard]] = {
    f"{cluster.UID}.json": cluster.build,
    f"{node.UID}.json": node.build,
    f"{job.UID}.json": job.build,
}


def render_all() -> dict[str, str]:
    """``{file name: JSON text}`` for every dashboard, exactly as committed."""
    return {name: encode(build()) for name, build in BUILDERS.items()}


def stale_files(directory: Path = DIRECTORY) -> list[str]:
    """Dashboards whose committed JSON differs from the generator's output, or is missing, or is
    a leftover of a dashboard that no longer exists."""
    expected = render_all()
    stale = [name for name, text in expected.items()
             if not (directory / name).is_file() or (directory / name).read_text() != text]
    stale += sorted(p.name for p in directory.glob("*.json") if p.name not in expected)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any JSON file is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: dashboards/{name} (run: python -m dashboards.generate)", file=sys.stderr)
        return 1 if stale else 0
    expected = render_all()
    for path in DIRECTORY.glob("*.json"):
        if path.name not in expected:
            path.unlink()
            print(f"removed dashboards/{path.name}")
    for name, text in expected.items():
        (DIRECTORY / name).write_text(text)
        print(f"wrote dashboards/{name} ({len(text) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
