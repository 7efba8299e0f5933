"""The search space of `infertool tune`: candidates x serving grid (x machine kinds, when tune.machines lists
them) -> trials, each a complete recipe that every other command would read the same way (the recipe's one
resolution), and the roofline's prediction of each (on its kind's GPU, at its kind's price).

Pure apart from ``predict`` (which reads model facts the way `infertool plan` does, no weights).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterator, Mapping

from infertool.data.fingerprint import digest
from infertool.errors import RecipeError, UsageError
from infertool.records import JSONView
from infertool.tune.records import KindPrediction, MachineInfo, PredictionRecord, Screening, max_num_seqs

if TYPE_CHECKING:
    from pydantic import BaseModel

    from infertool.perfmodel.model import PerfModel
    from infertool.plan.predicted import PlannedSpeed
    from infertool.recipe import Recipe, ServeSection, TuneMachine, TuneSection
    from infertool.resolve import Resolution
    from infertool.stages.base import EventCallback



def settings_text(settings: Mapping[str, JSONView]) -> str:
    """Serve settings in a few words: ``key=value``, a section as compact JSON without its unset fields."""
    def value(v: JSONView) -> str:
        if isinstance(v, Mapping):
            return json.dumps({k: x for k, x in v.items() if x is not None}, separators=(",", ":"))
        if isinstance(v, (str, int, float, bool)) or v is None:
            return str(v)
        return json.dumps(list(v), separators=(",", ":"))

    return ", ".join(f"{k}={value(v)}" for k, v in settings.items())

@dataclass(frozen=True)
class Candidate:
    index: int
    spec: dict[str, object] | None  # the merged quantize section (recipe data); None: the original model
    label: str
    key: str

    @property
    def original(self) -> bool:
        return self.spec is None

    def to_dict(self) -> dict[str, JSONView]:
        return asdict(self)


# Serve settings that can change a served model's OUTPUTS (its numerics), each with why: a trial whose grid point
# sets one of them to another value than the recipe's serve section is another configuration for accuracy: it is
# screened AS SERVED with those settings (its own screen stage, keyed by them) before it may show PASS. The one list
# tune, its dry run and its records read (``scoring_point``).
OUTPUT_SETTINGS: dict[str, str] = {
    "enforce_eager": "CUDA graphs / torch.compile (false) run other kernels and fusions than eager mode; measured on a "
                     "CPU, the original's greedy answers differ between the two (issue 21)",
    "dtype": "the precision the weights and activations are computed in",
    "kv_cache_dtype": "the KV cache stored at another precision (fp8) changes every attention read",
    "quantization": "the kernel and weight format vLLM loads the checkpoint with",
    "speculative": "speculative decoding verifies draft tokens in batched target passes (other shapes, other "
                   "kernels) and changes what the decode steps compute; vLLM does not promise bit-equal outputs",
    "tensor_parallel_size": "sharded matmuls sum their parts by all-reduce, in another order: other rounding",
}
# Not in the list, so such trials share their candidate's screening: max_num_seqs, max_num_batched_tokens,
# enable_prefix_caching, enable_chunked_prefill, gpu_memory_utilization, max_model_len, pipeline_parallel_size (the
# same kernels per layer), the executor backend and the tool / structured-output parsers (they shape load, memory
# and scheduling, not what one request computes at the screening's load).


# The reference (the original every screening and the served check are scored against) is served with the recipe's
# serve settings and these over them: an FP8 KV cache is a lossy setting, never part of what a trial is compared
# with, so a trial served with one (the recipe's own or a grid point's) is screened as served against the original
# at the model's own KV precision.
REFERENCE_SERVE: dict[str, JSONView] = {"kv_cache_dtype": "auto"}


def reference_recipe(recipe: Recipe) -> Recipe:
    """What the reference serves: the original (no quantize, no tune) at the recipe's serve settings with
    ``REFERENCE_SERVE`` over them."""
    serve = recipe.serve.model_copy(update=REFERENCE_SERVE) if recipe.serve is not None else None
    return recipe.model_copy(update={"quantize": None, "tune": None, "serve": serve})


def scoring_point(recipe: Recipe, point: dict[str, JSONView], original: bool = False) -> dict[str, JSONView]:
    """The output-changing settings (``OUTPUT_SETTINGS``) of a grid point whose value differs from what the trial's
    shared screening is served with: a quantized candidate's is the recipe's own serve section; the original's is
    the reference itself (``original``), whose ``REFERENCE_SERVE`` settings are compared as the trial serves them
    (its grid point's value, else the recipe's). Empty: the trial shares its candidate's screening (the original:
    it is the reference)."""
    own = recipe.serve.model_dump(mode="json") if recipe.serve is not None else {}
    if not own:
        from infertool.recipe import ServeSection

        own = ServeSection().model_dump(mode="json")
    shared = {**own, **REFERENCE_SERVE} if original else own
    out: dict[str, JSONView] = {}
    for key in [*point, *(REFERENCE_SERVE if original else ())]:
        value = point[key] if key in point else own.get(key)
        if key in OUTPUT_SETTINGS and key not in out and json.dumps(value, sort_keys=True, default=str) != json.dumps(
                shared.get(key), sort_keys=True, default=str):
            out[key] = value
    return out


def scored_settings(serve: ServeSection) -> dict[str, JSONView]:
    """The output-changing settings of a serve section as served (a ``ServeSection``): ``accuracy.scored_with``."""
    d = serve.model_dump(mode="json")
    return {key: d.get(key) for key in OUTPUT_SETTINGS}


@dataclass
class Trial:
    id: str
    candidate: Candidate
    serve: dict[str, JSONView]  # the grid point: serve field -> value
    recipe: Recipe  # the trial's full recipe (quantize = the candidate, serve = the grid point, no tune)
    prediction: PredictionRecord = field(default_factory=PredictionRecord)
    index: int = 0  # its place in the search space (``Space.trial``): how a Ray worker rebuilds it
    machine: TuneMachine | None = None  # its machine kind; None: no tune.machines
    # its output-changing settings that differ from the recipe's (``scoring_point``): non-empty, it is screened as
    # served with them (its own screening); empty, it shares its candidate's (the original: it is the reference)
    scoring: dict[str, JSONView] = field(default_factory=dict)
    # its recipe resolved once, with the candidate it WILL make (``resolution``); never sent to a Ray worker (a
    # worker rebuilds the trial from ``index`` and resolves on its own host)
    planned: Resolution | None = field(default=None, repr=False, compare=False)

    def resolution(self) -> Resolution:
        """The trial's recipe resolved once (``_as_planned``: the candidate it will make, not what a publish put at
        quantize.output): the plan, the decode check and the capacity search's start read it."""
        if self.planned is None:
            from infertool.resolve import resolve

            self.planned = _as_planned(resolve(self.recipe))
        return self.planned

    @property
    def max_num_seqs(self) -> int | None:
        """Its grid point's max_num_seqs (None: not on the grid); siblings differ in it only."""
        return max_num_seqs(self.serve)

    @property
    def own_screening(self) -> bool:
        """Whether its accuracy is scored with its own serve settings, not shared with its candidate's screening."""
        return bool(self.scoring)

    @property
    def screen_label(self) -> str:
        """What its screening scores: the candidate, with its output-changing serve settings when it has any."""
        return self.candidate.label + (f" with {settings_text(self.scoring)}" if self.scoring else "")

    def screening(self) -> Screening:
        """What the dry run and the trial's record say of its accuracy screening: shared or its own, and with what."""
        if self.scoring:
            return Screening(own=True, settings=dict(self.scoring),
                             why="; ".join(f"{k}: {OUTPUT_SETTINGS[k]}" for k in self.scoring))
        shared = "the reference itself" if self.candidate.original else f"{self.candidate.label}'s screening"
        return Screening(own=False, settings={}, shares=f"{shared}, at the recipe's serve settings")

    @property
    def label(self) -> str:
        point = ", ".join(f"{k}={v}" for k, v in self.serve.items())
        kind = f" @ {self.machine.name}" if self.machine is not None else ""
        return f"{self.candidate.label}" + (f" | {point}" if point else "") + kind

    @property
    def price_per_hour(self) -> float | None:
        """What the trial's machine costs per hour (its kind's price x the GPUs it takes); None: no machine kind
        (bench.cost_per_hour prices it, as before)."""
        return machine_price(self.machine, self.recipe) if self.machine is not None else None

    def to_dict(self) -> dict[str, JSONView]:
        d: dict[str, JSONView] = {"id": self.id, "label": self.label, "candidate": self.candidate.to_dict(),
                                   "serve": dict(self.serve),
             "prediction": self.prediction.to_dict(), "screening": self.screening().to_dict()}
        if self.machine is not None:
            d["machine"] = machine_info(self.machine, self.recipe).to_dict()
        return d


