"""The quantize capability (infertool.capability): ``plan(res, QuantizeOptions) -> QuantizePlan`` and
``run(plan, ctx) -> QuantizeResult``.

``plan`` is quick and loads no weights: the output's place, the preflight (the backend's rules and the generic
checks, infertool.quantize.preflight), the calibration text held out from the eval suite, the worker task's
spec and the vLLM load check's launches; every refusal that can come before work starts comes from it (a failed
preflight, a host that cannot run the backend, --verify without a serve environment). With ``check`` it refuses
nothing for this host and needs no managed environment for a local model directory (`quantize --check`).

``run`` quantizes in the backend's environment (its worker task), load-checks the checkpoint in vLLM as the
recipe serves it, writes the manifest, and publishes the output by a rename. It never prints; progress goes to
``ctx.on_event``. The output is built in a temporary sibling directory (``.<name>.<random>.tmp``) and renamed into
place only when everything succeeded: an error or Ctrl-C leaves no output behind, and the source model is never
written to.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from infertool import backends
from infertool.atomic import remove_inside, replace_dir, replace_refusal
from infertool.backends.base import CompareSpec, QuantBackend, QuantizeTaskResult, TaskInputs
from infertool.backends.greedy import Agreement
from infertool.capability import RunContext
from infertool.data.calibration import CalibrationInfo, CalibrationRequest
from infertool.data.overlap import Overlap
from infertool.errors import UsageError
from infertool.quantize.manifest import LayerErrors, WeightSize
from infertool.quantize.preflight import PreflightReport
from infertool.quantize.verify import LoadCheck
from infertool.records import Record, Sparse
from infertool.resolve import QUANTIZE_MANIFEST as MANIFEST_NAME, default_output
from infertool.summaries import Resolved

if TYPE_CHECKING:
    from infertool.models.info import ModelInfo
    from infertool.backends.base import QuantizeConfig
    from infertool.recipe import Recipe
    from infertool.resolve import ModelRef, Resolution

EventCallback = Callable[[dict], None]


@dataclass
class QuantizeOptions:
    """What a command line or a stage asks of a quantization besides the recipe."""

    out: str | Path | None = None  # the output directory (default: quantize.output, else out/<recipe>-<method>)
    check: bool = False  # plan only: an existing output is a warning, nothing is refused for this host
    verify: bool | None = None  # the vLLM load check (None: when the serve environment is set up)
    force: bool = False  # replace an existing output
    recipe_path: str | Path | None = None  # the recipe's file: a relative calibration source is read beside it


@dataclass
class CalibrationHeldOut(Sparse):
    """The calibration text against the eval suite the recipe scores with (``_held_out``: quantize.json's held_out);
    ``checked`` False: the suite was not readable here."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("calibration", "overlap", "corpus")

    suite: str | None = None
    calibration: str | None = None
    checked: bool = False
    overlap: Overlap | None = None
    corpus: dict | None = None  # the built-in corpus's facts (infertool.data.corpus.describe)


@dataclass
class QuantizeResult(Record):
    ok: bool = True
    recipe: str = ""
    method: str = ""
    backend: str | None = None
    source_model: str = ""
    output: str | None = None
    checked_only: bool = False
    preflight: PreflightReport | None = None
    size: dict | None = None  # WeightSize's data, kept as written (the report shows a malformed one as it is)
    timings: dict = field(default_factory=dict)
    calibration: CalibrationInfo | None = None
    layer_errors: LayerErrors | None = None
    verify: LoadCheck | None = None  # the vLLM load check (None: it did not run)
    load_check: dict | None = None  # the launches of the vLLM load check (with --check: what would run)
    resolution: dict | None = None  # what the recipe means (infertool.resolve): served model, target, settings
    held_out: CalibrationHeldOut | None = None  # the calibration text against the eval suite
    local_agreement: Agreement | None = None  # greedy agreement measured in the backend's env (no vLLM needed)
    manifest_path: str | None = None
    log_dir: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def weight_size(self) -> WeightSize:
        """``size`` by attribute, each None where not measured (a --check, a file that lacks them)."""
        return WeightSize.from_dict(self.size)

    @property
    def resolved(self) -> Resolved:
        return Resolved.from_dict(self.resolution)


@dataclass
class QuantizePlan:
    """What ``run`` will do, decided before any weights load (``to_dict`` is what a dry run shows)."""

    res: Resolution
    options: QuantizeOptions
    backend: QuantBackend[Any]  # Any: whichever config type the backend does
    config: QuantizeConfig  # the recipe's quantize section
    source: Path  # the original model's directory
    output: Path  # where the model is published
    info: ModelInfo  # the original's
    preflight: PreflightReport
    calibration: CalibrationInfo | None = None  # of the calibration text (None: the method needs none)
    calibration_spec: dict | None = None  # the calibration section with the source made absolute
    held_out: CalibrationHeldOut | None = None
    verify: bool = False  # the vLLM load check runs
    kernel_compare: bool = False  # the greedy comparison runs in the backend's kernels instead (no vLLM here)
    load_check: dict = field(default_factory=dict)  # name -> the load check's launch (dry run)
    task: str | None = None  # the worker task that quantizes
    spec: dict | None = None  # its spec, with the paths of a planned run
    warnings: list[str] = field(default_factory=list)  # failed preflight checks of level warning
    notes: list[str] = field(default_factory=list)  # said when the run starts
    timings: dict = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic, repr=False)

    def result(self) -> QuantizeResult:
        """The result as far as the plan knows it (with ``check``: the whole answer)."""
        b = self.backend
        return QuantizeResult(
            ok=True, recipe=self.res.recipe.name, method=self.config.method, backend=b.name if b.in_recipe else None,
            source_model=str(self.source), output=None if self.options.check else str(self.output),
            checked_only=self.options.check, preflight=self.preflight, timings=self.timings,
            calibration=self.calibration, warnings=list(self.warnings),
            resolution=self.res.to_dict(), held_out=self.held_out,
            load_check=dict(self.load_check) if b.checkpoint else None)

    def to_dict(self) -> dict:
        return {"backend": self.backend.name, "method": self.config.method, "source": str(self.source),
                "output": str(self.output), "verify": self.verify, "kernel_compare": self.kernel_compare,
                "task": self.task, "env": self.backend.env, "spec": self.spec, "load_check": self.load_check,
                "preflight": self.preflight.to_dict(), "held_out": self.held_out.to_dict() if self.held_out else None,
                "warnings": self.warnings,
                "notes": self.notes, "resolution": self.res.to_dict()}


