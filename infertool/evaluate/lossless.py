"""Speculation is lossless, checked (issue 32.4): a speculative serve configuration against the SAME configuration
without ``speculative``, both served, on a prompt set (a traffic class's own prompts, else the decode prompts),
with the decode path's comparison (infertool.evaluate.decode: greedy exact match, first divergence, teacher-forced
decode KLD, near ties) and its noise floor beside it.

The noise floor is the configuration without speculation compared with ITSELF: the same prompts sent twice to
the same server, the second pass teacher-forced on the first one's tokens, exactly as the speculative server is.
Same server, not a second start: both arms are compared as each was started once, so what one started server
does to the same requests twice (batch composition, request order, scheduling under WORKERS requests in flight)
is the noise a speculative arm must stay within; a second start would add a vLLM start (tens of seconds on CPU,
minutes on a GPU) to measure start-to-start effects neither arm's comparison has.

The rule (``decide``), said in every result's ``rule``: a configuration is NOT lossless when

- more of its answers diverge from the reference at a step that is not a near tie (the reference's top-2 gap at
  least ``near_tie_logprob``) than the floor's do (``divergences`` > the floor's), or
- the lower end of its decode-KLD interval is above the upper end of the floor's plus ``KLD_TOLERANCE`` nats.

Divergences at near ties are counted apart, beside the floor's, and decide nothing: a near tie may flip on any
change of batch shape. A comparison that could not be measured (the server has no per-step log-probabilities)
is ``lossless: null`` with why, never a guess.

One check serves both users: tune's screening and served check of a trial whose serve section has
``speculative`` (infertool.tune.stages), and bench's speculative experiment (infertool.bench.core), each with
its servers' lifetimes: ``LosslessCheck.run_plain`` on the server without speculation (the two passes),
``run_speculative`` on the speculative one, in either order, then ``result()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infertool.errors import InfertoolError
from infertool.evaluate.decode import DecodePhase, DecodeRaw, compare
from infertool.evaluate.result import DecodeComparison, Diverged
from infertool.records import Record

if TYPE_CHECKING:
    from infertool.evaluate.phases import Served
    from infertool.recipe import DecodeSpec, SpeculativeSpec
    from infertool.tasks import Events

KLD_TOLERANCE = 1e-3  # nats per decode step above the floor's interval a speculative arm may show
CLASS_PROMPTS = 20  # a traffic class's prompts checked (its first ones), unless eval.decode.n_prompts says
FLOOR_METHOD = "the configuration without speculation, the same server, the same prompts twice"


def rule_text(near_tie_logprob: float) -> str:
    """The rule in words (every result says it)."""
    return (f"not lossless when more answers diverge at a step that is not a near tie (reference top-2 gap >= "
            f"{near_tie_logprob:g} nats) than in the noise floor, or when the decode-KLD interval's lower end is "
            f"above the floor's upper end + {KLD_TOLERANCE:g} nats; divergences at near ties are counted apart and "
            "decide nothing")


# What a lossless check's JSON keeps of each decode comparison (``Lossless.figures`` / ``floor``), in this order
FIGURES = ("n_prompts", "exact_match", "exact_match_ci", "first_divergence_median", "first_divergence_ci", "kld",
           "kld_ci", "top1", "divergences", "near_ties", "steps", "skipped")


@dataclass
class Lossless(Record):
    """One lossless check: the speculative configuration against the same one without speculation (``figures``)
    on a prompt set (``prompts``: a traffic class, or the decode prompts), the noise floor beside it (``floor``),
    and the decision (``lossless``: None when not measured) with its reason and rule."""

    lossless: bool | None = None
    reason: str | None = None
    speculative: str | None = None  # the speculative config, in words ("ngram k=3")
    prompts: str | None = None  # whose prompts: "class short", "the decode prompts"
    figures: DecodeComparison = field(default_factory=DecodeComparison)  # decode.compare's block
    floor: DecodeComparison = field(default_factory=DecodeComparison)
    floor_method: str = FLOOR_METHOD
    kld_tolerance: float = KLD_TOLERANCE
    near_tie_logprob: float | None = None
    rule: str | None = None
    diverged: list[Diverged] = field(default_factory=list)  # the first diverging answers, both texts (decode.compare)

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = super().to_dict()
        for arm in ("figures", "floor"):
            d[arm] = {k: d[arm][k] for k in FIGURES if k in d[arm]}
        return d


def speculative_words(spec: SpeculativeSpec | None) -> str:
    """A speculative config in words: "ngram k=3"."""
    method, k, model = (spec.method, spec.num_speculative_tokens, spec.model) if spec else (None, None, None)
    return f"{method} k={k}" + (f" (draft {model})" if model else "")


def decide(figures: DecodeComparison, floor: DecodeComparison, *, speculative: str, prompts: str,
           near_tie_logprob: float) -> Lossless:
    """The rule (module docstring) on a comparison and its floor; the reason names the counts, e.g. "speculative
    ngram k=3 changed 4 of 20 answers beyond the noise floor (0 of 20)"."""
    out = Lossless(speculative=speculative, prompts=prompts, figures=figures, floor=floor,
                   near_tie_logprob=near_tie_logprob, rule=rule_text(near_tie_logprob))
    why_not = figures.skipped or floor.skipped
    if why_not or not figures.n_prompts or not floor.n_prompts:
        out.reason = f"speculative {speculative} on {prompts}: not measured ({why_not or 'no prompts compared'})"
        return out
    ties = (f"; near ties apart: {figures.near_ties} (floor {floor.near_ties})"
            if figures.near_ties or floor.near_ties else "")
    counts = (f"{figures.divergences} of {figures.n_prompts} answers beyond the noise floor "
              f"({floor.divergences} of {floor.n_prompts})")
    kld_lo = figures.kld_ci[0] if figures.kld_ci else None
    floor_hi = floor.kld_ci[1] if floor.kld_ci else None
    kld_over = kld_lo is not None and floor_hi is not None and kld_lo > floor_hi + KLD_TOLERANCE
    if figures.divergences > floor.divergences:
        out.lossless = False
        out.reason = f"speculative {speculative} changed {counts} on {prompts}{ties}"
    elif kld_over:
        out.lossless = False
        out.reason = (f"speculative {speculative} moved the decode distributions on {prompts}: decode KLD "
                      f"{figures.kld:.3g} [{kld_lo:.3g}, {figures.kld_ci[1]:.3g}] above the noise floor's "  # type: ignore[index]
                      f"{floor.kld:.3g} [.., {floor_hi:.3g}] + {KLD_TOLERANCE:g}{ties}")
    else:
        out.lossless = True
        out.reason = f"speculative {speculative} is lossless on {prompts}: changed {counts}{ties}"
    return out