def machine_gpus(machine: TuneMachine, recipe: Recipe) -> int:
    """The GPUs a trial takes on a kind with GPUs (its tensor x pipeline parallel size); 1 (the machine) else."""
    if not machine.has_gpus:
        return 1
    s = recipe.serve
    return (s.tensor_parallel_size * s.pipeline_parallel_size) if s is not None else 1


def machine_price(machine: TuneMachine, recipe: Recipe) -> float:
    """$ per hour of one trial of ``recipe`` on ``machine``: price_per_hour per GPU x its GPUs (a kind with GPUs),
    else price_per_hour (the machine)."""
    return machine.price_per_hour * machine_gpus(machine, recipe)


def machine_info(machine: TuneMachine, recipe: Recipe) -> MachineInfo:
    """What tune.json says of a trial's machine kind: its name, price, the GPUs the trial takes and what that costs
    per hour, and how Ray finds it."""
    return MachineInfo(name=machine.name, price_per_hour=machine.price_per_hour,
                       price_per="gpu" if machine.has_gpus else "machine", gpus=machine_gpus(machine, recipe),
                       trial_price_per_hour=machine_price(machine, recipe), gpu=machine.gpu,
                       accelerator_type=machine.accelerator_type, resources=machine.resources, cpus=machine.cpus)


