"""The quantization backend protocol: what one backend module declares, and what the rest of infertool asks it.

A backend is one module of this package holding ONE ``QuantBackend`` object (``BACKEND``), listed by one line of
the registry (``infertool/backends/__init__.py``). It declares:

- its recipe schema: a pydantic class per method it does (``methods``: method -> ``QuantizeConfig`` subclass), so
  that ``quantize: {method: M, backend: NAME, ...}`` validates against the backend's own fields, and whose
  ``layout()`` says its bits, group size, scheme, ignore and calibration to the rest of infertool;
- its preflight rules (``rules``): checks on the model's facts (config.json and safetensors headers, no weights)
  and the quantize section, each a ``Check``;
- its managed environment (``env``) and its worker tasks (``tasks``: the task definitions; ``task``: the one that
  quantizes; ``task_spec``: that task's spec);
- the manifest fields it adds (``manifest``), its label and facts for ``ModelRef.quantization`` (``label``,
  ``facts``), its weight bytes for the memory plan (``bytes_per_weight``);
- what vLLM serves of it on each platform (``serving``: CPU AVX2, CPU AVX-512, CUDA: loads? generates? under
  which vLLM quantization method) and its dtype rule (``weight_only``: a weight-only checkpoint stays 16-bit).

Below the recipe: this module imports leaves, models/ and pydantic only; a backend's heavy libraries (torch,
GPTQModel, llm-compressor) are imported inside its worker functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, model_serializer

from infertool.backends.greedy import Agreement, GreedyReference
from infertool.data.calibration import CalibrationInfo
from infertool.records import Record
from infertool.schema import STRICT

if TYPE_CHECKING:
    from infertool.backends.layers import Linear
    from infertool.models.info import ModelInfo
    from infertool.perf.host import HostFacts

CPU_AVX2, CPU_AVX512, CPU_OTHER, CUDA = "cpu-avx2", "cpu-avx512", "cpu", "cuda"
# compressed-tensors presets that quantize activations too (the others are weight-only)
ACTIVATION_SCHEMES = ("W8A8", "W8A8_FP8", "FP8_DYNAMIC")


class TargetFacts(Protocol):
    """What the backends read of a resolution's Target (resolve sits above backends: no import of it)."""

    @property
    def kind(self) -> str: ...  # "cpu" | "gpu"

    @property
    def this_host(self) -> bool: ...  # the recipe is for this machine


def platform(target: TargetFacts | None, host: HostFacts | None) -> str | None:
    """The platform vLLM serves on for a resolution's target and this host's facts: ``cuda`` for a GPU target,
    ``cpu-avx512`` / ``cpu-avx2`` / ``cpu`` (unknown vector ISA) for a CPU one; None when there is no target."""
    if target is None:
        return None
    if target.kind != "cpu":
        return CUDA
    isa = host.cpu_isa if host is not None else "unknown"
    return {"avx512": CPU_AVX512, "avx2": CPU_AVX2}.get(isa, CPU_OTHER)


@dataclass(frozen=True)
class Serving:
    """What vLLM does with a backend's checkpoint on one platform, from measurements or vLLM's documentation.

    ``loads`` / ``generates``: None when not known (no claim without evidence); ``detail``: the evidence;
    ``hint``: what to do instead when it does not serve; ``vllm_quantization``: the method vLLM picks."""

    loads: bool | None = None
    generates: bool | None = None
    detail: str = ""
    hint: str = ""
    vllm_quantization: str | None = None

    @property
    def verdict(self) -> tuple[str, str] | None:
        """("error", why) when vLLM cannot load it, ("warning", why) when it loads but cannot run it, else None."""
        if self.loads is False:
            return "error", self.detail + self.hint
        if self.generates is False:
            return "warning", self.detail
        return None


SERVES = Serving(True, True)
UNKNOWN = Serving()


@dataclass
class Check(Record):
    """One preflight check: ``level`` "error" makes the preflight fail; "warning" and "info" do not."""

    name: str
    ok: bool
    detail: str
    level: str = "error"


def check(name: str, ok: bool, detail: str, level: str = "error") -> Check:
    """A check whose level is "info" when it passed."""
    return Check(name, ok, detail, level if not ok else "info")


