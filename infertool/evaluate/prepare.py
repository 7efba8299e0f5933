"""What an eval compares, decided from the recipe's resolution (the command and `run` share it): the two
models as the engine needs them, the vLLM launches of the vllm engine (the recipe's serve settings: what you
serve is what you test), and whether the candidate's calibration text overlaps the suite (held out or not).
"""

from __future__ import annotations

from pathlib import Path

from infertool.errors import UsageError


def held_out_check(res, suite_name: str) -> dict | None:
    """Does the candidate's calibration text overlap the suite? From the candidate's quantize manifest (what it
    was really calibrated on), else from the recipe's calibration section."""
    from infertool.data.calibration import read_texts
    from infertool.data.overlap import overlap
    from infertool.data.suites import load_suite
    from infertool.resolve import candidate_manifest

    q = res.recipe.quantize
    if res.candidate is None or res.candidate.load_quantization or getattr(q, "calibration", None) is None:
        return None  # quantized when loaded, or without calibration data: no text to hold out
    cal = ((candidate_manifest(res.candidate) or {}).get("calibration") or {})
    source = cal.get("source") or q.calibration.source
    field = q.calibration.text_field
    try:
        docs, kind, _ = read_texts(source, field)
    except UsageError:
        return {"calibration": source, "checked": False, "why": "the calibration text is not readable here"}
    ov = overlap(docs, load_suite(suite_name).texts())
    return {"calibration": source, "kind": kind, "checked": True, "overlap": ov.to_dict(),
            "corpus_part": cal.get("corpus_part")}


def eval_models(res, ev, base: str | None, candidate: str | None, engine: str, *, dry_run: bool = False):
    """(base, candidate, base source, labels) as the engine needs them: model directories
    (hf, vllm) or served model names (openai). Models come from the recipe's resolution unless given."""
    if engine == "openai":
        base = base or ev.base
        candidate = candidate or ev.candidate
        if not base or not candidate:
            raise UsageError("engine openai needs the served model names of both models",
                              hint="pass --base NAME --candidate NAME (as /v1/models lists them), or set eval.base and eval.candidate")
        return base, candidate, base, {"base": base, "candidate": candidate}
    from infertool.models.sources import resolve_model

    if base or ev.base:
        b_path = str(resolve_model(base or ev.base, dtype=res.recipe.model.dtype).path)
        b_label = base or ev.base
    else:
        if not dry_run:
            res.ensure(res.base)
        b_path, b_label = res.base.path or res.base.source, res.base.label
    if candidate or ev.candidate:
        cpath = Path(candidate or ev.candidate).expanduser()
        c_label = str(candidate or ev.candidate)
    else:
        cref = res.candidate
        if cref is None:
            raise UsageError("no candidate model: the recipe has no quantize section and no eval.candidate",
                              hint="pass --candidate DIR (a quantized copy of the model), or add a quantize section "
                              "and run `infertool quantize RECIPE`")
        if cref.load_quantization:
            from infertool.resolve import BNB_UNSERVABLE

            raise UsageError(BNB_UNSERVABLE + ": infertool evaluates what it can serve",
                             hint="quantize with gptq/awq (4-bit) or llm-compressor W8A8 (8-bit) instead")
        cpath, c_label = Path(cref.path), cref.label
    if not dry_run and not (cpath / "config.json").is_file():
        raise UsageError(f"candidate model not found: {cpath} is not a model directory (no config.json)",
                          hint="run `infertool quantize RECIPE` first, or pass --candidate DIR")
    return b_path, str(cpath.absolute()), res.base.source, {"base": b_label, "candidate": c_label}


VLLM_MAX_LOGPROBS = 20  # vLLM's default --max-logprobs (ModelConfig.max_logprobs, vllm 0.32)


def vllm_plans(res, ev, base_path: str, cand_path: str, *, dry_run: bool = False, topk: int = 20) -> dict:
    """The two launches the vllm engine makes: the recipe's effective serve settings for each model (what
    you serve is what you test), plus --max-logprobs for the prompt log-probabilities when ``topk`` is more
    than vLLM's default (then `run`'s serve check and bench, which serve without it, share these servers)."""
    from dataclasses import replace

    from infertool.serve import prepare

    serve = res.serve_section
    if serve.max_model_len and serve.max_model_len < ev.seq_len + 1:
        raise UsageError(f"serve.max_model_len {serve.max_model_len} is shorter than eval.seq_len {ev.seq_len}: the model as "
                          "served cannot score these windows", hint=f"lower eval.seq_len or raise serve.max_model_len to {ev.seq_len + 1}")
    base_ref = res.base if base_path == res.base.path else replace(res.base, path=base_path, exists=True, label=base_path)
    cand_ref = res.candidate if (res.candidate and cand_path == res.candidate.path) else None
    if cand_ref is None or cand_ref.load_quantization:
        from infertool.resolve import ModelRef

        cand_ref = cand_ref or ModelRef("candidate", cand_path, cand_path, Path(cand_path, "config.json").is_file(),
                                        cand_path, {"method": "given"}, name=Path(cand_path).name)
    extra = ("--max-logprobs", str(topk)) if topk > VLLM_MAX_LOGPROBS else ()
    return {"candidate": prepare(res, model=cand_ref, purpose="eval (candidate)", extra_args=extra, dry_run=dry_run,
                                 port=None if dry_run else _free(), check_port=False),
            "base": prepare(res, model=base_ref, purpose="eval (base)", extra_args=extra, dry_run=dry_run,
                            port=None if dry_run else _free(), check_port=False)}


def _free() -> int:
    from infertool.procs import free_port

    return free_port()
