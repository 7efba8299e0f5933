"""The Resolution: one recipe's models, target and host, with the effective serve settings of each model and
the fingerprint of every input (see ``infertool.resolve``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from infertool.backends import quantized_checkpoint
from infertool.errors import UsageError
from infertool.perf import host as hostfacts
from infertool.resolve.refs import ModelRef, Target, base_label, cpu_serve_dtype

if TYPE_CHECKING:
    from infertool.models.info import PositionLimit
    from infertool.recipe import Recipe, ServeSection


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

    def ensure(self, model: ModelRef, on_event: Callable | None = None) -> ModelRef:
        """Make ``model`` exist locally when infertool can: a bundled/GGUF base (or a bitsandbytes candidate,
        which is the base) is converted into the cache once, as what it is: the recipe's model.source with
        model.layers, or the base a command line gave (``Overrides(base=...)``) as it was given. Other models are
        what they are; one that cannot be made here raises the clear error (``ModelLocation.require``)."""
        if model.exists or model.role not in ("base", "candidate") or (model.role == "candidate" and not model.load_quantization):
            return model
        from infertool.models import sources

        m = self.recipe.model
        recipe_base = self.base.source == m.source and self.base.label == base_label(self.recipe)
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

            d = load_config(model.path).declared_dtype  # a malformed config.json: ModelError (exit 2), never a guess
            if d is not None:
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
    lora = recipe.serve.lora if recipe.serve is not None else None
    if lora is not None:  # the adapters by content: a changed adapter is never answered from a cache
        from infertool.data.fingerprint import adapter_fingerprints

        out["adapters"] = adapter_fingerprints(lora.adapters)
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

