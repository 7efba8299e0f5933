"""Traffic classes: what kind of request each one of a bench's traffic is, and each class's summary.

A request keeps the ``class`` its trace or prompt file gives it. The others are classed by ``derive``'s rule,
first match, over the traffic as a whole (its thresholds in ``bench.classes``):

1. ``multi-turn``: a turn of a conversation with more than one user turn;
2. ``shared-prefix``: a prompt whose first ``prefix_chars`` characters or more are the start of another
   conversation's or request's prompt too (a system prompt, a RAG document, a template);
3. ``long``: an input of at least ``long_chars`` characters;
4. ``short``: the rest.

Lengths and prefixes count CHARACTERS (the bench holds no tokenizer for every source, and a class must not
change with the server). Prefixes are compared in blocks of BLOCK characters, as a prefix cache compares
blocks of tokens: a shared prefix is rounded down to whole blocks. ``summarise`` gives each class's share,
input lengths (characters), output lengths (tokens asked for) and prefix-sharing ratio: the fraction of its
prompt characters that are a prefix shared with an EARLIER request (a conversation's own earlier turns count).

Pure functions: no I/O, no server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from infertool.bench.metrics import length_stats
from infertool.bench.results import JsonObject, TrafficClass, TrafficClasses

BLOCK = 16  # characters a prefix is compared in (a prefix cache's block, in characters)
MAX_CLASSED = 100_000  # requests classed and summarised: a longer traffic's first ones (said in the summary's rule)
MULTI_TURN, SHARED_PREFIX, LONG, SHORT = "multi-turn", "shared-prefix", "long", "short"


@dataclass(frozen=True)
class Request:
    """One request of the traffic: its prompt text (a turn: the conversation so far, without the model's
    replies), the output tokens it asks for (None: the bench's output_len), the unit it belongs to (a
    conversation, or the request alone), its unit's user turns, and the class its file gives (None: derived)."""

    prompt: str
    output_len: int | None
    unit: int
    turns: int = 1
    given: str | None = None


@dataclass(frozen=True)
class ClassRule:
    """The thresholds of ``derive`` (``bench.classes``)."""

    prefix_chars: int = 1024
    long_chars: int = 4096

    def text(self) -> str:
        return (f"first match: the file's `class`; {MULTI_TURN} (more than one user turn); {SHARED_PREFIX} (a prompt "
                f"prefix of >= {self.prefix_chars:,} characters that another request starts with); {LONG} (input >= "
                f"{self.long_chars:,} characters); {SHORT}")


