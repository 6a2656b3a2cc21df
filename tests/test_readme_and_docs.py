"""The README fits two screens and still tells the truth; the docs it sends readers to are there.

Issue 45: the README was 481 lines, its status table a test log. It now holds what roofwatch answers
and for whom, one picture, the two Quickstart commands, the five things a user does next and links;
the settings moved to docs/configuration.md, the commands to docs/commands.md, the status to
docs/status.md. The trace format is the contract ``../shared/trace-format.md`` describes, kept inside
the repository as docs/trace-format.md, and nothing points outside the checkout for it any more.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
from pathlib import Path

import pytest

from agent.app.config import Settings
from agent.classifier.thresholds import Thresholds

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
SHARED_CONTRACT = ROOT.parent / "shared" / "trace-format.md"
QUICKSTART = ["./dev.sh demo", "./dev.sh test"]


def test_the_readme_fits_two_screens():
    assert len(README.splitlines()) <= 200


def test_the_quickstart_is_the_two_commands_and_ci_runs_the_second():
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert [line.split("#")[0].strip() for line in block.splitlines()] == QUICKSTART
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith(f"exec {QUICKSTART[1]}")


def test_the_readme_shows_the_status_page_and_links_only_to_what_exists():
    assert "![The status page of the demo node](docs/status-page.png)" in README
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    assert len(links) >= 25
    assert [link for link in links if not (ROOT / link).exists()] == []


def test_the_readme_keeps_no_status_table_issue_numbers_or_test_figures():
    assert "| part | state |" not in README
    assert not re.search(r"\bissue \d+", README, re.I)
    assert not re.search(r"[\d,]+ (of [\d,]+ )?tests\b", README)


@pytest.mark.parametrize("doc", ["commands.md", "configuration.md", "status.md", "development.md", "dcgm-exporter.md",
                                 "trace-format.md"])
def test_every_doc_the_readme_sends_readers_to_is_linked(doc):
    assert f"(docs/{doc})" in README


def test_every_setting_is_documented():
    text = (DOCS / "configuration.md").read_text()
    assert [name for name in Settings.model_fields if f"`{name}`" not in text] == []


@pytest.mark.skipif(not SHARED_CONTRACT.is_file(), reason="no ../shared/trace-format.md beside this checkout")
def test_the_trace_format_is_the_shared_contract_byte_for_byte():
    assert (DOCS / "trace-format.md").read_bytes() == SHARED_CONTRACT.read_bytes()


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    suffixes = {".py", ".md", ".sh", ".yml", ".yaml", ".toml", ".txt", ".html"}
    return [ROOT / n for n in listed if n and Path(n).suffix in suffixes and (ROOT / n).is_file()]


@pytest.mark.slow  # asks git for the tracked files (a child process)
def test_nothing_points_outside_the_checkout_for_the_trace_format():
    this = Path(__file__).resolve()
    outside = [str(p.relative_to(ROOT)) for p in tracked_text_files()
               if p.resolve() != this and "shared/trace-format" in p.read_text(errors="replace")]
    assert outside == []


@pytest.mark.parametrize("command", ["record", "classify"])
def test_the_help_of_the_commands_that_read_or_write_traces_names_the_format_doc(command):
    from agent.app.cli import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    assert "docs/trace-format.md" in " ".join(out.getvalue().split())
