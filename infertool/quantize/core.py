"""``quantize(recipe, ...)``: resolve the model, preflight, calibrate and quantize in the backend's
environment, load-check in vLLM, write the manifest, publish the output by a rename.

Never prints (the CLI renders the ``QuantizeResult``); progress goes to ``on_event``. The output is built
in a temporary sibling directory (``.<name>.<random>.tmp``) and renamed into place only when everything
succeeded: an error or Ctrl-C leaves no output behind, and the source model is never written to.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from infertool.atomic import replace_dir
from infertool.errors import UsageError
from infertool.quantize import MANIFEST_NAME
from infertool.resolve import default_output

EventCallback = Callable[[dict], None]



@dataclass
class QuantizeResult:
    ok: bool
    recipe: str
    method: str
    backend: str | None
    source_model: str
    output: str | None
    checked_only: bool
    preflight: dict
    size: dict | None = None
    timings: dict = field(default_factory=dict)
    calibration: dict | None = None
    layer_errors: dict | None = None
    verify: dict | None = None
    load_check: dict | None = None  # the launches of the vLLM load check (with --check: what would run)
    resolution: dict | None = None  # what the recipe means (infertool.resolve): served model, target, settings
    held_out: dict | None = None  # the calibration text against the eval suite (infertool.data.overlap)
    local_agreement: dict | None = None  # greedy agreement measured in the backend's env (no vLLM needed)
    manifest_path: str | None = None
    log_dir: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _emit(on_event: EventCallback | None, message: str, level: str = "info") -> None:
    if on_event is not None:
        on_event({"event": "log", "level": level, "message": message})


def _is_within(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def _held_out(recipe, qd: dict, recipe_dir: Path | None, report) -> dict:
    """Calibration and evaluation never share text: the calibration text against the eval suite the recipe
    scores with. Refused (a preflight error) at 1 % of the suite's word 13-grams unless
    calibration.allow_eval_overlap, which turns it into a warning recorded in the manifest."""
    from infertool.data.calibration import read_texts
    from infertool.data.overlap import overlap
    from infertool.data.suites import load_suite

    suite_name = recipe.eval.suite if recipe.eval is not None else "builtin-corpus"
    cal = qd["calibration"]
    docs, kind, _ = read_texts(cal["source"], cal.get("text_field", "text"), recipe_dir)
    try:
        suite = load_suite(suite_name)
    except UsageError as e:
        report.add("held_out", True, f"eval suite {suite_name} not readable here ({e.message}): overlap not checked")
        return {"suite": suite_name, "checked": False}
    ov = overlap(docs, suite.texts())
    d = {"suite": suite_name, "calibration": cal["source"], "checked": True, "overlap": ov.to_dict()}
    if kind == "builtin":
        from infertool.data import corpus

        d["corpus"] = corpus.describe()
    allowed = bool(cal.get("allow_eval_overlap"))
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


def _group_size_hint(report) -> str | None:
    for c in report.errors:
        if c.name == "held_out":
            return ("calibrate on other text (quantize.calibration.source), score another suite, or set "
                    "quantize.calibration.allow_eval_overlap: true to accept the overlap (recorded in the manifest)")
        if c.name == "group_size":
            valid = [g for g in report.valid_group_sizes if g != -1]
            if valid:
                pick = 64 if 64 in valid else valid[-1]
                return f"set a group size that divides every in_features, e.g. --set quantize.group_size={pick}"
    return "fix the recipe (or the model) and run `infertool quantize RECIPE --check` again"


def reference_dtype(res, info) -> str:
    """The dtype vLLM serves the original in for this recipe (serve.dtype, or its CPU rule for "auto"), which the
    original's reference tokens are computed in; the model's own dtype when vLLM's "auto" keeps it."""
    settings, _ = res.serve_for(res.base, None)
    dtype = getattr(settings, "dtype", "auto")
    if dtype and dtype != "auto":
        return {"half": "float16", "float": "float32"}.get(dtype, dtype)
    return info.dtype if info.dtype in ("bfloat16", "float16", "float32") else "bfloat16"


