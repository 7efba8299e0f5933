"""The as-served phases' blocks (``LmEvalComparison``, ``DecodeComparison``: results.json ``pooled.lm_eval`` and
``pooled.decode``) as rows of plain text for people: `infertool eval`'s tables and the run report's eval section
show the same figures the same way.

A results.json may come from an older version or from someone else: the records read it tolerantly (a missing or
malformed value is None, and reads "-" here), never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from infertool.evaluate.result import DecodeComparison, Diverged, LmEvalComparison
from infertool.evaluate.verdict import fmt

LM_EVAL_HEADER = ["task", "metric", "n", "base", "candidate", "recovery [interval]", "lost", "gained", "McNemar p"]


def _f(x: float | None) -> str:
    return fmt(x)


def _n(x: float | None) -> str:
    """A count (documents, steps, prompts): 1,234."""
    return "-" if x is None else f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _ci(ci: Sequence[float | None] | None, f: Callable[[float | None], str] = _f) -> str:
    """``[lo, hi]`` of an interval (None reads "[-, -]")."""
    lo, hi = (list(ci or []) + [None, None])[:2]
    return f"[{f(lo)}, {f(hi)}]"


def lm_eval_rows(block: LmEvalComparison) -> list[list[str]]:
    """Per lm-eval task: base and candidate score, recovery [interval], documents lost / gained, the exact McNemar
    p; the last row pools every task. The header is LM_EVAL_HEADER."""
    rows = []
    for name, t in block.tasks.items():
        p = t.mcnemar_p
        rows.append([name, t.metric, _n(t.n), _f(t.base), _f(t.candidate), f"{_f(t.recovery)} {_ci(t.recovery_ci)}",
                     _n(t.lost), _n(t.gained), "-" if p is None else f"{p:.3g}"])
    rows.append(["all tasks", "", _n(block.n), "", "", f"{_f(block.recovery)} {_ci(block.recovery_ci)}",
                 _n(block.lost), _n(block.gained), ""])
    return rows


def task_code_note(block: LmEvalComparison) -> str | None:
    """Whether the task folder's own code ran (``task_code``: eval.lm_eval.trust_code), as one line; None when
    the block records none (no include path, or nothing in it that runs code)."""
    tc = block.task_code
    if tc is None or not tc.ran:
        return None
    return (f"task code ran (eval.lm_eval.trust_code: true): {len(tc.ran)} reference(s) in "
            f"{tc.include_path!s}: " + "; ".join(tc.ran[:5]) + ("; ..." if len(tc.ran) > 5 else ""))


def decode_rows(block: DecodeComparison) -> list[tuple[str, str]]:
    """The decode path as served: (figure, value) rows: prompts, exact match, first divergence, divergences and
    near ties, decode KLD, top-1 agreement; one row saying why when the phase was skipped."""
    b = block
    if b.skipped:
        return [("not measured", b.skipped)]
    return [
        ("prompts", f"{_n(b.n_prompts)} ({'chat template' if b.chat else 'plain text'}, greedy, "
                    f"up to {_n(b.max_tokens)} tokens)"),
        ("exact match", f"{_pct(b.exact_match)} {_ci(b.exact_match_ci, _pct)}"),
        ("first divergence (median)", f"token {_n(b.first_divergence_median)} {_ci(b.first_divergence_ci, _n)} "
                                      "(a prompt that never diverges counts as max tokens)"),
        ("divergences", f"{_n(b.divergences)}, and {_n(b.near_ties)} near ties (reference top-2 "
                        f"gap < {_f(b.near_tie_logprob)} nats: counted apart, not as damage)"),
        ("decode KLD", f"{_f(b.kld)} {_ci(b.kld_ci)} over {_n(b.steps)} decode steps "
                       f"({b.kld_kind or 'top-k'}, teacher-forced on the same tokens; "
                       f"{_n(b.prefill_steps)} prefill positions left out; interval clustered by prompt)"),
        ("same top-1", f"{_pct(b.top1)} {_ci(b.top1_ci, _pct)}"),
    ] + _examples(b.diverged)


SHOWN_EXAMPLES = 3  # diverged prompts shown with both continuations
EXAMPLE_CHARS = 120


def _cut(t: str | None) -> str:
    return repr(t[:EXAMPLE_CHARS] + ("..." if len(t) > EXAMPLE_CHARS else "")) if t is not None else "-"


def _examples(diverged: list[Diverged]) -> list[tuple[str, str]]:
    """The first diverged prompts, each with both greedy continuations (cut): what a user would see differ."""
    return [(f"{d.id}: diverges at token {_n(d.at)}" + (" (near tie)" if d.near_tie else ""),
             f"reference {_cut(d.reference)} / candidate {_cut(d.candidate)}") for d in diverged[:SHOWN_EXAMPLES]]
