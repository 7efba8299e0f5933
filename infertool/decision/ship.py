"""What the run decides: the verdict's gates, the decision it implies (``Decision``), what to try next, and the
summary the report leads with (``RunSummary``, ``summarize``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from infertool import backends
from infertool.backends import ACTIVATION_SCHEMES
from infertool.decision.run import Names, Pair, RunData, Section, Speed, model_names, speed, weights
from infertool.evaluate.verdict import RULES, Gate, Rule
from infertool.records import Record, as_float
from infertool.summaries import EvalStageSummary

# ------------------------------------------------------------------------------------------- verdict
def _rule(g: Gate) -> Rule | None:
    return RULES.get(g.name) if isinstance(g.name, str) else None


def _severity(g: Gate) -> float:
    """How far a failed gate is beyond its threshold, as a multiple of the allowed loss (1 = at the threshold)."""
    est, thr, rule = g.estimate, g.threshold, _rule(g)
    if est is None or thr is None:
        return 1.0
    if rule is not None and not rule.upper:  # a floor on agreement: compare the losses 1 - x
        return (1 - est) / max(1 - thr, 1e-9)
    if rule is not None and rule.interval == "log":  # a ratio: the loss is how far it is above 1
        return (est - 1) / max(thr - 1, 1e-9)
    return est / thr if thr else math.inf


def _leans_bad(g: Gate) -> bool:
    est, thr, rule = g.estimate, g.threshold, _rule(g)
    if est is None or thr is None:
        return False
    return est < thr if rule is not None and not rule.upper else est > thr


def _on_items(g: Gate) -> bool:
    """A task-accuracy gate (judged on scored items), not one on the token distribution."""
    rule = _rule(g)
    return rule is not None and rule.unit == "items"


@dataclass
class _Quantization(Record):
    """What next_steps reads of a recipe's quantize section (the manifest's JSON, read tolerantly)."""

    scheme: str = ""
    bits: int | None = None


@dataclass
class _EvalItems(Record):
    max_items: int | None = None  # the recipe's eval.max_items (None: every item of the suite)


def quant_bits(q: Section | None) -> int | None:
    """The bits of a recipe's quantize section (its scheme's, else ``bits``)."""
    if not q:
        return None
    read = _Quantization.from_dict(q)
    if read.scheme.startswith(("W8", "FP8")):
        return 8
    return 4 if read.scheme.startswith("W4") else read.bits


def next_steps(verdict: str | None, gates: list[Gate], quantize: Section | None, *, target_kind: str = "cpu",
               eval_section: Section | None = None, not_served_here: str | None = None) -> list[str]:
    """What to try next, derived from which gates failed (or could not decide) and the recipe's quantization.
    ``not_served_here``: why this host served the original instead of the candidate (then only what this
    host can serve is said to run here). Empty for PASS and when there is no verdict."""
    if verdict not in ("FAIL", "INCONCLUSIVE") or not quantize:
        return []
    out: list[str] = []
    quant = backends.gentler(quantize, target_kind)
    if not_served_here and quant and (quant_bits(quantize) or 4) < 8:
        out.append(f"this host cannot serve the 4-bit candidate ({not_served_here}): of what follows, only 8-bit "
                   "would be served here; the 4-bit options are for hosts whose vLLM runs them")

    def ordered(severe: bool) -> list[str]:
        """8-bit first when far beyond the gate (finer 4-bit settings rarely close that) or when only 8-bit
        serves here; else the finer 4-bit settings first."""
        eight = [q for q in quant if q.startswith("8-bit")]
        rest = [q for q in quant if not q.startswith("8-bit")]
        return eight + rest if severe or not_served_here else rest + eight

    if verdict == "INCONCLUSIVE":
        return out + _undecided_steps([g for g in gates if g.status == "INCONCLUSIVE"], eval_section or {},
                                      ordered(False)[0] if quant else None)
    failed = [g for g in gates if g.status == "FAIL"]
    if failed and all(_on_items(g) for g in failed):
        out.append(f"the failing gates are task accuracy ({', '.join(g.name for g in failed)}), not the token "
                   "distribution: read the items that flipped (eval/items.jsonl) before changing the quantization")
    bits = quant_bits(quantize)
    if bits is not None and bits >= 8:
        scheme = _Quantization.from_dict(quantize).scheme
        if scheme in ACTIVATION_SCHEMES and target_kind == "gpu":
            out.append(f"{scheme} quantizes activations too: weight-only 8-bit (quantize.scheme: W8A16, or "
                       "quantize.bits: 8 with GPTQ) keeps them in 16 bits")
        out.append("8-bit already fails these gates: check that the thresholds suit this model (a small model loses "
                   "more than an 8B one; eval.accept), or keep the original (serve.model: original)")
        return out
    out += ordered(max((_severity(g) for g in failed), default=1.0) >= 2.0)
    return out


def _undecided_steps(open_: list[Gate], ev: Section, meanwhile: str | None) -> list[str]:
    """For INCONCLUSIVE gates: how many more items would decide them, or that the threshold itself must be
    decided; and, when the estimate already leans beyond the threshold, the first quantization to try."""
    out = []
    sized = [g for g in open_ if g.n_needed]
    if sized:
        what = "more eval items: " + ", ".join(f"about {g.n_needed:,} {g.unit or 'items'} would decide {g.name} "
                                              f"(now {g.n or 0:,})" for g in sized)
        mi = _EvalItems.from_dict(ev).max_items
        factor = max(((g.n_needed or 0) / g.n for g in sized if g.n), default=None)
        if mi and factor:
            what += f": eval.max_items: {math.ceil(mi * factor):,} (now {mi}), or a larger suite if this one has fewer"
        else:
            what += ": a larger suite (every item of this one is scored now)"
        out.append(what)
    for g in open_:
        if not g.n_needed:
            out.append(f"{g.name}: the estimate sits on its threshold ({g.threshold}): more items will not decide it; "
                       f"decide the threshold itself (eval.accept.{g.name})")
    leaning = [g for g in open_ if _leans_bad(g)]
    if leaning and meanwhile:
        out.append(f"{', '.join(g.name for g in leaning)}: the estimate is already beyond the threshold, so more items "
                   f"will likely make it FAIL; meanwhile try {meanwhile}")
    return out


def _gate_names(gates: list[Gate], status: str) -> str:
    names = [g.name for g in gates if g.status == status]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1] if names else "a gate"


@dataclass
class Decision(Record):
    """The sentence the summary leads with, a short title, and whether it says to ship the candidate (True /
    False / None: nothing to decide, or a trade-off the reader must weigh)."""

    ship: bool | None = None
    title: str = ""
    text: str = ""


def decision(verdict: str | None, gates: list[Gate], names: Names, gains: Speed, size: Pair | None,
             has_quantize: bool) -> Decision:
    """What the run says about shipping the candidate."""
    if not has_quantize:
        return Decision(None, "no quantization to decide",
                        f"Nothing to decide about quantization: the recipe has no quantize section "
                        f"(the served model is {names.served or names.original}).")
    if verdict is None:
        return Decision(None, "no verdict", "No verdict: this run has no eval stage, so nothing says whether the "
                        "candidate kept the original's accuracy (add an eval section, or drop --stages).")
    head = gains.headline if gains.status == "measured" else None
    r = head.output_tok_s.ratio if head else None
    faster = f"{r:.2f}x the output tokens/s of the original at {head.level}" if r is not None and head else None
    if verdict == "FAIL":
        n = sum(g.status == "FAIL" for g in gates)
        return Decision(False, "do not ship the candidate",
                        f"Do not ship the candidate: it fails the {_gate_names(gates, 'FAIL')} gate{'s' if n > 1 else ''} "
                        "(the whole interval beyond the threshold)" + (f", although it serves {faster}" if r and r >= 1 else "") + ".")
    if verdict == "INCONCLUSIVE":
        return Decision(False, "not decided yet",
                        f"Not decided: the eval cannot yet tell whether the candidate stays within "
                        f"{_gate_names(gates, 'INCONCLUSIVE')} (the interval straddles the threshold); do not ship it "
                        "until it can (see what to try next).")
    w = f"{size.ratio:.2f}x the weight bytes" if size else None
    if gains.status == "nothing to compare" and names.served_origin == "original":
        return Decision(None, "passes, but not served here",
                        f"The candidate passes every accuracy gate{' in ' + w if w else ''}, but it was not served here: "
                        f"{gains.why}. What it gains in speed was not measured: ship it where vLLM can run it, "
                        "and measure it there.")
    if head is None:
        return Decision(True, "ship the candidate",
                        f"Ship the candidate on accuracy: it passes every gate{' in ' + w if w else ''}; its speed against "
                        f"the original was not measured ({gains.why or gains.status}).")
    cost = head.cost_per_1m.ratio
    cost_txt = f", {cost:.2f}x the $ per 1M output tokens" if cost is not None else ""
    if r is None:
        return Decision(True, "ship the candidate",
                        f"Ship the candidate on accuracy: it passes every gate; its throughput at {head.level} could "
                        "not be compared (no request completed there).")
    if r >= 1.0:
        return Decision(True, "ship the candidate",
                        f"Ship the candidate: it passes every accuracy gate and serves {faster}{cost_txt}"
                        f"{', in ' + w if w else ''}.")
    return Decision(None, "passes, but saves memory only",
                    f"The candidate passes every accuracy gate but serves only {faster} on this host{cost_txt}: it saves "
                    f"memory{' (' + w + ')' if w else ''}, not time or money. Ship it where memory is the limit; else "
                    "serve the original.")


# ------------------------------------------------------------------------------------------- the summary
@dataclass
class RunSummary(Record):
    """Everything the report's summary section shows, as data."""

    names: Names = field(default_factory=Names)
    weights: Pair | None = None
    speed: Speed = field(default_factory=Speed)
    verdict: str | None = None  # PASS | FAIL | INCONCLUSIVE; None: no eval
    reason: str | None = None
    gates: list[Gate] = field(default_factory=list)
    decision: Decision = field(default_factory=Decision)
    suite: str | None = None  # the eval's
    engine: str | None = None
    confidence: float | None = None  # of the gates' intervals
    next: list[str] = field(default_factory=list)


