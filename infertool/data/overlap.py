"""Does calibration text overlap the eval suite's text? A model calibrated on the text it is scored on can
look better than it is, so infertool refuses (or, when the user allows it, warns loudly).

Method: word 13-grams, the unit GPT-3's contamination study used. Every 13-word window of the eval texts
is hashed; the overlap is the share of those windows that also occur in the calibration text, and the
number of eval texts (windows, questions, prompts) with at least one shared window. Words are lower-cased
runs of letters and digits, so whitespace and punctuation changes do not hide a copy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from infertool.records import Record

NGRAM = 13
REFUSE_SHARE = 0.01  # refuse when 1 % or more of the eval 13-grams occur in the calibration text
_WORD = re.compile(r"[a-z0-9]+")


def grams(text: str, n: int = NGRAM) -> set[int]:
    """The word n-grams of a text, hashed (64-bit; the sets are compared within one process)."""
    words = _WORD.findall(text.lower())
    return {hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1)}


@dataclass
class Overlap(Record):
    """What the calibration text shares with the eval suite (``overlap``); in a file with its share and verdict."""

    eval_ngrams: int = 0
    shared_ngrams: int = 0
    eval_texts: int = 0
    texts_with_overlap: int = 0
    ngram: int = NGRAM
    examples: list[str] = field(default_factory=list)  # a few eval texts that overlap (trimmed)

    @property
    def share(self) -> float:
        return self.shared_ngrams / self.eval_ngrams if self.eval_ngrams else 0.0

    @property
    def refused(self) -> bool:
        return self.share >= REFUSE_SHARE

    def describe(self) -> str:
        return (f"{self.shared_ngrams:,} of {self.eval_ngrams:,} word {self.ngram}-grams of the eval suite "
                f"({self.share:.1%}) occur in the calibration text; {self.texts_with_overlap} of "
                f"{self.eval_texts} eval texts share at least one")

    def to_dict(self) -> dict:
        return {**super().to_dict(), "share": self.share, "refused": self.refused}


def overlap(calibration_docs: list[str], eval_texts: list[str], n: int = NGRAM) -> Overlap:
    cal: set[int] = set()
    for d in calibration_docs:
        cal |= grams(d, n)
    total = shared = hit = 0
    examples: list[str] = []
    for t in eval_texts:
        g = grams(t, n)
        common = len(g & cal)
        total += len(g)
        shared += common
        if common:
            hit += 1
            if len(examples) < 3:
                examples.append(t[:120] + ("..." if len(t) > 120 else ""))
    return Overlap(total, shared, len(eval_texts), hit, n, examples)
