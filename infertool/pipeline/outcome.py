"""What a run ends with (``run_outcome``): the verdict and each gate, where the evaluated checkpoint was published
(or why not), the report written into the run directory and the commands that serve it; `run` prints it, or its
JSON (``RunOutcome.to_dict``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from infertool.pipeline.runner import RunResult
from infertool.summaries import Published


@dataclass(frozen=True)
class GateLine:
    """One gate the eval judged, as the run's end shows it."""

    name: str | None
    estimate: float | None
    lo: float | None
    hi: float | None
    threshold: float | None
    status: str | None


@dataclass
class RunOutcome:
    verdict: str | None = None  # PASS | FAIL | INCONCLUSIVE; None: the run has no eval
    reason: str | None = None
    gates: list[GateLine] = field(default_factory=list)
    published: Published | None = None  # the checkpoint published, or why nothing was
    report: dict = field(default_factory=dict)  # {"report.md": path, "report.html": path}, or {"error": why}
    commands: dict = field(default_factory=dict)  # {"serve": ..., "k8s": ...}: what serves the published checkpoint

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "gates": [asdict(g) for g in self.gates],
                "published": self.published.to_dict() if self.published is not None else None, "report": self.report, "commands": self.commands}


def run_outcome(result: RunResult) -> RunOutcome:
    """The outcome of ``result``: the eval's verdict and its measured gates (from the manifest's record of the eval
    stage), the published checkpoint, the report written into the run directory, the serve commands."""
    from infertool.errors import InfertoolError
    from infertool.evaluate.verdict import Gate
    from infertool.publish import serve_commands
    from infertool.report import write_report
    from infertool.summaries import EvalStageSummary

    ev = result.stages.get("eval")
    s = ev.summary_as(EvalStageSummary) if ev is not None and ev.summary is not None else EvalStageSummary()
    gates = [GateLine(g.name, g.estimate, g.lo, g.hi, g.threshold, g.status)
             for g in (Gate.from_dict(d) for d in s.gates or []) if g.status not in (None, "n/a")]
    try:
        report = write_report(result.run_dir).files
    except InfertoolError as e:
        report = {"error": e.message}
    return RunOutcome(s.verdict, s.reason, gates, result.published, report, serve_commands(str(result.run_dir)))
