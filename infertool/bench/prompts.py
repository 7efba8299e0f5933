"""The prompts a bench sends: the built-in corpus, a user JSONL file, or synthetic text; a shared prefix.

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
from typing import Iterator

from infertool.errors import UsageError

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


def read_jsonl(path: str | Path, field: str = "prompt") -> list[str]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"prompt file not found: {p}", hint="bench.prompt.source is 'builtin', 'synthetic' or a .jsonl file")
    texts: list[str] = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise UsageError(f"{p}:{n}: not a JSON object") from None
            if isinstance(row, str):
                texts.append(row)
                continue
            value = row.get(field) if isinstance(row, dict) else None
            if not isinstance(value, str) or not value:
                raise UsageError(f"{p}:{n}: no string field {field!r}",
                                 hint="set bench.prompt.field to the name of the prompt field")
            texts.append(value)
    if not texts:
        raise UsageError(f"{p} holds no prompts")
    return texts


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


def iter_prompts(bench, n: int, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN) -> Iterator[Prompt]:
    """``n`` prompts for a BenchSection, made one at a time as they are taken: seeded, so every arm of an
    experiment sends the same ones.

    With ``shared_prefix_ratio`` r > 0, every prompt starts with the same r x len tokens of text
    (what prefix caching can reuse) and continues with its own text.
    """
    rng = random.Random(bench.seed)
    spec = bench.prompt
    length_chars = max(1, int(spec.len * chars_per_token))
    prefix_chars = int(length_chars * bench.shared_prefix_ratio)
    if spec.source == "builtin":
        source = corpus_text()
    elif spec.source == "synthetic":
        source = None
    else:
        source = None
        texts = read_jsonl(spec.source, spec.field)
    prefix = ""
    if prefix_chars:
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
    for i in range(n):
        if spec.source == "builtin":
            body = _window(source, max(1, length_chars - prefix_chars), rng)
        elif spec.source == "synthetic":
            body = synthetic_text(max(1, length_chars - prefix_chars), rng)
        else:
            body = texts[i % len(texts)]
        yield Prompt(prefix + body, next(outs))


def build_prompts(bench, n: int, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN) -> list[Prompt]:
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
