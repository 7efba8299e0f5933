"""The recipe checks: one registry (``checks/registry.py``), the built-in checks (``checks/builtin.py``).
``run_checks(res, purpose=...)`` is what every entry point calls; see docs/architecture.md."""

from infertool.checks.registry import (
    CHECKS, PURPOSES, Check, CheckReport, ChecksFailed, Context, Finding, Skip, get, names, run_checks,
)
from infertool.checks import builtin  # noqa: E402,F401 - registers the built-in checks (importing the package does)

__all__ = ["CHECKS", "PURPOSES", "Check", "CheckReport", "ChecksFailed", "Context", "Finding", "Skip", "get",
           "names", "run_checks"]
