"""What a run's report decides: should the quantized candidate ship?

Pure functions over what a run directory holds (manifest.json and the stages' JSON: quantize.json,
results.json, bench.json), no I/O:

- who was compared, named as a person names a model (``ModelRef.label``: its source and quantization), never
  by a cache path;
- what the candidate gains: weight bytes before/after (quantize), served output tokens/s and $ per 1M output
  tokens of the original and the candidate, both measured in the same run with the same traffic and SLO;
- what it costs: the eval gates with their intervals;
- the verdict, the decision it implies, and the next thing to try when the verdict is FAIL or INCONCLUSIVE,
  derived from which gate failed and from the recipe's quantization.
"""

from __future__ import annotations

import math

from infertool.resolve import ACTIVATION_SCHEMES
DISTRIBUTION_GATES = ("max_mean_kld", "min_top1", "max_ppl_ratio")
ACCURACY_GATES = ("max_acc_drop", "max_flip_rate")


def dig(d, *path):
    """d[path[0]][path[1]]...; None where a step is missing or not a dict (manifests from older runs)."""
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _ratio(a, b) -> float | None:
    """b / a, when both are numbers and a is not 0."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
        return b / a
    return None


# ------------------------------------------------------------------------------------------- names
def model_names(manifest: dict, data: dict) -> dict:
    """{"original": label, "candidate": label or None, "served": label, "served_origin": ...}: the labels of
    the run's resolution (manifest), else of the stages' own records."""
    res = manifest.get("resolution") or {}
    stages = manifest.get("stages") or {}
    ev, be = data.get("eval") or {}, data.get("bench") or {}
    recipe = manifest.get("recipe") or {}
    original = (dig(res, "base", "label") or dig(stages, "model", "summary", "label") or dig(ev, "base", "label")
                or dig(be, "original", "label") or dig(recipe, "model", "source"))
    candidate = None
    if recipe.get("quantize") is not None or data.get("quantize"):
        candidate = (dig(res, "candidate", "label") or dig(stages, "quantize", "summary", "label")
                     or dig(data, "quantize", "resolution", "candidate", "label") or dig(ev, "candidate", "label"))
    served = (dig(res, "served", "label") or dig(be, "served", "label") or be.get("label")
              or dig(stages, "serve", "summary", "label") or (original if candidate is None else None))
    return {"original": original, "candidate": candidate, "served": served,
            "served_origin": res.get("served_origin") or dig(be, "served", "origin")}


# ------------------------------------------------------------------------------------------- gains
def weights(data: dict) -> dict | None:
    size = dig(data, "quantize", "size") or {}
    b, a = size.get("weight_bytes_before"), size.get("weight_bytes_after")
    if not (isinstance(b, (int, float)) and isinstance(a, (int, float)) and b):
        return None
    return {"original": b, "candidate": a, "ratio": a / b}


def _summary_of(level: dict) -> dict:
    return level.get("summary") or level


def _pair(a, b) -> dict:
    return {"original": a, "candidate": b, "ratio": _ratio(a, b)}


def speed(data: dict) -> dict:
    """The original and the candidate as served, level by level (same traffic and SLO), and the headline
    level: the heaviest closed-loop load (the last concurrency level), else the last level.

    status: "measured" | "nothing to compare" (the served model is the original, said why) | "not measured"."""
    be = data.get("bench")
    if not be:
        return {"status": "not measured", "why": "the run has no bench stage", "rows": []}
    comp = be.get("comparison") or {}
    if comp.get("nothing_to_compare"):
        return {"status": "nothing to compare", "why": comp["nothing_to_compare"], "rows": [],
                "settings": be.get("settings")}
    orig = be.get("original")
    if not orig:
        return {"status": "not measured", "rows": [], "settings": be.get("settings"),
                "why": "this run's bench measured the served model only (the original is measured beside the "
                       "candidate when the recipe has a quantize section and a bench section)"}
    by_label = {lv["level"]["label"]: lv for lv in orig.get("levels", [])}
    rows = []
    for lv in be.get("levels", []):
        o = by_label.get(lv["level"]["label"])
        if o is None:
            continue
        c, s = _summary_of(lv), _summary_of(o)
        rows.append({
            "level": lv["level"]["label"], "kind": lv["level"].get("kind"),
            "output_tok_s": _pair(s.get("output_token_throughput"), c.get("output_token_throughput")),
            "cost_per_1m": _pair(dig(s, "cost", "per_1m_output_tokens"), dig(c, "cost", "per_1m_output_tokens")),
            "goodput": _pair(dig(s, "goodput", "fraction"), dig(c, "goodput", "fraction")),
            "tpot_p50_ms": _pair(dig(s, "tpot_ms", "p50"), dig(c, "tpot_ms", "p50")),
            "ttft_p50_ms": _pair(dig(s, "ttft_ms", "p50"), dig(c, "ttft_ms", "p50")),
            "failed": {"original": s.get("failed"), "candidate": c.get("failed")},
        })
    if not rows:
        return {"status": "not measured", "rows": [], "settings": be.get("settings"),
                "why": "the original and the candidate have no load level in common"}
    conc = [r for r in rows if r["kind"] == "concurrency"]
    return {"status": "measured", "rows": rows, "headline": (conc or rows)[-1], "settings": be.get("settings"),
            "dtype": {"original": _served_dtype(orig), "candidate": _served_dtype(be)}}


def _served_dtype(report: dict) -> str | None:
    """The --dtype vLLM was started with for a bench report's (first) server; 'auto' when none was passed."""
    argv = dig((report.get("servers") or [None])[0], "argv")
    if not isinstance(argv, list):
        return None
    return argv[argv.index("--dtype") + 1] if "--dtype" in argv[:-1] else "auto"


