"""What an eval compares, decided in ONE place: ``plan(res, EvalOptions) -> EvalPlan`` (infertool.capability).

The command (`infertool eval`), `run`'s eval stage and a dry run all go through it:

- the eval section: the recipe's, with what the caller asks on top (``EvalOptions``: --suite, --engine,
  --url, --max-items, --preset), validated by the recipe's own rules;
- the two models: for the hf and vllm engines, the resolution's base and candidate (``--base`` /
  ``--candidate`` / eval.base / eval.candidate are ``resolve.Overrides``: the one resolution, never a
  ModelRef patched afterwards); for the openai engine, served model NAMES on a running server;
- the vLLM launches of the vllm engine (the recipe's serve settings: what you serve is what you test);
- whether the candidate's calibration text overlaps the suite (held out or not);
- the API key of the openai engine: only to URLs the user gave (infertool.trust.key_for).

A dry-run plan (``EvalOptions(dry_run=True)``) needs neither the models nor the serve environment; a plan to run
converts a bundled/GGUF base into the cache (once) and checks the candidate is there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertool.errors import UsageError
from infertool.evaluate.result import HeldOut

if TYPE_CHECKING:
    from infertool.recipe import EvalSection, Recipe
    from infertool.resolve import ModelRef, Overrides, Resolution
    from infertool.serve.launches import LaunchPlan

TOPK = 20  # the server engines' top-K prompt log-probabilities (the KLD is computed from them)
VLLM_MAX_LOGPROBS = 20  # vLLM's default --max-logprobs (ModelConfig.max_logprobs, vllm 0.32)


def logprobs_args(k: int) -> tuple[str, ...]:
    """The launch arguments a server needs to answer ``k`` log-probabilities a position: --max-logprobs past
    vLLM's default, nothing within it (so such a launch shares a server with those that pass none)."""
    return ("--max-logprobs", str(k)) if k > VLLM_MAX_LOGPROBS else ()


@dataclass(frozen=True)
class EvalOptions:
    """What a command line or a stage asks of an eval beyond the recipe (None: the recipe's eval section).

    - ``base`` / ``candidate``: for the hf and vllm engines, the original model (a directory, a .gguf,
      bundled:NAME) and the quantized model directory instead of model.source / quantize.output;
    - ``base_name`` / ``candidate_name``: for the openai engine, the served model names (as /v1/models lists
      them) instead of eval.base / eval.candidate;
    - ``url`` / ``candidate_url``: the openai engine's server(s);
    - ``key_urls``: the URLs the user gave (the command line's --url, --candidate-url, --set eval.url=...): the
      only ones serve.api_key_env's key may go to, besides those INFERTOOL_KEY_URLS allows;
    - ``out_dir``: where results.json, items.jsonl and the histogram go (default: out/eval/SUITE-TIMESTAMP);
    - ``allow_inconclusive``: INCONCLUSIVE is accepted (as eval.accept.allow_inconclusive says);
    - ``dry_run``: a plan to show, not to run (no model is converted or checked).
    """

    suite: str | None = None
    engine: str | None = None
    url: str | None = None
    candidate_url: str | None = None
    base: str | None = None
    candidate: str | None = None
    base_name: str | None = None
    candidate_name: str | None = None
    max_items: int | None = None
    preset: str | None = None
    out_dir: Path | None = None
    allow_inconclusive: bool = False
    dry_run: bool = False
    key_urls: tuple[str, ...] = ()

    def given(self, recipe: Recipe, sets: list[str] | None = None) -> EvalOptions:
        """These options as a command line gives them: ``base`` / ``candidate`` are served model names for the openai
        engine; the URLs given (url, candidate_url, ``--set eval.url=...`` in ``sets``) are the only ones an API key
        may go to (never one from the recipe file alone)."""
        given = [s.split("=", 1)[1].strip().strip("'\"") for s in sets or [] if s.startswith("eval.url=")]
        opts = replace(self, key_urls=tuple(u for u in (self.url, self.candidate_url, *given) if u))
        if engine_of(recipe, opts) == "openai":
            return replace(opts, base=None, candidate=None, base_name=self.base, candidate_name=self.candidate)
        return opts


