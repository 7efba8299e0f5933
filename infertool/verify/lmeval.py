"""`infertool verify`'s lm-eval re-run (issue 31): the lm-eval tasks the evidence's ``lmeval.json`` recorded, run
again on verify's served checkpoint with the same settings, through eval's own phase
(``evaluate.lm_eval_engine.LmEvalPhase``: the ``lmeval`` environment's worker, offline), so that the per-document
results compare with the evidence's (``verify.score.score_lmeval``).

    plan_rerun(lmeval, trust_task_code=) -> LmevalRerun     whether it can run here, and why not (never raises)
    rerun(rr, client, model_path=, log_dir=, events=) -> dict   lmeval.json's shape (``capture.lmeval_doc``)

The settings come from ``config.rerun`` (``capture.rerun_record``); an lmeval.json written before that key takes
what its ``config`` holds (the recipe's eval.lm_eval as dumped, the task names of its documents).

Trust: a task folder's code (``!function``, an include or data outside it, ...) runs only with
``--trust-task-code``: the trust recorded by the run that published is not taken, since a published folder may
come from someone else. A folder whose static scan (``evaluate.lm_eval_tasks.scan``) finds nothing runs without it,
and then lm-eval renders its templates in Jinja's sandbox (``evaluate.lm_eval_sandbox``), as eval's without
``trust_code``: the spec's ``trust_code`` is the flag, never the evidence's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from infertool.errors import InfertoolError, UsageError

if TYPE_CHECKING:
    from infertool.evaluate.server_engine import Client
    from infertool.recipe import LmEvalSpec
    from infertool.tasks import Events
    from infertool.verify.capture import RerunSettings
    from infertool.verify.evidence import LmevalDoc

TRUST_FLAG = "--trust-task-code"
ENV = "lmeval"
SHOWN_REFS = 3  # task-code references named in a refusal; the rest are counted


@dataclass
class LmevalRerun:
    """What verify's lm-eval re-run would be: ``spec`` (an ``recipe.LmEvalSpec``) when it can run here, else
    ``why`` it cannot and a ``hint``; ``notes`` say what it will do (task code that runs)."""

    spec: LmEvalSpec | None = None  # None: not run
    why: str = ""
    hint: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        s = self.spec
        if s is None:
            return {"runs": False, "why": self.why, "hint": self.hint}
        return {"runs": True, "tasks": list(s.tasks), "include_path": s.include_path, "num_fewshot": s.num_fewshot,
                "limit": s.limit, "apply_chat_template": s.apply_chat_template, "trust_task_code": bool(s.trust_code),
                "notes": list(self.notes)}


def _no(why: str, hint: str | None = None) -> LmevalRerun:
    return LmevalRerun(None, why, hint)


def recorded(lmeval: LmevalDoc) -> RerunSettings:
    """The settings lmeval.json records for a re-run: ``config.rerun``, else (an older file) its ``config`` as the
    recipe's eval.lm_eval, with the tasks of its documents."""
    from infertool.verify.capture import RERUN_SETTINGS, LmevalConfig, RerunSettings  # noqa: F811 - at run time

    cfg = LmevalConfig.from_dict(lmeval.config)
    if cfg.rerun is not None:
        return cfg.rerun
    return RerunSettings(list(lmeval.tasks), cfg.include_path, older=True,
                         extra={k: v for k, v in cfg.extra.items() if k in RERUN_SETTINGS})


