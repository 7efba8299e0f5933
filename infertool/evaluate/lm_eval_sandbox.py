"""Jinja's sandbox for lm-eval's task templates (issue 43, item 5): a task YAML's ``doc_to_text``,
``doc_to_target``, ``doc_to_choice``, ``gen_prefix``, ``description``, ... are Jinja templates, and lm-eval 0.4.13
renders them in a plain ``jinja2.Environment`` (lm_eval/utils.py: the module's ``env``, used by
``apply_template``), where ``{{ cycler.__init__.__globals__.os.popen(...) }}`` runs a command.

Without ``eval.lm_eval.trust_code`` (verify: ``--trust-task-code``) every template is rendered in ``TaskSandbox``,
Jinja's ``ImmutableSandboxedEnvironment`` made stricter: an unsafe attribute (``__class__``, ``__globals__``,
``_TemplateReference__context``, a list's ``append``, ...) raises ``SecurityError`` where it is reached (the stock
sandbox returns an undefined that raises only when printed), and each refusal is kept in ``refused``; ``**`` and
``*`` that would build a huge number or sequence are refused too. It is used in two places:

- infertool's screen (evaluate/lm_eval_tasks.py, ``check``): each template is parsed and rendered once with
  stand-in values (``StandIn``) before any model work;
- the lm-eval worker (``sandbox_lm_eval``): lm-eval's own ``env`` is replaced by a ``TaskSandbox`` with the same
  options, filters, tests and globals before any task loads, so every document's rendering is sandboxed. A
  lm-eval that does not render through that ``env`` is refused (``SandboxUnavailable``), never run unsandboxed.

A leaf: jinja2 and the standard library only (the worker imports it in the ``lmeval`` environment); infertool
imports it inside the functions that need it (jinja2 stays out of ``infertool --help``).
"""

from __future__ import annotations

import re
from types import FunctionType
from typing import Any

from jinja2 import BaseLoader, ChainableUndefined, Environment, StrictUndefined, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

SAFE_JINJA = (3, 1, 6)  # the first jinja2 without a known sandbox escape (str.format via |attr, CVE-2025-27516)
MAX_BUILT = 1_000_000  # items of a sequence, or bits of an integer, that ``*`` and ``**`` may build
# the options of a jinja2.Environment that change how a template renders, copied from lm-eval's
OPTIONS = ("block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
           "comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix",
           "trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "undefined", "finalize",
           "autoescape", "loader")


class SandboxUnavailable(RuntimeError):
    """This lm-eval does not render its task templates through ``lm_eval.utils.env``: it cannot be sandboxed."""


def regex_replace(string: str, pattern: str, repl: str, count: int = 0) -> str:
    """lm-eval's ``regex_replace`` filter (lm_eval/utils.py), for the screen, which runs without lm-eval."""
    return re.sub(pattern, repl, string, count=count)


class TaskSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox that raises at the first unsafe access and remembers it (``refused``)."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Any: jinja2.Environment's options
        super().__init__(*args, **kwargs)
        self.refused: list[str] = []

    def refuse(self, why: str) -> SecurityError:
        self.refused.append(why)
        return SecurityError(why)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:  # Any: whatever the template reached
        raise self.refuse(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # Any: Jinja's own signature  # noqa: N805
        if not __self.is_safe_callable(__obj):
            raise __self.refuse(f"{__obj!r:.80} is not safely callable")
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:  # Any: template values
        if operator == "**" and _is_int(left) and _is_int(right) and right > 0 \
                and max(1, abs(left).bit_length()) * right > MAX_BUILT:
            raise self.refuse(f"{left} ** {right} is too large for a task template")
        if operator == "*":
            seq, n = (left, right) if _is_int(right) else (right, left)
            if isinstance(seq, (str, list, tuple)) and _is_int(n) and len(seq) * n > MAX_BUILT:
                raise self.refuse(f"a sequence of {len(seq)} * {n} items is too large for a task template")
        return super().call_binop(context, operator, left, right)


def _is_int(x: Any) -> bool:  # Any: a template value
    return isinstance(x, int) and not isinstance(x, bool)


class StandIn(ChainableUndefined):
    """A stand-in for a document's value in the screen (the documents are not read there): every attribute, item,
    call and arithmetic gives a ``StandIn`` back, comparisons are false, numbers are 0 and a loop over it runs once,
    so that rendering goes on to the template's next expression; an item whose name starts with ``__`` is refused
    as the sandbox refuses the attribute. (Its operators are set below: jinja2's types of Undefined allow only
    errors there.)"""

    __slots__ = ()

    def __iter__(self) -> Any:  # Any: an iterator of one stand-in
        yield self


def _same(self: StandIn, *_args: Any) -> StandIn:  # Any: the other operand
    return self


def _item(self: StandIn, name: Any) -> StandIn:  # Any: an item's key
    if isinstance(name, str) and name.startswith("__"):
        raise SecurityError(f"access to item {name!r} is unsafe")
    return self


_PROBE_OPS: dict[str, Any] = {  # Any: the methods
    **dict.fromkeys(("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
                     "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pos__", "__neg__",
                     "__pow__", "__rpow__", "__call__"), _same),
    **dict.fromkeys(("__lt__", "__le__", "__gt__", "__ge__"), lambda self, other: False),
    "__int__": lambda self: 0, "__float__": lambda self: 0.0, "__complex__": lambda self: 0j, "__getitem__": _item}
for _name, _op in _PROBE_OPS.items():
    setattr(StandIn, _name, _op)


def screen_env() -> TaskSandbox:
    """The sandbox infertool's screen renders with: lm-eval's options (``StrictUndefined`` replaced by ``StandIn``,
    since no document is given) and its ``regex_replace`` filter."""
    env = TaskSandbox(loader=BaseLoader(), undefined=StandIn, keep_trailing_newline=True)
    env.filters.update(regex_replace=regex_replace)
    return env


def hidden_names(env: Environment, source: str) -> list[str]:
    """Attribute and item names written in the template (constants) that start with ``_`` and hold ``__``
    (``__class__``, ``_TemplateReference__context``): the sandbox refuses them on any object, so they are found
    on every branch, also one the stand-in values do not take. Raises TemplateSyntaxError."""
    found = []
    for node in env.parse(source).find_all((nodes.Getattr, nodes.Getitem)):
        name: Any = None  # Any: a constant's value
        if isinstance(node, nodes.Getattr):
            name = node.attr
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            name = node.arg.value
        if isinstance(name, str) and name.startswith("_") and "__" in name:
            found.append(name)
    return found


def sandbox_lm_eval() -> TaskSandbox:
    """Before any task loads, in the lm-eval worker: lm-eval's module-level ``lm_eval.utils.env`` (the one
    ``apply_template`` renders every task template with) replaced by a ``TaskSandbox`` with its options, filters,
    tests and globals (the sandbox's own safe ``range`` kept). Raises ``SandboxUnavailable`` when this lm-eval
    renders otherwise, or its jinja2 is older than ``SAFE_JINJA``."""
    import jinja2

    got = tuple(int(x) for x in re.findall(r"\d+", jinja2.__version__)[:3])
    if got < SAFE_JINJA:
        raise SandboxUnavailable(f"jinja2 {jinja2.__version__} has known sandbox escapes (fixed in "
                                 f"{'.'.join(map(str, SAFE_JINJA))})")
    import lm_eval.utils as utils

    try:
        old, apply = utils.env, utils.apply_template
    except AttributeError:
        old = apply = None
    if not isinstance(old, Environment) or not isinstance(apply, FunctionType) or "env" not in apply.__code__.co_names \
            or apply.__globals__ is not vars(utils):
        raise SandboxUnavailable("this lm-eval does not render task templates with lm_eval.utils.env (as 0.4.13 "
                                 "does), so infertool cannot sandbox them")
    options = {k: v for k, v in vars(old).items() if k in OPTIONS}
    options.update(undefined=old.undefined or StrictUndefined)
    env = TaskSandbox(extensions=list(old.extensions), **options)
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = [  # Any: filters, tests, globals
        (env.filters, old.filters), (env.tests, old.tests), (env.globals, old.globals)]
    for mine, theirs in pairs:
        for k, v in theirs.items():
            mine.setdefault(k, v)
    utils.env = env
    return env


class TooSlow(BaseException):
    """The screen's render ran past its time (a BaseException: no ``except Exception`` in Jinja swallows it)."""


class _Alarm:
    """TooSlow raised after ``seconds`` of this process's CPU time (ITIMER_VIRTUAL, SIGVTALRM: a render that runs
    long is busy, and the real-time timer of ``signal.alarm`` stays its users'), again every 50 ms until
    disarmed; the timer and handler it found are put back. Main thread only (elsewhere: no bound)."""

    def __init__(self, seconds: float) -> None:
        import signal
        import threading

        self.seconds = seconds
        self.armed = False
        self.usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
        self.old: Any = None  # Any: the handler it replaced
        self.old_timer = (0.0, 0.0)

    def ring(self, _signum: int, _frame: Any) -> None:  # Any: a frame
        if self.armed:
            raise TooSlow()

    def __enter__(self) -> _Alarm:
        import signal

        if self.usable:
            self.old = signal.signal(signal.SIGVTALRM, self.ring)
            self.armed = True
            self.old_timer = signal.setitimer(signal.ITIMER_VIRTUAL, self.seconds, 0.05)
        return self

    def __exit__(self, *_exc: Any) -> None:  # Any: the exception, if any (left to propagate)
        import signal

        if not self.usable:
            return
        while self.armed:  # a ring between here and the assignment raises once more: disarm again
            try:
                self.armed = False
            except TooSlow:
                continue
        signal.setitimer(signal.ITIMER_VIRTUAL, *self.old_timer)
        signal.signal(signal.SIGVTALRM, self.old)


def check(env: TaskSandbox, source: str, seconds: float) -> tuple[str | None, str | None]:
    """One template through the screen: parsed, its constant names checked (``hidden_names``) and rendered once
    with stand-in values within ``seconds``. (why the sandbox refuses it, None) or (None, its syntax error) or
    (None, None). Any other error of the render is the documents' (they are not read here) and ignored."""
    from jinja2.exceptions import TemplateSyntaxError

    try:
        names = hidden_names(env, source)
    except TemplateSyntaxError as e:
        return None, f"{e.message} (line {e.lineno} of the template)"
    if names:
        return f"access to {', '.join(repr(n) for n in dict.fromkeys(reversed(names)))} is unsafe", None
    before = len(env.refused)
    try:
        with _Alarm(seconds):
            env.from_string(source).render()
    except TooSlow:
        return f"rendering it took over {seconds:g} s of CPU", None
    except SecurityError as e:
        return str(e), None
    except Exception:  # noqa: BLE001 - a stand-in value the template could not use: the documents' business
        pass
    if len(env.refused) > before:  # refused, and the error turned into another one on the way out
        return env.refused[before], None
    return None, None