@dataclass
class EvalPlan:
    """Everything an eval's run needs; ``to_dict()`` is its dry run (never the API key).

    ``base`` / ``candidate`` are what the engine is given: model directories (hf, vllm) or served model names
    (openai); ``base_ref`` / ``candidate_ref`` are the resolution's models behind them (hf, vllm).
    """

    engine: str  # hf | vllm | openai
    suite: str
    base: str
    candidate: str
    base_label: str | None = None  # how a person names the base
    candidate_label: str | None = None
    base_source: str | None = None  # what the user wrote for the base (e.g. bundled:smollm2-135m)
    base_ref: ModelRef | None = None  # (hf, vllm)
    candidate_ref: ModelRef | None = None
    url: str | None = None
    candidate_url: str | None = None
    seq_len: int = 512
    batch_size: int = 8
    max_items: int | None = None
    topk: int = TOPK
    accept: dict[str, Any] = field(default_factory=lambda: {"preset": "standard"})  # Any: JSON values; eval.accept (recipe.AcceptSpec)
    launches: dict[str, LaunchPlan] | None = None  # vllm: {"candidate": ..., "base": ...} (infertool.serve.prepare)
    held_out: HeldOut | None = None
    trust_remote_code: bool = False  # model.trust_remote_code, for the hf engine's loaders
    out_dir: Path | None = None
    allow_inconclusive: bool = False
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)  # the resolution's (a model not made yet, a fallback)
    resolution: Resolution | None = field(default=None, repr=False)
    api_key: str | None = field(default=None, repr=False)
    eval_section: EvalSection | None = field(default=None, repr=False)  # lm_eval, decode (the as-served phases)

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        from infertool.evaluate.verdict import thresholds

        return {
            "dry_run": self.dry_run, "engine": self.engine, "suite": self.suite,
            "base": {"model": self.base, "label": self.base_label, "source": self.base_source},
            "candidate": {"model": self.candidate, "label": self.candidate_label},
            "url": self.url, "candidate_url": self.candidate_url, "sends_api_key": self.api_key is not None,
            "settings": {"seq_len": self.seq_len, "batch_size": self.batch_size, "max_items": self.max_items,
                         "topk": self.topk if self.engine != "hf" else None, "accept": self.accept,
                         "thresholds": thresholds(self.accept)},
            "allow_inconclusive": self.allow_inconclusive, "out_dir": str(self.out_dir) if self.out_dir else None,
            "held_out": self.held_out.to_dict() if self.held_out else None, "notes": list(self.notes),
            "resolution": self.resolution.to_dict() if self.resolution is not None else None,
            "launches": {k: p.to_dict() for k, p in (self.launches or {}).items()},
            "lm_eval": (self.eval_section.lm_eval.model_dump(mode="json")
                        if self.eval_section is not None and self.eval_section.lm_eval is not None else None),
            "decode": (self.eval_section.decode.model_dump(mode="json")
                       if self.eval_section is not None and self.engine != "hf" and self.eval_section.decode.enabled
                       else None),
        }


# ------------------------------------------------------------------------------------------- the plan
def make_plan(res: Resolution, options: EvalOptions) -> EvalPlan:
    """The eval of ``res`` (infertool.resolve.Resolution) as ``options`` ask: see the module docstring."""
    from infertool.data.formats import served_only
    from infertool.data.suites import load_suite

    ev = eval_section(res.recipe, options)
    suite = load_suite(ev.suite)  # an unknown suite fails here, a dry run too ("did you mean ...")
    served_only([(t.name, t.type) for t in suite.tasks], ev.engine)  # json / tool_call: not the hf engine
    if ev.engine != "hf" and ev.decode.enabled:  # the decode prompts, read and checked before any server
        from infertool.evaluate.decode import load_prompts

        load_prompts(str(ev.decode.prompts))
    common: dict[str, Any] = dict(suite=ev.suite, seq_len=ev.seq_len, batch_size=ev.batch_size, max_items=ev.max_items,  # Any: JSON values
                  accept=ev.accept.model_dump(), out_dir=options.out_dir, dry_run=options.dry_run,
                  allow_inconclusive=options.allow_inconclusive or ev.accept.allow_inconclusive, eval_section=ev)
    if ev.engine == "openai":
        base, cand = served_names(options.base_name or ev.base, options.candidate_name or ev.candidate)
        key = None if options.dry_run else api_key(res.recipe, ev.url, options)
        return EvalPlan("openai", base=base, candidate=cand, base_label=base, candidate_label=cand, base_source=base,
                        url=ev.url, candidate_url=options.candidate_url, api_key=key, notes=list(res.notes),
                        resolution=res, **common)
    res = eval_resolution(res, ev, options)
    base_ref, cand_ref = compared_models(res, dry_run=options.dry_run)
    launches = vllm_launches(res, ev.seq_len, dry_run=options.dry_run) if ev.engine == "vllm" else None
    given = options.base or options.candidate or ev.base or ev.candidate
    held = None if (given or options.dry_run) else held_out_check(res, ev.suite)
    trust = bool(res.recipe.model.trust_remote_code) if ev.engine == "hf" else False
    if trust and not options.dry_run:  # the vllm engine's launches say it themselves (infertool.serve.prepare)
        from infertool.trust import announce_remote_code

        announce_remote_code(res.recipe.model.source, trust)
    return EvalPlan(ev.engine, base=base_ref.path or base_ref.source, candidate=cand_ref.dir,
                    base_label=base_ref.label, candidate_label=cand_ref.label, base_source=base_ref.source,
                    base_ref=base_ref, candidate_ref=cand_ref, launches=launches, held_out=held,
                    trust_remote_code=trust, notes=list(res.notes), resolution=res, **common)


