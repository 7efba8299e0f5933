"""The built-in recipe checks, declared once each in ``BUILTIN`` (``checks/registry.py`` says how they run). Each is thin over
the module that owns its rule: serve/lint.py (what vLLM's start-up refuses), quantize/preflight.py (the quantized
layout against every layer), plan.py (the KV cache on a GPU), models.consistency (config.json against the
weights), envs.state (the serve environment a launch needs). No rule is written here a second time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.checks.registry import CheckContext, Finding, RecipeCheck, Skip

if TYPE_CHECKING:
    from infertool.models.info import ModelInfo
    from infertool.quantize.preflight import PreflightReport
    from infertool.recipe import ServeSection

LINT_LEVELS = {"error": "error", "warning": "warn"}  # a launch lint's "info" lines stay the launch's own notes


def _serve(ctx: CheckContext) -> ServeSection:
    """The effective serve settings of the served model (what a launch passes to vLLM)."""
    return ctx.once("serve", lambda: ctx.res.serve_for(ctx.res.served)[0])


def _served_info(ctx: CheckContext) -> ModelInfo:
    """The served model's facts (its config; a candidate not made yet: its base's; a model not here: the
    published architecture) — the same facts every launch's lint reads."""
    def make() -> ModelInfo:
        from infertool.serve.launches import model_info_for

        info = model_info_for(ctx.res, ctx.res.served)
        if info is None:
            raise Skip(f"the model {ctx.res.served.source} is not on this machine and is not a known architecture")
        return info
    return ctx.once("served_info", make)


def _lint(name: str, issues) -> list[Finding]:
    return [Finding(name, LINT_LEVELS[i.level], i.field, i.message, i.hint) for i in issues if i.level in LINT_LEVELS]


# ------------------------------------------------------------------------------------------ serve
def position_limit(ctx: CheckContext) -> list[Finding]:
    from infertool.serve.lint import lint_position_limit

    limit = ctx.res.position_limit(ctx.res.served)
    if limit.tokens is None:
        raise Skip(limit.why)
    return _lint("position_limit", lint_position_limit(_serve(ctx), limit))


def tensor_parallel(ctx: CheckContext) -> list[Finding]:
    from infertool.serve.lint import lint_tensor_parallel

    return _lint("tensor_parallel", lint_tensor_parallel(_serve(ctx), _served_info(ctx)))


def pipeline_parallel(ctx: CheckContext) -> list[Finding]:
    from infertool.serve.lint import lint_pipeline_stages

    return _lint("pipeline_parallel", lint_pipeline_stages(_serve(ctx), _served_info(ctx)))


def kv_fit(ctx: CheckContext) -> list[Finding]:
    """The KV cache holds one request at max_model_len: on a CPU vLLM's exact start-up rule (serve/lint.py), on
    a GPU the memory plan's block arithmetic (plan.py)."""
    if ctx.res.target.kind == "cpu":
        from infertool.serve.lint import lint_kv_capacity

        return _lint("kv_fit", lint_kv_capacity(_serve(ctx), _served_info(ctx)))
    from infertool import plan as planning
    from infertool.errors import UsageError

    try:
        p = planning.plan(ctx.res)
    except UsageError as e:
        raise Skip(f"no memory plan: {e.message}") from None
    tokens, max_len = p.capacity.kv_tokens, p.capacity.max_model_len
    if tokens >= max_len:
        return []
    d = p.device
    return [Finding("kv_fit", "error", "serve.max_model_len",
                    f"the KV cache on {d.count} x {d.name} holds {tokens:,} tokens, less than max_model_len "
                    f"{max_len:,}: vLLM would refuse to start",
                    "lower serve.max_model_len, raise serve.gpu_memory_utilization, set serve.kv_cache_dtype: fp8, "
                    "or add GPUs (`infertool plan RECIPE` shows the memory)")]


def reserved_cpus(ctx: CheckContext) -> list[Finding]:
    from infertool.serve.lint import lint_reserved_cpus

    if ctx.res.target.kind != "cpu":
        raise Skip("the target is a GPU")
    return _lint("reserved_cpus", lint_reserved_cpus(_serve(ctx)))


