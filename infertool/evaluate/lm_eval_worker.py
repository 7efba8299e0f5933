"""The lm-eval side of infertool.evaluate.lm_eval_engine: a script run by the ``lmeval`` environment's Python
(``python lm_eval_worker.py SPEC.json``; infertool is installed there as in every managed environment), so it
imports lm-evaluation-harness, the standard library and infertool's leaves infertool.records (the spec,
``WorkerSpec``, which the parent writes and this reads), infertool.atomic (its answer is written whole) and
infertool.evaluate.lm_eval_sandbox (jinja2 only).

Unless the spec's ``trust_code`` (the recipe's eval.lm_eval.trust_code, verify's ``--trust-task-code``), lm-eval's
template environment is replaced by Jinja's sandbox before any task loads (``lm_eval_sandbox.sandbox_lm_eval``):
a template that reaches Python's internals, for any document, fails with the answer's kind ``sandbox`` (the
task and what was refused) and never runs; a lm-eval that cannot be sandboxed is refused (kind ``no_sandbox``).

It resolves the tasks (an unknown name or data that is not on the machine is reported as such, naming the
task), runs ``lm_eval.simple_evaluate`` against the served endpoint with ``log_samples`` (loglikelihood tasks
through ``local-completions``; generative ones through ``local-completions``, or ``local-chat-completions`` when
``apply_chat_template``), and writes one JSON answer: per task the metric chosen, its direction and each
document's score (by ``doc_id``), or the error. Offline: the caller sets HF_DATASETS_OFFLINE / HF_HUB_OFFLINE.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if __name__ == "__main__":  # run as a script: its own folder (infertool/evaluate) must not shadow other modules
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from infertool.records import Record, Sparse  # noqa: E402 - after the path is cleaned

if TYPE_CHECKING:
    from infertool.evaluate.lm_eval_sandbox import TaskSandbox

PREFERRED = ("acc", "exact_match")  # the task's metric: these first, else the task's first metric


@dataclass
class WorkerSpec(Sparse):
    """SPEC.json as this worker reads it: what the parent (``lm_eval_engine.worker_spec``) asks of it, the served
    endpoint, the tokenizer, the tasks, lm-eval's options and where the answer goes; ``check`` (a ``TaskCheck``
    written): only check that the tasks are known and their data loads."""

    base_url: str = ""
    model: str = ""
    tokenizer: str | None = None
    tasks: list[str] = field(default_factory=list)
    include_path: list[str] = field(default_factory=list)
    num_fewshot: int | None = None
    limit: int | None = None
    window: list[int] | None = None
    apply_chat_template: bool = False
    fewshot_as_multiturn: bool = False
    system_instruction: str | None = None
    concurrent: int = 1
    max_gen_toks: int | None = None
    request_timeout_s: int | None = None
    out: str = ""
    trust_code: bool = False  # lm-eval renders templates its own way (unsandboxed): the user trusts the tasks
    check: bool | None = None  # only in the task check's spec

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("check",)


@dataclass
class TaskCheck(Record):
    """The task check's SPEC.json (``LmEvalPhase.preflight``), as the parent writes it: no endpoint, nothing is
    scored; read here as a ``WorkerSpec`` whose ``check`` is set."""

    check: bool = True
    tasks: list[str] = field(default_factory=list)
    include_path: list[str] = field(default_factory=list)
    out: str = ""
    trust_code: bool = False


def _write(path: str, obj: dict[str, Any]) -> None:  # Any: JSON values
    from infertool.atomic import write_json

    write_json(path, obj, indent=None)


def _load(tm: Any, name: str, sandbox: TaskSandbox | None) -> Any:  # Any: lm-eval's TaskManager and Task
    """The leaf tasks of one name (a task or a group): {task name: Task}; an error answer (dict) when lm-eval
    does not know the name, its data cannot be loaded here, or a template was refused by the sandbox."""
    if name not in set(tm.all_tasks):
        return {"ok": False, "kind": "unknown_task", "task": name,
                "message": f"lm-eval knows no task or group {name!r}"}
    try:
        return dict(tm.load([name])["tasks"])
    except Exception as e:  # noqa: BLE001 - a dataset error of any kind: the data is not here
        return _refused(sandbox, name) or {"ok": False, "kind": "missing_data", "task": name,
                                           "message": f"{type(e).__name__}: {str(e)[:600]}"}


def _refused(sandbox: TaskSandbox | None, task: str | None) -> dict[str, Any] | None:  # Any: JSON values
    """The answer when the sandbox refused a template (whatever lm-eval made of the SecurityError), else None."""
    if sandbox is None or not sandbox.refused:
        return None
    return {"ok": False, "kind": "sandbox", "task": task,
            "message": f"a task template was refused by Jinja's sandbox and stopped there: {sandbox.refused[0][:600]}"}


def _metric(task: Any) -> tuple[str, bool]:  # Any: an lm-eval Task
    """The task's metric for the join and whether higher is better."""
    names = [m["metric"] if isinstance(m, dict) else m for m in (task.config.metric_list or [])]
    names = [n for n in names if isinstance(n, str)] or list(task.higher_is_better().keys())
    for pref in PREFERRED:
        if pref in names:
            return pref, bool(task.higher_is_better().get(pref, True))
    m = names[0]
    return m, bool(task.higher_is_better().get(m, True))


