"""Work done on each SERVED model beside the suite's prompt-log-probability scoring: the seam where lm-eval tasks
(infertool.evaluate.lm_eval_engine) and the decode path (infertool.evaluate.decode) plug into every as-served
check (the eval's vllm and openai engines, tune's reference, screening and served check).

A phase runs once per server, while it is up (``run``), then pairs the two models' raw numbers (``compare``):

- ``run(served, prior, events) -> dict``: the raw, JSON-able numbers of ONE model. ``prior`` is the raw of the
  model served BEFORE this one in the same comparison (None for the first): the decode phase teacher-forces the
  second model on the first one's greedy tokens, so it needs them.
- ``preflight(log_dir)`` (optional): a check before any server starts; raises what the run would end with.
- ``gates``: the names of the accept gates its block feeds: tune's rounds run a phase only while one of them is
  undecided.
- ``compare(raw_ref, raw_cand, *, confidence, first)``: the phase's block of the pooled metrics, a record
  (``pool[phase.name]``: results.json's ``pooled.<name>``), ``first`` saying which model ran first
  ("base"/"reference" or "candidate").

The gates read the blocks: ``min_recovery`` from ``Pooled.lm_eval`` (``LmEvalComparison``) and ``max_decode_kld``
from ``Pooled.decode`` (``DecodeComparison``): infertool.evaluate.core.estimates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from infertool.evaluate.adapter_result import AdaptersComparison
from infertool.evaluate.result import DecodeComparison, LmEvalComparison, Pooled

if TYPE_CHECKING:
    from infertool.tasks import Events


@dataclass
class Served:
    """One model's server while a phase runs on it."""

    label: str  # "base" | "candidate" (tune: "reference" | "candidate" | "served")
    client: Any  # Any: server_engine.Client (base_url, model, api_key) or a stand-in; server_engine imports this module
    model_path: str | None = None  # the checkpoint served (its tokenizer, chat template); None: a server not ours
    log_dir: Path | None = None  # where a phase may write its files (lm-eval's samples)
    extra: dict[str, Any] = field(default_factory=dict)  # Any: JSON values


class Phase(Protocol):
    name: str
    gates: tuple[str, ...]  # the accept gates its block feeds (a sequential check runs a phase while one is open)

    def run(self, served: Served, prior: dict[str, Any] | None, events: Events) -> dict[str, Any]: ...  # Any: JSON values

    def compare(self, raw_ref: dict[str, Any], raw_cand: dict[str, Any], *, confidence: float,  # Any: JSON values
                first: str) -> LmEvalComparison | DecodeComparison | AdaptersComparison: ...


def preflight_all(phases: list[Phase], log_dir: Path) -> None:
    """Each phase's check before any server starts (its optional ``preflight(log_dir)``: lm-eval's tasks known and
    their data here), so a missing input ends the command at once, not after the servers and the suite."""
    for ph in phases:
        check = getattr(ph, "preflight", None)
        if callable(check):
            check(log_dir)


def run_all(phases: list[Phase], served: Served, done: dict[str, dict[str, Any]], events: Events) -> None:  # Any: JSON values
    """Run every phase on one server; ``done``: {phase name: {label: raw}} of the models served so far."""
    for ph in phases:
        got = done.setdefault(ph.name, {})
        prior = next(iter(got.values())) if got else None
        events.log(f"{ph.name}: the {served.label} model")
        got[served.label] = ph.run(served, prior, events)


def compare_all(phases: list[Phase], done: dict[str, dict[str, Any]], ref: str, cand: str,  # Any: JSON values
                confidence: float) -> Pooled:
    """Each phase's pooled block, the candidate against the reference (labels ``ref`` / ``cand``): the
    ``lm_eval`` and ``decode`` of a ``Pooled`` (a phase's own block, or one of its JSON form, read as the record)."""
    out = Pooled()
    for ph in phases:
        raws = done.get(ph.name) or {}
        if ref in raws and cand in raws:
            block = ph.compare(raws[ref], raws[cand], confidence=confidence, first=next(iter(raws)))
            if ph.name == "lm_eval":
                out.lm_eval = LmEvalComparison.from_dict(block)
            elif ph.name == "decode":
                out.decode = DecodeComparison.from_dict(block)
            elif ph.name == "adapters":
                out.adapters = AdaptersComparison.from_dict(block)
    return out