def plan_rerun(lmeval: LmevalDoc | None, *, trust_task_code: bool = False) -> LmevalRerun | None:
    """Whether the evidence's lm-eval tasks can run again here (None: the evidence has none): the recorded
    settings valid, the task folder on this machine and unchanged, its code trusted or none, the ``lmeval``
    environment ready. Every "cannot" is said, with its hint; nothing raises."""
    from infertool.evaluate.server_engine import Client
    from infertool.recipe import LmEvalSpec
    from infertool.tasks import Events
    from infertool.verify.capture import RerunSettings

    if lmeval is None:
        return None
    cfg = recorded(lmeval)
    if not cfg.tasks:
        return _no("lmeval.json records no lm-eval task to run again")
    include = cfg.include_path
    notes: list[str] = []
    if include is not None:
        if not Path(include).is_absolute():
            return _no(f"lmeval.json records the task folder {include!r} relative to the folder its run ran in, "
                       "which verify cannot know", "publish the checkpoint again with this infertool: it records the "
                       "folder's absolute path")
        if not Path(include).is_dir():
            return _no(f"the task folder {include} is not on this machine any more",
                       f"put the lm-eval task folder back at {include} (the same files), then verify again")
        want = cfg.include_digest
        if want is not None:
            from infertool.data.suites import folder_digest

            try:
                now = folder_digest(include)
            except UsageError as e:
                return _no(f"the task folder {include} cannot be read: {e.message}", e.hint)
            if now != want:
                return _no(f"the task folder {include} changed since the evidence was recorded (its files' digest "
                           f"{now[:12]}, recorded {want[:12]}): its documents would not be the same questions",
                           f"restore the folder as it was when the checkpoint was published, then verify again")
        else:
            notes.append(f"lmeval.json records no digest of {include}: its files are taken as they are now")
    if cfg.shipped_digest is not None:
        from infertool.verify.capture import shipped_digest

        if shipped_digest(cfg.tasks) != cfg.shipped_digest:
            return _no("infertool's shipped lm-eval tasks (infertool_*) changed since the evidence was recorded (another "
                       "infertool version): their documents would not be the same questions",
                       "verify with the infertool version that published the checkpoint")
    data = {k: v for k, v in cfg.to_dict().items()
            if k in LmEvalSpec.model_fields and k not in ("tokenizer", "trust_code")}
    data["trust_code"] = bool(trust_task_code)
    try:
        spec = LmEvalSpec.model_validate(data)
    except ValidationError as e:
        errs = e.errors()
        said = "; ".join(f"{'.'.join(str(x) for x in er['loc'])}: {er['msg']}" for er in errs[:3])[:400]
        return _no(f"lmeval.json's recorded settings are not valid lm-eval settings ({said})",
                   "publish the checkpoint again")
    if include is not None:
        from infertool.evaluate.lm_eval_tasks import scan

        try:
            sc = scan(include)
        except UsageError as e:
            return _no(f"the task folder {include} cannot be read: {e.message}", e.hint)
        if sc.errors:
            return _no(f"the task folder {include} has files lm-eval cannot read: {'; '.join(sc.errors[:SHOWN_REFS])}",
                       "fix the files, then verify again")
        if sc.refs and not trust_task_code:
            refs = sorted(sc.refs, key=lambda r: (r.file, r.line or 0))
            listed = "; ".join(r.text() for r in refs[:SHOWN_REFS]) + (
                f"; and {len(refs) - SHOWN_REFS} more" if len(refs) > SHOWN_REFS else "")
            return _no(f"the tasks in {include} run code or read outside their folder ({listed}), and verify runs "
                       f"a task folder's code only with {TRUST_FLAG} (the trust the publishing run recorded is not "
                       "taken: the folder may come from someone else)",
                       f"pass {TRUST_FLAG} only if you trust that code (it runs on this machine with your rights)")
        if sc.refs:
            notes.append(f"{TRUST_FLAG}: the code of the tasks in {include} runs ({len(sc.refs)} reference(s))")
    from infertool.envs.state import require_env

    try:
        require_env(ENV, "verify's lm-eval re-run (lm-evaluation-harness)")
    except InfertoolError as e:
        return _no(e.message, e.hint or f"run `infertool env setup {ENV}`")
    if cfg.older:
        notes.append("lmeval.json predates config.rerun: its tasks and settings are taken from its config")
    return LmevalRerun(spec, notes=notes)


def rerun(rr: LmevalRerun, client: Client, *, model_path: str | None, log_dir: Path,
          events: Events) -> LmevalDoc:
    """The tasks of ``rr`` run on the server ``client`` names (eval's lm-eval phase, its worker in the ``lmeval``
    environment; its files under ``log_dir``), as lmeval.json's shape (``capture.lmeval_doc``). Raises what the
    phase raises (an InfertoolError: data not here, a timeout, a failed worker)."""
    from infertool.evaluate.lm_eval_engine import LmEvalPhase, LmEvalRaw, WorkerAnswer
    from infertool.evaluate.phases import Served
    from infertool.verify.capture import lmeval_doc

    assert rr.spec is not None  # plan_rerun made it
    phase = LmEvalPhase(rr.spec)
    raw = phase.run(Served("verify", client, model_path=model_path, log_dir=log_dir), None, events)
    return lmeval_doc(WorkerAnswer.from_dict(raw), {"answer": LmEvalRaw.from_dict(raw).answer})  # its tasks, version