class LosslessCheck:
    """One lossless check over its two servers: ``run_plain`` on the configuration without speculation (the
    prompts twice: the reference and the floor), ``run_speculative`` on the speculative one (teacher-forced on
    the reference's tokens when it runs second), in either order; ``result()`` compares and decides."""

    def __init__(self, spec: DecodeSpec, prompts: list[dict[str, Any]], *, speculative: str, label: str,  # Any: JSON values
                 confidence: float = 0.95) -> None:
        self.phase = DecodePhase(spec, prompts)
        self.speculative, self.label, self.confidence = speculative, label, confidence
        self.plain: dict[str, Any] | None = None  # Any: JSON values
        self.again: dict[str, Any] | None = None  # Any: JSON values
        self.spec_raw: dict[str, Any] | None = None  # Any: JSON values
        self.spec_first = False
        self.failed: str | None = None  # why a pass could not be made (a server that answered no usable result)

    def run_plain(self, served: Served, events: Events) -> None:
        """The reference and the floor: the same prompts twice on this server (the second pass forced on the
        first one's tokens, as the speculative arm is)."""
        def both() -> None:
            self.plain = self.phase.run(served, self.spec_raw, events)
            self.again = self.phase.run(served, _own(self.plain), events)

        self._guarded(both, "the server without speculation")

    def run_speculative(self, served: Served, events: Events) -> None:
        self.spec_first = self.plain is None

        def once() -> None:
            self.spec_raw = self.phase.run(served, self.plain, events)

        self._guarded(once, "the speculative server")

    def _guarded(self, work: Callable[[], None], which: str) -> None:
        """A pass whose server fails a request (an error status, a malformed answer, a prompt longer than the
        server takes) leaves the check "not measured" with why, never a verdict; the other server still runs."""
        try:
            work()
        except InfertoolError as e:
            self.failed = self.failed or f"{which}: {e.message.splitlines()[0]}"

    def result(self) -> Lossless:
        tie = float(self.phase.spec.near_tie_logprob)
        if self.failed or self.plain is None or self.spec_raw is None or self.again is None:
            return decide(DecodeComparison(skipped=self.failed or "a server was not run"), DecodeComparison(),
                          speculative=self.speculative, prompts=self.label, near_tie_logprob=tie)
        block = compare(self.plain, self.spec_raw, confidence=self.confidence,
                        first="candidate" if self.spec_first else "reference", near_tie_logprob=tie)
        floor = compare(_own(self.plain), self.again, confidence=self.confidence, first="reference",
                        near_tie_logprob=tie)
        out = decide(block, floor, speculative=self.speculative,
                     prompts=self.label, near_tie_logprob=tie)
        out.diverged = block.diverged[:10]
        return out