def _model(spec: WorkerSpec, chat: bool) -> tuple[str, dict[str, Any]]:  # Any: lm-eval's model arguments
    """lm-eval's model name and arguments for the served endpoint."""
    base = spec.base_url.rstrip("/")
    args: dict[str, Any] = {"model": spec.model, "num_concurrent": spec.concurrent, "max_retries": 2,  # Any: as above
                            "timeout": spec.request_timeout_s, "seed": 1234,
                            **({"max_gen_toks": spec.max_gen_toks} if spec.max_gen_toks else {})}
    if chat:
        return "local-chat-completions", {**args, "base_url": f"{base}/chat/completions", "tokenizer_backend": "none",
                                          "tokenized_requests": False}
    # no tokenizer given: lm-eval's own choice ("auto": the server's tokenizer endpoints when it has them)
    tok = ({"tokenizer_backend": "huggingface", "tokenizer": spec.tokenizer} if spec.tokenizer
           else {"tokenizer_backend": "auto"})
    return "local-completions", {**args, "base_url": f"{base}/completions", **tok}


def _docs(samples: list[dict[str, Any]], metric: str) -> tuple[dict[str, Any], dict[str, Any]]:  # Any: JSON values
    """Each document's score under the task's first filter, and a short record of what the model answered."""
    scores, shown = {}, {}
    first_filter = samples[0].get("filter") if samples else None
    for s in samples:
        if s.get("filter") != first_filter or metric not in s:
            continue
        did = str(s["doc_id"])
        scores[did] = float(s[metric])
        resp = s.get("filtered_resps")
        shown[did] = {"resp": str(resp[0] if isinstance(resp, list) and resp else resp)[:200],
                      "target": str(s.get("target"))[:200]}
    return scores, shown


def _evaluate(spec: WorkerSpec, tasks: dict[str, Any], chat: bool) -> dict[str, Any]:  # Any: JSON values
    """simple_evaluate on some leaf tasks with one model; {task: its block}."""
    import lm_eval

    model, args = _model(spec, chat)
    samples = None
    if spec.window is not None:
        lo, hi = spec.window[0], spec.window[1]
        if spec.limit:
            hi = min(hi, spec.limit)
        samples = {}
        for name, t in tasks.items():
            n = len(t.eval_docs)
            samples[name] = list(range(min(lo, n), min(hi, n)))
    res = lm_eval.simple_evaluate(
        model=model, model_args=args, tasks=list(tasks.values()), num_fewshot=spec.num_fewshot,
        limit=None if samples is not None else spec.limit, samples=samples, log_samples=True,
        bootstrap_iters=0, apply_chat_template=spec.apply_chat_template,
        fewshot_as_multiturn=spec.fewshot_as_multiturn, system_instruction=spec.system_instruction,
        confirm_run_unsafe_code=False)
    out = {}
    for name, t in tasks.items():
        metric, hib = _metric(t)
        scores, shown = _docs(res["samples"].get(name, []), metric)
        out[name] = {"metric": metric, "higher_is_better": hib, "output_type": t.get_config("output_type"),
                     "n_docs": len(t.eval_docs), "docs": scores, "shown": shown, "via": model,
                     "score": (res["results"].get(name) or {}).get(f"{metric},{_first_filter(t)}")}
    return out


def _first_filter(task: Any) -> str:  # Any: an lm-eval Task
    fl = task.config.filter_list
    if isinstance(fl, list) and fl and isinstance(fl[0], dict):
        return str(fl[0].get("name", "none"))
    return "none"


def main(spec_path: str) -> int:
    with open(spec_path, encoding="utf-8") as f:
        spec = WorkerSpec.from_dict(json.load(f))
    out = spec.out
    sandbox: TaskSandbox | None = None  # lm-eval's templates are rendered in it (spec.trust_code false)
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager

        if not spec.trust_code:
            from infertool.evaluate.lm_eval_sandbox import SandboxUnavailable, sandbox_lm_eval

            try:
                sandbox = sandbox_lm_eval()  # before any task loads (a task may render at load)
            except SandboxUnavailable as e:
                _write(out, {"ok": False, "kind": "no_sandbox", "message": str(e)})
                return 0
        tm = TaskManager(include_path=spec.include_path or None)
        leaves: dict[str, Any] = {}  # Any: JSON values
        for name in spec.tasks:
            got = _load(tm, name, sandbox)
            if got.get("ok") is False:
                _write(out, got)
                return 0
            leaves.update(got)
        if spec.check:  # the preflight: the tasks are known and their data loads here; nothing is scored
            _write(out, _refused(sandbox, None) or {"ok": True, "check": True, "tasks": sorted(leaves),
                                                    "lm_eval": getattr(lm_eval, "__version__", "")})
            return 0
        chat = spec.apply_chat_template
        gen = {n: t for n, t in leaves.items() if chat and t.get_config("output_type") == "generate_until"}
        rest = {n: t for n, t in leaves.items() if n not in gen}
        result: dict[str, Any] = {}  # Any: JSON values
        if rest:
            result.update(_evaluate(spec, rest, chat=False))
        if gen:
            result.update(_evaluate(spec, gen, chat=True))
        _write(out, _refused(sandbox, None) or {"ok": True, "tasks": result,
                                                "lm_eval": getattr(lm_eval, "__version__", "")})
    except Exception as e:  # noqa: BLE001 - every failure becomes one answer the parent turns into an error
        traceback.print_exc()
        _write(out, _refused(sandbox, None) or {"ok": False, "kind": "error",
                                                "message": f"{type(e).__name__}: {str(e)[:1500]}"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
