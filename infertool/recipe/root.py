"""The recipe as a whole: its verify and run sections, and ``Recipe``, whose validators check across sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from infertool import backends
from infertool.recipe.bench import BenchSection, bench_request_tokens, mix_problems
from infertool.recipe.sections import (
    NAME_RE, EvalSection, ModelSection, ProfileSection, QuantizeSection, TargetSection,
)
from infertool.recipe.serve import ServeSection
from infertool.recipe.tune import TuneSection
from infertool.schema import MAX_LIST, MAX_NAME, MAX_PATH, MAX_TEXT, STRICT, Fraction, NoControl, NotBool, Requests, field_error

# --------------------------------------------------------------------------------------------
# verify: the evidence a published checkpoint carries, and the gates `infertool verify` judges it by
# --------------------------------------------------------------------------------------------

MIB = 1024 * 1024


class EvidenceSpec(BaseModel):
    """What `publish` (and so `run` and `tune`) writes into the published folder's ``evidence/``: the candidate's
    outputs AS SERVED (prompt top-k log-probabilities per scored item, greedy decode tokens with per-step top-k,
    lm-eval per-document results), the engine, its settings and the host, one content hash. Bounded: at most
    ``max_bytes`` and at most ``max_fraction`` of the weights' bytes, whichever is smaller; the ``max_*`` counts
    trim it further (docs/verify.md)."""

    model_config = STRICT

    enabled: bool = True
    top_k: Annotated[int, NotBool, Field(ge=1, le=20)] = 20  # log-probabilities kept per position
    max_bytes: Annotated[int, NotBool, Field(ge=64 * 1024, le=1024 * MIB)] = 32 * MIB
    max_fraction: Annotated[float, NotBool, Field(ge=0.0001, le=1)] = 0.02  # of the weights' bytes
    max_items: Requests | None = None  # scored items (perplexity windows, choices, generations) kept per task
    decode_prompts: Annotated[int, NotBool, Field(ge=1, le=100_000)] | None = None  # default: eval.decode's set
    decode_tokens: Annotated[int, NotBool, Field(ge=2, le=4096)] | None = None  # default: eval.decode.max_tokens


class VerifyAccept(BaseModel):
    """When `infertool verify` PASSes: every gate set here holds with its uncertainty (the interval's side), as in
    eval. The defaults sit above the noise floor measured in docs/verify.md (the same checkpoint, engine and
    settings against itself)."""

    model_config = STRICT

    # null turns a gate off. Defaults: provisional, to be set above the floor docs/verify.md measures.
    # greedy decode: share of prompts identical to the evidence or first diverging at a near tie (Wilson interval;
    # 35 prompts that all match are needed for its lower end to clear 0.9 at 95 %)
    min_exact_match: Fraction | None = 0.9
    max_decode_kld: Annotated[float, NotBool, Field(ge=0, le=100)] | None = 0.01  # teacher-forced, per step
    min_decode_top1: Fraction | None = 0.97
    max_prompt_kld: Annotated[float, NotBool, Field(ge=0, le=100)] | None = 0.01  # prompt logprobs, per token
    min_prompt_top1: Fraction | None = 0.97
    min_lmeval_agreement: Fraction | None = 0.95  # lm-eval: share of documents with the same result
    # the suite's json / tool_call items: share whose answer changed (Wilson; 4 unchanged items clear 0.5 at 95 %;
    # a dtype changed bf16 -> float32 changed 6 of 24, docs/verify.md), and validity drop (valid in the evidence,
    # not now, less the reverse, over the items; normal interval)
    max_answers_changed: Fraction | None = 0.5
    max_valid_drop: Fraction | None = 0.05
    confidence: Annotated[float, NotBool, Field(ge=0.5, le=0.999)] = 0.95
    allow_inconclusive: bool = False  # INCONCLUSIVE exits 1, like FAIL, unless true (then 0), as in eval


class SigningSpec(BaseModel):
    """Whose signature a published folder must carry (model-signing's ``model.sig``): `verify` checks it against
    ``trusted_keys`` (EC public keys in PEM, paths as given) before it reads anything else, and with ``required``
    `serve` and `serve --emit k8s` refuse (exit 6) a folder not validly signed by one of them. `--key PUB` adds a
    key on the command line."""

    model_config = STRICT

    required: bool = False
    trusted_keys: Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_PATH), NoControl]],
                            Field(max_length=MAX_LIST)] = Field(default_factory=list)


class VerifySection(BaseModel):
    """`infertool verify`: the evidence `publish` writes, the gates a re-check is judged by, and the signature a
    published folder must carry."""

    model_config = STRICT

    evidence: EvidenceSpec = Field(default_factory=EvidenceSpec)
    accept: VerifyAccept = Field(default_factory=VerifyAccept)
    signing: SigningSpec = Field(default_factory=SigningSpec)


# --------------------------------------------------------------------------------------------
# run and the recipe
# --------------------------------------------------------------------------------------------

# a stage's name: which names exist is the stage registry's to say (infertool.stages, above this layer:
# `infertool validate`, `run` and the pipeline check run.stages against it)
StageName = Annotated[str, Field(min_length=1, max_length=MAX_NAME), NoControl]


class RunSection(BaseModel):
    """`infertool run`'s own settings. `stages`: the stages to run by name (their dependencies come along), as
    `infertool run --stages` takes them: model, quantize, eval, profile, serve, bench; the stage registry
    says which names exist, and `infertool validate` refuses any other (`run.stages[i]: unknown stage`).
    `out_dir`: where run directories go."""

    model_config = STRICT

    stages: Annotated[list[StageName], Field(max_length=MAX_LIST)] | None = None
    out_dir: Annotated[str, Field(min_length=1, max_length=MAX_PATH), NoControl] = "runs"



@dataclass(frozen=True)
class PydanticError:
    """One of pydantic's error details, read once (the recipe's messages and the tune candidates' read it)."""

    kind: str
    loc: tuple[int | str, ...]
    message: str  # without pydantic's "Value error, " / "Assertion failed, "
    input: Any  # Any: the value pydantic refused, as the YAML held it
    ctx: dict[str, Any]  # Any: the context a validator raised with (recipe_field: field, message)

    @classmethod
    def of(cls, e: ErrorDetails) -> PydanticError:
        message = str(e["msg"])
        for prefix in ("Value error, ", "Assertion failed, "):
            message = message.removeprefix(prefix)
        return cls(e["type"], tuple(e["loc"]), message, e.get("input"), dict(e.get("ctx") or {}))

    def refined(self) -> tuple[list[str], str] | None:
        """A quantize section no backend took, or a validator's ``recipe_field`` error: the field path under the
        error's location that they name, and their message; None for any other error."""
        if self.kind == "quantize_method" and isinstance(self.input, dict):
            field, msg = backends.registry.method_error(self.input)
            return ([] if field is None else [field]), msg
        if self.kind == "recipe_field":
            return str(self.ctx.get("field")).split("."), str(self.ctx.get("message", self.message))
        return None


class Recipe(BaseModel):
    """One recipe; each command reads the sections it needs."""

    model_config = STRICT

    name: Annotated[str, Field(max_length=MAX_NAME)]
    description: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    model: ModelSection
    target: TargetSection | None = None
    quantize: QuantizeSection | None = None
    eval: EvalSection | None = None
    profile: ProfileSection | None = None
    serve: ServeSection | None = None
    bench: BenchSection | None = None
    run: RunSection | None = None
    tune: TuneSection | None = None
    verify: VerifySection | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value:
            raise ValueError("name must not be empty (it names the run directories)")
        if not NAME_RE.fullmatch(value):
            raise ValueError(
                "name must start with a letter or digit and contain only letters, digits, "
                f"'.', '_' and '-' (it names the run directories); got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check_tune(self) -> Recipe:
        """Every candidate is a valid quantize section once merged over the recipe's; the SLO and, for the
        cost objective, the price exist."""
        t = self.tune
        if t is None:
            return self
        base: dict = self.quantize.model_dump(mode="json", exclude={"output"}) if self.quantize is not None else {}
        for i, cand in enumerate(t.candidates):
            if cand == "none":
                continue
            method = base.get("method")
            merged = {**(base if cand.get("method", method) == method else {}), **cand}
            merged.pop("output", None)
            try:
                TypeAdapter(QuantizeSection).validate_python(merged)
            except ValidationError as exc:
                err = PydanticError.of(exc.errors(include_url=False)[0])
                loc = [str(p) for p in err.loc if str(p) not in backends.registry.section_tags()]
                under, msg = err.refined() or ([], err.message)
                loc += under
                raise field_error(f"tune.candidates[{i}]" + ("." + ".".join(loc) if loc else ""), msg) from None
        if (t.slo or (self.bench.slo if self.bench else None)) is None:
            raise field_error("tune.slo", "tune needs an SLO to meet: tune.slo or bench.slo (ttft_ms, tpot_ms, e2e_ms)")
        if self.bench is None:
            raise field_error("bench", "tune measures serving under the recipe's traffic: add a bench section "
                               "(prompt, output_len, requests)")
        if t.objective == "cost" and self.bench.cost_per_hour is None and not t.machines:
            raise field_error("bench.cost_per_hour", "objective cost needs bench.cost_per_hour (what the machine "
                               "costs you per hour) for $ per 1M output tokens")
        return self

    @model_validator(mode="after")
    def _check_lengths(self) -> Recipe:
        """What every request of the bench needs fits serve.max_model_len (vLLM refuses a request whose prompt and
        max_tokens exceed it), for the recipe's server and for each max_model_len tune would try; the pipeline
        stages are not more than the layers the recipe keeps (model.layers)."""
        serve, bench = self.serve, self.bench
        if serve is not None and self.model.layers is not None and serve.pipeline_parallel_size > self.model.layers:
            raise field_error("serve.pipeline_parallel_size", f"pipeline_parallel_size {serve.pipeline_parallel_size} "
                               f"exceeds the model's {self.model.layers} layers (model.layers): each stage needs one")
        if bench is None:
            return self
        longest = bench_request_tokens(bench)
        what = (f"prompt.len {bench.prompt.len:,} + " if bench.prompt.source in ("builtin", "synthetic") else "") + \
            f"output_len {bench.output_len:,}" + (f" (+{bench.output_len_spread:g} spread)" if bench.output_len_spread else "")
        if serve is not None and serve.max_model_len is not None and longest > serve.max_model_len:
            raise field_error("bench.output_len", f"bench requests need up to {longest:,} tokens ({what}), more than "
                               f"serve.max_model_len {serve.max_model_len:,}: vLLM would refuse every request")
        grid = self.tune.serve_grid.max_model_len if self.tune is not None else None
        for i, value in enumerate(grid or []):
            if value is not None and longest > value:
                raise field_error(f"tune.serve_grid.max_model_len[{i}]", f"max_model_len {value:,} is shorter than the "
                                   f"{longest:,} tokens a bench request needs ({what})")
        return self

    @model_validator(mode="after")
    def _check_adapter_mix(self) -> Recipe:
        """bench.adapters.mix names the base and serve.lora's adapters only, each with a positive share (every
        problem in one error)."""
        spec = self.bench.adapters if self.bench is not None else None
        if spec is not None:
            serve = self.serve
            lora = serve.lora if serve is not None else None
            problems = mix_problems(spec, list(lora.adapters) if lora is not None else [],
                                    serve.served_model_name if serve is not None else None)
            if problems:
                raise field_error("bench.adapters.mix", "; ".join(problems))
        return self

    @model_validator(mode="after")
    def _check_served(self) -> Recipe:
        if self.serve is not None and self.serve.model == "quantized" and self.quantize is None:
            raise field_error("serve.model", "serve.model: quantized needs a quantize section (there is no "
                               "quantized model to serve); use original, a model directory, or add quantize")
        return self