class LosslessChecks:
    """The check on several prompt sets (a traffic's classes) over the same two servers: each server serves every
    set while it is up (``run_plain`` / ``run_speculative``), one result per set (``results``)."""

    def __init__(self, spec: DecodeSpec, sets: list[tuple[str, list[dict[str, Any]]]], *, speculative: str,  # Any: JSON values
                 confidence: float = 0.95) -> None:
        self.checks = [LosslessCheck(spec, prompts, speculative=speculative, label=label, confidence=confidence)
                       for label, prompts in sets]
        self.speculative_ran = False  # the speculative server's passes were made (or tried)

    @property
    def measurable(self) -> bool:
        """Whether any set can still be measured (no pass of it has failed)."""
        return any(c.failed is None for c in self.checks)

    def run_plain(self, served: Served, events: Events) -> None:
        for c in self.checks:
            events.log(f"lossless: {c.label} on the server without speculation, twice (the reference, the floor)")
            c.run_plain(served, events)

    def run_speculative(self, served: Served, events: Events) -> None:
        self.speculative_ran = True
        for c in self.checks:
            events.log(f"lossless: {c.label} on the speculative server ({c.speculative})")
            c.run_speculative(served, events)

    def results(self) -> list[Lossless]:
        return [c.result() for c in self.checks]


class VariantChecks:
    """Several speculative settings, each against the SAME configuration without speculation, on the same prompt
    sets (bench.per_class: each variant on the baseline's settings, each class's own prompts): the reference
    server's two passes made once (``run_plain``, before any speculative server) and shared by every variant;
    each speculative server's pass (``run_speculative``) under its label; ``result(label, set)``."""

    def __init__(self, spec: DecodeSpec, sets: list[tuple[str, list[dict[str, Any]]]], variants: dict[str, str], *,  # Any: JSON values
                 confidence: float = 0.95) -> None:
        self.by_variant = {label: LosslessChecks(spec, sets, speculative=words, confidence=confidence)
                           for label, words in variants.items()}

    def run_plain(self, served: Served, events: Events) -> None:
        checks = list(self.by_variant.values())
        if not checks:
            return
        assert not any(c.speculative_ran for c in checks), "the reference runs first: the variants share its passes"
        checks[0].run_plain(served, events)
        for other in checks[1:]:
            for mine, ref in zip(other.checks, checks[0].checks):
                mine.plain, mine.again, mine.failed = ref.plain, ref.again, ref.failed

    def run_speculative(self, label: str, served: Served, events: Events) -> None:
        self.by_variant[label].run_speculative(served, events)

    def result(self, label: str, prompts: str) -> Lossless | None:
        """The variant's check on one prompt set ("class NAME"); None for a variant or set not checked."""
        checks = self.by_variant.get(label)
        found = next((c for c in checks.checks if c.label == prompts), None) if checks is not None else None
        return found.result() if found is not None else None


def _own(raw: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values
    """A raw without its teacher-forced values: what a second pass is forced on (its own greedy tokens)."""
    own = DecodeRaw.from_dict(raw)
    return replace(own, prompts=[replace(p, forced=None) for p in own.prompts]).to_dict()


def all_lossless(results: list[Lossless]) -> Lossless | None:
    """The first check that is not lossless (what a configuration loses by), else the first not measured, else
    None (every one lossless, or none run)."""
    bad = [r for r in results if r.lossless is False]
    if bad:
        return bad[0]
    return next((r for r in results if r.lossless is None), None)
