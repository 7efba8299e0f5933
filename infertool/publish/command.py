"""`infertool publish SRC DEST` as a capability: ``plan`` (every refusal, before a byte is copied) and ``run`` (the
copy into a folder, with its evidence captured, copied or not; or the upload through boto3 / huggingface_hub,
printed as calls with ``dry_run``)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from infertool.errors import BackendError, UsageError
from infertool.publish.checkpoint import (EVIDENCE, FACTS, beside, check_room, check_source, checkpoint_files,
                                          fingerprint, said)
from infertool.summaries import Published, Signature
from infertool.publish.facts import (CardFacts, claimed_facts, published_record, read_facts, recorded_path,
                                     run_facts, tune_record, vouched)
from infertool.publish.folder import EvidenceWriter, check_dest, env_folders, publish_dir
from infertool.publish.provenance import BuildFacts, carried
from infertool.publish.provenance import run_facts as run_build
from infertool.publish.served import check_fingerprint, recipe_of_run
from infertool.records import Record, Sparse

if TYPE_CHECKING:
    from infertool.recipe import Recipe


EventCallback = Callable[[dict[str, Any]], None]  # Any: an event's JSON values


@dataclass
class PublishOptions:
    dest: str
    dry_run: bool = False
    force: bool = False  # replace a DEST folder infertool did not publish (still never one replace_refusal keeps)
    evidence: bool = True  # write DEST/evidence/ (--no-evidence: False)
    sign_key: str | None = None  # --sign-key: the EC private key file that signs DEST (model.sig)


@dataclass
class CaptureSpec(Record):
    """The evidence publish captures: the server it starts (the recipe's serve settings on the checkpoint) and
    what it asks."""

    serves: str = ""
    argv: list[str] = field(default_factory=list)
    top_k: int = 0
    max_bytes: int = 0
    max_fraction: float = 0.0


@dataclass
class EvidencePlan(Sparse):
    """What publish does about ``DEST/evidence/``: one of capture, copies (a published source's folder), uploads,
    or missing (why there will be none)."""

    capture: CaptureSpec | None = None
    copies: str | None = None
    uploads: str | None = None
    missing: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("capture", "copies", "uploads", "missing")


@dataclass
class PublishPlan(Record):
    """What `infertool publish` copies and where: the folder (checkpoint + card), the kind of destination, and
    for an object store or a hub the exact library calls."""

    src: str
    kind: str  # run | tune | published
    folder: str  # the checkpoint's folder to copy (verified)
    fingerprint: str
    dest: str
    scheme: str  # dir | s3 | hf
    facts: CardFacts = field(default_factory=CardFacts)
    calls: list[str] = field(default_factory=list)
    dry_run: bool = False
    evidence: EvidencePlan = field(default_factory=EvidencePlan)
    build: BuildFacts = field(default_factory=BuildFacts)  # provenance.intoto.json's facts (publish.provenance)
    signature: Signature | None = None  # the signature DEST will carry (its key's fingerprint; never the key)
    sign_key: str | None = field(default=None, repr=False)  # the private key file: used, never written out

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = super().to_dict()
        d.pop("sign_key", None)
        return d


@dataclass
class PublishResult:
    """What `infertool publish` did: its plan, and the published folder's record or the files uploaded."""

    plan: PublishPlan
    published: Published | None = None
    uploaded: int | None = None

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        out: dict[str, Any] = {"dry_run": self.plan.dry_run, **self.plan.to_dict()}  # Any: JSON values
        if self.published is not None:
            out["published"] = self.published.to_dict()
        if self.uploaded is not None:
            out["uploaded"] = self.uploaded
        return out


def _source(src: str) -> tuple[str, Path, str, CardFacts, BuildFacts]:
    """SRC of `infertool publish`: (kind, checkpoint folder, fingerprint, facts, build facts) for a run directory,
    a tune directory or a published folder; the checkpoint verified against its record; the facts infertool's own
    (a card nothing vouches for: ``claimed_facts``); the build facts a run's manifest's, or the provenance the
    folder carries (a tune's winner, a published folder), as it is."""
    p = Path(src).expanduser()
    if (p / "tune.json").is_file():
        folder, fp = tune_record(p)
        check_fingerprint(folder, fp, f"tune {p.name}",
                          f"infertool tune again, or infertool publish {shlex.quote(str(folder))} DEST")
        facts = read_facts(folder / FACTS)
        return ("tune", folder, fp, (vouched(facts, fp) if facts.fingerprint == fp else None) or claimed_facts(facts),
                carried(folder, "tune"))
    if (p / "manifest.json").is_file():
        from infertool.report import load_run

        run_dir, manifest = load_run(p)
        pub = published_record(manifest)
        if not pub.fingerprint:
            raise UsageError(f"{run_dir} published no checkpoint", hint="a run with quantize and eval stages publishes one")
        path = recorded_path(run_dir, pub.path) if pub.path else None
        for where in (path, run_dir / "quantize" / "model"):
            if where is not None and (where / "config.json").is_file() and fingerprint(where) == pub.fingerprint:
                return "run", where, pub.fingerprint, run_facts(run_dir, manifest), run_build(run_dir, manifest)
        raise UsageError(f"neither {said(path)} nor the run's quantize entry holds the checkpoint run {run_dir.name} "
                         f"evaluated (fingerprint {pub.fingerprint})", hint="run it again: `infertool run` publishes it")
    if (p / FACTS).is_file():
        facts = read_facts(p / FACTS)
        fp = str(facts.fingerprint)
        check_fingerprint(p, fp, f"the card in {p}", "infertool publish RUN_DIR " + shlex.quote(str(p)))
        return "published", p, fp, vouched(facts, fp) or claimed_facts(facts), carried(p)
    raise UsageError(f"{said(src)} is not a run directory, a tune directory or a published folder",
                     hint=f"give runs/<recipe>-<time>, a tune directory, or a folder with {FACTS}")


def _remote_calls(folder: Path, scheme: str, dest: str) -> list[str]:
    """The exact library calls a remote publish makes (printed with --dry-run)."""
    if scheme == "hf":
        repo = dest.removeprefix("hf://").strip("/")
        return [f"huggingface_hub.HfApi().upload_folder(folder_path={str(folder)!r}, repo_id={repo!r}, repo_type='model')"]
    bucket, _, prefix = dest.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    files = checkpoint_files(folder) + beside(folder)
    return [f"boto3.client('s3').upload_file({str(f)!r}, {bucket!r}, "
            f"{'/'.join(x for x in (prefix, f.relative_to(folder).as_posix()) if x)!r})" for f in files]


def _scheme(dest: str) -> str:
    if dest.startswith(("s3://", "hf://")):
        from infertool.serve.k8s import check_model_uri

        hint = "s3://bucket/prefix or hf://org/name: the names S3 and the hub take (no space, no '..')"
        check_model_uri(dest, "publish DEST", hint=hint)  # the rule --model-from applies to what it fetches
        if dest.startswith("s3://"):
            return "s3"
        repo = dest[5:].strip("/")
        if repo.count("/") != 1 or not all(repo.split("/")) or "@" in repo:
            raise UsageError(f"{dest}: not a model repository", hint="hf://org/name")
        return "hf"
    if "://" in dest:
        raise UsageError(f"{said(dest, 100)}: an unknown destination", hint="a folder, s3://bucket/prefix or hf://org/name")
    return "dir"


def plan(src: str, options: PublishOptions) -> PublishPlan:
    """What `infertool publish SRC DEST` does (every refusal here, before a byte is copied)."""
    kind, folder, fp, facts, build = _source(src)
    scheme = _scheme(options.dest)
    check_source(folder)  # links and special files: refused before a copy, and never listed for an upload
    dest = options.dest
    if scheme == "dir":
        forbidden: dict[str, Path | None] = {
            "the source": folder, "the source's run": Path(facts.run_dir) if facts.run_dir else None,
            "INFERTOOL_HOME's environments": env_folders()}
        if kind == "run":
            forbidden["the stage cache"] = Path(src).expanduser().absolute().parent / ".stages"
        dest = str(check_dest(options.dest, forbidden, force=options.force))
        check_room(folder, Path(dest))
    calls = _remote_calls(folder, scheme, options.dest) if scheme != "dir" else []
    evidence = _evidence_plan(src, kind, folder, scheme, options)
    signature = _signature_plan(options.sign_key, scheme, [folder, Path(dest)])
    return PublishPlan(str(src), kind, str(folder), fp, dest, scheme, facts, calls, options.dry_run, evidence,
                       build, signature, options.sign_key)


def _signature_plan(key: str | None, scheme: str, inside: list[Path]) -> Signature | None:
    """--sign-key checked: an EC private key (``signing.signature_of``), outside what is published (never
    copied into it), for a folder (an upload ships a folder signed when it was published)."""
    if key is None:
        return None
    from infertool.signing import signature_of

    if scheme != "dir":
        raise UsageError("--sign-key signs a folder as it is published; an upload ships what a folder holds",
                         hint="publish to a folder with --sign-key, then upload that folder")
    real = Path(key).expanduser().resolve()
    for d in inside:
        r = d.expanduser().resolve()
        if r == real or r in real.parents:
            raise UsageError(f"--sign-key {said(key)} is inside {r}: a private key never goes into what is published",
                             hint="keep the key in a folder of its own (`infertool keys new ~/.infertool-keys`)")
    return signature_of(key)


def source_recipe(src: str, kind: str) -> Recipe:
    """The recipe a run directory ran (its manifest's) or a tune chose (its tuned.yaml), validated."""
    p = Path(src).expanduser()
    if kind == "run":
        from infertool.report import load_run

        run_dir, manifest = load_run(p)
        return recipe_of_run(run_dir, manifest)
    tuned = p / "tuned.yaml"
    if not tuned.is_file():
        raise UsageError(f"{said(p)} has no tuned.yaml: the tune found no winner", hint="see its tune.md")
    from infertool.recipe import load_recipe

    return load_recipe(str(tuned), [])


def _evidence_plan(src: str, kind: str, folder: Path, scheme: str, options: PublishOptions) -> EvidencePlan:
    """What publish does about ``DEST/evidence/`` (``EvidencePlan``)."""
    ev = folder / EVIDENCE
    if scheme != "dir":
        return EvidencePlan(uploads=str(ev)) if ev.is_dir() else \
            EvidencePlan(missing=f"{said(folder)} carries no evidence/ to upload")
    if not options.evidence:
        return EvidencePlan(missing="published with --no-evidence")
    if kind == "published":
        if ev.is_dir() and not ev.is_symlink():
            return EvidencePlan(copies=str(ev))
        return EvidencePlan(missing="the source folder carries no evidence (publish from its run or tune directory "
                                    "to capture it)")
    from infertool.recipe import VerifySection
    from infertool.resolve import resolve
    from infertool.serve import prepare

    try:
        recipe = source_recipe(src, kind)
    except UsageError as e:  # a run or tune directory whose recipe is gone: the weights still ship, said why
        return EvidencePlan(missing=f"the {kind}'s recipe, whose serve settings the evidence needs, is not readable: "
                                    f"{e.message.splitlines()[0][:300]}")
    spec = (recipe.verify or VerifySection()).evidence
    if not spec.enabled:
        return EvidencePlan(missing="verify.evidence.enabled is false in the recipe")
    res = resolve(recipe, candidate_path=folder)
    launch = prepare(res, model=res.candidate_at(folder, exists=True), purpose="eval (candidate)", dry_run=True)
    return EvidencePlan(capture=CaptureSpec(str(folder), list(launch.spec.argv), spec.top_k, spec.max_bytes,
                                            spec.max_fraction))


def evidence_writer(p: PublishPlan, on_event: EventCallback | None = None) -> EvidenceWriter | None:
    """The evidence writer of a plan (``verify.capture``): capture (a run or tune directory: the recipe's serve
    settings on the checkpoint), copy (a published folder's), or none."""
    from infertool.resolve import resolve
    from infertool.verify.capture import copier, lmeval_source, writer

    if p.scheme != "dir":
        return None
    from infertool.publish.speed import copied_speed, run_speed, with_speed

    if p.evidence.copies is not None:
        return copied_speed(copier(Path(p.evidence.copies)), Path(p.evidence.copies))
    if p.evidence.capture is None:
        return None
    recipe = source_recipe(p.src, p.kind)
    res = resolve(recipe, candidate_path=p.folder)
    if p.kind == "run":
        from infertool.report import load_run

        _, manifest = load_run(Path(p.src).expanduser())
        rec = manifest.stages.get("eval")
        answer, why = lmeval_source(recipe, Path(rec.dir) if rec is not None and rec.dir else None)
        speed, _ = run_speed(Path(p.src).expanduser(), manifest)
    else:
        answer, why = None, "tune keeps no per-document lm-eval results with its winner"
        speed = None
    return with_speed(writer(res, p.folder, on_event=on_event, lmeval_answer=answer, lmeval_why=why, strict=True),
                      speed)


def run(p: PublishPlan, on_event: EventCallback | None = None) -> PublishResult:
    """The copy (a folder, its evidence written as the plan says) or the upload (boto3, huggingface_hub) of a
    plan; --dry-run: nothing."""
    if p.dry_run:
        return PublishResult(p)
    if p.scheme == "dir":
        published = publish_dir(p.folder, Path(p.dest), p.facts, evidence_writer(p, on_event), p.evidence.missing,
                                p.build, p.sign_key)
        return PublishResult(p, published=Published.from_dict(published))
    folder = Path(p.folder)
    if not (folder / FACTS).is_file():  # a run's stage entry has no card: the card travels with the weights
        raise UsageError(f"{p.src}: upload its published folder, which holds the card",
                         hint=f"infertool publish {shlex.quote(str(Path(p.facts.path or p.folder)))} {p.dest}")
    return PublishResult(p, uploaded=_upload(folder, p))


def _upload(folder: Path, p: PublishPlan) -> int:
    """The remote upload through the library's own client; a missing library or credentials: a clear error."""
    lib = "huggingface_hub" if p.scheme == "hf" else "boto3"
    try:
        mod = __import__(lib)
    except ImportError:
        raise BackendError(f"publishing to {p.dest} needs the {lib} package, which is not installed",
                           hint=f"pip install {lib} (and its credentials), or --dry-run to see the calls") from None
    try:
        if p.scheme == "hf":
            mod.HfApi().upload_folder(folder_path=str(folder), repo_id=p.dest[5:].strip("/"), repo_type="model")
            return 1
        client = mod.client("s3")
        bucket, _, prefix = p.dest[5:].partition("/")
        n = 0
        for f in checkpoint_files(folder) + beside(folder):
            client.upload_file(str(f), bucket, "/".join(x for x in (prefix.strip("/"), f.relative_to(folder).as_posix()) if x))
            n += 1
        return n
    except Exception as e:  # noqa: BLE001 - the library's own errors (no credentials, denied): said, not a traceback
        raise BackendError(f"publishing to {p.dest} failed: {type(e).__name__}: {str(e)[:300]}",
                           hint=f"check {lib}'s credentials (AWS_* / HF_TOKEN), or --dry-run to see the calls") from None
