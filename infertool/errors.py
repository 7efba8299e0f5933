"""The error tree. Every error a user can cause or meet carries a message, a hint and an exit code.

Exit codes (documented in the README):
    0  ok
    1  verdict failed (eval FAIL; INCONCLUSIVE has its own documented behaviour)
    2  bad usage or bad recipe
    3  environment / backend error (a managed env is missing or broken, a worker failed)
    4  runtime failure (anything else that went wrong while doing the work)
    5  internal error (a bug in infertool: its traceback is saved to a file)
    6  signature refused (a published folder unsigned, its signature invalid or by another key, where one is required)
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_VERDICT_FAILED = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3
EXIT_RUNTIME = 4
EXIT_INTERNAL = 5
EXIT_SIGNATURE = 6


class InfertoolError(Exception):
    """Base class: a message for people, an optional hint, an exit code."""

    exit_code: int = EXIT_RUNTIME

    def __init__(self, message: str, hint: str | None = None, *, log_path: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.log_path = log_path

    def to_dict(self) -> dict:
        return {
            "error": type(self).__name__,
            "message": self.message,
            "hint": self.hint,
            "exit_code": self.exit_code,
            "log_path": self.log_path,
        }


class UsageError(InfertoolError):
    """Bad command-line usage: a wrong argument, a missing file, an override that makes no sense."""

    exit_code = EXIT_USAGE


@dataclass
class RecipeIssue:
    """One problem in a recipe: where (dotted path, line) and what."""

    path: str
    message: str
    line: int | None = None
    column: int | None = None

    def to_dict(self) -> dict:
        return {"path": self.path, "message": self.message, "line": self.line, "column": self.column}


class RecipeError(InfertoolError):
    """A recipe that cannot be used. Carries EVERY issue found, not only the first."""

    exit_code = EXIT_USAGE

    def __init__(self, source: str, issues: list[RecipeIssue], hint: str | None = None):
        n = len(issues)
        super().__init__(f"{source}: {n} error{'s' if n != 1 else ''} in the recipe", hint)
        self.source = source
        self.issues = issues

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["source"] = self.source
        d["issues"] = [i.to_dict() for i in self.issues]
        return d


class Interrupted(InfertoolError):
    """Ctrl-C."""

    exit_code = 130


class InternalError(InfertoolError):
    """A bug: an exception no InfertoolError stands for (its traceback is kept in a file, ``log_path``)."""

    exit_code = EXIT_INTERNAL


class SignatureError(InfertoolError):
    """A published folder's signature was required and is missing, invalid, or by a key not trusted."""

    exit_code = EXIT_SIGNATURE


class BackendError(InfertoolError):
    """A managed environment is missing or broken, or a backend worker failed."""

    exit_code = EXIT_BACKEND


class EnvNotReady(BackendError):
    """A stage needs an environment that has not been set up."""


class RuntimeFailure(InfertoolError):
    """The work itself failed (a conversion, a server, a measurement)."""

    exit_code = EXIT_RUNTIME


class OutputClosed(RuntimeFailure):
    """Standard output is closed, a broken pipe or full: the command's result could not be written there (the
    files it writes are written; its message goes to stderr)."""


class TokenizerMismatch(RuntimeFailure):
    """Two servers tokenized the same text differently, so their answers cannot be compared position by position.
    ``what``: the text (a task's window, a decode prompt)."""

    def __init__(self, what: str, hint: str | None = None, *, message: str | None = None):
        super().__init__(message or f"{what}: the two servers tokenized differently", hint)
        self.what = what