def code_loading(ctx: CheckContext) -> list[Finding]:
    from infertool.serve.lint import lint_code_loading

    return _lint("code_loading", lint_code_loading(_serve(ctx)))


def engine_settings(ctx: CheckContext) -> list[Finding]:
    from infertool.serve.lint import lint_engine_settings

    return _lint("engine_settings", lint_engine_settings(_serve(ctx)))


def speculative_method(ctx: CheckContext) -> list[Finding]:
    """Every speculative setting the recipe would serve (serve.speculative, bench.per_class.speculative) against
    what the engine can run here: serve/lint.py's rule (suffix decoding's package, a draft / EAGLE directory, MTP
    layers in the served model's config.json)."""
    from infertool.serve.lint import lint_speculative

    served_spec = _serve(ctx).speculative
    specs = [("serve.speculative", served_spec)] if served_spec is not None else []
    bench = ctx.res.recipe.bench
    if bench is not None and bench.per_class is not None and bench.per_class.speculative:
        specs += [(f"bench.per_class.speculative[{i}]", s) for i, s in enumerate(bench.per_class.speculative)]
    if not specs:
        raise Skip("the recipe names no speculative setting")
    config = None
    served = ctx.res.served
    if any(s.method == "mtp" for _, s in specs) and served.exists and served.path:
        from infertool.errors import InfertoolError
        from infertool.models.info import load_config

        try:
            config = load_config(served.path).full
        except InfertoolError:
            config = None  # config_vs_weights and the launch say what is wrong with it
    here = ctx.res.target.this_host
    return _lint("speculative_method", [i for f, s in specs for i in lint_speculative(s, f, here=here, model_config=config)])


# ------------------------------------------------------------------------------------------ quantize
PREFLIGHT_FIELDS = {"group_size": "quantize.group_size", "packing": "quantize.bits", "layers": "quantize.ignore",
                    "architecture": "model.source", "weights": "model.source", "host": "target",
                    "tensor_parallel": "serve.tensor_parallel_size", "vllm": "quantize.method"}


def _preflight(ctx: CheckContext) -> PreflightReport:
    """The quantize preflight's layout view of the base model (shapes and vLLM's support, not this host's memory
    or disk): computed once for the three checks that read it."""
    def make() -> PreflightReport:
        from infertool.models.info import model_info
        from infertool.perf.host import has_cuda
        from infertool.quantize.preflight import preflight

        base = ctx.res.base
        if not (base.exists and base.path):
            raise Skip(base.note or f"the base model {base.source} is not on this machine")
        tp = _serve(ctx).tensor_parallel_size
        q = ctx.res.recipe.quantize
        assert q is not None, "the preflight checks are registered for recipes with a quantize section"
        return preflight(model_info(base.path), q, serve={"tensor_parallel_size": tp},
                         output=None, has_cuda=has_cuda(), target=ctx.res.target, host=ctx.res.host,
                         resources=False)
    return ctx.once("preflight", make)


def _preflight_findings(name: str, ctx: CheckContext, which: tuple[str, ...] | None, but: tuple[str, ...] = ()):
    from infertool.quantize.preflight import fix_hint

    report = _preflight(ctx)
    out = []
    for c in report.checks:
        if c.ok or c.level not in ("error", "warning") or c.name in but or (which is not None and c.name not in which):
            continue
        hint = fix_hint(report) if c.name == "group_size" else None
        out.append(Finding(name, LINT_LEVELS[c.level], PREFLIGHT_FIELDS.get(c.name, f"quantize.{c.name}"), c.detail, hint))
    return out


def group_size(ctx: CheckContext) -> list[Finding]:
    """group_size and the int32 packing against every quantized layer, the architecture, the weight files."""
    return _preflight_findings("group_size", ctx, None, but=("tensor_parallel", "vllm"))


def quantized_tp(ctx: CheckContext) -> list[Finding]:
    """serve.tensor_parallel_size against the QUANTIZED layout: every shard a whole number of groups / packs."""
    return _preflight_findings("quantized_tp", ctx, ("tensor_parallel",))