# ------------------------------------------------------------------------------------------------ plan
def plan(res: Resolution, options: QuantizeOptions | None = None, *, on_event: EventCallback | None = None) -> QuantizePlan:
    """Everything before the work (see the module docstring); raises PreflightFailed, UsageError or
    BackendError for a quantization that cannot start. ``on_event``: progress of a bundled model's conversion."""
    from infertool.models.info import model_info
    from infertool.perf.host import has_cuda
    from infertool.quantize.preflight import PreflightFailed, fix_hint, preflight

    options = options or QuantizeOptions()
    recipe, q = res.recipe, res.recipe.quantize
    if q is None:
        raise UsageError(f"recipe {recipe.name!r} has no quantize section",
                         hint="add one (method: gptq | awq | bnb), e.g. from `infertool recipes show quickstart`")
    backend = backends.of(q)
    t0 = time.monotonic()
    timings: dict[str, Any] = {}  # Any: JSON values (hashed / written / validated)
    dest = _output(res, options, q, backend)
    res.ensure(res.base, on_event=on_event)
    src = Path(res.base.dir).resolve()
    timings["resolve_model"] = time.monotonic() - t0
    _refuse_overlap(dest, src)

    t = time.monotonic()
    info = model_info(src)
    recipe_dir = _recipe_dir(options.recipe_path)
    cal_check = cal_spec = None
    if (calibration := backend.calibration(q)) is not None:
        from infertool.data.calibration import check_source

        cal_spec = calibration.model_dump(mode="json")
        cal_check = check_source(CalibrationRequest.from_dict(cal_spec), recipe_dir)
        cal_spec = {**cal_spec, "source": cal_check.source}  # absolute path (or builtin) for the worker
    serve = recipe.serve.model_dump(mode="json") if recipe.serve is not None else None
    report = preflight(info, q, serve=serve, output=dest, has_cuda=has_cuda(), target=res.target, host=res.host)
    held = _held_out(recipe, CalibrationRequest.from_dict(cal_spec), recipe_dir, report) if cal_spec else None
    _output_check(report, dest, options)
    timings["preflight"] = time.monotonic() - t
    if not report.ok:
        raise PreflightFailed(report, hint=fix_hint(report))
    p = QuantizePlan(res, options, backend, q, src, dest, info, report, cal_check, cal_spec, held,
                     warnings=[f"{c.name}: {c.detail}" for c in report.warnings], timings=timings, t0=t0)
    if backend.checkpoint:
        p.load_check = load_check_launches(p.res, p.res.candidate_at(dest, exists=False))
    _decide_verify(p)
    if backend.task:
        p.task = backend.task
        p.spec = backend.task_spec(q, _task_inputs(p, _work_dir(dest), _log_dir(), announce=False))
    return p