def tune_of(recipe: Recipe) -> TuneSection:
    """The recipe's tune section (``run_tune`` and the command refuse a recipe without one first)."""
    if recipe.tune is None:
        raise UsageError(f"recipe {recipe.name!r} has no tune section")
    return recipe.tune


def candidates(recipe: Recipe) -> list[Candidate]:
    """The recipe's candidates, each merged over the recipe's quantize section (validated by the recipe)."""
    from infertool.recipe import QuantizeSection
    from pydantic import TypeAdapter

    base = recipe.quantize.model_dump(mode="json", exclude={"output"}) if recipe.quantize is not None else {}
    method = recipe.quantize.method if recipe.quantize is not None else None
    out: list[Candidate] = []
    seen: dict[str, int] = {}
    for i, cand in enumerate(tune_of(recipe).candidates):
        if cand == "none":
            spec, label = None, "original"
        else:
            merged = {**(base if cand.get("method", method) == method else {}), **cand}
            merged.pop("output", None)
            q = TypeAdapter(QuantizeSection).validate_python(merged)
            spec = q.model_dump(mode="json", exclude={"output"})
            label = q.label()
        key = digest(spec)
        if key in seen:
            raise UsageError(f"tune.candidates[{i}] is the same quantization as tune.candidates[{seen[key]}]",
                             hint="remove the duplicate candidate")
        seen[key] = i
        out.append(Candidate(i, spec, label, key))
    return out


# A tune runs each trial for minutes (a server started, its load searched) and at most tune.max_trials (<= 10,000)
# of them: a space beyond a million trials would be sampled on under 1 % of its points; it is a list crossed with
# itself by mistake, not a search. Refused from the axis lengths alone, before anything is built (a 64^4 x 4 grid
# materialised whole took 18.5 GB).
MAX_SPACE = 1_000_000
# Trials planned (a recipe and a roofline prediction each: about a millisecond and a few KB) before anything runs:
# the whole space when it is this small, else a sample of this many (or of tune.max_trials, when larger) drawn with
# tune.seed; a sampler's later picks are planned when picked.
PLAN_SAMPLE = 1024