def _block_keys(text: str) -> list[int]:
    """The hash of each whole-block prefix of ``text``: key k stands for text[:(k + 1) * BLOCK]."""
    keys, h = [], 0
    for k in range(len(text) // BLOCK):
        h = hash((h, text[k * BLOCK:(k + 1) * BLOCK]))
        keys.append(h)
    return keys


def shared_with_other_unit(requests: Sequence[Request], keys: list[list[int]] | None = None) -> list[int]:
    """Per request: the longest prefix (characters, whole blocks) its prompt shares with a request of ANOTHER
    unit (``keys``: each prompt's ``_block_keys``, when the caller has them)."""
    keys = keys if keys is not None else [_block_keys(r.prompt) for r in requests]
    units: dict[int, int] = {}  # block key -> the first unit seen with it; -1: two units or more
    for r, ks in zip(requests, keys):
        for key in ks:
            seen = units.setdefault(key, r.unit)
            if seen != r.unit and seen != -1:
                units[key] = -1
    out = []
    for ks in keys:
        depth = 0
        for key in ks:
            if units[key] != -1:
                break
            depth += 1
        out.append(depth * BLOCK)
    return out


def shared_with_earlier(requests: Sequence[Request], keys: list[list[int]] | None = None) -> list[int]:
    """Per request, in the traffic's order: the longest prefix (characters, whole blocks) of its prompt that an
    earlier request's prompt starts with too (what a prefix cache could reuse)."""
    seen: set[int] = set()
    out = []
    for i, r in enumerate(requests):
        ks = keys[i] if keys is not None else _block_keys(r.prompt)
        depth = 0
        while depth < len(ks) and ks[depth] in seen:
            depth += 1
        out.append(depth * BLOCK)
        seen.update(ks)
    return out


def derive(requests: Sequence[Request], rule: ClassRule, keys: list[list[int]] | None = None) -> list[str]:
    """Each request's class (see the module docstring): the given one, else the rule's; every turn of a
    conversation gets the class of the conversation (its first turn's prefix decides shared-prefix)."""
    other = shared_with_other_unit(requests, keys)
    first_of: dict[int, int] = {}
    for i, r in enumerate(requests):
        first_of.setdefault(r.unit, i)
    out = []
    for r in requests:
        first = first_of[r.unit]
        if r.given is not None:
            out.append(r.given)
        elif r.turns > 1:
            out.append(MULTI_TURN)
        elif other[first] >= rule.prefix_chars:
            out.append(SHARED_PREFIX)
        elif len(requests[first].prompt) >= rule.long_chars:
            out.append(LONG)
        else:
            out.append(SHORT)
    return out


def summarise(requests: Sequence[Request], rule: ClassRule, replayed: str | None = None) -> TrafficClasses:
    """Each class's share, lengths and prefix-sharing ratio (at most the first MAX_CLASSED requests), largest
    class first."""
    total = len(requests)
    requests = list(requests[:MAX_CLASSED])
    keys = [_block_keys(r.prompt) for r in requests]  # once, for both
    names = derive(requests, rule, keys)
    earlier = shared_with_earlier(requests, keys)
    by: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        by.setdefault(name, []).append(i)
    n = len(requests)
    rows = []
    for name, idx in by.items():
        chars = sum(len(requests[i].prompt) for i in idx)
        rows.append(TrafficClass(
            name=name, origin="given" if requests[idx[0]].given is not None else "derived", requests=len(idx),
            share=len(idx) / n if n else None,
            input_chars=length_stats([len(requests[i].prompt) for i in idx]),
            output_tokens=length_stats([o for i in idx if (o := requests[i].output_len) is not None]),
            prefix_shared=(sum(earlier[i] for i in idx) / chars) if chars else None))
    rows.sort(key=lambda c: (-c.requests, c.name))
    text = rule.text() + (f"; the first {n:,} requests of {total:,}" if total > n else "")
    return TrafficClasses(rule=text, unit="characters", requests=n, classes=rows, replayed=replayed)


def decode_prompts(requests: Sequence[Request], names: Sequence[str], per_class: int,
                   chat: bool = False) -> list[tuple[str, list[JsonObject]]]:
    """Each class's own prompts as decode prompts (infertool.evaluate.decode's form: ``{"id", "prompt"}``, or
    ``{"id", "messages"}`` with the prompt as the user's message when the traffic goes to the chat endpoint): its
    first ``per_class`` requests with a non-blank prompt, in the traffic's order; the largest class first."""
    by: dict[str, list[JsonObject]] = {}
    sizes: dict[str, int] = {}
    for r, name in zip(requests, names):
        sizes[name] = sizes.get(name, 0) + 1
        got = by.setdefault(name, [])
        if len(got) < per_class and r.prompt.strip():
            pid = f"{name}-{len(got) + 1}"
            got.append({"id": pid, "messages": [{"role": "user", "content": r.prompt}]} if chat
                       else {"id": pid, "prompt": r.prompt})
    return sorted(((n, ps) for n, ps in by.items() if ps), key=lambda kv: (-sizes[kv[0]], kv[0]))


def select(names: Sequence[str], wanted: str) -> list[int]:
    """The indices of the requests of class ``wanted``."""
    return [i for i, name in enumerate(names) if name == wanted]