def vllm_support(ctx: CheckContext) -> list[Finding]:
    """What vLLM on the recipe's target does with the quantized format."""
    return _preflight_findings("vllm_support", ctx, ("vllm",))


# ------------------------------------------------------------------------------------------ models
def config_vs_weights(ctx: CheckContext) -> list[Finding]:
    """config.json against the safetensors headers (shapes, layer count): a 70B config over 8B weights."""
    try:
        from infertool.models.consistency import config_vs_weights as compare
    except ImportError:
        raise Skip("not available (infertool.models.consistency is not in this build)") from None
    models = [m for m in (ctx.res.base, ctx.res.served) if m.exists and m.path]
    if not models:
        raise Skip(f"the model {ctx.res.base.source} is not on this machine")
    out = []
    for path in dict.fromkeys(m.dir for m in models):
        out += [Finding("config_vs_weights", "error", "model.source",
                        f"{path}: config.json does not describe these weights: {problem}",
                        "point model.source at a directory whose config.json describes its weights")
                for problem in compare(path)]
    return out


# ------------------------------------------------------------------------------------------ input files
def _input_readers(recipe) -> list[tuple[str, Callable[[], object]]]:
    """(recipe field, its reader) for every input file of the user's the recipe names: the bench's prompt file and
    trace, an eval suite given as a file, the decode prompts, the calibration text. Built-in sets are package data,
    not read here; a relative calibration path not found here is quantize's to find beside the recipe."""
    from infertool.bench.prompts import traffic_files
    from infertool.data.calibration import BUILTIN as CAL_BUILTIN, read_texts
    from infertool.data.suites import DECODE_PROMPTS_BUILTIN, builtin_dir, load_suite, resolve_suite_path

    out = list(traffic_files(recipe.bench)) if recipe.bench is not None else []
    ev = recipe.eval
    if ev is not None:
        suite = resolve_suite_path(ev.suite)  # an unknown name: a UsageError, as every eval says it
        if suite.parent != builtin_dir():
            out.append(("eval.suite", lambda: load_suite(ev.suite)))
        if ev.decode.enabled and ev.decode.prompts != DECODE_PROMPTS_BUILTIN:
            from infertool.evaluate.decode import load_prompts

            out.append(("eval.decode.prompts", lambda: load_prompts(str(ev.decode.prompts))))
    cal = getattr(recipe.quantize, "calibration", None)
    if cal is not None and cal.source != CAL_BUILTIN:
        p = Path(cal.source).expanduser()
        if p.is_absolute() or os.path.lexists(p):
            out.append(("quantize.calibration.source", lambda: read_texts(cal.source, cal.text_field)))
    return out


def input_files(ctx: CheckContext) -> list[Finding]:
    """Every input file the recipe names, read whole and checked by ``infertool.inputs`` and its format's rules
    before any work: a regular UTF-8 file within its size cap, JSON within bounds, the documented fields."""
    from infertool.errors import UsageError

    try:
        readers = _input_readers(ctx.res.recipe)
    except UsageError as e:
        return [Finding("input_files", "error", "eval.suite", e.message, e.hint)]
    if not readers:
        raise Skip("the recipe names no input file of its own")
    out = []
    for name, read in readers:
        try:
            read()
        except UsageError as e:
            message = e.message.removeprefix(f"{name}: ")
            out.append(Finding("input_files", "error", name, message, e.hint))
    return out


# ------------------------------------------------------------------------------------------ environment
def serve_env(ctx: CheckContext) -> list[Finding]:
    """The managed serve environment a launch runs vLLM in: a warning for a dry run (it starts nothing), an
    error for a real launch (which refuses with exit 3)."""
    from infertool.envs.state import require_env
    from infertool.errors import EnvNotReady

    if not ctx.res.target.this_host:
        raise Skip("the recipe is for another machine: its serve environment is set up there")
    try:
        require_env("serve", needed_by="a vLLM launch")
    except EnvNotReady as e:
        when = ("a real launch refuses to start (exit 3); this dry run starts nothing" if ctx.dry
                else "this launch cannot start")
        return [Finding("serve_env", "warn" if ctx.dry else "error", "serve", f"{e.message}: {when}", e.hint)]
    return []


