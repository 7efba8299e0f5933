"""The records of the per-adapter check (infertool.evaluate.adapters, results.json ``pooled.adapters``): each
served LoRA adapter on the candidate against the same adapter on the reference, and its effect on the reference
(adapter against the plain model: an adapter the server ignored would show none)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from infertool.evaluate.metrics import PairedAccuracy
from infertool.records import Record, Sparse


@dataclass
class AdapterEffect(Record):
    """The adapter against the plain model on the reference server: how much it changes the answers."""

    kld: float | None = None  # mean top-k KLD(plain || adapter) per scored token
    top1: float | None = None  # same top-1 token
    changed: float | None = None  # share of generate / multiple-choice items whose answer the adapter changes
    items: int = 0


@dataclass
class AdapterBlock(Sparse):
    """One adapter: the candidate+adapter against the reference+adapter (top-k KLD and same top-1 over the
    perplexity tokens, paired accuracy over the items), and its effect on the reference."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("items", "effect")

    name: str = ""
    tokens: int = 0
    kld_kind: str = ""
    kld: float | None = None
    kld_ci: list[float] | None = None
    top1: float | None = None
    top1_ci: list[float | None] | None = None
    items: PairedAccuracy | None = None
    effect: AdapterEffect | None = None


@dataclass
class AdaptersComparison(Sparse):
    """Every adapter's block and the worst one (largest KLD): the ``max_adapter_kld`` gate reads it."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("worst",)

    adapters: list[AdapterBlock] = field(default_factory=list)
    worst: str | None = None
    first: str = ""

    @property
    def worst_block(self) -> AdapterBlock | None:
        return next((a for a in self.adapters if a.name == self.worst), None)