def quantize(
    recipe: Any,
    *,
    recipe_path: str | Path | None = None,
    out: str | Path | None = None,
    check: bool = False,
    verify: bool | None = None,
    force: bool = False,
    on_event: EventCallback | None = None,
    pool: Any = None,
) -> QuantizeResult:
    """Run (or with ``check=True`` only preflight) the recipe's quantize section. ``pool`` (a run's
    ``ServerPool``): the load check's vLLM server stays running for the run's later stages, re-keyed to the
    published checkpoint (serve's check and bench launch it with the same settings)."""
    from infertool.models.info import model_info, safetensors_stats, weight_files
    from infertool.perf.host import has_cuda
    from infertool.quantize import verify as load_check
    from infertool.quantize.backends import BACKEND_ENVS, BACKEND_TASKS
    from infertool.quantize.preflight import PreflightFailed, linear_layers, matches_ignore, run_preflight
    from infertool.recipe import recipe_to_dict
    from infertool.resolve import ModelRef, resolve

    t_start = time.monotonic()
    timings: dict[str, Any] = {}
    q = recipe.quantize
    if q is None:
        raise UsageError(
            f"recipe {recipe.name!r} has no quantize section",
            hint="add one (method: gptq | awq | bnb), e.g. from `infertool recipes show quickstart`",
        )
    qd = q.model_dump(mode="json")
    method = qd["method"]
    backend = qd.get("backend") if method != "bnb" else None
    res = resolve(recipe, candidate_path=out)
    dest = Path(res.candidate.path if method != "bnb" else (out or qd.get("output") or default_output(recipe.name, method)))
    dest = dest.expanduser().absolute()
    recipe_dir = Path(recipe_path).expanduser().resolve().parent if recipe_path and Path(recipe_path).is_file() else None

    t = time.monotonic()
    res.ensure(res.base, on_event=on_event)
    src = Path(res.base.path).resolve()
    timings["resolve_model"] = time.monotonic() - t
    if _is_within(dest.resolve(), src) or _is_within(src, dest.resolve()):
        raise UsageError(
            f"the output {dest} overlaps the source model {src}",
            hint="quantize never writes into its source: choose another --out",
        )

    t = time.monotonic()
    info = model_info(src)
    cal_check = None
    if method != "bnb":
        from infertool.data.calibration import check_source

        cal_check = check_source(qd["calibration"], recipe_dir)
        qd["calibration"]["source"] = cal_check.source  # absolute path (or builtin) for the stage
    serve = recipe.serve.model_dump(mode="json") if getattr(recipe, "serve", None) else None
    report = run_preflight(info=info, quantize=qd, serve=serve, output=dest, has_cuda=has_cuda(),
                           target=res.target, host=res.host)
    held = _held_out(recipe, qd, recipe_dir, report) if method != "bnb" else None
    if dest.exists() and not force:
        report.add("output", check, f"{dest} already exists: pass --force to replace it, or choose another --out",
                   level="warning" if check else "error")
    else:
        report.add("output", True, f"{'replaces ' if dest.exists() else ''}{dest}")
    llmc_plan = None
    if backend == "llmcompressor":
        from infertool.quantize.backends import llmcompressor

        llmc_plan = llmcompressor.plan(qd, has_cuda=has_cuda())
        report.plan["llmcompressor"] = llmc_plan
    timings["preflight"] = time.monotonic() - t
    if not report.ok:
        raise PreflightFailed(report, hint=_group_size_hint(report))
    warnings = [f"{c.name}: {c.detail}" for c in report.warnings]
    for w in warnings:
        _emit(on_event, w, "warning")

    candidate_ref = ModelRef("candidate", str(dest), str(dest), False, res.candidate.label, res.candidate.quantization,
                             name=res.candidate.name)
    base = QuantizeResult(
        ok=True, recipe=recipe.name, method=method, backend=backend, source_model=str(src),
        output=str(dest), checked_only=check, preflight=report.to_dict(), timings=timings,
        calibration=cal_check.to_dict() if cal_check else None, warnings=warnings,
        resolution=res.to_dict(), held_out=held,
    )
    if method != "bnb":
        # the GPTQModel backend computes the original's reference tokens itself: only the quantized checkpoint is served
        base.load_check = {k: p.to_dict() for k, p in load_check.plans(res, candidate_ref, dry_run=True,
                                                                         original=backend != "gptqmodel").items()}
    if check:
        base.output = None
        timings["total"] = time.monotonic() - t_start
        return base

    from infertool.envs.state import state
    from infertool.envs.paths import logs_root
    from infertool.envs.runner import run_task

    if llmc_plan is not None:
        from infertool.quantize.backends import llmcompressor

        llmcompressor.refuse_on_host(llmc_plan, method)
    if not res.target.this_host:
        if verify:
            raise UsageError(f"--verify: the load check serves the checkpoint as the recipe does, on {res.target.count} x "
                             f"{res.target.gpu}, and this host has no NVIDIA GPU",
                             hint="quantize here with --no-verify and run the load check on the target, or `--check --json` "
                             "to see its launches")
        verify = False
        _emit(on_event, f"the load check runs on the recipe's target ({res.target.count} x {res.target.gpu}), not here", "warning")
    # the greedy comparison in GPTQModel's kernels: where the vLLM load check is not run only because the serve
    # environment is not set up (an explicit --no-verify asks for no generation at all), or (below) where vLLM
    # loads the checkpoint but cannot generate on this host
    kernel_compare = False
    if verify is None:
        verify = state("serve").status == "ready"
        kernel_compare = not verify and res.target.this_host
    elif verify and method != "bnb":
        from infertool.envs.state import require_env

        require_env("serve", needed_by="--verify (the vLLM load check)")  # before hours of quantizing, not after
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    log_dir = logs_root() / f"{stamp}-quantize-{os.getpid()}"
    base.log_dir = str(log_dir)

    dest.parent.mkdir(parents=True, exist_ok=True)
    work = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"
    model_out = work / "model"
    stage_result: dict = {}
    verify_result: dict | None = None
    try:
        work.mkdir()
        if method == "bnb":
            model_out.mkdir()
        else:
            from infertool.quantize.backends import gptqmodel as gptqmodel_backend

            ignore = qd.get("ignore") or []
            ignore_modules = [l.name for l in linear_layers([src / f for f in info.weight_files])
                              if ignore and matches_ignore(l.name, ignore)]
            if backend == "gptqmodel":
                spec = gptqmodel_backend.build_spec(qd, model=src, out_dir=model_out, offload_dir=work / "offload",
                                                    ignore_modules=ignore_modules, num_layers=info.num_layers, base_dir=None)
                spec["log_dir"] = str(log_dir)
                # ONE greedy comparison: the quantized checkpoint in vLLM (the load check) against the original's
                # tokens computed in the worker, or in GPTQModel's kernels when vLLM does not run here
                spec["reference"] = {"dtype": reference_dtype(res, info)} if (verify or kernel_compare) else None
                spec["compare"] = kernel_compare
            else:
                from infertool.quantize.backends import llmcompressor

                spec = llmcompressor.build_spec(qd, llmc_plan, model=src, out_dir=model_out,
                                                calibration=qd["calibration"], dtype=recipe.model.dtype)
            from infertool.trust import announce_remote_code

            spec["trust_remote_code"] = announce_remote_code(recipe.model.source, recipe.model.trust_remote_code)
            _emit(on_event, f"quantizing {src.name} with {backend} ({method}) in the {BACKEND_ENVS[backend]!r} environment")
            t = time.monotonic()
            run = run_task(BACKEND_TASKS[backend], spec, on_event=on_event, log_dir=log_dir)
            stage_result = run.result
            timings["quantize_task"] = time.monotonic() - t
            timings["backend"] = stage_result.get("timings", {})
            shutil.rmtree(work / "offload", ignore_errors=True)

        if verify and method != "bnb":
            t = time.monotonic()
            _emit(on_event, "load check: the quantized checkpoint served by vLLM as the recipe serves it, greedy vs the original")
            reference = stage_result.get("reference")
            verify_result = load_check.load_check(res, ModelRef("candidate", str(model_out), str(model_out), True,
                                                                res.candidate.label, res.candidate.quantization,
                                                                name=res.candidate.name),
                                                  log_dir=log_dir, on_event=on_event, reference=reference, pool=pool)
            timings["verify"] = time.monotonic() - t
            if not verify_result.get("generated"):
                base.warnings.append(f"verify: {verify_result.get('reason')}")
                if reference is not None and verify_result.get("loaded"):  # vLLM cannot generate here: GPTQModel's kernels
                    t = time.monotonic()
                    _emit(on_event, "greedy comparison in GPTQModel's kernels instead (vLLM cannot generate on this host)")
                    run = run_task("quantize.gptqmodel.compare", {"model": str(model_out), "reference": reference,
                                                                   "trust_remote_code": spec.get("trust_remote_code", False)},
                                    on_event=on_event, log_dir=log_dir)
                    stage_result["local_agreement"] = run.result.get("local_agreement")
                    timings["compare"] = time.monotonic() - t
        elif verify and method == "bnb":
            verify_result = {"loaded": None, "generated": False, "reason": "bitsandbytes is applied when a model is loaded: "
                             "nothing to load-check here (vLLM loads bitsandbytes on CUDA GPUs only)"}

        size_after = safetensors_stats(weight_files(model_out)).bytes if method != "bnb" else None
        from infertool.quantize.manifest import build_manifest, env_packages, layer_error_summary, size_summary, write_manifest

        layers = stage_result.get("layers") or []
        base.size = size_summary(info.weight_bytes, size_after)
        base.calibration = stage_result.get("calibration") or base.calibration
        base.layer_errors = layer_error_summary(layers) if method != "bnb" else None
        base.verify = verify_result
        base.local_agreement = stage_result.get("local_agreement")
        timings["total"] = time.monotonic() - t_start
        fields: dict[str, Any] = {
            "recipe": recipe_to_dict(recipe),
            "recipe_source": str(recipe_path) if recipe_path else None,
            "method": method,
            "backend": backend,
            "source_model": {"source": recipe.model.source, "path": str(src), "weight_bytes": info.weight_bytes,
                             "files": info.weight_files, "architecture": (info.architectures or [None])[0]},
            "preflight": {"checks": [c for c in report.to_dict()["checks"]], "plan": report.plan},
            "size": base.size,
            "timings_s": timings,
        }
        if method == "bnb":
            bnb = {"load_in_4bit": qd["quant_type"] != "int8", "load_in_8bit": qd["quant_type"] == "int8",
                   "bnb_4bit_quant_type": qd["quant_type"] if qd["quant_type"] != "int8" else None,
                   "bnb_4bit_use_double_quant": qd["double_quant"], "bnb_4bit_compute_dtype": qd["compute_dtype"]}
            fields["kind"] = "load-time-quantization"
            fields["load_time"] = {"model": str(src), "transformers": {"BitsAndBytesConfig": bnb},
                                   "vllm": {"quantization": "bitsandbytes", "cuda_only": True}}
        else:
            fields["environment"] = env_packages(BACKEND_ENVS[backend])
            fields["backend_versions"] = stage_result.get("versions")
            fields["quantize_config"] = stage_result.get("quantize_config")
            fields["calibration"] = base.calibration
            fields["layer_errors"] = {"summary": base.layer_errors, "layers": layers,
                                      "metric": "GPTQModel's per-module loss (as reported by the backend)"}
            fields["verify"] = verify_result
            fields["local_agreement"] = stage_result.get("local_agreement")
            if stage_result.get("compute_dtype"):
                fields["compute_dtype"] = stage_result["compute_dtype"]
            if verify_result is not None:
                fields["verify_environment"] = env_packages("serve")
            fields["held_out"] = held
        write_manifest(model_out, build_manifest(**fields))
        replace_dir(model_out, dest)  # an existing output (allowed by --force) is moved aside, then removed
        if pool is not None:
            pool.moved(model_out, dest)  # the load check's server now serves the published checkpoint's files
        base.manifest_path = str(dest / MANIFEST_NAME)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    base.output = str(dest)
    timings["total"] = time.monotonic() - t_start
    return base