# ------------------------------------------------------------------------------------------ eval
def lm_eval_code(ctx: CheckContext) -> list[Finding]:
    """The code an lm-eval task folder would run (``!function``, ``class:``, includes and data outside it), read
    from its YAML without running it: refused unless eval.lm_eval.trust_code (evaluate/lm_eval_tasks.py)."""
    from infertool.evaluate.lm_eval_tasks import problems

    lm = getattr(ctx.res.recipe.eval, "lm_eval", None)
    if lm is None or not lm.include_path:
        raise Skip("the recipe has no eval.lm_eval.include_path")
    return [Finding("lm_eval_code", p.level, p.field, p.message, p.hint) for p in problems(lm)]


def suite_tools(ctx: CheckContext) -> list[Finding]:
    """A suite's json / tool_call tasks against the engine and the serve flags they need, before any server
    starts (data/formats.py ``served_needs``: what vLLM 0.32 refuses without them)."""
    from infertool.data.formats import served_needs
    from infertool.data.suites import load_suite
    from infertool.errors import UsageError

    ev = ctx.res.recipe.eval
    if ev is None:
        raise Skip("the recipe has no eval section")
    try:
        suite = load_suite(ev.suite)
    except UsageError:
        raise Skip("the suite does not load (input_files says why)") from None
    if ev.engine == "openai":
        raise Skip("eval.engine openai: the server at eval.url is started by someone else")
    return [Finding("suite_tools", "error", f, m, h) for f, m, h in served_needs(suite.tasks, ev.engine, _serve(ctx))]


LAUNCHING = frozenset({"run", "serve", "eval", "bench", "tune", "quantize", "launch"})
SERVE = ("serve",)

BUILTIN = (  # in the order they run (and report): listed in the one check registry by infertool/checks/__init__.py
    RecipeCheck("position_limit", position_limit, "max_model_len within the model's position limit",
                reads=("serve", "model")),
    RecipeCheck("tensor_parallel", tensor_parallel, "serve.tensor_parallel_size divides the attention heads",
                reads=("serve", "model")),
    RecipeCheck("pipeline_parallel", pipeline_parallel, "serve.pipeline_parallel_size at most the layers",
                reads=("serve", "model")),
    RecipeCheck("kv_fit", kv_fit, "the KV cache holds one request at max_model_len", reads=("serve", "target", "model")),
    RecipeCheck("reserved_cpus", reserved_cpus, "serve.cpu.reserved_cpus leaves vLLM a core",
                reads=("serve", "target")),
    RecipeCheck("code_loading", code_loading, "what serve.allow_code lets load code (warning)", reads=SERVE),
    RecipeCheck("engine_settings", engine_settings, "settings vLLM's V1 engine ignores (warning)", reads=SERVE),
    RecipeCheck("speculative_method", speculative_method, "a speculative method the engine can run here",
                reads=("serve", "bench", "model")),
    RecipeCheck("group_size", group_size, "group size and packing against every quantized layer",
                reads=("quantize", "base"), needs=("quantize",)),
    RecipeCheck("quantized_tp", quantized_tp, "tensor parallelism over the quantized shapes",
                reads=("quantize", "serve", "base"), needs=("quantize",)),
    RecipeCheck("vllm_support", vllm_support, "vLLM on the target serves the quantized format",
                reads=("quantize", "target"), needs=("quantize",)),
    RecipeCheck("config_vs_weights", config_vs_weights, "config.json against the safetensors headers",
                reads=("model", "base")),
    RecipeCheck("lm_eval_code", lm_eval_code, "code of eval.lm_eval's task folder only with trust_code",
                reads=("eval",), needs=("eval",)),
    RecipeCheck("suite_tools", suite_tools, "json / tool_call tasks: a served engine and the tool-calling flags",
                reads=("eval", "serve"), needs=("eval",)),
    RecipeCheck("input_files", input_files, "every input file: a regular UTF-8 file, bounded, its fields",
                reads=("bench", "eval", "quantize")),
    RecipeCheck("serve_env", serve_env, "the serve environment a launch needs (warning in a dry run)",
                reads=("target",), purposes=LAUNCHING),
)
