"""Rendering in one place: Rich for people (stderr), JSON for machines (stdout).

Core functions never print; the CLI hands their results to these helpers.

Rich reads `[...]` in a string as markup, so a recipe, model, path or server text pasted into one would
restyle the line, link elsewhere, or crash it (`[/]`: MarkupError). Every such value goes through esc()
inside a markup string, or in as plain() Text (kv_table does that for its cells and title); esc() and
plain() also show terminal control characters as escapes instead of sending them to the terminal.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, TypeAlias

from rich.console import Console
from rich.table import Table
from rich.text import Text

from infertool.atomic import dumps_json, jsonable

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from infertool.errors import InfertoolError, InternalError, OutputClosed
    from infertool.worker import WorkerEvent


# Human output: tables and results go to stdout unless --json is given, progress and logs to stderr.
def _width(stream) -> int | None:
    """Rich's own width on a terminal; 120 columns for pipes and CI logs (Rich would use 80) unless COLUMNS is set."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return None if tty or os.environ.get("COLUMNS") else 120


class _Stdout(Console):
    """Rich on stdout, whose broken pipe or full device is an ``OutputClosed`` (exit 4), not Rich's SystemExit(1)
    (a verdict's FAIL) or an internal error."""

    def on_broken_pipe(self) -> None:
        import errno

        self.quiet = True
        raise stdout_failed(BrokenPipeError(errno.EPIPE, "broken pipe"))

    def _write_buffer(self) -> None:  # Rich's one write to its file: a full device (/dev/full) said the same way
        try:
            super()._write_buffer()
        except BrokenPipeError:
            raise
        except OSError as e:
            self.quiet = True
            raise stdout_failed(e) from None


class _Stderr(Console):
    """Rich on stderr, which falls silent when its reader is gone (the exit code still says what happened)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True


out = _Stdout(highlight=False, soft_wrap=False, width=_width(sys.stdout))
err = _Stderr(stderr=True, highlight=False, width=_width(sys.stderr))


# What a person is shown: text, a number, a path, an error, a list of names; rendered by str(), never as markup
Shown: TypeAlias = "str | int | float | Path | BaseException | Text | list[str] | None"

to_jsonable = jsonable  # the one JSON form of infertool.atomic (typed results, no NaN / Infinity)


def print_json(data: object) -> None:
    """Machine output: one JSON document on stdout (closed, a broken pipe or full: ``OutputClosed``, exit 4)."""
    text = dumps_json(data) + "\n"
    if sys.stdout is None:  # started with stdout closed (`>&-`)
        raise stdout_failed(None)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        raise stdout_failed(e) from None


def flush_stdout() -> None:
    """What a command wrote on stdout, flushed before it exits (``handle_errors``): an ``OutputClosed`` when it
    cannot be (a reader gone, a full device), never a traceback at the interpreter's exit. A stdout closed from
    the start is not one: Rich's output has gone nowhere, and ``print_json`` says so itself."""
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except OSError as e:
        raise stdout_failed(e) from None


def stdout_failed(e: OSError | None) -> OutputClosed:
    """Standard output cannot be written (``e``: why; None: closed): silenced (what is still written there, the
    error's own JSON included, goes to os.devnull, so the interpreter's last flush cannot fail) and said as an
    ``OutputClosed`` (exit 4)."""
    from infertool.errors import OutputClosed

    devnull = open(os.devnull, "w")
    try:
        os.dup2(devnull.fileno(), 1)
    except OSError:
        pass
    sys.stdout = devnull
    why = "it is closed" if e is None else (e.strerror or type(e).__name__).lower()
    return OutputClosed(f"the result could not be written on standard output: {why}",
                        hint="the files the command writes are written; give its output a reader, or write it to a "
                        "file (> FILE)")


