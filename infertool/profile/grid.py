"""The shapes a profile times: prefill lengths, decode batch sizes at one context, how many steps and repeats."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShapeGrid:
    batch: list[int]  # decode batch sizes
    prompt_len: list[int]  # prefill lengths (batch 1)
    decode_len: int  # decode steps timed per batch size
    context: int  # the context the decode batches run at
    repeats: int = 3  # each timing is the median of this many runs
    seed: int = 0  # random token ids (exact lengths, no prefix-cache hits)
