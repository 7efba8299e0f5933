"""lm-evaluation-harness as an engine (issue 21): the ``lm_eval`` phase of every as-served check
(infertool.evaluate.phases).

``run`` runs lm-eval ITSELF (the pinned library in the managed ``lmeval`` environment, as a subprocess:
infertool/evaluate/lm_eval_worker.py) against one served endpoint, offline (HF_DATASETS_OFFLINE, HF_HUB_OFFLINE:
nothing is downloaded), bounded by ``eval.lm_eval.timeout_s`` and stopped with its process group on a timeout or
an interrupt. Loglikelihood tasks go through ``local-completions`` (prompt log-probabilities, echo) with the
served checkpoint's tokenizer; generative tasks through ``local-completions``, or ``local-chat-completions`` when
``apply_chat_template`` (the server applies the model's chat template). lm-eval's logged samples give each
document's score.

``compare`` joins the two models by (task, doc_id), only on the documents both scored (a reference scored on more
items than the candidate compares on the shared ones): per task the metric (acc, else exact_match, else the
task's first), base and candidate score, recovery = candidate / base with a paired interval (the delta method on
the log of the ratio of means, with the per-document covariance: see ``paired_recovery``), the documents lost
and gained and the exact McNemar p (a sign test on lost vs gained); pooled over every document of every task
the same figures, which the ``min_recovery`` gate reads (infertool.evaluate.core.estimates).

Task names starting with ``infertool_`` are the tasks infertool ships (infertool/_data/lm_eval): their folder is
added to the include path. See docs/lm-eval.md.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from infertool import net
from infertool.atomic import write_json, write_text
from infertool.errors import BackendError, UsageError
from infertool.evaluate.lm_eval_export import SHIPPED_PREFIX, shipped_dir
from infertool.evaluate.lm_eval_worker import TaskCheck, WorkerSpec
from infertool.evaluate.metrics import mcnemar_exact, t_for
from infertool.evaluate.result import LmEvalComparison, LmEvalTask, TaskCode
from infertool.records import Record

if TYPE_CHECKING:
    from infertool.evaluate.phases import Served
    from infertool.recipe import LmEvalSpec
    from infertool.tasks import Events

WORKER = Path(__file__).with_name("lm_eval_worker.py")
REQUEST_TIMEOUT_S = 300  # lm-eval's per-request timeout against the server
MAX_LISTED = 50  # lost/gained document ids kept per task in the block
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


class LmEvalPhase:
    """The lm-eval phase: ``spec`` is the recipe's eval.lm_eval (infertool.recipe.LmEvalSpec)."""

    name = "lm_eval"
    gates: tuple[str, ...] = ("min_recovery",)

    def __init__(self, spec: LmEvalSpec) -> None:
        self.spec = spec
        self.task_code: list[str] | None = None  # what the task folder's code does (trust_code), once read

    def trusted(self) -> list[str]:
        """The task folder read WITHOUT running it (evaluate/lm_eval_tasks.py), before lm-eval starts: its code
        refused (exit 2) unless eval.lm_eval.trust_code, else said once on the screen; what will run, as text."""
        if self.task_code is None:
            from infertool.evaluate.lm_eval_tasks import require_trusted

            self.task_code = [r.text() for r in require_trusted(self.spec)]
        return self.task_code

    def run(self, served: Served, prior: dict[str, Any] | None, events: Events,  # Any: JSON values
            window: tuple[int, int] | None = None) -> dict[str, Any]:  # Any: JSON values
        """lm-eval's tasks on one served model: {"tasks": {task: {"metric", "higher_is_better", "docs":
        {doc_id: score}, ...}}, "answer": the worker's file}. ``window=(lo, hi)``: documents [lo, hi) of each task."""
        from infertool.envs.state import require_env

        self.trusted()
        python = require_env("lmeval", "eval.lm_eval (lm-evaluation-harness)")
        log_dir = Path(served.log_dir or ".").absolute()
        log_dir.mkdir(parents=True, exist_ok=True)
        tag = f"lm_eval-{served.label}" + (f"-{window[0]}-{window[1]}" if window else "")
        include = include_paths(self.spec, log_dir)
        spec = worker_spec(self.spec, served, include, window, out=str(log_dir / f"{tag}.json"))
        spec_path = log_dir / f"{tag}.spec.json"
        write_json(spec_path, spec.to_dict())
        events.log(f"lm-eval: {', '.join(self.spec.tasks)} on the {served.label} model "
                   f"({'window ' + str(list(window)) if window else 'limit ' + str(self.spec.limit)})")
        cwd = Path(include[0]) if self.spec.include_path else log_dir
        run_worker([str(python), str(WORKER), str(spec_path)], log_dir / f"{tag}.log", cwd=cwd,
                   timeout_s=float(self.spec.timeout_s), api_key=getattr(served.client, "api_key", None))
        return read_answer(Path(spec.out), log_dir / f"{tag}.log", include,
                           secrets=[getattr(served.client, "api_key", None)])

    def compare(self, raw_ref: dict[str, Any], raw_cand: dict[str, Any], *, confidence: float,  # Any: JSON values
                first: str) -> LmEvalComparison:
        block = compare_raw(raw_ref, raw_cand, confidence=confidence)
        if self.spec.include_path:  # the report says whether the task folder's own code ran, and which
            block.task_code = TaskCode(bool(self.spec.trust_code), str(self.spec.include_path), self.trusted())
        return block

    def preflight(self, log_dir: Path) -> None:
        """Before any server starts: lm-eval knows every task and loads its data on this machine (offline), or the
        same error the run would end with (an unknown task, data not here: exit 2). Remembered by what it read
        (the tasks, the include path's files, infertool's shipped tasks, the lmeval environment's packages), so
        a check that passed is not paid again."""
        from infertool.envs.state import read_marker, require_env

        self.trusted()  # before lm-eval's TaskManager ever imports a task's code
        python = require_env("lmeval", "eval.lm_eval (lm-evaluation-harness)")
        log_dir = Path(log_dir).absolute()
        log_dir.mkdir(parents=True, exist_ok=True)
        mark = _checked_marker(self.spec, m.packages if (m := read_marker("lmeval")) else {})
        if mark.is_file():
            return
        include = include_paths(self.spec, log_dir)
        out = log_dir / "lm_eval-check.json"
        spec_path = log_dir / "lm_eval-check.spec.json"
        write_json(spec_path, TaskCheck(tasks=list(self.spec.tasks), include_path=include, out=str(out),
                                          trust_code=bool(self.spec.trust_code)).to_dict())
        cwd = Path(include[0]) if self.spec.include_path else log_dir
        run_worker([str(python), str(WORKER), str(spec_path)], log_dir / "lm_eval-check.log", cwd=cwd,
                   timeout_s=min(float(self.spec.timeout_s), PREFLIGHT_TIMEOUT_S), api_key=None)
        try:
            ans = WorkerAnswer.from_dict(json.loads(out.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            raise BackendError("lm-eval's task check ended without an answer:\n" + _tail(log_dir / "lm_eval-check.log"),
                               hint="see the log", log_path=str(log_dir / "lm_eval-check.log")) from None
        if not ans.ok:
            raise answer_error(ans, include, str(log_dir / "lm_eval-check.log"), [])
        write_json(mark, {"tasks": ans.tasks, "lm_eval": ans.lm_eval})


PREFLIGHT_TIMEOUT_S = 300.0  # lm-eval's import and the tasks' data loading, before any server starts


def _checked_marker(spec: LmEvalSpec, packages: dict[str, Any]) -> Path:  # Any: JSON values
    """Where a passed task check of ``spec`` is remembered (INFERTOOL_HOME/cache/lm_eval_checks/<digest>.json):
    keyed by the tasks, the include path's files by content, infertool's version (its shipped tasks) and the
    lmeval environment's packages."""
    import infertool
    from infertool.data.fingerprint import digest
    from infertool.data.suites import folder_digest
    from infertool.envs.paths import home

    files = folder_digest(spec.include_path) if spec.include_path else None
    key = digest({"tasks": list(spec.tasks), "include": files, "infertool": infertool.__version__,
                  "packages": packages})
    return home() / "cache" / "lm_eval_checks" / f"{key}.json"


# --------------------------------------------------------------------------------------------
# running lm-eval
# --------------------------------------------------------------------------------------------

def include_paths(spec: LmEvalSpec, log_dir: Path) -> list[str]:
    """The include path lm-eval gets: the recipe's ``include_path`` (relative: from the current folder, as the
    recipe's other paths), then, when a task name starts with ``infertool_``, a copy of the shipped tasks with
    their data files' absolute paths (lm-eval resolves a relative data file from its current folder)."""
    out = []
    if spec.include_path:
        p = Path(spec.include_path).expanduser().absolute()
        if not p.is_dir():
            raise UsageError(f"eval.lm_eval.include_path {spec.include_path!r} is not a folder",
                             hint="give the folder of your lm-eval task YAMLs (relative: from the current folder)")
        out.append(str(p))
    if any(t.startswith(SHIPPED_PREFIX) for t in spec.tasks):
        out.append(str(materialize_shipped(log_dir / "lm_eval_tasks")))
    return out


def materialize_shipped(dest: Path) -> Path:
    """The shipped task YAMLs written into ``dest`` with absolute data-file paths (the data stays where it ships)."""
    src = shipped_dir()
    dest.mkdir(parents=True, exist_ok=True)
    for y in sorted(src.glob("*.yaml")):
        cfg = yaml.safe_load(y.read_text(encoding="utf-8"))
        files = ((cfg.get("dataset_kwargs") or {}).get("data_files") or {})
        for split, name in list(files.items()):
            files[split] = str(src / name)
        write_text(dest / y.name, yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return dest


def worker_spec(spec: LmEvalSpec, served: Served, include: list[str], window: tuple[int, int] | None, *,
                out: str) -> WorkerSpec:
    """What the worker needs: the endpoint, the tokenizer (eval.lm_eval.tokenizer, else the served checkpoint's
    folder; none known: lm-eval's own choice, the server's tokenizer_info/tokenize endpoints), the tasks and
    lm-eval's options."""
    client = served.client
    given = getattr(spec, "tokenizer", None)
    tok = str(Path(given).expanduser().absolute()) if given else served.model_path
    if tok is None and Path(str(client.model)).is_dir():  # a server not ours that serves a local folder
        tok = str(Path(client.model).absolute())
    return WorkerSpec(base_url=client.base_url, model=client.model, tokenizer=tok, tasks=list(spec.tasks),
                      include_path=include, num_fewshot=spec.num_fewshot, limit=spec.limit,
                      window=list(window) if window else None, apply_chat_template=spec.apply_chat_template,
                      fewshot_as_multiturn=spec.fewshot_as_multiturn, system_instruction=spec.system_instruction,
                      concurrent=spec.concurrent, max_gen_toks=spec.max_gen_toks, request_timeout_s=REQUEST_TIMEOUT_S,
                      out=out, trust_code=bool(spec.trust_code))


def worker_env(api_key: str | None) -> dict[str, str]:
    """The worker's environment: offline, the parent's virtualenv removed, the server's key in OPENAI_API_KEY
    (lm-eval's API models read it there; never on a command line)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OFFLINE)
    env["OPENAI_API_KEY"] = api_key or "EMPTY"
    return env


def run_worker(argv: list[str], log_path: Path, *, cwd: Path, timeout_s: float, api_key: str | None) -> None:
    """Run the worker in its own process group, its output into ``log_path``; stopped (the whole group) past
    ``timeout_s`` or on an interrupt."""
    from infertool.procs import stop_group, tied

    with open(log_path, "ab") as log:
        proc = subprocess.Popen(tied(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(cwd), env=worker_env(api_key), start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc.pid, 5.0, poll=proc.poll)
            raise BackendError(f"lm-eval ran past eval.lm_eval.timeout_s ({timeout_s:g} s) and was stopped",
                               hint="raise eval.lm_eval.timeout_s, or lower eval.lm_eval.limit",
                               log_path=str(log_path)) from None
        except BaseException:
            stop_group(proc.pid, 5.0, poll=proc.poll)
            raise


def _tail(log_path: Path, n: int = 12) -> str:
    try:
        return "\n".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def read_answer(out: Path, log_path: Path, include: list[str], secrets: list[str | None],
                ) -> dict[str, Any]:  # Any: JSON values
    """The worker's answer as the phase's raw numbers, or the error it reported (unknown task, missing data)."""
    try:
        ans = WorkerAnswer.from_dict(json.loads(out.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        raise BackendError("lm-eval ended without an answer:\n" + net.quote(_tail(log_path), secrets, 2000),
                           hint="see the log", log_path=str(log_path)) from None
    if ans.ok:
        tasks = {t: {k: v for k, v in b.items() if k != "shown"} for t, b in ans.tasks.items()}
        return {"tasks": tasks, "lm_eval": ans.lm_eval, "answer": str(out)}
    raise answer_error(ans, include, str(log_path), secrets)


@dataclass
class WorkerAnswer(Record):
    """The lm-eval worker's answer file (lm_eval_worker.py writes it in the lmeval environment, read here only):
    ``ok`` with the tasks' per-document scores (a task check: their names), else the error's ``kind`` (unknown_task,
    missing_data, error), its ``task`` and ``message``."""

    ok: bool = False
    tasks: Any = None  # Any: {task: {metric, higher_is_better, docs, shown}}, or the checked task names
    lm_eval: str | None = None  # lm-eval's version
    check: bool = False
    kind: str | None = None
    task: str | None = None
    message: str = ""


def answer_error(ans: WorkerAnswer | dict[str, Any], include: list[str], log_path: str,  # Any: JSON values
                 secrets: list[str | None]) -> Exception:
    """The error of a worker's answer: an unknown task and data not on the machine are the user's to fix."""
    ans = WorkerAnswer.from_dict(ans)
    task, msg = ans.task, net.quote(ans.message, secrets, 600)
    where = f" (include path: {', '.join(include)})" if include else ""
    if ans.kind == "unknown_task":
        return UsageError(f"eval.lm_eval: lm-eval knows no task {task!r}{where}",
                          hint="name a task of `lm_eval ls tasks`, an infertool_ task (infertool_mc, infertool_gen, "
                          "infertool_gsm_style, infertool_chat), or one whose YAML is in eval.lm_eval.include_path")
    if ans.kind == "missing_data":
        return UsageError(
            f"eval.lm_eval: the data of task {task!r} is not on this machine (lm-eval runs offline here: nothing is "
            f"downloaded): {msg}",
            hint="put the dataset in the Hugging Face datasets cache (HF_DATASETS_CACHE, default "
            "~/.cache/huggingface/datasets: load it once where the hub can be reached and copy the cache), or "
            "write a `dataset_path: json` task over your files in eval.lm_eval.include_path (docs/lm-eval.md)")
    if ans.kind == "sandbox":
        return UsageError(f"eval.lm_eval: {f'task {task!r}: ' if task else ''}{msg}",
                          hint="remove the template's reach into Python's internals, or set eval.lm_eval.trust_code: "
                          "true (verify: --trust-task-code) only if you trust the tasks (their templates then run "
                          "with your rights)", log_path=log_path)
    if ans.kind == "no_sandbox":
        return BackendError(f"lm-eval not run: {msg}", hint="set up the lmeval environment again (`infertool env "
                            "setup lmeval`), or set eval.lm_eval.trust_code: true only if you trust the tasks",
                            log_path=log_path)
    return BackendError(f"lm-eval failed: {msg}", hint="see the log", log_path=log_path)


# --------------------------------------------------------------------------------------------
# the join and the statistics
# --------------------------------------------------------------------------------------------

def paired_recovery(base: list[float], cand: list[float], confidence: float,
                    ) -> tuple[float | None, list[float] | None]:
    """Recovery = mean(cand) / mean(base) over paired documents, and its interval: the delta method on
    log(mean c / mean b) with Student's t quantile (n - 1 degrees of freedom), Var = s_c^2/(n c^2) + s_b^2/(n b^2) - 2 s_bc/(n b c) with the sample (co)variances of
    the per-document scores, so the pairing (the same documents) narrows it. Identical scores give exactly
    [1, 1]. With a zero mean (no log): recovery 1 + mean(c - b)/mean(b), the interval from the paired
    difference's standard error; a base that scores 0 has no recovery (None)."""
    n = len(base)
    if n == 0 or len(cand) != n:
        return None, None
    mb, mc = math.fsum(base) / n, math.fsum(cand) / n
    if mb <= 0:
        return None, None
    rec = mc / mb
    if n < 2:
        return rec, None
    z = t_for(confidence, n - 1)  # Student's t with n - 1 degrees of freedom: a few documents, a wide interval
    vb = math.fsum((x - mb) ** 2 for x in base) / (n - 1)
    vc = math.fsum((y - mc) ** 2 for y in cand) / (n - 1)
    cov = math.fsum((x - mb) * (y - mc) for x, y in zip(base, cand)) / (n - 1)
    if mc > 0:
        var = vc / (n * mc * mc) + vb / (n * mb * mb) - 2 * cov / (n * mb * mc)
        se = math.sqrt(max(var, 0.0))
        return rec, [rec * math.exp(-z * se), rec * math.exp(z * se)]
    d = [y - x for x, y in zip(base, cand)]
    md = math.fsum(d) / n
    se = math.sqrt(max(math.fsum((v - md) ** 2 for v in d) / (n - 1), 0.0) / n) / mb
    return rec, [max(0.0, rec - z * se), rec + z * se]


def _key(doc_id: str) -> tuple[int, int, str]:
    return (0, int(doc_id), "") if str(doc_id).lstrip("-").isdigit() else (1, 0, str(doc_id))


@dataclass
class TaskScores(Record):
    """One lm-eval task on one model: its metric and each document's score (the worker's block, ``shown`` aside)."""

    metric: str = "?"
    higher_is_better: bool = True
    docs: dict[str, float] = field(default_factory=dict)


@dataclass
class LmEvalRaw(Record):
    """The lm-eval phase's raw numbers of one model (``LmEvalPhase.run``: ``read_answer``)."""

    tasks: dict[str, TaskScores] = field(default_factory=dict)
    lm_eval: str | None = None  # lm-eval's version
    answer: str = ""  # the worker's answer file


def join_task(ref: TaskScores, cand: TaskScores) -> tuple[list[str], list[float], list[float]]:
    """The documents both models scored, in doc order, and their scores (oriented: higher is better)."""
    sign = 1.0 if ref.higher_is_better else -1.0
    ids = sorted(set(ref.docs) & set(cand.docs), key=_key)
    return ids, [sign * ref.docs[i] for i in ids], [sign * cand.docs[i] for i in ids]


def task_block(ids: list[str], b: list[float], c: list[float], metric: str, confidence: float,
               higher_is_better: bool = True) -> LmEvalTask:
    """One task's figures: scores, recovery with its interval, lost/gained documents, exact McNemar p. ``b``, ``c``:
    oriented scores (higher is better: a lower-is-better metric's negated, as ``join_task`` gives them). Recovery
    of a lower-is-better metric (a perplexity) is mean(base) / mean(candidate) on the metric's own values, so
    below 1 is worse either way; its interval the inverse of the other ratio's."""
    lost = [i for i, x, y in zip(ids, b, c) if y < x]
    gained = [i for i, x, y in zip(ids, b, c) if y > x]
    n = len(ids)
    sign = 1.0 if higher_is_better else -1.0
    ci: list[float | None] | None
    if higher_is_better:
        rec, up = paired_recovery(b, c, confidence)
        ci = [*up] if up is not None else None
    else:
        inv, inv_ci = paired_recovery([-x for x in b], [-y for y in c], confidence)  # mean(c) / mean(b), raw
        rec, ci = (1.0 / inv if inv else None), None
        if inv and inv_ci:
            lo, hi = inv_ci
            ci = [1.0 / hi, 1.0 / lo if lo > 0 else None]
    return LmEvalTask(metric=metric, base=sign * math.fsum(b) / n if n else None,
                      candidate=sign * math.fsum(c) / n if n else None, higher_is_better=higher_is_better,
                      recovery=rec, recovery_ci=ci, lost=len(lost), gained=len(gained),
                      mcnemar_p=mcnemar_exact(len(lost), len(gained)), n=n, lost_docs=lost[:MAX_LISTED],
                      gained_docs=gained[:MAX_LISTED])


def compare_raw(raw_ref: dict[str, Any], raw_cand: dict[str, Any], *, confidence: float) -> LmEvalComparison:  # Any: JSON values
    """The pooled lm_eval block (results.json ``pooled.lm_eval``): per task, and pooled over every document of
    the higher-is-better tasks (accuracies, exact matches: a lower-is-better metric such as a perplexity has its
    own recovery, base / candidate, and is not added to scores of another scale); tasks that only one model ran
    are left out."""
    tasks: dict[str, LmEvalTask] = {}
    all_b: list[float] = []
    all_c: list[float] = []
    ref, cand = LmEvalRaw.from_dict(raw_ref), LmEvalRaw.from_dict(raw_cand)
    for name in sorted(set(ref.tasks) & set(cand.tasks)):
        r = ref.tasks[name]
        ids, sb, sc = join_task(r, cand.tasks[name])
        if not ids:
            continue
        hib = r.higher_is_better
        tasks[name] = task_block(ids, sb, sc, r.metric, confidence, hib)
        if hib:
            all_b += sb
            all_c += sc
    pooled = task_block([str(i) for i in range(len(all_b))], all_b, all_c, "pooled", confidence)
    return LmEvalComparison(tasks=tasks, recovery=pooled.recovery, recovery_ci=pooled.recovery_ci, n=pooled.n,
                            lost=pooled.lost, gained=pooled.gained, mcnemar_p=pooled.mcnemar_p, base=pooled.base,
                            candidate=pooled.candidate, confidence=confidence)
