"""THE check registry: every recipe check declared once, run by every entry point that reads a recipe.

A check is a name, the recipe sections and models it reads, the purposes it applies to, and
``run(ctx) -> list[Finding]``. ``run_checks(res, purpose=...)`` runs the ones that apply and returns a
``CheckReport``: the findings (errors, then warnings) and the checks skipped, each with why (a model that is not
on this machine, a section the recipe does not have): data, never silence. validate, plan, every ``--dry-run``,
``--emit k8s`` and ``quantize --check`` call it once (``commands._common.recipe_checks``), so the same recipe
gives the same findings and the same exit code everywhere. The checks themselves live in ``checks/builtin.py``,
thin over the rules' own modules (serve/lint.py, quantize/preflight.py, plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, TypeVar, cast

from infertool.errors import UsageError
from infertool.registry import Registry

if TYPE_CHECKING:
    from infertool.resolve import Resolution

# Every entry point that runs the checks, by the purpose it passes (tests drive each check through each of them).
# "launch": a real start (the serve environment is then an error, not a warning).
PURPOSES = ("validate", "plan", "run", "serve", "emit", "eval", "bench", "tune", "quantize", "launch")
DRY = frozenset(PURPOSES) - {"launch"}
LEVELS = ("error", "warn")


@dataclass(frozen=True)
class Finding:
    """What a check found: ``level`` error (exit 2 everywhere) or warn (said; the exit code is unchanged)."""

    check: str
    level: str
    field: str
    message: str
    hint: str | None = None

    def to_dict(self) -> dict:
        return {"check": self.check, "level": self.level, "field": self.field, "message": self.message,
                "hint": self.hint}

    def line(self) -> str:
        """The one way a finding reads on a terminal (every entry point prints these lines)."""
        text = f"{self.level}: {self.check}: {self.field}: {self.message}"
        return text + (f"\n  hint: {self.hint}" if self.hint else "")


class Skip(Exception):
    """Raised by a check that cannot run here (``why``: the model is not on this machine, ...)."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class RecipeCheck:
    """One recipe check (a backend's preflight rule is a ``backends.base.Check``): ``reads`` the recipe sections
    (and "model" / "base": the models) it reads; ``needs`` the sections that must be in the recipe for it to apply;
    ``purposes`` the entry points it runs in."""

    name: str
    run: Callable[["CheckContext"], list[Finding]]
    summary: str
    reads: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    purposes: frozenset = DRY | {"launch"}


T = TypeVar("T")


@dataclass
class CheckContext:
    """What a check reads: the resolution, the entry point's purpose, and facts computed once per run."""

    res: Resolution
    purpose: str
    cache: dict[str, object] = field(default_factory=dict)  # what once() computed (or the Skip it raised), by name

    @property
    def dry(self) -> bool:
        return self.purpose != "launch"

    def once(self, key: str, make: Callable[[], T]) -> T:
        """``make()`` computed once per run of the checks (model facts, the quantize preflight, the plan);
        a Skip it raises is kept and raised again for every check that asks."""
        if key not in self.cache:
            try:
                self.cache[key] = make()
            except Skip as e:
                self.cache[key] = e
        value = self.cache[key]
        if isinstance(value, Skip):
            raise value
        return cast(T, value)  # what make() returned for this key


@dataclass
class CheckReport:
    purpose: str
    findings: list[Finding] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # check name -> why
    ran: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warn"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_list(self) -> list[dict]:
        """The findings as JSON (the "checks" key of every command's --json)."""
        return [f.to_dict() for f in self.findings]

    def to_dict(self) -> dict:
        return {"purpose": self.purpose, "ok": self.ok, "findings": self.to_list(), "ran": list(self.ran),
                "skipped": dict(self.skipped)}


class ChecksFailed(UsageError):
    """A recipe check found an error (exit 2): every error finding, one line each; under --json the findings
    under "checks"."""

    def __init__(self, report: CheckReport):
        errors = report.errors
        lines = [f"the recipe checks found {len(errors)} error(s):"] + [f.line() for f in errors]
        super().__init__("\n".join(lines), hint="fix the fields named above (`infertool validate RECIPE` runs the "
                         "same checks)")
        self.report = report

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["checks"] = self.report.to_list()
        return d


# THE check registry, in the order the checks run: filled with checks/builtin.py's BUILTIN, and frozen, by
# infertool/checks/__init__.py (importing anything of infertool.checks does it first).
REGISTRY: Registry[RecipeCheck] = Registry("check", name_of=lambda c: c.name)
names = REGISTRY.names
get = REGISTRY.get


def applies(check: RecipeCheck, res, purpose: str) -> str | None:
    """Why ``check`` does not apply to this recipe and purpose, or None when it does."""
    if purpose not in check.purposes:
        return f"not run by {purpose}"
    missing = [s for s in check.needs if getattr(res.recipe, s, None) is None]
    if missing:
        return f"the recipe has no {', '.join(missing)} section"
    return None


def run_checks(res, *, purpose: str, only: tuple[str, ...] | None = None) -> CheckReport:
    """Every registered check that applies to ``res`` for ``purpose``: errors first, then warnings, in the
    registry's order. A check that cannot run here is listed in ``skipped`` with why."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r}")
    ctx, report = CheckContext(res, purpose), CheckReport(purpose)
    for check in REGISTRY.values():
        if only is not None and check.name not in only:
            continue
        why = applies(check, res, purpose)
        if why is None:
            try:
                report.findings += check.run(ctx)
                report.ran.append(check.name)
                continue
            except Skip as e:
                why = e.why
        report.skipped[check.name] = f"skipped: {why}"
    report.findings.sort(key=lambda f: LEVELS.index(f.level))
    return report
