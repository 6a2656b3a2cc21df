"""What every check of ``roofwatch doctor`` produces: findings, and the report that sums them into an exit status.

Each :class:`Finding` says what was seen, what it costs (which metrics and which workload classes
become unavailable) and the fix. Vendor checks (agent.diagnostics.nvidia, .amd) only produce
findings; the exit status is decided here, in one place: 0 everything works, 3 the agent works
with pieces missing, 1 no GPU can be read at all. The text form is printable whatever the findings
hold (:meth:`Report.text`); the JSON form escapes as JSON does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, Literal

from agent.model.indexes import gpu_order, index_value
from agent.model.text import printable

Status = Literal["ok", "warn", "fail", "info"]


EXIT_FULL, EXIT_UNUSABLE, EXIT_DEGRADED = 0, 1, 3


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    status: Status
    detail: str
    impact: str = ""
    """Metrics and classes that are unavailable or weaker because of this."""
    fix: str = ""
    gpu: str | None = None


@dataclass(slots=True)
class Report:
    findings: list[Finding] = field(default_factory=list)
    gpus: int = 0

    def add(self, *findings: Finding) -> None:
        self.findings.extend(findings)

    @property
    def exit_code(self) -> int:
        if self.gpus == 0:
            return EXIT_UNUSABLE
        return EXIT_DEGRADED if any(f.status in ("warn", "fail") for f in self.findings) else EXIT_FULL

    @property
    def verdict(self) -> str:
        return {EXIT_FULL: "fully usable", EXIT_DEGRADED: "usable, with pieces missing (see above)",
                EXIT_UNUSABLE: "not usable: no GPU can be read"}[self.exit_code]

    def to_json(self) -> dict[str, Any]:
        return {"usable": self.exit_code != EXIT_UNUSABLE, "fully_usable": self.exit_code == EXIT_FULL,
                "exit_code": self.exit_code, "gpus": self.gpus, "findings": [asdict(f) for f in self.findings]}

    def text(self) -> str:
        """The findings for a terminal. Every field passes through :func:`shown`: a check's detail and
        fix carry what the neighbours said (an inference server's model name, dcgm-exporter's
        ``modelName``, a driver's GPU name, an error's text), and none of it may drive the terminal."""
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "info": "    "}
        lines = []
        for f, gpus in _grouped(self.findings):
            where = f" [{gpu_list(gpus)}]" if gpus else ""
            lines.append(f"{marks[f.status]} {shown(f.check)}{where}: {shown(f.detail)}")
            if f.impact:
                lines.append(f"       missing: {shown(f.impact)}")
            if f.fix:
                lines.append(f"       fix: {shown(f.fix)}")
        lines.append(f"\nnode: {self.verdict}")
        return "\n".join(lines)


def _grouped(findings: list[Finding]) -> list[tuple[Finding, list[str]]]:
    """The findings with those that differ only in their GPU said once, with the GPUs they hold for: eight
    GPUs of one node with the same counter sources are one line, not eight. A group stands where its last
    member stood, so each GPU's own lines (its identity, its spec) come first."""
    members: dict[tuple[str, str, str, str, str], list[int]] = {}
    for i, f in enumerate(findings):
        if f.gpu is not None:
            members.setdefault((f.check, f.status, f.detail, f.impact, f.fix), []).append(i)
    out: list[tuple[Finding, list[str]]] = []
    for i, f in enumerate(findings):
        if f.gpu is None:
            out.append((f, []))
            continue
        group = members[(f.check, f.status, f.detail, f.impact, f.fix)]
        if i == group[-1]:
            out.append((f, [shown(findings[j].gpu) for j in group]))
    return out


def gpu_list(gpus: list[str]) -> str:
    """``GPU 3``, ``GPUs 0-7``, ``GPUs 0-3, 6, 7/1``: runs of consecutive indexes folded."""
    if len(gpus) == 1:
        return f"GPU {gpus[0]}"
    parts: list[str] = []
    run: list[int] = []
    for gpu in sorted(gpus, key=gpu_order):
        number = index_value(gpu)
        if number is not None and run and number == run[-1] + 1:
            run.append(number)
            continue
        parts.extend(_run_text(run))
        run = [number] if number is not None else []
        if number is None:
            parts.append(gpu)
    parts.extend(_run_text(run))
    return "GPUs " + ", ".join(parts)


def _run_text(run: list[int]) -> list[str]:
    if not run:
        return []
    return [f"{run[0]}-{run[-1]}"] if len(run) > 2 else [str(n) for n in run]


def shown(text: object) -> str:
    """One line of printable text: line breaks and tabs become spaces (an error's text may span
    lines), every other control or format character U+FFFD (ESC, BEL, C1 CSI, bidi overrides;
    agent.model.text). Letters of any script stay as they are."""
    return printable(str(text).replace("\r\n", " ").replace("\n", " ").replace("\t", " "))


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