@dataclass(frozen=True)
class Grid:
    """The serving grid as its axes (serve field -> values, the recipe's order): its points by index, in
    ``itertools.product`` order (the last axis fastest), never all at once."""

    axes: tuple[tuple[str, tuple[JSONView, ...]], ...]

    @property
    def size(self) -> int:
        """The number of points: the product of the axis lengths (1 without an axis: the recipe's own settings)."""
        return math.prod(len(values) for _, values in self.axes)

    def point(self, index: int) -> dict[str, JSONView]:
        """The point at ``index`` (mixed radix over the axes), as ``list(self)[index]`` would give it."""
        if not 0 <= index < self.size:
            raise IndexError(f"grid point {index} of {self.size}")
        picked: dict[str, JSONView] = {}
        for key, values in reversed(self.axes):
            index, at = divmod(index, len(values))
            picked[key] = values[at]
        return {key: picked[key] for key, _ in self.axes}

    def index(self, positions: dict[str, int]) -> int:
        """The index of the point that takes value ``positions[field]`` of each axis (the inverse of ``point``)."""
        out = 0
        for key, values in self.axes:
            out = out * len(values) + positions[key]
        return out

    def __iter__(self) -> Iterator[dict[str, JSONView]]:
        keys = [key for key, _ in self.axes]
        for values in itertools.product(*(values for _, values in self.axes)):
            yield dict(zip(keys, values))

    def describe(self) -> str:
        return " x ".join(f"{key} {len(values)}" for key, values in self.axes)


def grid(recipe: Recipe) -> Grid:
    """The recipe's serving grid (nothing crossed). A value listed twice on one axis is refused: two trials would
    be the same configuration (the same id, the same directory)."""
    data = {k: v for k, v in tune_of(recipe).serve_grid.model_dump().items() if v is not None}
    for key, values in data.items():
        seen: set[str] = set()
        for value in values:
            enc = json.dumps(value, sort_keys=True, default=str)
            if enc in seen:
                raise UsageError(f"tune.serve_grid.{key} lists {enc} twice",
                                 hint="remove the duplicate value: each trial is one distinct configuration")
            seen.add(enc)
    return Grid(tuple((key, tuple(values)) for key, values in data.items()))


@dataclass
class Space:
    """Candidates x serving grid x machine kinds: trial ``i`` is, with M kinds (1 without tune.machines), candidate
    ``i // M // grid.size`` at grid point ``i // M % grid.size`` on kind ``i % M`` (the order ``trials`` lists them
    in); built one at a time, on demand."""

    recipe: Recipe
    candidates: list[Candidate]
    grid: Grid
    machines: list[TuneMachine] = field(default_factory=list)  # tune.machines; empty: no kind dimension

    @property
    def kinds(self) -> int:
        """The length of the machine-kind dimension (1 without tune.machines)."""
        return len(self.machines) or 1

    @property
    def size(self) -> int:
        return len(self.candidates) * self.grid.size * self.kinds

    def trial(self, index: int) -> Trial:
        if not 0 <= index < self.size:
            raise IndexError(f"trial {index} of {self.size}")
        rest, m = divmod(index, self.kinds)
        c, p = divmod(rest, self.grid.size)
        cand, point = self.candidates[c], self.grid.point(p)
        machine = self.machines[m] if self.machines else None
        # the same configuration on another kind is another trial
        ident = {"candidate": cand.key, "serve": point, **({"machine": machine.name} if machine is not None else {})}
        tid = digest(ident)[:12]
        return Trial(tid, cand, point, trial_recipe(self.recipe, cand, point, machine), index=index, machine=machine,
                     scoring=scoring_point(self.recipe, point, cand.original))

    def index(self, candidate: int, positions: dict[str, int], machine: int = 0) -> int:
        """The index of candidate ``candidate`` at the grid point of ``positions`` (field -> value position) on
        machine kind ``machine`` (its position in tune.machines)."""
        return (candidate * self.grid.size + self.grid.index(positions)) * self.kinds + machine

    def sample(self, k: int, seed: int) -> list[int]:
        """The indices of the trials to plan: every one when ``k`` covers the space, else ``k`` drawn with
        ``seed`` (``random.sample`` of a range: the space is never listed), in index order."""
        if self.size <= k:
            return list(range(self.size))
        return sorted(random.Random(seed).sample(range(self.size), k))

    def describe(self) -> str:
        axes = f": {self.grid.describe()}" if self.grid.axes else ""
        kinds = f" x {len(self.machines)} machine kinds" if self.machines else ""
        return (f"{self.size:,} trials ({len(self.candidates)} candidates x {self.grid.size:,} serving "
                f"settings{axes}{kinds})")


