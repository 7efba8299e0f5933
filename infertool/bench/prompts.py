"""The prompts a bench sends: the built-in corpus, a user JSONL file (prompts or chats), synthetic text, the
ShareGPT sample, N shared system prompts x M questions; a shared prefix.

Lengths are in the SERVER's tokens: the main environment has no tokenizer, so the characters per
token of the text are measured once through the server's /tokenize endpoint (vLLM has one) and
prompts are cut to ``len`` tokens with that ratio (4 characters per token when the server cannot
tokenize). The prompt tokens the server actually saw are reported from its usage figures.

Built-in corpus: Python's own ``pydoc_data.topics`` (PSF licence, always installed): English
technical prose, no download.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from infertool.errors import UsageError

if TYPE_CHECKING:
    from infertool.bench.datasets import TokenCounter
    from infertool.recipe import BenchSection

DEFAULT_CHARS_PER_TOKEN = 4.0
_WORDS = ("the model server request token cache batch latency memory prefix decode prefill queue "
          "stream kernel tensor weight layer head value key page block throughput goodput").split()


@dataclass
class Prompt:
    text: str
    output_len: int


def corpus_text() -> str:
    """The built-in corpus as one string (paragraphs of pydoc topics, in a fixed order)."""
    from infertool.data.corpus import prompt_text

    return prompt_text()


def read_jsonl(path: str | Path, field: str = "prompt", what: str = "bench.prompt.source") -> list[str]:
    """The prompts of a JSONL file (``read_jsonl_requests`` without the reply lengths)."""
    return [text for text, _ in read_jsonl_requests(path, field, what=what)]


PROMPTS_HINT = ("a prompt file is JSONL: one JSON string, or an object with the prompt field or a chat, per line; "
                "an object may carry `class` (a name: letters, digits, - and _)")


def read_jsonl_requests(path: str | Path, field: str = "prompt", counter: TokenCounter | None = None,
                        what: str = "bench.prompt.source") -> list[tuple[str, int | None]]:
    """(prompt, output length or None) per line of a JSONL file (``read_jsonl_classed`` without the classes)."""
    return [(text, out) for text, out, _ in read_jsonl_classed(path, field, counter, what)]


def read_jsonl_classed(path: str | Path, field: str = "prompt", counter: TokenCounter | None = None,
                       what: str = "bench.prompt.source") -> list[tuple[str, int | None, str | None]]:
    """(prompt, output length or None, `class` or None) per line of a JSONL file (read by ``infertool.inputs``: a
    regular UTF-8 file, bounded; ``what`` names the field or flag that gave it): a string, an object with the
    string field ``field``, or a chat (``messages: [{role, content}]`` / ``conversations: [{from, value}]``: its
    first user turn, and, given a ``datasets.TokenCounter``, the token count of the reply after it as the output
    length); an object's ``class`` is its traffic class (infertool.bench.classes)."""
    from infertool import inputs
    from infertool.bench.datasets import chat_messages, row_class

    p = Path(path).expanduser()
    rows: list[tuple[str, int | None, str | None]] = []
    for n, row in inputs.read_jsonl(p, inputs.PROMPTS, what, hint=PROMPTS_HINT):
        if isinstance(row, str):
            if not row:
                raise UsageError(f"{what}: {p}:{n}: an empty prompt", hint="remove the line")
            rows.append((row, None, None))
            continue
        cls = row_class(row, f"{what}: {p}:{n}", PROMPTS_HINT)
        value = row.get(field) if isinstance(row, dict) else None
        msgs = chat_messages(row) if value is None else None
        if msgs:
            first = next((k for k, (role, _) in enumerate(msgs) if role == "user"), None)
            if first is not None:
                reply = msgs[first + 1][1] if first + 1 < len(msgs) and msgs[first + 1][0] == "assistant" else None
                out = max(1, counter.count(reply)) if counter is not None and reply is not None else None
                rows.append((msgs[first][1], out, cls))
                continue
        if not isinstance(value, str) or not value:
            raise UsageError(f"{what}: {p}:{n}: no string field {field!r} and no chat with a user turn",
                             hint="set bench.prompt.field to the name of the prompt field")
        rows.append((value, None, cls))
    if not rows:
        raise UsageError(f"{what}: {p} holds no prompts", hint=PROMPTS_HINT)
    return rows


def traffic_files(bench: BenchSection) -> list[tuple[str, Callable[[], object]]]:
    """(recipe field, its reader) for every file the bench's traffic reads: a prompt or conversations .jsonl
    (bench.prompt.source), a trace (bench.trace). Each reader reads its file whole and checks its fields
    (``infertool.inputs`` and the format's own rules): what the ``input_files`` check and ``bench.plan`` run before
    any request."""
    from infertool.bench import datasets

    out: list[tuple[str, Callable[[], object]]] = []
    spec = bench.prompt
    if spec.source.lower().endswith(".jsonl"):
        if spec.multi_turn is not None:
            out.append(("bench.prompt.source", lambda: datasets.read_chat_jsonl(spec.source)))
        else:
            out.append(("bench.prompt.source", lambda: read_jsonl_requests(spec.source, spec.field)))
    if bench.trace is not None:
        trace = bench.trace
        out.append(("bench.trace", lambda: datasets.load_trace(trace)))
    return out


