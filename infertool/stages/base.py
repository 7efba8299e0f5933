"""The Stage type: one step of `run` or `tune`, declared once, and the one key function computed from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from infertool.summaries import StageSummary

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from infertool.recipe import Recipe
    from infertool.resolve import Resolution
    from infertool.serve.pool import ServerPool

EventCallback = Callable[[dict], None]

# bumped when every stage's entries change form; a single stage's new form is its own ``format``
KEY_VERSION = 2
# the host facts that decide how a model is served and timed (the serve dtype on a CPU): part of the key of a
# stage that declares ``host=True``
HOST_FACTS = ("accelerator", "cpu_isa", "cpu_bf16", "cpu_fp16")


@dataclass
class StageOutput:
    """A completed stage, as the stages after it see it: its cache entry and its typed summary."""

    dir: Path
    summary: StageSummary
    key: str = ""


@dataclass
class StageContext:
    """What a stage's ``run`` is given: the recipe it reads, the temporary directory it writes into (renamed
    into its entry when it returns), the outputs of the stages it depends on, where progress goes, the run's
    servers, its options, what its graph gives besides the recipe (``job``: tune's trial and settings) and the
    graph's resolution (``res``: `run` resolves its recipe once, the candidate where its quantize stage wrote it)."""

    recipe: Recipe
    run_dir: Path | None
    work: Path
    upstream: dict[str, StageOutput] = field(default_factory=dict)
    on_event: EventCallback | None = None
    servers: ServerPool | None = None  # the run's pool; None: the stage launches and stops its own
    options: DataclassInstance | None = None  # an instance of its Stage.options dataclass (read with isinstance)
    job: Any = None  # Any: tune's TrialJob (tune sits above stages: no import of it here)
    res: Resolution | None = None  # the graph's one resolution (`run`'s); None: the stage resolves its recipe

    def emit(self, message: str, level: str = "info") -> None:
        if self.on_event is not None:
            self.on_event({"event": "log", "level": level, "message": message})

    def dir_of(self, name: str) -> Path | None:
        """The entry of an upstream stage (None: it is not part of this graph, e.g. quantize without a quantize
        section)."""
        out = self.upstream.get(name)
        return out.dir if out is not None else None


Need = bool | Callable[["Recipe"], bool]


@dataclass(frozen=True)
class Stage:
    """One step of `run` or `tune`, declared once; the graphs, the key, the device and server handling are
    computed from these declarations (``infertool.stages.registry``).

    - ``sections``: the recipe sections it reads (their values enter its key);
    - ``inputs``: what it reads by content (keys of ``Resolution.inputs()``: model, calibration, suite, prompts,
      phases (the decode prompts and lm-eval task files), served_model), part of its key;
    - ``host``: whether this host's facts (``HOST_FACTS``: accelerator, CPU ISA, half-precision support) enter its
      key: a stage that serves or times;
    - ``depends``: the stages whose outputs it reads (registered before it; their keys enter its key);
    - ``asked_by``: the recipe section that asks for it: `run` selects it when the recipe has that section, and a
      stage that depends on it goes without it when the recipe lacks it (None: always there);
    - ``format``: its output format version (a new one: older entries are not reused);
    - ``device``: it runs an engine in this process's workers (quantize, hf eval, hf profile): on a GPU it needs
      the device to itself; ``server``: it starts vLLM servers (through the run's pool); each a bool or a
      function of the recipe (eval and profile depend on their engine);
    - ``times_host``: it times this machine: idle servers beside it are paused and what they took is recorded;
    - ``graphs``: which graphs it belongs to (``run``, ``tune``); a dependency outside a graph enters the key of
      the stages that depend on it but does not run there;
    - ``key_parts(recipe, job)``: derived facts that decide its output besides the above (bench: what it
      measures; tune: a trial id, rounds); ``options``: the dataclass of its options (a non-default value
      enters the key: tune's quantization without the load check);
    - ``view(recipe, job)``: the recipe it reads, made from its graph's (tune's reference: the original as the
      recipe serves it); None: the graph's recipe;
    - ``launches(res) -> {label: launch}``: the servers it would start for a resolution (a dry run shows them,
      and which of them share one server); ``notes(res)``: what a dry run says of it besides;
    - ``run(ctx) -> summary``: the work, a thin adapter over a capability; ``summary``: its type.
    """

    name: str
    run: Callable[[StageContext], Any]  # Any: its summary record, or a stand-in's plain dict (see summarize)
    summary: type[StageSummary] = StageSummary
    sections: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    host: bool = False
    depends: tuple[str, ...] = ()
    asked_by: str | None = None
    format: int | None = None
    device: Need = False
    server: Need = False
    times_host: bool = False
    graphs: tuple[str, ...] = ("run",)
    key_parts: Callable[[Recipe, Any], dict] | None = None  # Any: the graph's job (tune's TrialJob)
    options: type | None = None
    view: Callable[[Recipe, Any], Recipe] | None = None  # Any: the graph's job (tune's TrialJob)
    launches: Callable[[Resolution], dict] | None = None
    notes: Callable[[Resolution], list[str]] | None = None
    doc: str = ""

    def uses_device(self, recipe: Recipe) -> bool:
        """Whether it runs an engine in this process's workers (it needs the GPU to itself)."""
        return self.device(recipe) if callable(self.device) else bool(self.device)

    def uses_servers(self, recipe: Recipe) -> bool:
        """Whether it starts vLLM servers (through the run's pool when there is one)."""
        return self.server(recipe) if callable(self.server) else bool(self.server)

    def asked(self, recipe: Recipe) -> bool:
        """Whether the recipe asks for it (has the section that does)."""
        return self.asked_by is None or getattr(recipe, self.asked_by, None) is not None

    def summarize(self, value: Any) -> StageSummary:  # Any: a record or a stand-in's plain dict
        """What ``run`` returned as this stage's summary type (a stand-in's plain dict, another record)."""
        if isinstance(value, self.summary):
            return value
        return self.summary.from_dict(value.to_dict() if hasattr(value, "to_dict") else value)

    def planned_launches(self, res: Resolution) -> dict:
        """The server launches it would make for ``res`` (label -> the launch as data), for a dry run."""
        return self.launches(res) if self.launches is not None else {}

    def planned_notes(self, res: Resolution) -> list[str]:
        return self.notes(res) if self.notes is not None else []

    def recipe_for(self, recipe: Recipe, job: Any = None) -> Recipe:  # Any: the graph's job (tune's TrialJob)
        """The recipe this stage reads when its graph is given ``recipe``."""
        return self.view(recipe, job) if self.view is not None else recipe

    def key(self, recipe_dict: dict, upstream_keys: dict[str, str], inputs: dict, host: dict, *,
            parts: dict | None = None, options: DataclassInstance | None = None) -> str:
        """Its cache key: a hash of its declarations' values (see ``stage_key``)."""
        return stage_key(self, recipe_dict, upstream_keys, inputs, host, parts=parts, options=options)


def _options_part(stage: Stage, options: DataclassInstance | None) -> dict | None:
    """The options that differ from the stage's defaults (None: all default, the key is the plain one)."""
    if options is None or stage.options is None or not is_dataclass(options) or isinstance(options, type):
        return None
    given, default = asdict(options), asdict(stage.options())
    changed = {k: v for k, v in given.items() if default.get(k) != v}
    return changed or None


def stage_key(stage: Stage, recipe_dict: dict, upstream_keys: dict[str, str], inputs: dict, host: dict, *,
              parts: dict | None = None, options: DataclassInstance | None = None) -> str:
    """THE key of a stage's output, from its declarations: the recipe sections it reads, its inputs by content,
    the host facts (when it declares them), its upstream stages' keys, its format version, its non-default
    options and the explicit ``parts`` its graph adds. The same stage with the same values gets the same key in
    `run` and `tune`; any change to one of them gives a new key (and a new entry)."""
    from infertool.data.fingerprint import digest

    extra: dict[str, Any] = {k: inputs.get(k) for k in stage.inputs if inputs.get(k) is not None}  # Any: JSON values (hashed / written / validated)
    if stage.host:
        extra["host"] = {k: host.get(k) for k in HOST_FACTS}
    extra.update(parts or {})
    opts = _options_part(stage, options)
    if opts:
        extra["options"] = opts
    payload: dict[str, Any] = {"stage": stage.name, "v": KEY_VERSION,  # Any: JSON values (hashed / written / validated)
                               "sections": {s: recipe_dict.get(s) for s in stage.sections},
                               "upstream": {d: upstream_keys[d] for d in stage.depends if d in upstream_keys},
                               "extra": extra}
    if stage.format is not None:
        payload["format"] = stage.format
    return digest(payload)