def _output(res: Resolution, options: QuantizeOptions, q: QuantizeConfig, backend: QuantBackend[Any]) -> Path:  # Any: whichever config type the backend does
    if backend.checkpoint:
        cand = res.candidate_at(options.out) if options.out else res.candidate
        assert cand is not None, "a recipe with a quantize section has a candidate"
        where: str | Path = cand.dir
    else:
        where = options.out or q.output or default_output(res.recipe.name, q.method)
    return Path(where).expanduser().absolute()


def _recipe_dir(recipe_path: str | Path | None) -> Path | None:
    if recipe_path and Path(recipe_path).is_file():
        return Path(recipe_path).expanduser().resolve().parent
    return None


def _refuse_overlap(dest: Path, src: Path) -> None:
    if dest.resolve().is_relative_to(src) or src.is_relative_to(dest.resolve()):
        raise UsageError(f"the output {dest} overlaps the source model {src}",
                         hint="quantize never writes into its source: choose another --out")


def _output_check(report: PreflightReport, dest: Path, options: QuantizeOptions) -> None:
    why = replace_refusal(dest) if (dest.exists() or dest.is_symlink()) and options.force else None
    if why:
        report.add("output", False, f"{why}; choose another --out (or quantize.output)")
    elif dest.exists() and not options.force:
        report.add("output", options.check, f"{dest} already exists: pass --force to replace it, or choose another "
                   "--out", level="warning" if options.check else "error")
    else:
        report.add("output", True, f"{'replaces ' if dest.exists() else ''}{dest}")


def _held_out(recipe: Recipe, cal: CalibrationRequest, recipe_dir: Path | None,
              report: PreflightReport) -> CalibrationHeldOut:
    """Calibration and evaluation never share text: the calibration text against the eval suite the recipe
    scores with. Refused (a preflight error) at 1 % of the suite's word 13-grams unless
    calibration.allow_eval_overlap, which turns it into a warning recorded in the manifest."""
    from infertool.data.calibration import read_texts
    from infertool.data.overlap import overlap
    from infertool.data.suites import load_suite

    suite_name = recipe.eval.suite if recipe.eval is not None else "builtin-corpus"
    docs, kind, _ = read_texts(cal.source, cal.text_field, recipe_dir)
    try:
        suite = load_suite(suite_name)
    except UsageError as e:
        report.add("held_out", True, f"eval suite {suite_name} not readable here ({e.message}): overlap not checked")
        return CalibrationHeldOut(suite_name)
    ov = overlap(docs, suite.texts())
    d = CalibrationHeldOut(suite_name, cal.source, True, ov)
    if kind == "builtin":
        from infertool.data import corpus

        d.corpus = corpus.describe()
    allowed = cal.allow_eval_overlap
    if ov.refused:
        report.add("held_out", allowed, f"the calibration text overlaps eval suite {suite_name}: {ov.describe()}; the "
                   "verdict would be measured on text the model was calibrated on"
                   + (" (allowed by calibration.allow_eval_overlap)" if allowed else ""),
                   level="warning" if allowed else "error")
    elif ov.shared_ngrams:
        report.add("held_out", False, f"the calibration text shares a little with eval suite {suite_name}: {ov.describe()}",
                   level="warning")
    else:
        report.add("held_out", True, f"calibration and eval suite {suite_name} share no word {ov.ngram}-gram"
                   + (" (the built-in corpus's calibration and eval parts)" if kind == "builtin" else ""))
    return d