def search_space(recipe: Recipe) -> Space:
    """The recipe's search space, counted from the axis lengths before anything is built; a space of more than
    MAX_SPACE trials is refused (exit 2) with its size and axes."""
    g = grid(recipe)
    tune = tune_of(recipe)
    machines = list(tune.machines or [])
    n = len(tune.candidates) * g.size * (len(machines) or 1)
    if n > MAX_SPACE:
        axes = f": {g.describe()}" if g.axes else ""
        kinds = f" x {len(machines)} machine kinds" if machines else ""
        raise UsageError(
            f"tune's search space is {n:,} trials ({len(tune.candidates)} candidates x {g.size:,} serving "
            f"settings{axes}{kinds}), more than the {MAX_SPACE:,} one tune searches",
            hint="a tune runs at most tune.max_trials (<= 10,000) trials, under 1% of a space this large: keep the "
                 "serve_grid values that matter (each axis multiplies the space), or split it into several tunes")
    return Space(recipe, candidates(recipe), g, machines)


def trial_recipe(recipe: Recipe, candidate: Candidate, point: dict[str, JSONView],
                 machine: TuneMachine | None = None) -> Recipe:
    """The recipe of one trial: the candidate as its quantize section, the grid point over its serve section,
    serve.model cleared (the trial serves its candidate), no tune section; on a machine kind, its GPU as
    target.gpu (what plan and the roofline read) and its price for the trial as bench.cost_per_hour."""
    from infertool.recipe import BenchSection, recipe_to_dict, validate_recipe_data

    def dump(section: BaseModel | None) -> dict[str, JSONView]:
        return section.model_dump(mode="json") if section is not None else {}

    gpu = machine.gpu if machine is not None else None
    data = {**recipe_to_dict(recipe), "tune": None,
            "quantize": dict(candidate.spec) if candidate.spec is not None else None,
            "serve": {**dump(recipe.serve), **point, "model": None},
            **({"target": {**dump(recipe.target), "gpu": gpu}} if gpu else {})}
    try:
        trial = validate_recipe_data({k: v for k, v in data.items() if v is not None or k == "serve"},
                                     source=f"tune trial ({candidate.label}, {point})")
    except RecipeError as e:
        raise UsageError(f"the trial {candidate.label} with {point} is not a valid recipe: "
                         + "; ".join(f"{i.path}: {i.message}" for i in e.issues)) from None
    if machine is None:  # on a machine kind: its price for the trial (its GPUs) is bench.cost_per_hour
        return trial
    bench = (trial.bench or BenchSection()).model_copy(update={"cost_per_hour": machine_price(machine, trial)})
    return trial.model_copy(update={"bench": bench})


def trials(recipe: Recipe) -> list[Trial]:
    """Every trial, candidate by candidate, of a space small enough to plan whole (PLAN_SAMPLE); a larger one is
    read by index (``search_space(recipe).trial(i)``)."""
    sp = search_space(recipe)
    if sp.size > PLAN_SAMPLE:
        raise UsageError(f"tune's search space is {sp.describe()}: too many to list (at most {PLAN_SAMPLE:,})")
    return [sp.trial(i) for i in range(sp.size)]


def _as_planned(res: Resolution) -> Resolution:
    """The resolution with the candidate the trial WILL make (planned from its base and method), never whatever is
    at quantize.output now: a checkpoint published there by an earlier run or tune is another candidate's."""
    import dataclasses

    if res.candidate is None or not res.candidate.exists or res.candidate.path is None:
        return res
    cand = res.candidate_at(res.candidate.path, exists=False)
    served = cand if res.served is res.candidate or res.served_origin == "candidate" else res.served
    return dataclasses.replace(res, candidate=cand, served=served)


