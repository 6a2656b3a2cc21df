"""What every check of ``roofwatch doctor`` produces: findings, and the report that sums them into an exit status.

Each :class:`Finding` says what was seen, what it costs (which metrics and which workload classes
become unavailable) and the fix. Vendor checks (agent.diagnostics.nvidia, .amd) only produce
findings; the exit status is decided here, in one place: 0 everything works, 3 the agent works
with pieces missing, 1 no GPU can be read at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, Literal

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
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "info": "    "}
        lines = []
        for f in self.findings:
            where = f" [GPU {f.gpu}]" if f.gpu is not None else ""
            lines.append(f"{marks[f.status]} {f.check}{where}: {f.detail}")
            if f.impact:
                lines.append(f"       missing: {f.impact}")
            if f.fix:
                lines.append(f"       fix: {f.fix}")
        lines.append(f"\nnode: {self.verdict}")
        return "\n".join(lines)


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