def load_check_launches(res: Resolution, candidate: ModelRef | None = None) -> dict:
    """The vLLM load check's launches (as a dry run shows them) of ``candidate`` (default: the resolution's): the
    quantized checkpoint, and the original unless the backend's worker computes the original's reference tokens
    itself. Needs neither the model nor the serve environment (`run --dry-run` shows them)."""
    import infertool.quantize.verify as load_check

    assert res.recipe.quantize is not None  # a load check is of a quantize recipe's candidate
    b = backends.of(res.recipe.quantize)
    planned = load_check.plans(res, candidate or res.candidate, dry_run=True, original=not b.reference_in_worker)
    return {k: launch.to_dict() for k, launch in planned.items()}


def load_check_runs(res: Resolution, verify: bool | None = None) -> bool:
    """Whether a quantization of ``res`` load-checks its checkpoint in vLLM here, as ``plan`` decides it
    (``verify`` None: when the serve environment is set up): a backend that writes a checkpoint, a recipe for
    this host."""
    from infertool.envs.state import state

    q = res.recipe.quantize
    if q is None or not backends.of(q).checkpoint or not res.target.this_host or res.candidate is None:
        return False
    return verify if verify is not None else state("serve").status == "ready"


def _decide_verify(p: QuantizePlan) -> None:
    """Whether the vLLM load check runs (and where the greedy comparison runs instead); for a run (not --check),
    the refusals that must come before hours of quantizing, not after."""
    from infertool.envs.state import require_env, state
    from infertool.perf.host import has_cuda

    res, verify = p.res, p.options.verify
    if not p.options.check:
        refusal = p.backend.refusal(p.config, has_cuda=has_cuda())
        if refusal is not None:
            raise refusal
    if not res.target.this_host:
        if verify and not p.options.check:
            raise UsageError(f"--verify: the load check serves the checkpoint as the recipe does, on {res.target.count} x "
                             f"{res.target.gpu}, and this host has no NVIDIA GPU",
                             hint="quantize here with --no-verify and run the load check on the target, or `--check --json` "
                             "to see its launches")
        verify = False
        p.notes.append(f"the load check runs on the recipe's target ({res.target.count} x {res.target.gpu}), not here")
    # the greedy comparison in the backend's kernels: where the vLLM load check is not run only because the serve
    # environment is not set up (an explicit --no-verify asks for no generation at all), or (in run) where vLLM
    # loads the checkpoint but cannot generate on this host
    if verify is None:
        verify = state("serve").status == "ready"
        p.kernel_compare = not verify and res.target.this_host and p.backend.compare_task is not None
    elif verify and p.backend.checkpoint and not p.options.check:
        require_env("serve", needed_by="--verify (the vLLM load check)")
    p.verify = bool(verify) and p.backend.checkpoint


def reference_dtype(res: Resolution, info: ModelInfo) -> str:
    """The dtype vLLM serves the original in for this recipe (serve.dtype, or its CPU rule for "auto"), which the
    original's reference tokens are computed in; the model's own dtype when vLLM's "auto" keeps it."""
    settings, _ = res.serve_for(res.base, None)
    dtype = settings.dtype
    if dtype != "auto":
        return {"half": "float16", "float": "float32"}.get(dtype, dtype)
    return info.dtype if info.dtype in ("bfloat16", "float16", "float32") else "bfloat16"


