"""The recipe's tune section: candidates, the serving grid, machine kinds, classes and routing."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from infertool.metricspec import objective_names
from infertool.recipe.bench import RepeatSpec, SLOSpec
from infertool.recipe.sections import NAME_RE, AcceptSpec, TargetSection
from infertool.recipe.serve import ServeSection
from infertool.schema import (
    MAX_LIST, MAX_PATH, STRICT, ClassName, Name, NoControl, NotBool, Requests, Seconds, Seed, Seqs, Share, Text,
    field_error, sweep,
)


TUNE_OBJECTIVES: tuple[str, ...] = objective_names()  # the metric table's objectives (infertool.metricspec)
if TYPE_CHECKING:
    TuneObjective = str
else:  # a Literal of the table's objectives, built at run time: pydantic checks it and recipe.md lists them
    TuneObjective = Literal[TUNE_OBJECTIVES]


class TuneLoadSearch(BaseModel):
    """How the largest load that meets the SLO is found for each configuration: a bracketing search
    (doubling, then bisection) over concurrency, not a fixed sweep."""

    model_config = STRICT

    min_concurrency: Seqs = 1
    max_concurrency: Seqs | None = None  # default: the trial's max_num_seqs (else 64)
    goodput_target: Share = 0.9  # share of requests that meet the SLO
    requests: Requests | None = None  # per probe; default: bench.requests
    max_probes: Annotated[int, NotBool, Field(ge=2, le=32)] = 8
    # a probe near the SLO edge is repeated until the goodput interval decides it (meets / misses the target), at
    # most max_runs runs; the probe at the largest load meeting the SLO gets min_runs (its throughput's interval);
    # rel_width is not used here (the goodput target decides a probe)
    repeats: RepeatSpec = Field(default_factory=lambda: RepeatSpec(max_runs=3, min_runs=2))
    edge: Annotated[float, NotBool, Field(ge=0.0, le=10)] = 0.25  # a run whose latency is within this share of the SLO bound is near the edge


class TuneAccuracy(BaseModel):
    """Accuracy screening with early stopping: windows/items (and the lm-eval documents and decode prompts of the
    as-served phases) are scored in rounds (cumulative sizes) and a candidate stops as soon as its verdict is
    decided (every gate decided, or one FAILs); after round 1 only the sources of undecided gates are scored
    again. The winner's served check runs in the same rounds, up to served_items."""

    model_config = STRICT

    rounds: Annotated[list[Requests], Field(min_length=1, max_length=MAX_LIST)] = [8, 16, 32]
    served_check: bool = True  # re-check the winner as served, with its exact serving settings
    served_items: Requests | None = None  # the served check's last round (default: the last round)

    @field_validator("rounds")
    @classmethod
    def _increasing(cls, value: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(value, value[1:])):
            raise ValueError(f"rounds are cumulative sizes and must increase; got {value}")
        return value


class TuneRay(BaseModel):
    model_config = STRICT

    address: Text | None = None  # default: RAY_ADDRESS, else "auto"
    cpus_per_trial: Annotated[float, NotBool, Field(ge=0.01, le=1024)] = 1
    max_concurrent_trials: Annotated[int, NotBool, Field(ge=1, le=10_000)] | None = None
    # trials Ray has not started within this many seconds, while no other trial runs, are cancelled and recorded
    # as skipped (never left pending)
    placement_timeout_s: Annotated[float, NotBool, Field(ge=1, le=86_400)] = 600


# Ray's own resources: a machine kind asks for CPUs and GPUs through cpus and its trials' TP x PP, not by name
_RAY_BUILTIN_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}
_RESOURCE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")
MAX_PRICE_PER_HOUR = 10_000.0  # $ per hour (per GPU): above any machine a cloud rents


# Ray names a node's NVIDIA GPU by the first all-caps model token of its name ("NVIDIA H100 80GB HBM3" -> "H100",
# "NVIDIA A100-SXM4-80GB" -> "A100": ray/_private/accelerators/nvidia_gpu.py); the GPU table's datasheet names
# read the same way
_RAY_NVIDIA_RE = re.compile(r"NVIDIA\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")


def ray_accelerator_type(gpu: str) -> str | None:
    """The Ray accelerator type (``ray.util.accelerators``) whose nodes carry ``gpu`` (a GPU table key or alias),
    as Ray labels a node it detects it on; None when Ray has no name for it (then a machine kind names
    accelerator_type or resources itself)."""
    from infertool.perf.hardware import find_gpu

    try:
        spec = find_gpu(gpu)
    except Exception:  # noqa: BLE001 - an unknown GPU: the field's own validator says so
        return None
    name = str(getattr(spec, "name", "") or "")
    if "MI300X" in name or "MI300X" in spec.key:
        return "AMD-Instinct-MI300X-OAM"
    m = _RAY_NVIDIA_RE.match(name)
    return m.group(1).replace(" ", "-") if m and len(m.group(1)) > 1 else None