@dataclass
class ModelFacts:
    """What a backend's preflight rules read: the model's config and weight shapes (no weights loaded), the
    linear layers the recipe quantizes, and where the quantization runs and what it is served on."""

    info: ModelInfo
    linears: list[Linear]  # every linear layer inside the decoder layers
    quantized: list[Linear]  # those the recipe quantizes (after quantize.ignore)
    valid_group_sizes: list[int]
    has_cuda: bool  # the quantization runs on an NVIDIA GPU here
    target: TargetFacts | None = None  # the resolution's Target; None: not known
    host: HostFacts | None = None  # this host's facts

    @property
    def architecture(self) -> str | None:
        return next(iter(self.info.architectures or []), None) or self.info.model_type

    @property
    def causal_lm(self) -> bool:
        return any(a.endswith(("ForCausalLM", "ForConditionalGeneration")) for a in self.info.architectures or [])


@dataclass(frozen=True)
class Layout:
    """What a quantize section says of the weights, whatever its method: bits, group size, an llm-compressor
    scheme, the modules left alone, the calibration section (each absent where the method has none)."""

    bits: int | None = None
    group_size: int = -1
    scheme: str | None = None
    ignore: tuple[str, ...] = ()
    calibration: CalibrationSection | None = None


class QuantizeConfig(BaseModel):
    """Base of every backend's recipe schema (the quantize section). Each has the fields ``method`` (a Literal),
    ``output`` (where `infertool quantize` writes; None: out/<recipe>-<method>) and, when the recipe names the
    backend, ``backend`` (``registry.backend_field``). ``impl`` is the backend that declared the class;
    ``FIELD_HINTS`` explains an unknown key a user may try here."""

    model_config = STRICT

    impl: ClassVar[QuantBackend[Any]]  # Any: the backend that declared the subclass (any config type)
    FIELD_HINTS: ClassVar[dict[str, str]] = {}
    if TYPE_CHECKING:  # every subclass declares these fields (method a Literal); read through the base type
        method: str
        output: str | None

    @model_serializer(mode="wrap")
    def _with_its_backend(self, handler: Any, info: Any) -> Any:  # Any: pydantic's serializer handler / info / data
        """The backend is always written out, also where defaults are left out (a tuned recipe): a dump read back
        must pick the same backend's schema, and only the method's default backend goes without saying."""
        data = handler(self)
        if (isinstance(data, dict) and "backend" in type(self).model_fields and "backend" not in data
                and "backend" not in (info.exclude or ())):
            data = {"method": data.pop("method", self.method), "backend": getattr(self, "backend"), **data}
        return data

    def label(self) -> str:
        return self.impl.label(self)

    def layout(self) -> Layout:
        """Its bits, group size, scheme, ignore and calibration (a subclass with those fields says them)."""
        return Layout()

    def facts(self) -> dict:
        return self.impl.facts(self)

    def bytes_per_weight(self) -> tuple[float, str]:
        """Bytes per quantized linear weight (scales included) and how to say it: the memory plan's estimate."""
        return self.impl.bytes_per_weight(self)


@dataclass
class TaskInputs:
    """What the quantize capability hands a backend to write its worker task's spec: absolute paths only."""

    model: str  # the original model's directory
    out_dir: str  # where the task writes the checkpoint
    work_dir: str  # scratch space beside it (offloaded layers), removed afterwards
    log_dir: str
    num_layers: int | None
    ignore_modules: list[str]  # the quantize.ignore patterns resolved to module names
    calibration: dict | None  # the calibration section with an absolute source; None: no calibration data
    dtype: str  # model.dtype
    reference_dtype: str | None  # the dtype the original's reference tokens are computed in (None: none)
    compare: bool  # compare the checkpoint greedily in the backend's own kernels (no vLLM here)
    trust_remote_code: bool
    has_cuda: bool  # the task runs on an NVIDIA GPU


@dataclass
class QuantizeTaskResult(Record):
    """A backend's quantize task's answer, read back once from the worker protocol (``quantize.core``): timings,
    the calibration it used, the per-module errors, the settings and versions it ran with, and the original's
    greedy tokens (``reference``) and the comparison in its own kernels where it computed them."""

    timings: dict[str, float] = field(default_factory=dict)
    local_agreement: Agreement | None = None
    reference: GreedyReference | None = None
    calibration: CalibrationInfo | None = None
    layers: list[dict] = field(default_factory=list)  # the backend's per-module log (layer, module, loss, ...)
    quantize_config: dict | None = None
    versions: dict | None = None
    compute_dtype: ComputeDtype | None = None
    model: str | None = None  # a load-time quantization (no task): the original's directory
    trust_remote_code: bool = False  # the spec's, said back by quantize.core