def served_names(base: str | None, candidate: str | None) -> tuple[str, str]:
    """The openai engine's two models: names on a running server, both needed."""
    if not base or not candidate:
        raise UsageError("engine openai needs the served model names of both models",
                         hint="pass --base NAME --candidate NAME (as /v1/models lists them), or set eval.base and eval.candidate")
    return base, candidate


def eval_section(recipe: Recipe, options: EvalOptions) -> EvalSection:
    """The recipe's eval section with the options' suite, engine, url, max_items and preset on top, checked
    by the recipe's own rules (an openai engine needs a url, a known preset, ...)."""
    from pydantic import ValidationError

    from infertool.recipe import EvalSection

    ev = recipe.eval or EvalSection()
    changes: dict[str, Any] = {k: v for k, v in (("suite", options.suite), ("engine", options.engine),  # Any: JSON values
                                                 ("url", options.url), ("max_items", options.max_items)) if v is not None}
    if options.preset is not None:
        changes["accept"] = {**ev.accept.model_dump(), "preset": options.preset}
    if not changes:
        return ev
    try:
        return EvalSection.model_validate({**ev.model_dump(), **changes})
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(p) for p in first.get("loc") or ()] + [str(f) for f in [(first.get("ctx") or {}).get("field")] if f]
        where = ".".join(["eval", *loc])
        flag = {"eval.suite": "--suite", "eval.engine": "--engine", "eval.url": "--url", "eval.max_items": "--max-items",
                "eval.accept.preset": "--preset"}.get(where)
        raise UsageError(f"{where}: {first.get('msg')}", hint=(f"check {flag} (or {where} in the recipe); " if flag else "")
                         + "`infertool eval run --help` lists the options and their values") from None


def engine_of(recipe: Recipe, options: EvalOptions) -> str:
    return options.engine or (recipe.eval.engine if recipe.eval is not None else "hf")


def overrides(recipe: Recipe, options: EvalOptions) -> Overrides:
    """The models an eval names besides the recipe's (``options`` first, then eval.base / eval.candidate), as
    inputs of ``resolve()``; none for the openai engine, whose models are names on a server."""
    from infertool.resolve import Overrides

    if engine_of(recipe, options) == "openai":
        return Overrides()
    ev = recipe.eval
    return Overrides(base=options.base or (ev.base if ev else None),
                     candidate=options.candidate or (ev.candidate if ev else None))


def eval_resolution(res: Resolution, ev: EvalSection, options: EvalOptions) -> Resolution:
    """``res`` when it resolved the models the eval names (``overrides``), else the recipe resolved again with
    them (a candidate the caller resolved, such as `run`'s quantize entry, is kept when none is named)."""
    from infertool.resolve import Overrides, resolve

    base, cand = options.base or ev.base, options.candidate or ev.candidate
    named = (base and res.base.source != base) or (cand and (res.candidate is None or res.candidate.source != str(cand)))
    if not named:
        return res
    keep = res.candidate if not cand else None
    keep_path = keep.path if keep is not None and keep.exists and not keep.load_quantization else None
    return resolve(res.recipe, Overrides(base=base, candidate=cand), candidate_path=keep_path)