class TuneMachine(BaseModel):
    """A machine kind tune may run trials on (tune.machines): each trial is one candidate x one serving setting x
    one kind. With tune.executor: ray, a trial asks Ray for a node of its kind: `accelerator_type` (Ray's
    accelerator type, as `ray.util.accelerators` names it: "L4", "H100", "A100-80G"...), `resources` (custom
    resources the kind's nodes were started with, e.g. {"kind_small": 1}), or else the Ray accelerator type of
    `gpu` (a GPU table key: "L4", "H100-SXM"...). `gpu` is also the GPU tune plans the kind's trials for (the
    roofline, the memory fit). `price_per_hour` is $ per hour PER GPU for a kind with GPUs (`gpu` or
    `accelerator_type`): a trial on tensor x pipeline parallel GPUs costs price x TP x PP per hour; for a kind
    without GPUs it is the price of the machine a trial runs on. A trial's $ per 1M output tokens is that price
    over the output tokens it serves in an hour at the largest load meeting the SLO. `cpus`: the CPUs a trial
    asks for on this kind (default tune.ray.cpus_per_trial)."""

    model_config = STRICT

    name: Name
    price_per_hour: Annotated[float, NotBool, Field(le=MAX_PRICE_PER_HOUR, gt=0)]
    accelerator_type: Annotated[str, Field(min_length=1, max_length=100), NoControl] | None = None
    resources: Annotated[dict[Annotated[str, Field(min_length=1, max_length=100), NoControl], Annotated[float, NotBool, Field(le=1e6, gt=0)]],
                         Field(min_length=1, max_length=16)] | None = None
    gpu: Annotated[str, Field(max_length=100), NoControl] | None = None
    cpus: Annotated[float, NotBool, Field(ge=0.01, le=1024)] | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError("a machine kind's name starts with a letter or digit and has only letters, digits, '.', "
                             f"'_' and '-' (it labels trials); got {value!r}")
        return value

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        known = TargetSection._known_gpu(value)
        assert known is None or isinstance(known, str)  # a name in, a name out
        return known

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if key in _RAY_BUILTIN_RESOURCES or key.startswith("accelerator_type:"):
                raise ValueError(f"{key!r} is one of Ray's own resources: a kind asks for CPUs with cpus, GPUs through "
                                 "its trials' tensor x pipeline parallel size, a GPU type with accelerator_type")
            if not _RESOURCE_RE.fullmatch(key):
                raise ValueError(f"resource name {key!r}: letters, digits, '_', '.', ':', '/' and '-' only")
        return value

    @property
    def has_gpus(self) -> bool:
        """A kind with GPUs: its price is per GPU."""
        return bool(self.gpu or self.accelerator_type)


# serve fields that are not serving settings to tune (where it listens, what it serves, secrets)
_NOT_TUNABLE = {"model", "host", "port", "api_key_env", "served_model_name", "env", "extra_args", "allow_code", "cpu",
                "startup_timeout_s", "swap_space", "preemption_mode"}


def _grid_model() -> type[BaseModel]:
    """tune.serve_grid: every tunable serve field, as a list of the values that field accepts (so each value is
    validated like the field itself, with its path: tune.serve_grid.max_num_seqs[1])."""
    fields: dict[str, Any] = {}  # Any: pydantic create_model's (typing form, default) field definitions
    for name, info in ServeSection.model_fields.items():
        if name in _NOT_TUNABLE:
            continue
        inner = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        fields[name] = (sweep(inner) | None, None)
    return create_model("ServeGrid", __config__=STRICT, __doc__="serve field -> values to cross", **fields)


if TYPE_CHECKING:
    class ServeGrid(BaseModel):
        """What a type checker sees of the model ``_grid_model()`` makes: a list of values per tunable serve field."""

        def __getattr__(self, name: str) -> list[Any] | None: ...  # Any: the values of that serve field
else:
    ServeGrid = _grid_model()


MAX_TUNE_CLASSES = 15  # classes tuned apart: an HTTPRoute holds 16 rules, one per class and a default
_HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,256}$")  # an HTTP header name (RFC 7230 token)
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class TuneClass(BaseModel):
    """One traffic class tune.classes tunes apart: its name, its SLO (default tune.slo, else bench.slo) and its
    share of target.peak_rps (default: its share of the traffic's requests)."""

    model_config = STRICT

    name: ClassName
    slo: SLOSpec | None = None
    share: Share | None = None


