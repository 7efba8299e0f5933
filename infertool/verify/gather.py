"""What one served model answers to the evidence's questions: the scored suite's prompt log-probabilities
(``evaluate.server_engine.collect``) and the decode path (``evaluate.decode.DecodePhase``), with the same
collectors eval uses. `publish` gathers it once from the candidate to write the evidence; `verify` gathers it
again, teacher-forced on the evidence's greedy tokens (``prior_decode``), and compares."""

from __future__ import annotations

from typing import Any

from dataclasses import dataclass

from infertool.evaluate.decode import DecodePhase
from infertool.evaluate.phases import Served
from infertool.evaluate.server_engine import Client, collect
from infertool.recipe import DecodeSpec
from infertool.tasks import Events

WORKERS = 8  # requests in flight while scoring the suite (as eval.batch_size's default)


@dataclass
class Gathered:
    prompts: dict[str, Any] | None  # Any: collect's raw output: {"tasks": ..., "stats": ...}; None: no suite asked
    decode: dict[str, Any] | None  # Any: DecodePhase.run's raw output; None: no decode prompts asked


def gather(client: Client, *, tasks: list[dict[str, Any]] | None,  # Any: eval's task requests, as JSON
           decode_prompts: list[dict[str, Any]] | None, decode: DecodeSpec,  # Any: decode prompts, as JSON
           k: int, events: Events, label: str = "candidate", prior_decode: dict[str, Any] | None = None,  # Any: JSON values
           workers: int = WORKERS, model_path: str | None = None) -> Gathered:
    """Score ``tasks`` with top-``k`` prompt log-probabilities, then run the decode prompts (greedy, per-step
    top-``decode.top_k``; teacher-forced on ``prior_decode``'s tokens when given) on the server ``client``
    names. ``workers``: requests in flight (1: one at a time, the batch-1 floor), for the suite and the decode path alike."""
    prompts = collect(client, tasks, k=k, workers=workers, events=events, label=label) if tasks else None
    raw = None
    if decode_prompts:
        phase = DecodePhase(decode, prompts=decode_prompts, workers=workers)
        raw = phase.run(Served(label, client, model_path), prior_decode, events)
    return Gathered(prompts, raw)