def verdict_of(run: RunData) -> tuple[str | None, str | None, list[Gate]]:
    """The eval's verdict, reason and gates: results.json's, else what the manifest kept of them. A gate
    without a name is left out."""
    ev, kept = run.eval, run.summary("eval", EvalStageSummary)
    verdict = (ev and ev.verdict) or (kept and kept.verdict)
    reason = (ev and ev.reason) or (kept and kept.reason)
    gates = (ev and ev.gates) or [Gate.from_dict(g) for g in (kept and kept.gates) or [] if isinstance(g, dict)]
    return verdict or None, reason or None, [g for g in gates if isinstance(g.name, str)]


def summarize(run: RunData) -> RunSummary:
    """Everything the summary section shows, as data."""
    ev = run.eval
    names = model_names(run)
    size = weights(run.quantize)
    gains = speed(run.bench)
    verdict, reason, gates = verdict_of(run)
    not_here = gains.why if gains.status == "nothing to compare" and names.served_origin == "original" else None
    return RunSummary(
        names, size, gains, verdict, reason, gates, decision(verdict, gates, names, gains, size, run.has_quantize),
        suite=(ev.suite.name or None) if ev else None, engine=(ev.engine or None) if ev else None,
        confidence=as_float(ev.confidence) if ev else None,
        next=next_steps(verdict, gates, run.section("quantize"), target_kind=run.manifest.target_kind or "cpu",
                        eval_section=run.section("eval"), not_served_here=not_here))
