"""LoRA adapters checked as served (serve.lora, the vllm engine): both servers serve the same adapters, and the
``adapters`` phase (the infertool.evaluate.phases protocol) scores the suite's tasks through each adapter's name on
each server, then pairs the reference+adapter against the candidate+adapter with the suite's own summary (top-k
KLD and same top-1 over the perplexity tokens, paired accuracy over the items): the question a user of a quantized
base asks, "do my adapters still answer the same on it?". On the reference server the plain model is scored too,
so each adapter's effect (adapter against plain) is shown: an adapter the server silently ignored has none.

The gate ``max_adapter_kld`` reads the worst adapter's KLD (``Pooled.adapters``: AdaptersComparison).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from infertool.evaluate import metrics as M
from infertool.evaluate.adapter_result import AdapterBlock, AdapterEffect, AdaptersComparison
from infertool.evaluate.paired import ChoicePair, GeneratePair, Paired
from infertool.evaluate.server_engine import Client, collect, combine
from infertool.records import Record

if TYPE_CHECKING:
    from infertool.data.suites import Suite
    from infertool.evaluate.phases import Served
    from infertool.tasks import Events

REFERENCE_LABELS = ("base", "reference")  # the server whose plain model is scored too (the adapters' effect)

# core.summarize (injected: core builds this phase, so this module does not import core)
Summarize = Callable[..., Any]  # Any: (tasks, records, Pooled, gates)


@dataclass
class AdaptersRaw(Record):
    """One server's raw numbers: each adapter's ``server_engine.collect`` output, and the plain model's on the
    reference server."""

    adapters: dict[str, dict[str, Any]] = field(default_factory=dict)  # Any: collect's raw output
    plain: dict[str, Any] | None = None  # Any: collect's raw output


class AdaptersPhase:
    name = "adapters"
    gates: tuple[str, ...] = ("max_adapter_kld",)

    def __init__(self, names: list[str], requests: list[dict[str, Any]], suite: Suite, summarize: Summarize, *,  # Any: JSON values
                 k: int, workers: int):
        self.names = names
        self.requests = requests
        self.suite = suite
        self.summarize = summarize
        self.k = k
        self.workers = workers

    def run(self, served: Served, prior: dict[str, Any] | None, events: Events) -> dict[str, Any]:  # Any: JSON values
        base = served.client
        raw = AdaptersRaw()
        for name in self.names:
            client = Client(base.base_url, name, api_key=base.api_key)
            raw.adapters[name] = collect(client, self.requests, k=self.k, workers=self.workers, events=events,
                                         label=f"{served.label}+{name}")
        if served.label in REFERENCE_LABELS:
            raw.plain = collect(base, self.requests, k=self.k, workers=self.workers, events=events,
                                label=f"{served.label} (no adapter)")
        return raw.to_dict()

    def compare(self, raw_ref: dict[str, Any], raw_cand: dict[str, Any], *, confidence: float,  # Any: JSON values
                first: str) -> AdaptersComparison:
        ref, cand = AdaptersRaw.from_dict(raw_ref), AdaptersRaw.from_dict(raw_cand)
        accept = {"confidence": confidence}
        blocks = []
        for name in self.names:
            if name not in ref.adapters or name not in cand.adapters:
                continue
            _, _, pool, _ = self.summarize(self.suite, combine(ref.adapters[name], cand.adapters[name], self.k), accept)
            block = block_of(name, pool, confidence)
            if ref.plain is not None:
                paired = combine(ref.plain, ref.adapters[name], self.k)
                _, _, effect, _ = self.summarize(self.suite, paired, accept)
                block.effect = effect_of(effect, paired)
            blocks.append(block)
        measured = [b for b in blocks if b.kld is not None]
        worst = max(measured, key=lambda b: b.kld or 0.0).name if measured else None
        return AdaptersComparison(blocks, worst, first)


def block_of(name: str, pool: Any, confidence: float) -> AdapterBlock:  # Any: core's Pooled
    """One adapter's block from the suite's pooled summary of reference+adapter against candidate+adapter."""
    block = AdapterBlock(name=name, items=pool.items)
    tok = pool.tokens
    if tok is not None and tok.tokens:
        z = M.z_for(confidence)
        mean, se = tok.kld.mean_se()
        block.tokens, block.kld_kind, block.kld = tok.tokens, tok.kld_kind, mean
        block.kld_ci = [mean - z * se, mean + z * se]
        block.top1, block.top1_ci = tok.top1_agree, list(tok.top1_agree_ci)
    return block


def effect_of(pool: Any, paired: dict[str, Paired]) -> AdapterEffect:  # Any: core's Pooled
    """The adapter against the plain model on the reference: KLD and same top-1 over the tokens, and the share
    of items whose answer (a generated text, a multiple-choice pick) it changes."""
    changed = n = 0
    for task in paired.values():
        if isinstance(task, GeneratePair):
            changed += sum(it.out_b != it.out_c for it in task.items)
            n += len(task.items)
        elif isinstance(task, ChoicePair):
            changed += sum(it.ll_b.index(max(it.ll_b)) != it.ll_c.index(max(it.ll_c)) for it in task.items)
            n += len(task.items)
    tok = pool.tokens
    return AdapterEffect(kld=tok.kld.mean_se()[0] if tok is not None and tok.tokens else None,
                         top1=tok.top1_agree if tok is not None and tok.tokens else None,
                         changed=changed / n if n else None, items=n)


def adapters_phase(resolution: Any, suite: Suite, requests: list[dict[str, Any]], summarize: Summarize, *,  # Any: Resolution; JSON values
                   k: int, workers: int) -> list[AdaptersPhase]:
    """The phase when the recipe serves LoRA adapters (serve.lora) with the vllm engine: [] otherwise."""
    lora = resolution.serve_section.lora if resolution is not None else None
    if lora is None:
        return []
    return [AdaptersPhase(list(lora.adapters), requests, suite, summarize, k=k, workers=lora_workers(resolution, workers))]


def lora_workers(resolution: Any, workers: int) -> int:  # Any: Resolution
    """Requests in flight per server: 1 with serve.lora on vLLM's CPU backend. Measured with vLLM 0.32 there: with
    --enable-lora, prompt log-probability requests batched together (plain model or adapter alike) kill the engine
    ("einsum(): subscript b has size 4 ... 511" in punica_cpu add_lora_logits); one at a time they are answered."""
    if resolution is not None and resolution.serve_section.lora is not None and resolution.target.kind == "cpu":
        return 1
    return workers



ADAPTER_HEADER = ("adapter", "tokens", "KLD (quantized vs original) [CI]", "same top-1 [CI]", "acc orig -> quant",
                  "effect: KLD vs no adapter", "answers changed")


def adapter_rows(block: AdaptersComparison) -> list[tuple[str, ...]]:
    """One row per adapter (results.json ``pooled.adapters``), the worst marked."""
    def f(x: float | None, spec: str) -> str:
        return "—" if x is None else format(x, spec)

    rows: list[tuple[str, ...]] = []
    for a in block.adapters:
        ci = f" [{f(a.kld_ci[0], '.4f')}, {f(a.kld_ci[1], '.4f')}]" if a.kld_ci else ""
        tci = f" [{f(a.top1_ci[0], '.1%')}, {f(a.top1_ci[1], '.1%')}]" if a.top1_ci else ""
        acc = f"{f(a.items.acc_base, '.0%')} -> {f(a.items.acc_cand, '.0%')} ({a.items.n})" if a.items else "—"
        eff = a.effect or AdapterEffect()
        rows.append((a.name + (" (worst)" if a.name == block.worst and len(block.adapters) > 1 else ""),
                     f"{a.tokens:,}", f(a.kld, ".4f") + ci, f(a.top1, ".1%") + tci, acc, f(eff.kld, ".4f"),
                     f"{f(eff.changed, '.0%')} of {eff.items}" if eff.items else "—"))
    return rows


def adapters_table(block: AdaptersComparison) -> Any:  # Any: a rich Table (rich imported when rendering)
    from rich.table import Table

    from infertool.output import plain

    tab = Table(title="LoRA adapters (as served: each adapter on the quantized model vs on the original)")
    for col in ADAPTER_HEADER:
        tab.add_column(col, justify="left" if col == "adapter" else "right")
    for row in adapter_rows(block):
        tab.add_row(*(plain(c) for c in row))
    return tab