# ------------------------------------------------------------------------------------------- verdict
def _severity(g: dict) -> float:
    """How far a failed gate is beyond its threshold, as a multiple of the allowed loss (1 = at the threshold)."""
    est, thr = g.get("estimate"), g.get("threshold")
    if not isinstance(est, (int, float)) or not isinstance(thr, (int, float)):
        return 1.0
    if g["name"].startswith("min_"):  # a floor on agreement: compare the losses 1 - x
        return (1 - est) / max(1 - thr, 1e-9)
    if g["name"] == "max_ppl_ratio":
        return (est - 1) / max(thr - 1, 1e-9)
    return est / thr if thr else math.inf


def quant_bits(q: dict | None) -> int | None:
    if not q:
        return None
    scheme = q.get("scheme") or ""
    if scheme.startswith(("W8", "FP8")):
        return 8
    if scheme.startswith("W4"):
        return 4
    return q.get("bits")


def next_steps(verdict: str | None, gates: list[dict], quantize: dict | None, *, target_kind: str = "cpu",
               eval_section: dict | None = None, not_served_here: str | None = None) -> list[str]:
    """What to try next, derived from which gates failed (or could not decide) and the recipe's quantization.
    ``not_served_here``: why this host served the original instead of the candidate (then only what this
    host can serve is said to run here). Empty for PASS and when there is no verdict."""
    if verdict not in ("FAIL", "INCONCLUSIVE") or not quantize:
        return []
    ev = eval_section or {}
    out: list[str] = []
    quant = _quantization_options(quantize, target_kind)
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
        open_ = [g for g in gates if g.get("status") == "INCONCLUSIVE"]
        sized = [g for g in open_ if g.get("n_needed")]
        if sized:
            what = "more eval items: " + ", ".join(f"about {g['n_needed']:,} {g.get('unit') or 'items'} would decide "
                                                  f"{g['name']} (now {g.get('n') or 0:,})" for g in sized)
            mi = ev.get("max_items")
            factor = max(g["n_needed"] / g["n"] for g in sized if g.get("n")) if any(g.get("n") for g in sized) else None
            if mi and factor:
                what += f": eval.max_items: {math.ceil(mi * factor):,} (now {mi}), or a larger suite if this one has fewer"
            else:
                what += ": a larger suite (every item of this one is scored now)"
            out.append(what)
        for g in open_:
            if not g.get("n_needed"):
                out.append(f"{g['name']}: the estimate sits on its threshold ({g.get('threshold')}): more items will not "
                           f"decide it; decide the threshold itself (eval.accept.{g['name']})")
        leaning = [g for g in open_ if _leans_bad(g)]
        if leaning and quant:
            out.append(f"{', '.join(g['name'] for g in leaning)}: the estimate is already beyond the threshold, so more "
                       f"items will likely make it FAIL; meanwhile try {ordered(False)[0]}")
        return out
    failed = [g for g in gates if g.get("status") == "FAIL"]
    names = [g["name"] for g in failed]
    if failed and all(n in ACCURACY_GATES for n in names):
        out.append(f"the failing gates are task accuracy ({', '.join(names)}), not the token distribution: read the "
                   "items that flipped (eval/items.jsonl) before changing the quantization")
    bits = quant_bits(quantize)
    if bits is not None and bits >= 8:
        scheme = quantize.get("scheme") or ""
        if scheme in ACTIVATION_SCHEMES and target_kind == "gpu":
            out.append(f"{scheme} quantizes activations too: weight-only 8-bit (quantize.scheme: W8A16, or "
                       "quantize.bits: 8 with GPTQ) keeps them in 16 bits")
        out.append("8-bit already fails these gates: check that the thresholds suit this model (a small model loses "
                   "more than an 8B one; eval.accept), or keep the original (serve.model: original)")
        return out
    out += ordered(max((_severity(g) for g in failed), default=1.0) >= 2.0)
    return out


