"""The one greedy comparison of a quantized checkpoint with its original: the prompts, how many tokens, and the
agreement of two token sequences, and the original's greedy tokens computed in transformers inside a backend's
worker (``reference_greedy``: the vLLM load check then starts one server, for the checkpoint, not two). The
vLLM load check (infertool.quantize.verify) and a backend's own kernels (where vLLM cannot generate) compare on
the same prompts. torch and transformers are imported inside the worker functions only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infertool.records import Record

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "The three primary colors are",
]
MAX_TOKENS = 16


@dataclass
class Agreement(Record):
    """``token_agreement``'s answer read back by attribute; ``engine``: what generated the two sides (a backend's
    own comparison says it)."""

    agreement: float | None = None
    tokens: int | None = None
    identical: int | None = None
    prompts: int | None = None
    mean_first_divergence: float | None = None
    engine: str | None = None

    def to_dict(self) -> dict:
        """As written: the figures a side has (a backend's comparison that failed has its engine and error only)."""
        return {k: v for k, v in super().to_dict().items() if v is not None}


@dataclass
class GreedyReference(Record):
    """The original's greedy tokens on the load check's prompts (``reference_greedy``'s answer, read back from a
    backend's worker): what computed them, the prompts, how many tokens, the tokens and their texts."""

    engine: str = ""
    dtype: str | None = None
    prompts: list[str] = field(default_factory=list)
    max_tokens: int = MAX_TOKENS
    tokens: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)


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


def generate_greedy(model, tokenizer, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """Greedy completions of ``prompts`` by a transformers model, one prompt at a time, as token ids."""
    import torch

    result = []
    for p in prompts:
        ids = tokenizer(p, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)
        result.append(out[0, ids["input_ids"].shape[1]:].tolist())
    return result


def reference_greedy(original: str, tokenizer, dtype: str | None, *, env: str, trust_remote_code: bool = False) -> dict:
    """The original's greedy tokens on the load check's prompts, in transformers on this host, in ``dtype`` (the
    dtype vLLM serves the original in for this recipe; default the model's own); ``env``: the managed environment
    this runs in, for the record."""
    import gc

    import torch
    from transformers import AutoModelForCausalLM

    from infertool.models.convert import dist_version
    from infertool.perf.host import torch_device

    model = AutoModelForCausalLM.from_pretrained(original, dtype=getattr(torch, dtype) if dtype else "auto",
                                                 trust_remote_code=trust_remote_code)
    used = str(next(model.parameters()).dtype).removeprefix("torch.")
    tokens = generate_greedy(model, tokenizer, PROMPTS, MAX_TOKENS)
    texts = [tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
    del model
    gc.collect()
    return {"engine": f"transformers {dist_version('transformers')} ({used}, {torch_device()}"
                      f", in the {env} environment)",
            "dtype": used, "prompts": list(PROMPTS), "max_tokens": MAX_TOKENS, "tokens": tokens, "texts": texts}
