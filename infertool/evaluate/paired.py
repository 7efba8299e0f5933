"""Both models' raw numbers on one suite, paired item by item: what an engine hands the summary
(infertool.evaluate.core.summarize). The server engines pair two scorings (``server_engine.combine``); the hf
engine pairs in its worker and sends them as JSON (``to_json``), read back once (``from_json``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from infertool.evaluate.structured import ChatAnswer
from infertool.records import Record, Sparse


@dataclass
class RequestItem(Record):
    id: str = ""
    context: str = ""  # multiple choice: the question, then each continuation
    continuations: list[str] = field(default_factory=list)
    prompt: str = ""  # generate: a prompt, or a chat item's conversation
    messages: list[dict[str, Any]] | None = None  # Any: JSON values
    # json / tool_call (infertool.data.formats.request_items): the request fields of a structured item
    response_format: dict[str, Any] | None = None  # Any: JSON values
    tools: list[dict[str, Any]] | None = None  # Any: JSON values (OpenAI's tool format)
    tool_choice: str | dict[str, Any] | None = None  # Any: JSON values


@dataclass
class ScoreTask(Record):
    """One task as an engine scores it: ``data.suites.SuiteTask.request``'s JSON, read once by each engine."""

    name: str = ""
    type: str = ""
    text: str = ""  # perplexity: the corpus, cut in windows of seq_len tokens
    seq_len: int = 0
    max_windows: int | None = None
    window_start: int = 0  # scoring in rounds (tune): windows [window_start, max_windows) of the same cut
    items: list[RequestItem] = field(default_factory=list)
    chat: bool = False
    max_tokens: int = 32
    stop: list[str] = field(default_factory=list)


@dataclass
class HfJob(Record):
    """The hf engine's work (its worker's spec): both models, the tasks, the batch size."""

    base: str = ""
    candidate: str = ""
    tasks: list[ScoreTask] = field(default_factory=list)
    batch_size: int = 8
    trust_remote_code: bool = False  # model.trust_remote_code: passed to every loader
    threads: int | None = None


def cut_at_stop(text: str, stop: list[str]) -> str:
    """A generated text before the first stop string it holds."""
    for st in stop:
        if st and st in text:
            text = text[:text.index(st)]
    return text


@dataclass(frozen=True)
class PairedWindow:
    """A perplexity window: per scored token, both log-probabilities, the KLD and whether the top-1 agree."""

    id: str
    n_bytes: int
    lp_b: list[float]
    lp_c: list[float]
    kld: list[float]
    same_top1: list[int]
    covered_b: list[float] | None = None  # top-k engines: the base's probability mass the top-k cover


@dataclass(frozen=True)
class PairedChoices:
    """A multiple-choice item: per continuation, both log-likelihoods and whether each model's greedy path is it."""

    id: str
    ll_b: list[float]
    ll_c: list[float]
    n_bytes: list[int]
    greedy_b: list[bool] = field(default_factory=list)
    greedy_c: list[bool] = field(default_factory=list)


@dataclass(frozen=True)
class PairedOutputs:
    """A generation item: both models' greedy text."""

    id: str
    out_b: str
    out_c: str


@dataclass(frozen=True)
class PerplexityPair:
    type: ClassVar[str] = "perplexity"
    items: list[PairedWindow]
    seq_len: int | None = None
    corpus_tokens: int | None = None
    kld_kind: str = "full"  # "full" (hf: exact), "top-K" (a server's top-k: a lower bound)


@dataclass(frozen=True)
class ChoicePair:
    type: ClassVar[str] = "multiple_choice"
    items: list[PairedChoices]


@dataclass(frozen=True)
class GeneratePair:
    type: ClassVar[str] = "generate"
    items: list[PairedOutputs]


@dataclass(frozen=True)
class PairedAnswers:
    """A json / tool_call item: both models' chat answers as served (the raw Answers)."""

    id: str
    answer_b: ChatAnswer
    answer_c: ChatAnswer


@dataclass(frozen=True)
class StructuredPair:
    """A json or tool_call task (``kind``): both models' answers, item by item (server engines only)."""

    type: ClassVar[str] = "structured"
    kind: str
    items: list[PairedAnswers]


Paired = PerplexityPair | ChoicePair | GeneratePair | StructuredPair


@dataclass
class TaskTiming(Sparse):
    """An engine's time on a task (the server engines: on ``all`` of them), as results.json's timing.per_task."""

    OMIT_NONE = ("gen_tokens",)
    base_s: float = 0.0
    cand_s: float = 0.0
    tokens: int = 0
    gen_tokens: int | None = None  # the hf engine's generated tokens
    wall_s: float = 0.0


@dataclass
class EngineRun:
    """An engine's answer for both models: the paired tasks, the timing, what each model was (its path, server,
    loader), the phases' raw numbers ({phase: {label: raw}}) and the top-k the KLD is computed from."""

    engine: str
    tasks: dict[str, Paired]
    timing: dict[str, TaskTiming]
    base: dict[str, Any] = field(default_factory=dict)  # Any: JSON values
    candidate: dict[str, Any] = field(default_factory=dict)  # Any: JSON values
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)  # Any: JSON values
    topk: int | None = None
    versions: dict[str, str] = field(default_factory=dict)


def to_json(task: Paired) -> dict[str, Any]:  # Any: JSON values
    return {"type": task.type, **asdict(task)}


def from_json(d: dict[str, Any]) -> Paired:  # Any: JSON values (the hf worker's answer)
    """A paired task from its JSON (``to_json``)."""
    body = {k: v for k, v in d.items() if k != "type"}
    if d["type"] == "perplexity":
        return PerplexityPair(**{**body, "items": [PairedWindow(**w) for w in body["items"]]})
    if d["type"] == "multiple_choice":
        return ChoicePair([PairedChoices(**it) for it in body["items"]])
    if d["type"] == StructuredPair.type:
        return StructuredPair(body["kind"], [PairedAnswers(it["id"], ChatAnswer.from_dict(it["answer_b"]),
                                                           ChatAnswer.from_dict(it["answer_c"])) for it in body["items"]])
    return GeneratePair([PairedOutputs(**it) for it in body["items"]])


def run_from_json(d: dict[str, Any]) -> EngineRun:  # Any: JSON values (the hf worker's answer)
    """The hf engine's answer (``hf_engine.compare_task``), read once."""
    return EngineRun(**{**d, "tasks": {name: from_json(t) for name, t in d["tasks"].items()},
                        "timing": {name: TaskTiming.from_dict(t) for name, t in d["timing"].items()}})
