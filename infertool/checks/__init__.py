"""The recipe checks: one registry (``checks/registry.py``), filled here, once, with the built-in checks
(``checks/builtin.py``'s ``BUILTIN``). ``run_checks(res, purpose=...)`` is what every entry point calls; see
docs/architecture.md."""

from infertool.checks.registry import (
    PURPOSES, REGISTRY, CheckReport, ChecksFailed, CheckContext, Finding, RecipeCheck, Skip, get, names, run_checks,
)
from infertool.checks.builtin import BUILTIN

for _check in BUILTIN:
    REGISTRY.register(_check.name, _check)
REGISTRY.freeze()

__all__ = ["PURPOSES", "REGISTRY", "CheckReport", "ChecksFailed", "CheckContext", "Finding", "RecipeCheck", "Skip", "get",
           "names", "run_checks"]
