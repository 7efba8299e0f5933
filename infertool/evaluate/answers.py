"""A completions server's answer, checked before it becomes a figure: the prompt log-probabilities of an echo +
logprobs answer (``parse_prompt_logprobs``), the bounds a log-probability and a token id must keep, and ``pmap``,
which maps requests over a bounded thread pool and reports the Malformed answers together. Below both users: the
suite's scoring (infertool.evaluate.server_engine) and the decode path (infertool.evaluate.decode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from infertool import net
from infertool.errors import BackendError
from infertool.records import JSONValue, Record

T = TypeVar("T")
R = TypeVar("R")

NO_PROMPT_LOGPROBS_HINT = (
    "log-likelihood tasks (perplexity, multiple_choice) need prompt log-probabilities: a server that "
    "accepts /v1/completions with echo=true and logprobs=N (vLLM does; start it with --max-logprobs 20). "
    "Generation-only suites (e.g. synthetic-gen) work without them"
)

# A prompt log-probability a server may send: finite, at most a rounding above 0 (read as 0), at least LP_FLOOR
# (vLLM writes -inf as -9999.0). Anything else makes the answer malformed, never a figure.
LP_CEIL = 1e-3
LP_FLOOR = -1e4
MAX_TOKEN_ID = 2**31


class NoPromptLogprobs(BackendError):
    """The server answered, but without prompt log-probabilities."""


class Malformed(BackendError):
    """One answer the engine cannot score (wrong types, values out of range): counted by ``pmap`` with its
    reason, then reported together."""



def _lp(v: JSONValue, where: str) -> float:
    """A log-probability from a server, checked (see LP_CEIL, LP_FLOOR); a small positive rounding reads as 0."""
    x = net.number(v, lo=LP_FLOOR, hi=LP_CEIL)
    if x is None:
        shown = "missing (null, NaN or Infinity)" if v is None else f"{net.quote(repr(v), n=40)}, not a log-probability"
        raise Malformed(f"{where} is {shown}: a log-probability is a finite number in [{LP_FLOOR:g}, 0]")
    return min(x, 0.0)


def _list(v: JSONValue, name: str, n: int, kind: type | None = None) -> list[Any]:  # Any: JSON values
    if not isinstance(v, list) or len(v) < n:
        got = f"a list of {len(v)}" if isinstance(v, list) else f"a {type(v).__name__}"
        raise Malformed(f"logprobs.{name} is {got}, not a list of at least {n} (the prompt's tokens)")
    if kind is not None and not all(isinstance(x, kind) and not isinstance(x, bool) for x in v[:n]):
        raise Malformed(f"logprobs.{name} holds values that are not {kind.__name__}s")
    return v[:n]


def _top(v: JSONValue, i: int) -> dict[str, float]:
    if not isinstance(v, dict) or not v:
        raise Malformed(f"top_logprobs[{i}] is {net.quote(repr(v), n=40)}, not the top-k log-probabilities")
    return {str(t): _lp(x, f"top_logprobs[{i}][{net.quote(str(t), n=20)!r}]") for t, x in v.items()}


@dataclass
class Logprobs(Record):
    """A choice's ``logprobs`` object as sent (a field absent, or logprobs not an object: None)."""

    tokens: Any = None  # Any: JSON values as sent (these four): the readers check them
    token_logprobs: Any = None  # Any: as sent
    top_logprobs: Any = None  # Any: as sent
    text_offset: Any = None  # Any: as sent


@dataclass
class CompletionChoice(Record):
    """One choice of a /completions answer as sent (None where absent), its ``logprobs`` read as ``lists``;
    ``prompt_tokens``: the answer's usage.prompt_tokens (``of``)."""

    text: Any = None  # Any: JSON values as sent (these four)
    finish_reason: Any = None  # Any: as sent
    index: Any = None  # Any: as sent (of several prompts: which one)
    logprobs: Any = None  # Any: as sent (an object, null, or another type)
    prompt_tokens: Any = field(default=None, init=False)  # Any: as sent

    @property
    def lists(self) -> Logprobs:
        return Logprobs.from_dict(self.logprobs)

    @classmethod
    def of(cls, r: dict[str, Any], where: str = "") -> CompletionChoice:  # Any: JSON values
        """choices[0] of an answer, with its usage.prompt_tokens."""
        ans = CompletionAnswer.from_dict(r)
        if not ans.choices or not isinstance(ans.choices[0], dict):
            raise Malformed(f"{where}the answer has no choices[0] object")
        c = cls.from_dict(ans.choices[0])
        c.prompt_tokens = ans.usage.prompt_tokens
        return c


@dataclass
class CompletionUsage(Record):
    prompt_tokens: Any = None  # Any: as sent