def _leans_bad(g: dict) -> bool:
    est, thr = g.get("estimate"), g.get("threshold")
    if not isinstance(est, (int, float)) or not isinstance(thr, (int, float)):
        return False
    return est < thr if g["name"].startswith("min_") else est > thr


def _quantization_options(q: dict, target_kind: str) -> list[str]:
    """Gentler or better quantizations than ``q`` (a recipe's quantize section), most promising first:
    8-bit, a smaller group, activation order, the other 4-bit method, more calibration text."""
    opts: list[str] = []
    method, backend = q.get("method"), q.get("backend") or "gptqmodel"
    if method == "bnb" or (quant_bits(q) or 4) >= 8:
        return opts
    if target_kind == "cpu":
        opts.append("8-bit: on a CPU that is W8A8 int8 through llm-compressor (quantize: {method: gptq, backend: "
                    "llmcompressor, scheme: W8A8, bits: 8}; eval.engine: vllm, since only the server quantizes "
                    "activations; recipes/smollm2-w8-cpu.yaml is one): half the weight bytes of 16-bit instead of about a quarter")
    else:
        opts.append("8-bit: quantize.bits: 8 (weight-only GPTQ; or scheme: W8A16 / FP8_DYNAMIC with llm-compressor): "
                    "half the weight bytes of 16-bit instead of about a quarter")
    g = q.get("group_size")
    if isinstance(g, int) and (g == -1 or g > 32):
        smaller = 128 if g == -1 else g // 2
        opts.append(f"a smaller group size: quantize.group_size: {smaller} (now {g}; it must divide every quantized "
                    "in_features, which infertool quantize RECIPE --check tells in seconds)")
    if method == "gptq" and backend == "gptqmodel" and not q.get("desc_act"):
        opts.append("activation order: quantize.desc_act: true (GPTQ quantizes the most important columns first)")
    if method == "gptq":
        opts.append("AWQ: quantize.method: awq (4-bit with activation-aware scales)")
    elif method == "awq":
        opts.append("GPTQ: quantize.method: gptq (4-bit with error compensation)")
    samples = dig(q, "calibration", "samples")
    if isinstance(samples, int) and samples < 128:
        opts.append(f"more calibration text: quantize.calibration.samples: 128 (now {samples})")
    return opts


def _gate_names(gates: list[dict], status: str) -> str:
    names = [g["name"] for g in gates if g.get("status") == status]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1] if names else "a gate"