def compared_models(res: Resolution, *, dry_run: bool = False) -> tuple[ModelRef, ModelRef]:
    """(base, candidate): the resolution's models, checked: a candidate exists (unless a dry run) and is one
    vLLM can serve; a base infertool converts (bundled, GGUF: the recipe's or a named one) is converted when the
    plan is to run."""
    cand = res.candidate
    if cand is None:
        raise UsageError("no candidate model: the recipe has no quantize section and no eval.candidate",
                         hint="pass --candidate DIR (a quantized copy of the model), or add a quantize section "
                         "and run `infertool quantize RECIPE`")
    if cand.load_quantization:
        from infertool.backends.bnb import BNB_UNSERVABLE

        raise UsageError(BNB_UNSERVABLE + ": infertool evaluates what it can serve",
                         hint="quantize with gptq/awq (4-bit) or llm-compressor W8A8 (8-bit) instead")
    if dry_run:
        return res.base, cand
    if not (Path(cand.dir) / "config.json").is_file():
        raise UsageError(f"candidate model not found: {cand.path} is not a model directory (no config.json)",
                         hint="run `infertool quantize RECIPE` first, or pass --candidate DIR")
    return res.ensure(res.base), cand


def vllm_launches(res: Resolution, seq_len: int, *, dry_run: bool = False, topk: int = TOPK) -> dict[str, LaunchPlan]:
    """The two launches the vllm engine makes: the recipe's effective serve settings for each model (what
    you serve is what you test), plus --max-logprobs for the prompt log-probabilities when ``topk`` is more
    than vLLM's default (then `run`'s serve check and bench, which serve without it, share these servers)."""
    from infertool.serve import prepare as prepare_launch

    serve = res.serve_section
    if serve.max_model_len and serve.max_model_len < seq_len + 1:
        raise UsageError(f"serve.max_model_len {serve.max_model_len} is shorter than eval.seq_len {seq_len}: the model as "
                         "served cannot score these windows", hint=f"lower eval.seq_len or raise serve.max_model_len to {seq_len + 1}")
    extra = logprobs_args(topk)
    return {role: prepare_launch(res, model=model, purpose=f"eval ({role})", extra_args=extra, dry_run=dry_run)
            for role, model in (("candidate", res.candidate), ("base", res.base))}


def held_out_check(res: Resolution, suite_name: str) -> HeldOut | None:
    """Does the candidate's calibration text overlap the suite? From the candidate's quantize manifest (what it
    was really calibrated on), else from the recipe's calibration section."""
    from infertool.data.calibration import CalibrationInfo, read_texts
    from infertool.data.overlap import overlap
    from infertool.data.suites import load_suite
    from infertool.resolve import candidate_manifest

    q = res.recipe.quantize
    if res.candidate is None or res.candidate.load_quantization or (calib := getattr(q, "calibration", None)) is None:
        return None  # quantized when loaded, or without calibration data: no text to hold out
    cal = CalibrationInfo.from_dict((candidate_manifest(res.candidate) or {}).get("calibration"))
    source = cal.source or calib.source
    field = calib.text_field
    try:
        docs, kind, _ = read_texts(source, field)
    except UsageError:
        return HeldOut(calibration=source, why="the calibration text is not readable here")
    # corpus_part: the manifest's is an object, which HeldOut.corpus_part (a string) never held: results.json has null
    return HeldOut(calibration=source, checked=True, kind=kind, overlap=overlap(docs, load_suite(suite_name).texts()))


def api_key(recipe: Recipe, url: str | None, options: EvalOptions) -> str | None:
    """serve.api_key_env's key for the openai engine's server(s): sent only when every one of them is a URL
    the user gave (``options.key_urls``) or INFERTOOL_KEY_URLS allows; a key withheld is said once."""
    if recipe.serve is None or not recipe.serve.api_key_env:
        return None
    from infertool.trust import key_for

    key = None
    for target in dict.fromkeys(u for u in (url, options.candidate_url) if u):
        key = key_for(target, recipe.serve.api_key_env, user_urls=list(options.key_urls))
        if key is None:
            break
    return key