class TuneRouting(BaseModel):
    """How `serve --emit k8s` routes a per-class tune: a Gateway API HTTPRoute attached to the Gateway
    ``gateway`` sends a request whose header ``header`` names a class to that class's Service; the others
    to the largest class's."""

    model_config = STRICT

    header: Annotated[str, Field(min_length=1, max_length=256)] = "x-infertool-class"
    gateway: Annotated[str, Field(min_length=1, max_length=63)] = "inference-gateway"

    @field_validator("header")
    @classmethod
    def _check_header(cls, value: str) -> str:
        if not _HEADER_RE.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is no HTTP header name: letters, digits and !#$%&'*+.^_`|~- only")
        return value

    @field_validator("gateway")
    @classmethod
    def _check_gateway(cls, value: str) -> str:
        if not _DNS_LABEL_RE.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is no Gateway name: lower-case letters, digits and '-', starting and "
                             "ending with a letter or digit, at most 63")
        return value


class TuneSection(BaseModel):
    """`infertool tune`: which quantization x serving configuration to ship."""

    model_config = STRICT

    # each a partial quantize section over the recipe's (method, bits, group_size, backend, scheme...);
    # "none": the original model
    candidates: Annotated[list[Literal["none"] | dict[str, Any]], Field(min_length=1, max_length=MAX_LIST)]  # Any: a partial quantize section as the YAML holds it (validated per backend later)
    serve_grid: ServeGrid = Field(default_factory=lambda: ServeGrid())  # serve field -> values to cross
    objective: TuneObjective = "cost"  # a metric of infertool.metricspec.METRICS that names an objective
    accept: AcceptSpec | None = None  # default: eval.accept
    slo: SLOSpec | None = None  # default: bench.slo
    max_trials: Annotated[int, NotBool, Field(ge=1, le=10_000)] = 24
    max_wall_s: Seconds = 4 * 3600
    sampler: Literal["auto", "grid", "tpe"] = "auto"  # auto: the grid when it fits max_trials, else Optuna TPE
    seed: Seed = 0
    executor: Literal["local", "ray"] = "local"
    ray: TuneRay = Field(default_factory=TuneRay)
    # machine kinds to compare (each trial on one): none = this machine (local) or any node (ray) at bench.cost_per_hour
    machines: Annotated[list[TuneMachine], Field(min_length=1, max_length=MAX_LIST)] | None = None
    load: TuneLoadSearch = Field(default_factory=TuneLoadSearch)
    accuracy: TuneAccuracy = Field(default_factory=TuneAccuracy)
    out_dir: Annotated[str, Field(min_length=1, max_length=MAX_PATH), NoControl] = "tune"
    # tune per traffic class (infertool.tune.classes): true = every class of the traffic, or the classes to tune
    # apart (a name, or {name, slo, share}); each its own search over the same trials' shared accuracy evidence
    classes: bool | Annotated[list[ClassName | TuneClass], Field(min_length=1, max_length=MAX_TUNE_CLASSES)] | None = None
    routing: TuneRouting = Field(default_factory=TuneRouting)  # the per-class tune's HTTPRoute (serve --emit k8s)

    @model_validator(mode="after")
    def _check_classes(self) -> TuneSection:
        """Each class named once."""
        seen: dict[str, int] = {}
        for i, c in enumerate(self.classes if isinstance(self.classes, list) else []):
            name = c if isinstance(c, str) else c.name
            if name in seen:
                raise field_error(f"classes[{i}]", f"class {name!r} is also classes[{seen[name]}]: name each class once")
            seen[name] = i
        return self

    @model_validator(mode="after")
    def _check_machines(self) -> TuneSection:
        """Machine kinds: distinct names; on Ray each says where Ray finds it; more than one kind needs Ray (the
        local executor runs on this one machine: one kind, its price and GPU, may describe it)."""
        kinds = self.machines or []
        seen: dict[str, int] = {}
        for i, m in enumerate(kinds):
            if m.name in seen:
                raise field_error(f"machines[{i}].name", f"machine kind {m.name!r} is also machines[{seen[m.name]}]: "
                                   "each kind needs its own name (it labels its trials)")
            seen[m.name] = i
        if len(kinds) > 1 and self.executor != "ray":
            raise field_error("machines", f"{len(kinds)} machine kinds need tune.executor: ray (each trial placed on "
                               "a node of its kind); the local executor runs every trial on this machine, one kind")
        if self.executor == "ray":
            for i, m in enumerate(kinds):
                if not (m.accelerator_type or m.resources or (m.gpu and ray_accelerator_type(m.gpu))):
                    what = f"gpu {m.gpu} has no Ray accelerator type" if m.gpu else "it names neither"
                    raise field_error(f"machines[{i}]", f"machine kind {m.name!r}: Ray places a trial by "
                                       f"accelerator_type or custom resources, and {what}: add accelerator_type "
                                       "(e.g. 'L4', 'H100') or resources (e.g. {kind_small: 1})")
        return self