def decision(verdict: str | None, gates: list[dict], names: dict, gains: dict, size: dict | None,
             has_quantize: bool) -> dict:
    """The sentence the summary leads with, a short title, and whether it says to ship the candidate (True /
    False / None: nothing to decide, or a trade-off the reader must weigh)."""
    if not has_quantize:
        return {"ship": None, "title": "no quantization to decide",
                "text": f"Nothing to decide about quantization: the recipe has no quantize section "
                        f"(the served model is {names.get('served') or names.get('original')})."}
    if verdict is None:
        return {"ship": None, "title": "no verdict",
                "text": "No verdict: this run has no eval stage, so nothing says whether the candidate kept the "
                        "original's accuracy (add an eval section, or drop --stages)."}
    head = gains.get("headline") if gains.get("status") == "measured" else None
    r = head["output_tok_s"]["ratio"] if head else None
    faster = (f"{r:.2f}x the output tokens/s of the original at {head['level']}" if r is not None else None)
    if verdict == "FAIL":
        n = sum(g.get("status") == "FAIL" for g in gates)
        return {"ship": False, "title": "do not ship the candidate",
                "text": f"Do not ship the candidate: it fails the {_gate_names(gates, 'FAIL')} gate{'s' if n > 1 else ''} "
                        f"(the whole interval beyond the threshold)" + (f", although it serves {faster}" if r and r >= 1 else "") + "."}
    if verdict == "INCONCLUSIVE":
        return {"ship": False, "title": "not decided yet",
                "text": f"Not decided: the eval cannot yet tell whether the candidate stays within "
                        f"{_gate_names(gates, 'INCONCLUSIVE')} (the interval straddles the threshold); do not ship it "
                        "until it can (see what to try next)."}
    w = f"{size['ratio']:.2f}x the weight bytes" if size else None
    if gains.get("status") == "nothing to compare" and names.get("served_origin") == "original":
        return {"ship": None, "title": "passes, but not served here",
                "text": f"The candidate passes every accuracy gate{' in ' + w if w else ''}, but it was not served here: "
                        f"{gains.get('why')}. What it gains in speed was not measured: ship it where vLLM can run it, "
                        "and measure it there."}
    if head is None:
        return {"ship": True, "title": "ship the candidate",
                "text": f"Ship the candidate on accuracy: it passes every gate{' in ' + w if w else ''}; its speed against "
                        f"the original was not measured ({gains.get('why') or gains.get('status')})."}
    cost = head["cost_per_1m"]["ratio"]
    cost_txt = f", {cost:.2f}x the $ per 1M output tokens" if cost is not None else ""
    if r is None:
        return {"ship": True, "title": "ship the candidate",
                "text": f"Ship the candidate on accuracy: it passes every gate; its throughput at {head['level']} could "
                        "not be compared (no request completed there)."}
    if r >= 1.0:
        return {"ship": True, "title": "ship the candidate",
                "text": f"Ship the candidate: it passes every accuracy gate and serves {faster}{cost_txt}"
                        f"{', in ' + w if w else ''}."}
    return {"ship": None, "title": "passes, but saves memory only",
            "text": f"The candidate passes every accuracy gate but serves only {faster} on this host{cost_txt}: it saves "
                    f"memory{' (' + w + ')' if w else ''}, not time or money. Ship it where memory is the limit; else "
                    "serve the original."}


def summarize_run(manifest: dict, data: dict) -> dict:
    """Everything the summary section shows, as data."""
    recipe = manifest.get("recipe") or {}
    ev = data.get("eval") or {}
    names = model_names(manifest, data)
    size = weights(data)
    gains = speed(data)
    verdict = ev.get("verdict") or dig(manifest, "stages", "eval", "summary", "verdict")
    reason = ev.get("reason") or dig(manifest, "stages", "eval", "summary", "reason")
    gates = ev.get("gates") or dig(manifest, "stages", "eval", "summary", "gates") or []
    has_quantize = recipe.get("quantize") is not None or bool(data.get("quantize"))
    target_kind = dig(manifest, "target", "kind") or "cpu"
    dec = decision(verdict, gates, names, gains, size, has_quantize)
    return {"names": names, "weights": size, "speed": gains, "verdict": verdict, "reason": reason, "gates": gates,
            "decision": dec, "eval": {"suite": dig(ev, "suite", "name"), "engine": ev.get("engine"),
                                      "confidence": dig(ev, "settings", "accept", "confidence")},
            "next": next_steps(verdict, gates, recipe.get("quantize"), target_kind=target_kind,
                               eval_section=recipe.get("eval"),
                               not_served_here=gains.get("why") if gains.get("status") == "nothing to compare"
                               and names.get("served_origin") == "original" else None)}