@dataclass
class ComputeDtype(Record):
    """Where calibration ran in another dtype than the model's: in ``dtype``, saved in ``stored``, and why."""

    dtype: str = ""
    stored: str = ""
    why: str = ""


@dataclass
class ReferenceSpec(Record):
    """The original's greedy reference a worker computes: in which dtype (None: the model's)."""

    dtype: str | None = None


@dataclass
class CompareSpec(Record):
    """The spec of a backend's ``compare_task``: a saved checkpoint, greedy against the original's reference."""

    model: str = ""
    reference: GreedyReference = field(default_factory=GreedyReference)
    trust_remote_code: bool = False


@dataclass(frozen=True)
class InitFacts:
    """What `infertool init` knows when it proposes a quantization: the model, and what the target's vLLM does
    with 4-bit weight-only GPTQ (the default backend's ``Serving.verdict`` there)."""

    model_type: str | None
    architecture: str
    target_kind: str  # cpu | gpu
    cpu_isa: str  # avx512 | avx2 | unknown: this host's, for a CPU target
    four_bit: tuple[str, str] | None

    @property
    def four_bit_serves(self) -> bool:
        """4-bit weight-only checkpoints load and run on the target (a GPU, or an AVX-512 CPU that loads them)."""
        return not (self.target_kind == "cpu" and (self.cpu_isa != "avx512" or (self.four_bit or ("",))[0] == "error"))


@dataclass(frozen=True)
class QuantProposal:
    """The quantize section `infertool init` proposes (a backend's choice or a --method preset); None: left out."""

    method: str
    backend: str | None = None
    scheme: str | None = None
    bits: int | None = None
    group_size: int | None = None
    calibration: dict[str, Any] | None = None  # Any: the calibration section's values (source, samples, ...)

    def section(self) -> dict[str, Any]:  # Any: the recipe's values
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass
class InitChoice:
    """A backend's proposal for `infertool init`: the quantize section, and each decision with its reason."""

    quantize: QuantProposal
    decisions: list[tuple[str, Any, str, str]]  # Any: a recipe value. (recipe path, value, why, level "info" | "warning"), in order


class CalibrationSection(Protocol):
    """What the memory estimate reads of a method's calibration section (backends.methods.CalibrationSpec)."""

    samples: int
    seq_len: int

    def model_dump(self, *, mode: str) -> dict[str, Any]: ...  # Any: the section as JSON


Q = TypeVar("Q", bound=QuantizeConfig)