def visible(text: Shown) -> str:
    """``text`` with every control or format character (ESC, BEL, CR, bidi overrides...) but newline and tab
    shown as its escape (``\\x1b``), so that no value can move the cursor, recolour or retitle a terminal."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs")
                   else ascii(ch)[1:-1] for ch in s)


def escaped(text: object) -> str:
    """``text`` on one line: every character that is not printable (a newline, ESC, a bidi override) as its
    escape."""
    s = str(text)
    return s if s.isprintable() else "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in s)


def quoted(value: object, limit: int = 200) -> str:
    """A value someone else wrote, for a message: quoted, ``escaped``, cut at ``limit`` characters."""
    text = escaped(value)
    return "'" + (text if len(text) <= limit else text[:limit - 3] + "...") + "'"


def esc(value: Shown) -> str:
    """A value to put inside a Rich markup string: its `[` cannot open a tag, its control characters show."""
    from rich.markup import escape

    return escape(visible(value))


def plain(value: Shown, style: str = "") -> Text:
    """A value as Rich Text, never read as markup (a Text passes through as it is)."""
    return value if isinstance(value, Text) else Text(visible(value), style=style)


def kv_table(rows: Iterable[tuple[str, Shown]], title: str | None = None) -> Table:
    """A two-column table; keys, values and title are plain text (give a Text for a styled value)."""
    table = Table(title=None if title is None else plain(title), show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for k, v in rows:
        table.add_row(plain(k), plain("" if v is None else v))
    return table


def os_error(e: BaseException) -> InfertoolError | None:
    """An OSError the user's input or machine causes, as the error it is: a path too long (exit 2), no space left
    or over quota (exit 4), standard output a broken pipe (exit 4); None for any other exception (a bug)."""
    import errno
    import stat

    from infertool.errors import RuntimeFailure, UsageError

    if not isinstance(e, OSError):
        return None
    name = quoted(e.filename, 120) if e.filename else "a file"
    if e.errno == errno.ENAMETOOLONG:
        return UsageError(f"{name}: the path is too long", hint="a file name holds at most 255 bytes, a path "
                          "4,096: give a shorter one")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return RuntimeFailure(f"no space left on the device writing {name} ({e.strerror})",
                              hint="free some space, or write elsewhere (--out)")
    try:
        on_pipe = sys.stdout is not None and stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's capture)
        on_pipe = False
    return stdout_failed(e) if e.errno == errno.EPIPE and on_pipe else None


def internal_error(e: Exception) -> InternalError:
    """A bug as an error to render: its traceback saved to a file (the error's ``log_path``)."""
    import tempfile
    import traceback

    from infertool.errors import InternalError

    fd, path = tempfile.mkstemp(prefix="infertool-crash-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exc(file=f)
    return InternalError(f"{type(e).__name__}: {e}", "set INFERTOOL_DEBUG=1 to see the traceback", log_path=path)


def render_error(error: InfertoolError, *, as_json: bool = False) -> None:
    """An InfertoolError for people (stderr) or, with --json, as JSON on stdout too."""
    from infertool.errors import InternalError, Interrupted, RecipeError

    if as_json:
        print_json({"ok": False, **error.to_dict()})
    if isinstance(error, Interrupted):
        err.print("[yellow]interrupted[/]")
        return
    if isinstance(error, InternalError):
        err.print(f"[bold red]internal error:[/] {esc(error.message)}", markup=True, highlight=False)
        err.print(f"[dim]traceback saved to {esc(error.log_path)}; set INFERTOOL_DEBUG=1 to see it here[/]")
        return
    err.print(f"[bold red]error:[/] {esc(error.message)}", markup=True, highlight=False, soft_wrap=True)
    if isinstance(error, RecipeError):
        for issue in error.issues:
            where = issue.path
            if issue.line is not None:
                where += f" (line {issue.line}" + (f", column {issue.column}" if issue.column else "") + ")"
            err.print(f"  • [bold]{esc(where)}[/]: {esc(issue.message)}", soft_wrap=True)
    if error.hint:
        err.print(f"[yellow]hint:[/] {esc(error.hint)}", soft_wrap=True)
    if error.log_path:
        err.print(f"[dim]full log: {esc(str(error.log_path))}[/]", soft_wrap=True)


class StageProgress:
    """Turns worker/task events into Rich progress bars and log lines on stderr.

    Use as a context manager; pass `self.on_event` to `run_task`.
    """

    def __init__(self, title: str):
        self.title = title
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._last: dict[str, tuple[str | None, float]] = {}

    def __enter__(self) -> "StageProgress":
        return self

    def _start(self) -> None:
        if self._progress is None:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                       TimeElapsedColumn)

            self._progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=False)
            self._progress.start()

    def _plain(self, ev: WorkerEvent) -> None:
        import time

        if ev.event == "log":
            err.print(visible(f"  {ev.level or 'info'}: {ev.message or ''}"), markup=False, highlight=False,
                      soft_wrap=True)
            return
        if ev.event != "progress":
            return
        key = ev.task or "work"
        desc = ev.description or key
        done, total = ev.completed or 0, ev.total
        now = time.monotonic()
        last_desc, last_t = self._last.get(key, (None, 0.0))
        finished = total is not None and done >= total
        if desc != last_desc or finished or now - last_t > 10:
            frac = f" [{done:g}/{total:g}]" if total else ""
            err.print(visible(f"  {self.title}: {desc}{frac}"), markup=False, highlight=False, soft_wrap=True)
            self._last[key] = (desc, now)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def on_event(self, event: dict) -> None:
        from infertool.worker import WorkerEvent

        ev = WorkerEvent.from_dict(event)
        if not err.is_terminal:
            self._plain(ev)  # CI logs and pipes: plain lines instead of a live bar
            return
        self._start()
        progress = self._progress
        assert progress is not None  # _start made it
        if ev.event == "progress":
            key = ev.task or "work"
            desc = esc(ev.description or key)  # the bar's column reads it as markup
            if key not in self._tasks:
                self._tasks[key] = progress.add_task(desc, total=ev.total)
            progress.update(self._tasks[key], completed=ev.completed or 0, total=ev.total, description=desc)
        elif ev.event == "log":
            style = {"warning": "yellow", "error": "red"}.get(ev.level or "info", "dim")
            progress.console.print(plain(ev.message or "", style=style))


EventCallback = Callable[[dict], None]