def _work_dir(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"


def _log_dir() -> Path:
    from infertool.envs.paths import logs_root

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return logs_root() / f"{stamp}-quantize-{os.getpid()}"


def _task_inputs(p: QuantizePlan, work: Path, log_dir: Path, *, announce: bool = True) -> TaskInputs:
    """The backend's task inputs for a run in ``work`` (``announce``: say that the model's remote code runs)."""
    from infertool.backends.layers import linear_layers, matches_ignore
    from infertool.perf.host import has_cuda
    from infertool.trust import announce_remote_code

    recipe, q = p.res.recipe, p.config
    ignore = list(q.layout().ignore)
    ignore_modules = [lin.name for lin in linear_layers([p.source / f for f in p.info.weight_files])
                      if ignore and matches_ignore(lin.name, ignore)]
    compare_here = p.verify or p.kernel_compare
    return TaskInputs(
        model=str(p.source), out_dir=str(work / "model"), work_dir=str(work), log_dir=str(log_dir),
        num_layers=p.info.num_layers, ignore_modules=ignore_modules, calibration=p.calibration_spec,
        dtype=recipe.model.dtype, reference_dtype=reference_dtype(p.res, p.info) if compare_here else None,
        compare=p.kernel_compare, has_cuda=has_cuda(),
        trust_remote_code=announce_remote_code(recipe.model.source, recipe.model.trust_remote_code) if announce
        else recipe.model.trust_remote_code)


# ------------------------------------------------------------------------------------------------- run
def run(p: QuantizePlan, ctx: RunContext | None = None) -> QuantizeResult:
    """Quantize as planned; ``ctx.out_dir`` (when given) is where the model is published instead of the plan's
    output; ``ctx.servers`` (a run's ServerPool): the load check's vLLM server stays running for the run's later
    stages, re-keyed to the published checkpoint (serve's check and bench launch it with the same settings)."""
    ctx = ctx or RunContext()
    result = p.result()
    for w in p.warnings:
        ctx.emit(w, "warning")
    if p.options.check:
        p.timings["total"] = time.monotonic() - p.t0
        return result
    dest = Path(ctx.out_dir).expanduser().absolute() if ctx.out_dir is not None else p.output
    if dest != p.output:
        _refuse_overlap(dest, p.source)
        if dest.exists() and not p.options.force:
            raise UsageError(f"{dest} already exists: pass --force to replace it, or choose another --out")
        why = replace_refusal(dest) if dest.exists() or dest.is_symlink() else None
        if why:
            raise UsageError(why, hint="choose another --out")
    for note in p.notes:
        ctx.emit(note, "warning")
    log_dir = _log_dir()
    result.log_dir = str(log_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = _work_dir(dest)
    try:
        work.mkdir()
        task_result = _quantize_in_env(p, ctx, work, log_dir)
        verify = _load_check(p, ctx, work, log_dir, task_result, result)
        _publish(p, ctx, work, dest, task_result, verify, result)
    finally:
        remove_inside(work, dest.parent, ignore_errors=True)
    result.output = str(dest)
    p.timings["total"] = time.monotonic() - p.t0
    return result


def _quantize_in_env(p: QuantizePlan, ctx: RunContext, work: Path, log_dir: Path) -> QuantizeTaskResult:
    """The backend's worker task, in its managed environment, its answer read back (the one reader of it); an
    empty answer (and an empty model directory) when nothing runs (a quantization applied at load time)."""
    if not p.task:
        (work / "model").mkdir()
        return QuantizeTaskResult(model=str(p.source))
    from infertool.envs.runner import run_task

    inputs = _task_inputs(p, work, log_dir)
    spec = p.backend.task_spec(p.config, inputs)
    ctx.emit(f"quantizing {p.source.name} with {p.backend.name} ({p.config.method}) in the {p.backend.env!r} environment")
    t = time.monotonic()
    task = run_task(p.task, spec, on_event=ctx.on_event, log_dir=log_dir)
    p.timings["quantize_task"] = time.monotonic() - t
    answer = QuantizeTaskResult.from_dict(task.result)
    answer.trust_remote_code = inputs.trust_remote_code
    p.timings["backend"] = answer.timings
    remove_inside(work / "offload", work, ignore_errors=True)
    return answer


def _load_check(p: QuantizePlan, ctx: RunContext, work: Path, log_dir: Path, task_result: QuantizeTaskResult,
                result: QuantizeResult) -> LoadCheck | None:
    """The checkpoint served by vLLM as the recipe serves it, greedy against the original; where vLLM loads it
    but cannot generate here, the greedy comparison in the backend's own kernels instead."""
    if not p.verify:
        return None
    from infertool.envs.runner import run_task
    import infertool.quantize.verify as load_check

    model_out = work / "model"
    t = time.monotonic()
    ctx.emit("load check: the quantized checkpoint served by vLLM as the recipe serves it, greedy vs the original")
    reference = task_result.reference
    verified = load_check.load_check(p.res, p.res.candidate_at(model_out, exists=True), log_dir=log_dir,
                                     on_event=ctx.on_event, reference=reference, pool=ctx.servers)
    p.timings["verify"] = time.monotonic() - t
    if not verified.generated:
        result.warnings.append(f"verify: {verified.reason}")
        if reference is not None and verified.loaded and p.backend.compare_task:
            t = time.monotonic()
            ctx.emit(f"greedy comparison in {p.backend.name}'s kernels instead (vLLM cannot generate on this host)")
            spec = CompareSpec(str(model_out), reference, task_result.trust_remote_code).to_dict()
            task = run_task(p.backend.compare_task, spec, on_event=ctx.on_event, log_dir=log_dir)
            task_result.local_agreement = QuantizeTaskResult.from_dict(task.result).local_agreement
            p.timings["compare"] = time.monotonic() - t
    return verified


def _publish(p: QuantizePlan, ctx: RunContext, work: Path, dest: Path, task_result: QuantizeTaskResult,
             verify: LoadCheck | None, result: QuantizeResult) -> None:
    """The manifest beside the weights, then the rename into place (an existing output, allowed by --force, is
    moved aside, then removed)."""
    from infertool.models.info import safetensors_stats, weight_files
    from infertool.quantize.manifest import write_manifest

    model_out = work / "model"
    b = p.backend
    size_after = safetensors_stats(weight_files(model_out)).bytes if b.checkpoint else None
    result.size = WeightSize.of(p.info.weight_bytes, size_after).to_dict()
    result.calibration = task_result.calibration or result.calibration
    result.layer_errors = LayerErrors.of(task_result.layers) if b.checkpoint else None
    result.verify = verify
    result.local_agreement = task_result.local_agreement
    p.timings["total"] = time.monotonic() - p.t0
    write_manifest(model_out, _manifest(p, task_result, result))
    replace_dir(model_out, dest)
    if ctx.servers is not None:
        ctx.servers.moved(model_out, dest)  # the load check's server now serves the published checkpoint's files
    result.manifest_path = str(dest / MANIFEST_NAME)


def _manifest(p: QuantizePlan, task_result: QuantizeTaskResult, result: QuantizeResult) -> dict:
    from infertool.quantize.manifest import build_manifest, env_packages
    from infertool.recipe import recipe_to_dict

    recipe, info, b = p.res.recipe, p.info, p.backend
    fields: dict[str, Any] = {  # Any: JSON values (hashed / written / validated)
        "recipe": recipe_to_dict(recipe),
        "recipe_source": str(p.options.recipe_path) if p.options.recipe_path else None,
        "method": p.config.method,
        "backend": result.backend,
        "source_model": {"source": recipe.model.source, "path": str(p.source), "weight_bytes": info.weight_bytes,
                         "files": info.weight_files, "architecture": next(iter(info.architectures or []), None)},
        "preflight": {"checks": p.preflight.checks, "plan": p.preflight.plan},
        "size": result.size,
        "timings_s": p.timings,
    }
    if b.task:
        fields.update({
            "environment": env_packages(b.env) if b.env else None,  # None: it ran in-process
            "backend_versions": task_result.versions, "quantize_config": task_result.quantize_config,
            "calibration": result.calibration,
            "layer_errors": {"summary": result.layer_errors, "layers": task_result.layers,
                             "metric": b.layer_error_metric or f"{b.name}'s per-module loss"},
            "verify": result.verify, "local_agreement": task_result.local_agreement,
            **({"compute_dtype": task_result.compute_dtype} if task_result.compute_dtype else {}),
            **({"verify_environment": env_packages("serve")} if result.verify is not None else {}),
            "held_out": p.held_out})
    fields.update(b.manifest(p.config, task_result))
    return build_manifest(**fields)