@dataclass
class CompletionAnswer(Record):
    """A /completions answer as sent: its choices (each an object or not) and usage."""

    choices: list[Any] = field(default_factory=list)  # Any: JSON values as sent
    usage: CompletionUsage = field(default_factory=CompletionUsage)


def _prompt_len(c: CompletionChoice, prompt: str | list[int], tokens: list[Any]) -> int:  # Any: JSON values
    """How many of the echoed tokens are the prompt's: the ids sent, else usage.prompt_tokens (a count within
    the answer's tokens), else all but the generated one."""
    if isinstance(prompt, list):
        return len(prompt)
    if c.prompt_tokens is not None:
        n = net.count(c.prompt_tokens, hi=len(tokens))
        if n is None:
            raise Malformed(f"usage.prompt_tokens {net.quote(repr(c.prompt_tokens), n=40)} is not a count "
                            f"of the answer's {len(tokens)} tokens")
        return n
    return len(tokens) - 1


@dataclass(frozen=True)
class PromptLogprobs:
    tokens: list[str]
    lp: list[float | None]  # lp[0]: None (the first token has no context)
    top: list[dict[str, float]]
    offsets: list[int]  # each token's offset in the prompt's text (a text prompt)


def parse_prompt_logprobs(r: dict[str, Any], prompt: str | list[int], where: str) -> PromptLogprobs:  # Any: JSON values
    """An echo + logprobs answer checked and cut to the prompt's tokens.
    ``lp[0]`` is None (the first token has no context); every other position has a log-probability and a
    non-empty top-k. No prompt log-probabilities at all: NoPromptLogprobs; anything else wrong: Malformed."""
    c = CompletionChoice.of(r)
    if c.logprobs is not None and not isinstance(c.logprobs, dict):
        raise Malformed(f"choices[0].logprobs is a {type(c.logprobs).__name__}, not an object")
    lp = c.lists
    tokens, token_lps = lp.tokens, lp.token_logprobs
    for name, v in (("tokens", tokens), ("token_logprobs", token_lps)):
        if v is not None and not isinstance(v, list):
            raise Malformed(f"logprobs.{name} is a {type(v).__name__}, not a list")
    n = _prompt_len(c, prompt, tokens) if isinstance(tokens, list) and tokens else 0
    if not tokens or not isinstance(token_lps, list) or not token_lps or not any(v is not None for v in token_lps[1:n]):
        raise NoPromptLogprobs(
            f"{where} returned no prompt log-probabilities (echo + logprobs): refusing to score log-likelihood "
            "tasks, which would come out at chance", hint=NO_PROMPT_LOGPROBS_HINT)
    names: list[str] = _list(tokens, "tokens", n, str)
    lps = _list(token_lps, "token_logprobs", n)
    out_lp = [None if i == 0 and v is None else _lp(v, f"token_logprobs[{i}]") for i, v in enumerate(lps)]
    top = _list(lp.top_logprobs, "top_logprobs", n) if lp.top_logprobs is not None else [None] * n
    out_top = [_top(t, i) if (i or t) else {} for i, t in enumerate(top)]
    offsets = _list(lp.text_offset, "text_offset", n, int) if lp.text_offset is not None else []
    if any(net.count(o) is None for o in offsets):
        raise Malformed("logprobs.text_offset holds offsets that are not counts")
    return PromptLogprobs(names, out_lp, out_top, offsets)


def pmap(fn: Callable[[T], R], items: Sequence[T], workers: int, progress: Callable[[int], None] | None = None,
         what: str = "items") -> list[R]:
    """Map over items with a bounded thread pool, preserving order (the server batches concurrent requests).

    An item whose answer is Malformed is counted and the others go on; at the end they fail together, with
    their count and the first reasons. Any other error stops the map at once (the items not started are
    cancelled) and is raised: one unreachable or silent server costs one deadline, not one per item."""
    out: dict[int, R] = {}  # by the item's index
    bad: dict[str, list[int]] = {}  # reason: the items that gave it
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(fn, it): i for i, it in enumerate(items)}
        done = 0
        try:
            for fut in futures:
                try:
                    out[futures[fut]] = fut.result()
                except Malformed as e:
                    bad.setdefault(e.message, []).append(futures[fut])
                done += 1
                if progress:
                    progress(done)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    if bad:
        n = sum(len(v) for v in bad.values())
        why = "; ".join(f"{reason} (x{len(idx)})" if len(idx) > 1 else reason for reason, idx in list(bad.items())[:3])
        raise Malformed(f"{n} of {len(items)} {what} could not be scored: the server's answers were malformed: "
                        f"{why}{'; ...' if len(bad) > 3 else ''}",
                        hint="is this an OpenAI-compatible server (vLLM)? infertool refuses a verdict from "
                        "answers it cannot check")
    return [out[i] for i in range(len(items))]