class QuantBackend(Generic[Q]):
    """One quantization backend (see the module docstring). Subclasses set the class attributes and override
    what differs; the defaults describe a calibrating weight quantizer that writes a checkpoint."""

    name: str = ""  # quantize.backend in the recipe
    description: str = ""
    methods: dict[str, type[QuantizeConfig]] = {}
    in_recipe: bool = True  # the recipe names it (quantize.backend); False: the method has no backend field
    env: str | None = None  # the managed environment its worker tasks run in (infertool.envs.specs)
    tasks: tuple[dict, ...] = ()  # its worker task definitions (infertool.tasks.WorkerTask fields)
    task: str | None = None  # the task that quantizes (None: nothing runs, e.g. quantized when loaded)
    compare_task: str | None = None  # greedy comparison in its own kernels, where vLLM cannot generate
    reference_in_worker: bool = False  # its task computes the original's greedy tokens (one vLLM server, not two)
    checkpoint: bool = True  # writes a quantized checkpoint (False: applied when the model is loaded)
    load_time: str | None = None  # the loader's quantization when applied at load time ("bitsandbytes")
    layer_error_metric: str | None = None  # what the per-layer errors in the manifest measure

    def __init__(self) -> None:
        for cls in self.methods.values():
            cls.impl = self

    def __repr__(self) -> str:
        return f"<quantization backend {self.name}: {', '.join(self.methods)}>"

    # ---------------------------------------------------------------------------- naming
    def label(self, q: Q) -> str:
        """'GPTQ 4-bit g64 (gptqmodel)', 'W8A8 (llmcompressor)'."""
        s = q.layout()
        g = "" if (s.group_size == -1 or not self.weight_only(q) and s.scheme) else f" g{s.group_size}"
        what = f"{s.scheme}{g}" if s.scheme else f"{q.method.upper()} {s.bits}-bit{g}"
        return f"{what} ({self.name})"

    def bits(self, q: Q) -> int | None:
        """The weights' bits (the scheme's when it has one)."""
        s = q.layout()
        if (s.scheme or "").startswith(("W8", "FP8")):
            return 8
        if (s.scheme or "").startswith("W4"):
            return 4
        return s.bits

    def facts(self, q: Q) -> dict:
        """``ModelRef.quantization`` of a candidate made this way."""
        s = q.layout()
        return {"method": q.method, "label": self.label(q), "bits": s.bits, "group_size": s.group_size,
                "backend": self.name, "scheme": s.scheme, "weight_only": self.weight_only(q)}

    def weight_only(self, q: Q) -> bool:
        """Weights quantized, activations 16-bit: vLLM runs the checkpoint in half precision only (its weight-only
        kernels refuse float32), so a CPU without bf16 instructions still serves it in 16 bits."""
        return True

    def bytes_per_weight(self, q: Q) -> tuple[float, str]:
        from infertool.perf import roofline

        bits, s = self.bits(q) or 16, q.layout()
        per = roofline.quantized_bytes_per_weight(bits, s.group_size if s.group_size > 0 else None)
        return per, f"{q.method} {bits}-bit g{s.group_size}" + (f" ({s.scheme})" if s.scheme else "")

    # ---------------------------------------------------------------------------- before work starts
    def calibration(self, q: Q) -> CalibrationSection | None:
        """The calibration section (CalibrationSpec), or None when the method needs no data."""
        return q.layout().calibration

    def rules(self, m: ModelFacts, q: Q) -> list[Check]:
        """The backend's preflight checks: architecture, shapes, host (never raises for a failed check)."""
        return []

    def plan(self, q: Q, *, has_cuda: bool) -> dict:
        """What the backend would run (shown by --check, recorded in the preflight's plan)."""
        return {}

    def refusal(self, q: Q, *, has_cuda: bool) -> Exception | None:
        """Why this host cannot run the quantization (an InfertoolError to raise before work starts), or None."""
        return None

    def serving(self, q: Q, platform: str | None) -> Serving:
        """What vLLM does with this checkpoint on ``platform`` (CPU_AVX2, CPU_AVX512, CPU_OTHER, CUDA)."""
        return UNKNOWN

    def memory_estimate(self, m: ModelFacts, q: Q) -> tuple[int, str] | None:
        """Bytes the quantization needs where it runs, and what they are for; None: nothing to estimate."""
        from infertool.backends.layers import calibration_memory_estimate

        cal = self.calibration(q)
        if cal is None:
            return int(m.info.weight_bytes * 2 + 1.5 * 2**30), "the model's weights, quantized in memory"
        est = calibration_memory_estimate(m.info, m.quantized, cal.samples, cal.seq_len, q.method)
        return est, f"calibration ({cal.samples} x {cal.seq_len} tokens)"

    def output_estimate(self, m: ModelFacts, q: Q) -> int | None:
        from infertool.backends.layers import output_size_estimate

        bits = self.bits(q)
        if not bits or not m.quantized:
            return None
        return output_size_estimate(m.info, m.quantized, bits, q.layout().group_size)

    def init_choice(self, f: InitFacts) -> InitChoice | None:
        """The quantization `infertool init` proposes with this backend, or None (the next backend's turn)."""
        return None

    def gentler(self, q: Q, target_kind: str) -> list[str]:
        """Gentler or better quantizations than ``q`` to try when the eval's gates fail, most promising first."""
        return []

    # ---------------------------------------------------------------------------- the work
    def task_spec(self, q: Q, inputs: TaskInputs) -> dict:
        """The spec of ``task`` (JSON data: the worker reads nothing else)."""
        raise NotImplementedError(f"backend {self.name} has no worker task")

    def manifest(self, q: Q, result: QuantizeTaskResult) -> dict:
        """The manifest fields this backend adds, from its task's result (keys of its own: ``result.extra``)."""
        return {}
