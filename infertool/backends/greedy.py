"""The one greedy comparison of a quantized checkpoint with its original: the prompts, how many tokens, and the
agreement of two token sequences. The vLLM load check (infertool.quantize.verify) and a backend's own kernels
(where vLLM cannot generate) compare on the same prompts. Standard library only.
"""

from __future__ import annotations

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "The three primary colors are",
]
MAX_TOKENS = 16


def token_agreement(base: list[list[int]], candidate: list[list[int]]) -> dict:
    """Position-wise agreement of greedy token sequences (a missing position counts as a disagreement),
    plus the number of identical completions and the mean first-divergence position."""
    matched = total = identical = 0
    first_div = []
    for a, b in zip(base, candidate):
        n = max(len(a), len(b))
        same = sum(1 for x, y in zip(a, b) if x == y)
        matched += same
        total += n
        identical += int(a == b)
        d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        first_div.append(d if a != b else n)
    return {
        "agreement": matched / total if total else None,
        "tokens": total,
        "identical": identical,
        "prompts": len(first_div),
        "mean_first_divergence": sum(first_div) / len(first_div) if first_div else None,
    }