def synthetic_text(n_chars: int, rng: random.Random) -> str:
    words: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:n_chars]


def _window(text: str, n_chars: int, rng: random.Random) -> str:
    if n_chars >= len(text):
        return (text * (n_chars // max(1, len(text)) + 1))[:n_chars]
    start = rng.randrange(0, len(text) - n_chars)
    return text[start:start + n_chars]


def iter_output_lengths(output_len: int, spread: float, rng: random.Random) -> Iterator[int]:
    """Output lengths for ever: all ``output_len``, or uniform within +-spread of it (at least 1)."""
    if spread <= 0:
        return itertools.repeat(output_len)
    lo = max(1, round(output_len * (1 - spread)))
    hi = max(lo, round(output_len * (1 + spread)))
    return (rng.randint(lo, hi) for _ in itertools.count())


def output_lengths(n: int, output_len: int, spread: float, rng: random.Random) -> list[int]:
    """``n`` output lengths (iter_output_lengths)."""
    return list(itertools.islice(iter_output_lengths(output_len, spread, rng), n))


def iter_prompts(bench: BenchSection, n: int, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN) -> Iterator[Prompt]:
    """``n`` prompts for a BenchSection, made one at a time as they are taken: seeded, so every arm of an
    experiment sends the same ones.

    Sources: ``builtin`` / ``synthetic`` text of ``len`` tokens; ``sharegpt`` (vLLM bench's sample of the
    packaged file with ``bench.seed``: each prompt with its own output length, ``infertool.bench.datasets``);
    ``shared_prefix`` (N system prompts x M questions); a JSONL file of prompts or chats (a chat's first reply
    gives the output length when bench.prompt.tokenizer is known). With ``shared_prefix_ratio`` r > 0, every
    builtin/synthetic/file prompt starts with the same r x len tokens of text (what prefix caching can reuse)
    and continues with its own text.
    """
    spec = bench.prompt
    if spec.source == "sharegpt":
        from infertool.bench.datasets import sharegpt_sample

        yield from (Prompt(s.prompt, s.output_len) for s in sharegpt_sample(bench, n))
        return
    rng = random.Random(bench.seed)
    length_chars = max(1, int(spec.len * chars_per_token))
    prefix_chars = int(length_chars * bench.shared_prefix_ratio)
    rows: list[tuple[str, int | None]] = []
    if spec.source == "builtin":
        source = corpus_text()
    else:
        source = None
        if spec.source not in ("synthetic", "shared_prefix"):
            from infertool.bench.datasets import counter_for

            rows = read_jsonl_requests(spec.source, spec.field, counter_for(bench, required=False))
    prefix = ""
    if prefix_chars and spec.source != "shared_prefix":
        prefix = _window(corpus_text(), prefix_chars, random.Random(bench.seed + 1)) if source is None \
            else _window(source, prefix_chars, random.Random(bench.seed + 1))
        prefix = prefix.rstrip() + "\n\n"
    # the lengths are drawn first from the seed (the same prompts as a list would give); past a million
    # requests from a stream of their own, so that nothing of size n is built
    spread = getattr(bench, "output_len_spread", 0.0)
    if spread and n <= 1_000_000:
        outs = iter(output_lengths(n, bench.output_len, spread, rng))
    else:
        outs = iter_output_lengths(bench.output_len, spread, random.Random(bench.seed + 2))
    shared: list[str] = []
    if spec.source == "shared_prefix":
        from infertool.bench.datasets import shared_prefix_texts

        shared = shared_prefix_texts(bench, min(n, 1_000_000), chars_per_token)
    for i in range(n):
        out = next(outs)
        if source is not None:  # builtin
            body = _window(source, max(1, length_chars - prefix_chars), rng)
        elif spec.source == "synthetic":
            body = synthetic_text(max(1, length_chars - prefix_chars), rng)
        elif spec.source == "shared_prefix":
            body = shared[i % len(shared)]
        else:
            body, own = rows[i % len(rows)]
            out = own or out
        yield Prompt(prefix + body, out)


def build_prompts(bench: BenchSection, n: int, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN) -> list[Prompt]:
    """The first ``n`` prompts of iter_prompts, as a list."""
    return list(iter_prompts(bench, n, chars_per_token))


class PromptStream:
    """Prompt ``i`` of iter_prompts on demand, for indices asked in increasing order (what every traffic
    pattern does); nothing is built ahead."""

    def __init__(self, prompts: Iterator[Prompt]):
        self._it = prompts
        self._next = 0

    def get(self, i: int) -> Prompt:
        if i < self._next:
            raise ValueError(f"prompt {i} was asked after prompt {self._next - 1}")
        while self._next < i:  # another process's prompts: skip them
            next(self._it)
            self._next += 1
        self._next += 1
        return next(self._it)


def chars_per_token(sample_chars: int, tokens: int | None) -> float:
    if not tokens or tokens <= 0:
        return DEFAULT_CHARS_PER_TOKEN
    return max(0.5, sample_chars / tokens)
