"""``resolve(recipe)``: the one place a ModelRef or a Target is made (see ``infertool.resolve``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool import backends
from infertool.errors import UsageError
from infertool.perf import host as hostfacts
from infertool.resolve.refs import (ModelRef, Overrides, Target, base_label, candidate_manifest, default_output,
                                    host_cannot_run, name_of, recipe_target)
from infertool.resolve.resolution import Resolution

if TYPE_CHECKING:
    from infertool.recipe import Recipe


def _base_ref(recipe: Recipe, materialize: bool, on_event: Callable | None) -> ModelRef:
    """model.source where it is on this machine (models.sources.locate); with ``materialize``, converted now
    and refused when it is not here, else said in the note."""
    from infertool.models import sources

    m = recipe.model
    where = sources.locate(m.source, layers=m.layers, dtype=m.dtype, convert=materialize, on_event=on_event)
    if m.layers is not None and where.exists and where.kind in ("hf", "hub"):
        raise UsageError("model.layers applies to GGUF and bundled sources only",
                         hint="a Hugging Face model is used as it is" if where.kind == "hub" else
                         "a Hugging Face directory is used as it is")
    if materialize:
        where.require()
    return ModelRef("base", m.source, str(where.path) if where.path else None, where.exists, base_label(recipe),
                    declared_dtype=m.dtype, note=where.note, name=name_of(m.source))


def _given_base(recipe: Recipe, source: str, materialize: bool, on_event: Callable | None) -> ModelRef:
    """The original model a command line names instead of model.source (named by what was given): it must be
    on this machine, except a bundled/GGUF source that a plan may describe before its conversion."""
    from infertool.models import sources

    m = recipe.model
    where = sources.locate(source, dtype=m.dtype, convert=materialize, on_event=on_event)
    if where.kind in ("hf", "hub"):
        where.require()
    return ModelRef("base", source, str(where.path) if where.path else None, where.exists, source,
                    declared_dtype=m.dtype, note=where.note, name=name_of(source))


def _given_candidate(given: str | Path, recipe_ref: ModelRef | None = None) -> ModelRef:
    """The quantized model a command line names instead of quantize.output (named by what was given); its
    quantization from the recipe when the recipe has one, else "given"."""
    p = Path(given).expanduser()
    exists = (p / "config.json").is_file()
    facts = recipe_ref.quantization if recipe_ref is not None and recipe_ref.quantization else {"method": "given"}
    return ModelRef("candidate", str(given), str(p.absolute()), exists, str(given), facts, name=p.name,
                    declared_dtype=recipe_ref.declared_dtype if recipe_ref is not None else None,
                    note=None if exists else f"{given} is not a model directory (no config.json)")



def _candidate_ref(recipe: Recipe, base: ModelRef, candidate_path: str | Path | None) -> ModelRef | None:
    q = recipe.quantize
    if q is None:
        return None
    label = f"{q.label()} of {base.label}"
    facts = q.facts()
    b = backends.of(q)
    if not b.checkpoint:  # quantized when loaded (bitsandbytes): the base is the model
        return ModelRef("candidate", base.source, base.path, base.exists, label, facts, b.load_time,
                        declared_dtype=base.declared_dtype, note=base.note, name=f"{base.name}-{q.method}-{getattr(q, 'quant_type', '')}".rstrip("-"))
    where = Path(candidate_path) if candidate_path else Path(q.output or default_output(recipe.name, q.method))
    where = where.expanduser().absolute()
    exists = (where / "config.json").is_file()
    name = Path(q.output).expanduser().name if q.output else default_output(recipe.name, q.method).name
    return ModelRef("candidate", str(where), str(where), exists, label, facts, declared_dtype=base.declared_dtype,
                    note=None if exists else f"{where} does not exist yet: `infertool quantize` writes it", name=name)



def resolve(recipe: Recipe, overrides: Overrides | None = None, *, candidate_path: str | Path | None = None,
            materialize: bool = False, gpu: str | None = None, on_event: Callable | None = None) -> Resolution:
    """The one resolution of ``recipe`` (see the module docstring), the only place a ModelRef or a Target is made.

    ``overrides``: the command line's models and GPU (``Overrides``).
    ``candidate_path``: where the candidate is (``run`` passes its quantize stage's entry); the same as
    ``Overrides(candidate=...)``.
    ``materialize``: convert a bundled/GGUF base into the cache now (a launch needs it; a plan or a dry run
    uses the cached conversion when there is one, else says where it will be).
    ``gpu``: plan for this GPU instead of target.gpu / this host (the same as ``Overrides(gpu=...)``).
    """
    ov = overrides or Overrides()
    host = hostfacts.host_facts()
    base = _given_base(recipe, ov.base, materialize, on_event) if ov.base else _base_ref(recipe, materialize, on_event)
    given_candidate = ov.candidate or None
    if given_candidate is not None and candidate_path is None and recipe.quantize is None:
        cand: ModelRef | None = _given_candidate(given_candidate)
    else:
        cand = _candidate_ref(recipe, base, candidate_path or given_candidate)
        if cand is not None and given_candidate is not None and candidate_path is None:
            cand = _given_candidate(given_candidate, cand)
    served, origin, notes = _served(recipe, base, cand, host, made_by_run=candidate_path is not None)
    target = recipe_target(recipe, host, gpu or ov.gpu)
    return Resolution(recipe, base, cand, served, origin, target, host, notes + _target_notes(target))


def with_candidate(res: Resolution, path: str | Path) -> Resolution:
    """``res`` once `run`'s quantize stage made the candidate at ``path``: the same recipe, host, base and target;
    the candidate there, and what is served decided again (its load check may have found that this host cannot
    run it)."""
    cand = _candidate_ref(res.recipe, res.base, path)
    served, origin, notes = _served(res.recipe, res.base, cand, res.host, made_by_run=True)
    return Resolution(res.recipe, res.base, cand, served, origin, res.target, res.host,
                      notes + _target_notes(res.target), res._inputs)


def _served(recipe: Recipe, base: ModelRef, cand: ModelRef | None, host: hostfacts.HostFacts, *,
            made_by_run: bool) -> tuple[ModelRef, str, list[str]]:
    """What is served (the model, its origin) and what to say of it. ``made_by_run``: the candidate's path is the
    one a run's quantize stage writes."""
    notes: list[str] = []
    serve = recipe.serve
    choice = serve.model if serve is not None else None
    if choice == "original":
        served, origin = base, "original"
    elif choice == "quantized" or (choice is None and cand is not None):
        assert cand is not None, "the recipe refuses serve.model: quantized without a quantize section"
        served, origin = cand, "candidate"
        if not cand.exists and not cand.load_quantization:
            notes.append(f"the quantized model is not there yet ({cand.path}): " + (
                "the run's quantize stage makes it" if made_by_run else
                "run `infertool quantize` first, or set serve.model: original"))
        reason = host_cannot_run(candidate_manifest(cand), host) if choice is None else None
        if reason:
            served, origin = base, "original"
            notes.append(f"SERVING THE ORIGINAL MODEL, not the quantized one: its load check found that vLLM on "
                         f"this host loads it but cannot run it ({reason}); set serve.model: quantized to try anyway")
    elif choice is None:
        served, origin = base, "original"
    else:
        p = Path(choice).expanduser()
        exists = os.path.lexists(p / "config.json")
        served = ModelRef("served", choice, str(p.absolute()), exists, choice, name=name_of(choice),
                          note=None if exists else f"serve.model {choice} is not a model directory (no config.json)")
        origin = "serve.model"
    return served, origin, notes


def _target_notes(target: Target) -> list[str]:
    if target.this_host:
        return []
    return [f"the recipe is for {target.count} x {target.gpu}; this host has no NVIDIA GPU: plans, dry runs and "
            "manifests describe the target, launches here are refused"]


