"""The as-served phases' blocks (results.json ``pooled.lm_eval`` and ``pooled.decode``) as rows of plain text for
people: `infertool eval`'s tables and the run report's eval section show the same figures the same way.

A results.json may come from an older version or from someone else: every figure is read tolerantly (a missing
or malformed value reads "-"), never an exception.
"""

from __future__ import annotations

from infertool.evaluate.verdict import fmt

LM_EVAL_HEADER = ["task", "metric", "n", "base", "candidate", "recovery [interval]", "lost", "gained", "McNemar p"]


def _num(x) -> float | None:
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _f(x) -> str:
    return fmt(_num(x))


def _n(x) -> str:
    """A count (documents, steps, prompts): 1,234."""
    x = _num(x)
    return "-" if x is None else f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _pct(x) -> str:
    x = _num(x)
    return "-" if x is None else f"{x:.1%}"


def _ci(ci, f=_f) -> str:
    """``[lo, hi]`` of an interval (a list in results.json; anything else reads "[-, -]")."""
    lo, hi = (list(ci) + [None, None])[:2] if isinstance(ci, (list, tuple)) else (None, None)
    return f"[{f(lo)}, {f(hi)}]"


def lm_eval_rows(block: dict) -> list[list[str]]:
    """Per lm-eval task: base and candidate score, recovery [interval], documents lost / gained, the exact McNemar
    p; the last row pools every task. The header is LM_EVAL_HEADER."""
    rows = []
    tasks = given if isinstance(given := block.get("tasks"), dict) else {}
    for name, t in tasks.items():
        if not isinstance(t, dict):
            continue
        p = _num(t.get("mcnemar_p"))
        rows.append([str(name), str(t.get("metric") or ""), _n(t.get("n")), _f(t.get("base")), _f(t.get("candidate")),
                     f"{_f(t.get('recovery'))} {_ci(t.get('recovery_ci'))}", _n(t.get("lost")), _n(t.get("gained")),
                     "-" if p is None else f"{p:.3g}"])
    rows.append(["all tasks", "", _n(block.get("n")), "", "", f"{_f(block.get('recovery'))} {_ci(block.get('recovery_ci'))}",
                 _n(block.get("lost")), _n(block.get("gained")), ""])
    return rows


def task_code_note(block: dict) -> str | None:
    """Whether the task folder's own code ran (``task_code``: eval.lm_eval.trust_code), as one line; None when
    the block records none (no include path, or nothing in it that runs code)."""
    given = block.get("task_code")
    tc: dict = given if isinstance(given, dict) else {}
    listed = tc.get("ran")
    ran: list = listed if isinstance(listed, list) else []
    if not ran:
        return None
    return (f"task code ran (eval.lm_eval.trust_code: true): {len(ran)} reference(s) in "
            f"{tc.get('include_path')!s}: " + "; ".join(str(r) for r in ran[:5]) + ("; ..." if len(ran) > 5 else ""))


def decode_rows(block: dict) -> list[tuple[str, str]]:
    """The decode path as served: (figure, value) rows: prompts, exact match, first divergence, divergences and
    near ties, decode KLD, top-1 agreement; one row saying why when the phase was skipped."""
    if block.get("skipped"):
        return [("not measured", str(block["skipped"]))]
    return [
        ("prompts", f"{_n(block.get('n_prompts'))} ({'chat template' if block.get('chat') else 'plain text'}, greedy, "
                    f"up to {_n(block.get('max_tokens'))} tokens)"),
        ("exact match", f"{_pct(block.get('exact_match'))} {_ci(block.get('exact_match_ci'), _pct)}"),
        ("first divergence (median)", f"token {_n(block.get('first_divergence_median'))} "
                                      f"{_ci(block.get('first_divergence_ci'), _n)} (a prompt that never diverges counts "
                                      "as max tokens)"),
        ("divergences", f"{_n(block.get('divergences'))}, and {_n(block.get('near_ties'))} near ties (reference top-2 "
                        f"gap < {_f(block.get('near_tie_logprob'))} nats: counted apart, not as damage)"),
        ("decode KLD", f"{_f(block.get('kld'))} {_ci(block.get('kld_ci'))} over {_n(block.get('steps'))} decode steps "
                       f"({block.get('kld_kind') or 'top-k'}, teacher-forced on the same tokens; "
                       f"{_n(block.get('prefill_steps'))} prefill positions left out; interval clustered by prompt)"),
        ("same top-1", f"{_pct(block.get('top1'))} {_ci(block.get('top1_ci'), _pct)}"),
    ] + _examples(block.get("diverged"))


SHOWN_EXAMPLES = 3  # diverged prompts shown with both continuations
EXAMPLE_CHARS = 120


def _examples(diverged) -> list[tuple[str, str]]:
    """The first diverged prompts, each with both greedy continuations (cut): what a user would see differ."""
    rows = []
    for d in (diverged if isinstance(diverged, list) else [])[:SHOWN_EXAMPLES]:
        if not isinstance(d, dict):
            continue
        cut = lambda t: repr(t[:EXAMPLE_CHARS] + ("..." if len(t) > EXAMPLE_CHARS else "")) if isinstance(t, str) else "-"  # noqa: E731
        rows.append((f"{d.get('id')}: diverges at token {_n(d.get('at'))}" + (" (near tie)" if d.get("near_tie") else ""),
                     f"reference {cut(d.get('reference'))} / candidate {cut(d.get('candidate'))}"))
    return rows