def predict(trial: Trial, concurrency: int | None = None, perf_model: PerfModel | None = None,
            slo: tuple[float | None, float | None] | None = None) -> PredictionRecord:
    """What `infertool plan` says of the trial before anything is measured: does it fit (memory, KV capacity
    for the traffic, position limits), and the roofline bound for decode tokens/s at ``concurrency``
    (default: the largest batch its KV cache allows, capped by max_num_seqs) and the $ per 1M output tokens
    that bound would cost. ``perf_model``: on a machine kind with a GPU, the performance model's prediction
    with intervals too (``model``: ``tune.outlook`` weighs the kinds with it), at ``slo`` (TPOT, TTFT ms: tune's)."""
    from infertool import plan as planning

    r = trial.recipe
    res = trial.resolution()
    bench = r.bench
    assert bench is not None  # a tune recipe has one
    per_request = bench.prompt.len + bench.output_len
    on_gpu_kind = perf_model is not None and trial.machine is not None and bool(trial.machine.gpu)
    p = planning.plan(res, planning.PlanOptions(context=bench.prompt.len + bench.output_len // 2,
                                                batches=[concurrency] if concurrency else None,
                                                predict=on_gpu_kind, perf_model=perf_model, slo=slo, predict_at=[]))
    reasons = list(p.reasons)
    if p.capacity.kv_tokens and p.capacity.kv_tokens < per_request:
        reasons.append(f"the KV cache holds {p.capacity.kv_tokens:,} tokens, fewer than one request of the traffic "
                       f"({per_request:,})")
    rows, roof = p.roofline.decode, p.roofline
    knee = roof.knee.concurrency if roof.knee else None
    at = concurrency or knee  # calibrated: the predicted max load; else the largest batch the KV cache allows
    row = next((x for x in rows if at and x.batch == at), rows[-1] if rows else None)
    calibrated = bool(row and row.calibrated_tokens_per_s is not None)
    tps = (row.calibrated_tokens_per_s if calibrated else row.tokens_per_s) if row else None
    bound = (("overhead" if row.overhead_bound else row.bound) if calibrated else row.bound) if row else None
    cost = bench.cost_per_hour
    return PredictionRecord(
        fits=not reasons, reasons=reasons, weight_bytes=p.model.weight_bytes, kv_tokens=p.capacity.kv_tokens,
        max_batch_by_kv=max(1, p.capacity.kv_tokens // max(1, per_request)) if p.capacity.kv_tokens else 0,
        batch=row.batch if row else None, decode_tokens_per_s=tps, bound=bound,
        peak_source=(roof.peak_source if not calibrated or roof.calibration is None else
                     f"{roof.peak_source}; engine step cost as served (calibration {roof.calibration.key})"),
        cost_per_1m_output_tokens=(cost / (tps * 3600) * 1e6) if (cost is not None and tps) else None,
        calibration=roof.calibration.key if calibrated and roof.calibration else None,
        step_ms=(row.calibrated_step_ms if calibrated else row.step_ms) if row else None, knee=knee,
        model=kind_prediction(p.predicted) if p.predicted is not None else None)


def kind_prediction(speed: PlannedSpeed) -> KindPrediction | None:
    """The performance model's prediction at the trial's operating point (``PlannedSpeed.at_slo``), as tune.json
    keeps it; None where the model has no number (no points for the hardware)."""
    at = speed.at_slo
    if at is None or speed.none:
        return None
    return KindPrediction(model=speed.model, weights=speed.weights, gpu=speed.gpu, gpus=speed.gpus,
                          input_len=speed.input_len, output_len=speed.output_len, price_per_hour=speed.price_per_hour,
                          concurrency=at.concurrency, ttft_ms=at.ttft_ms,
                          tpot_ms=at.tpot_ms, output_tps=at.output_tps,
                          usd_per_mtok=at.usd_per_mtok, wide=list(speed.wide))


def capacity_start(trial: Trial, res: Resolution, url: str, served_name: str, lo: int, hi: int, *,
                   headers: dict[str, str] | None = None,
                   on_event: EventCallback | None = None) -> int | None:
    """Where the trial's capacity search starts: the knee the calibrated model predicts (clipped to [lo, hi]).
    The calibration of this host, model and serve settings is measured on the trial's running server first when
    none is cached (or the cached one has no point at ``hi``): seconds, once per key and batch. None (start at ``lo``)
    when the calibration cannot be measured (said as a log event, never fatal: the search still runs)."""
    from infertool.errors import InfertoolError
    from infertool.profile import calibration

    bench = trial.recipe.bench
    assert bench is not None  # a tune recipe has one
    try:
        calibration.ensure_on_server(res, url, served_name, batch=hi, context=bench.prompt.len + bench.output_len // 2,
                                     prompt_len=bench.prompt.len, headers=headers, on_event=on_event)
    except (InfertoolError, ValueError) as e:  # never fatal: the search starts at lo, as without a model
        if on_event:
            why = e.message if isinstance(e, InfertoolError) else str(e)
            on_event({"event": "log", "message": f"no calibration of the engine's step cost: {why}"})
        return None
    knee = predict(trial).knee
    return None if knee is None else max(lo, min(hi, knee))
