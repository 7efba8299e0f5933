"""The built-in corpus, offline: Python's own ``pydoc_data.topics`` (PSF licence, always installed), and
its two DISJOINT parts, so that calibration and evaluation never share text.

- ``calibration``: what ``quantize.calibration.source: builtin`` calibrates on;
- ``eval``: what the ``builtin-corpus`` suite scores (``source: builtin:pydoc_topics:eval``).

The split is by content, not just by topic (pydoc's topics repeat each other): see ``split()``. The two
parts share no word 13-gram. The corpus changes between Python releases; ``describe()`` records the Python
version, the topics and a content hash of each part for the manifests.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import lru_cache

from infertool.data.fingerprint import texts_sha256
from infertool.errors import UsageError

NAME = "pydoc_topics"
PARTS = ("calibration", "eval")
EVAL_SHARE = 0.30
SEPARATOR = "\n\n"
LICENCE = "pydoc_data.topics (PSF licence), Python's own documentation topics"
SPLIT_RULE = (f"topics that copy longer ones dropped, topics sharing text grouped, groups balanced to {EVAL_SHARE:.0%} "
              "of characters for eval; the parts share no word 13-gram")


@dataclass(frozen=True)
class Part:
    name: str
    keys: tuple[str, ...]  # topic keys, in sorted order
    docs: tuple[str, ...]

    @property
    def text(self) -> str:
        return SEPARATOR.join(self.docs)

    @property
    def chars(self) -> int:
        return len(self.text)

    def sha256(self) -> str:
        return docs_sha256(self.docs)

    def facts(self) -> dict:
        """What the manifests record of this part: its topics, first and last topic, size and hash."""
        return {"topics": len(self.keys), "first": self.keys[0] if self.keys else None,
                "last": self.keys[-1] if self.keys else None, "chars": self.chars, "sha256": self.sha256()}


def docs_sha256(docs) -> str:
    """Content hash of a sequence of documents (length-prefixed, so boundaries count)."""
    return texts_sha256(docs)


@lru_cache(maxsize=1)
def topics() -> tuple[tuple[str, str], ...]:
    """(key, text) of every topic, in sorted key order."""
    import pydoc_data.topics as t

    return tuple((k, t.topics[k]) for k in sorted(t.topics))


CONTAINED = 0.5  # a topic with half its 13-grams already in longer topics is a copy of them: dropped


@lru_cache(maxsize=1)
def split() -> dict[str, Part]:
    """The disjoint calibration and eval parts (deterministic for a given Python's corpus).

    pydoc's topics repeat each other (``compound`` holds ``if``, ``while``, ``try``...; ``specialnames``
    holds ``customization``), so splitting by topic alone would share a third of the eval text. Instead:
    1. a topic whose word 13-grams are at least half inside longer topics is dropped (it is a copy);
    2. topics that still share any 13-gram are grouped (connected components): a group never straddles;
    3. groups, largest first, go to the part furthest below its share (30 % of characters to eval).
    The result shares no 13-gram between the parts (a test checks this with ``infertool.data.overlap``).
    """
    from infertool.data.overlap import grams

    text = dict(topics())
    ngrams = {k: grams(t) for k, t in text.items()}
    kept: list[str] = []
    seen: set[int] = set()
    for key in sorted(text, key=lambda k: (-len(text[k]), k)):
        g = ngrams[key]
        if g and len(g & seen) >= CONTAINED * len(g):
            continue
        kept.append(key)
        seen |= g
    parent = {k: k for k in kept}

    def root(k: str) -> str:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    owner: dict[int, str] = {}
    for key in sorted(kept):
        for h in ngrams[key]:
            if h in owner:
                parent[root(key)] = root(owner[h])
            else:
                owner[h] = key
    groups: dict[str, list[str]] = {}
    for key in sorted(kept):
        groups.setdefault(root(key), []).append(key)
    total = sum(len(text[k]) for k in kept)
    chars = {"calibration": 0, "eval": 0}
    share = {"calibration": 1 - EVAL_SHARE, "eval": EVAL_SHARE}
    chosen: dict[str, list[str]] = {"calibration": [], "eval": []}
    for group in sorted(groups.values(), key=lambda g: (-sum(len(text[k]) for k in g), g[0])):
        name = max(("calibration", "eval"), key=lambda p: share[p] * total - chars[p])
        chosen[name] += group
        chars[name] += sum(len(text[k]) for k in group)
    return {name: Part(name, tuple(sorted(keys)), tuple(text[k] for k in sorted(keys)))
            for name, keys in chosen.items()}


def part(name: str) -> Part:
    if name not in PARTS:
        raise UsageError(f"unknown part {name!r} of the built-in corpus", hint=f"parts: {', '.join(PARTS)}")
    return split()[name]


def whole_text() -> str:
    """Every topic (both parts): for bench prompts, where no accuracy is measured."""
    return SEPARATOR.join(t for _, t in topics())


def prompt_text() -> str:
    """The whole corpus with whitespace runs collapsed (paragraphs of one line each): bench prompts."""
    parts = [re.sub(r"\s+", " ", t).strip() for _, t in topics()]
    return SEPARATOR.join(p for p in parts if p)


def describe(name: str | None = None) -> dict:
    """What the manifests record: the Python version, the split rule, each part's topics, size and hash."""
    parts = split()
    chosen = [name] if name else list(PARTS)
    return {
        "corpus": f"builtin:{NAME}",
        "licence": LICENCE,
        "python_version": sys.version.split()[0],
        "split": SPLIT_RULE,
        "parts": {p: parts[p].facts() for p in chosen},
    }
