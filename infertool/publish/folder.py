"""The published folder: where it may go (``check_dest``: never inside the stage cache, a run, the source or the
environments; an existing folder replaced only when infertool published it), and the copy (``publish_dir``):
through a temporary folder beside DEST and a rename, with ``MODEL_CARD.md`` and ``infertool.json`` (``write_card``,
the one writer of both), the evidence folder and ``provenance.intoto.json`` (``publish.provenance``); never a link
into the cache."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from infertool.atomic import (OutputPathError, atomic_dir, copy_file, link_file, name_refusal, remove_inside,
                              replace_refusal, write_json, write_text)
from infertool.errors import UsageError
from infertool.publish.card import model_card
from infertool.publish.checkpoint import (CARD, EVIDENCE, FACTS, check_room, check_source, checkpoint_files,
                                          fingerprint, said, short)
from infertool.summaries import Published
from infertool.publish.facts import CardFacts, read_facts, run_facts
from infertool.publish.provenance import BuildFacts
from infertool.publish.provenance import run_facts as run_build
from infertool.publish.provenance import write as write_provenance
from infertool.summaries import EvidenceBlock

if TYPE_CHECKING:
    from infertool.recipe import Recipe
    from infertool.resolve import Resolution
    from infertool.summaries import RunManifest


EvidenceWriter = Callable[[Path, str], EvidenceBlock]  # (the evidence folder to write, the fingerprint) -> its block


def check_dest(dest: str | Path, forbidden: Mapping[str, str | Path | None], force: bool | None = None) -> Path:
    """DEST as a folder to publish into (absolute), refused (UsageError, exit 2) when its name cannot be a folder's
    (``atomic.name_refusal``: a control character, a part over 255 bytes), when it is inside (or holds) one of
    ``forbidden`` ({what: folder}: the stage cache, the run directory, the source model, the environments), or is
    there and may not be replaced (``atomic.replace_refusal``: only an empty folder or a model folder).
    ``force``: `infertool publish`'s --force; False (the command without it) replaces only a folder infertool
    published (``ownership_refusal``); None (`run`, `tune`, which have no such flag) replaces only a folder
    infertool published or quantized (``ownership_refusal(quantized=True)``)."""
    text = str(dest)
    if not text.strip():
        raise UsageError("an empty destination: nothing to publish to", hint="name a folder, e.g. out/my-model")
    why = name_refusal(text)
    if why:
        raise UsageError(f"cannot publish to {said(text, 100)}: {why}", hint="name a folder, e.g. out/my-model")
    p = Path(text).expanduser().absolute()
    real = p.resolve()
    for what, root in forbidden.items():
        if not root:
            continue
        r = Path(root).expanduser().resolve()
        if real == r or r in real.parents or real in r.parents:
            raise UsageError(f"cannot publish to {text}: it is {'inside' if real != r and r in real.parents else 'or holds'} "
                             f"{what} ({r})", hint="publish to a folder of its own, e.g. --publish out/<name>")
    for d in (real, *real.parents):  # inside any run directory (beside its stage cache) or tune directory
        if ((d / "manifest.json").is_file() and (d.parent / ".stages").is_dir()) or \
                ((d / "tune.json").is_file() and (d / ".stages").is_dir()):
            raise UsageError(f"cannot publish to {text}: it is inside the run directory {d}",
                             hint="publish to a folder of its own, e.g. --publish out/<name>")
    try:
        from infertool.atomic import check_output_dir

        check_output_dir(p.parent)
    except OutputPathError as e:
        raise UsageError(f"cannot publish to {text}: {e}", hint=e.hint) from None
    if p.exists() or p.is_symlink():
        why = replace_refusal(p)
        if why:
            raise UsageError(f"cannot publish to {text}: {why}",
                             hint="publishing replaces only an empty folder or a model folder: name a new folder")
        why = None if force else ownership_refusal(p, quantized=force is None)
        if why:
            raise UsageError(f"cannot publish to {text}: {why}", hint=(
                "name a new folder, or pass --force to replace this one (every file in it goes)" if force is False else
                "publish to a new folder (--publish DIR), or remove this one yourself if it may go"))
    return p


def ownership_refusal(folder: Path, *, quantized: bool = False) -> str | None:
    """Why the existing ``folder`` is not one infertool published, as it published it (None: it is, or it is
    empty): its ``infertool.json`` is there and infertool's card data, and the folder's fingerprint now is the one
    it records (no file added, removed or changed since). ``quantized``: a checkpoint `infertool quantize` wrote
    (its ``infertool-manifest.json`` beside it, no card yet) is infertool's too (`run` publishes where the recipe's
    quantize.output is)."""
    from infertool.resolve import QUANTIZE_MANIFEST

    if not any(folder.iterdir()):
        return None
    facts_file = folder / FACTS
    manifest = folder / QUANTIZE_MANIFEST
    if quantized and not facts_file.exists() and manifest.is_file() and not manifest.is_symlink():
        return None
    if facts_file.is_symlink() or not facts_file.is_file():
        return f"it holds no {FACTS}: infertool did not publish this folder, and publish replaces only its own"
    try:
        claimed = read_facts(facts_file).fingerprint
        now = fingerprint(folder)
    except (UsageError, OSError) as e:
        return f"its {FACTS} or its files cannot be read as infertool's ({said(e, 200)})"
    if now != claimed:
        return (f"it changed since infertool published it (fingerprint {short(now)} now, {short(claimed)} in its "
                f"{FACTS}): a file in it was added, removed or changed, and publish replaces only its own copy")
    return None


def env_folders() -> Path:
    from infertool.envs.paths import envs_root

    return envs_root()


def _evidence(write: EvidenceWriter | None, folder: Path, fp: str, why_not: str | None) -> EvidenceBlock:
    """infertool.json's ``evidence`` block: what ``write`` wrote into ``folder`` (``infertool.verify.capture``), else
    why not (and no stale evidence folder is left beside the weights)."""
    if write is not None:
        block = write(folder, fp)
        if block.fingerprint:
            return block
        why_not = block.why_missing
    if folder.exists() or folder.is_symlink():
        remove_inside(folder, folder.parent)
    return EvidenceBlock.absent(why_not or "publish wrote no evidence")


def write_card(folder: Path, facts: CardFacts) -> None:
    """The one writer of ``infertool.json`` and ``MODEL_CARD.md``."""
    write_json(folder / FACTS, facts.to_dict())
    write_text(folder / CARD, model_card(facts))


def publish_dir(src: str | Path, dest: Path, facts: CardFacts | dict[str, Any],  # Any: infertool.json's facts
                evidence: EvidenceWriter | None = None,
                no_evidence: str | None = None,
                build: BuildFacts | None = None,
                sign_key: str | Path | None = None) -> dict[str, Any]:  # Any: the Published record as JSON
    """Copy the checkpoint ``src`` to ``dest`` whole (a temporary folder beside it, then a rename), with the card
    and ``infertool.json``; the copy's fingerprint must be the source's. ``evidence`` writes ``evidence/`` (inside
    the temporary folder: the published folder appears with it, or not at all) and returns infertool.json's
    ``evidence`` block; without it, ``no_evidence`` says why there is none. ``build``: how the checkpoint was
    built, written as ``provenance.intoto.json`` after the card (``publish.provenance``; None: nothing known).
    ``sign_key`` (an EC private key file): the last step inside the temporary folder signs every file of it
    (``model.sig``, ``infertool.signing``), the provenance included. Returns the ``Published`` record as the
    manifest and published.json keep it: {path, fingerprint, evidence, signature}."""
    from infertool.signing import sign_folder, signature_of

    src = Path(src)
    card = facts if isinstance(facts, CardFacts) else CardFacts.read(facts)
    built = build if build is not None else BuildFacts.unknown("the publisher gave no build facts")
    check_source(src)
    sig = signature_of(sign_key) if sign_key else None  # the key refused before a byte is copied
    fp = fingerprint(src)
    # already there (a re-run that reused quantize): the weights are linked, not copied again, and the card says this run
    there = (dest / "config.json").is_file() and not dest.is_symlink() and fingerprint(dest) == fp
    try:
        if not there:
            check_room(src, dest)
        with atomic_dir(dest) as tmp:
            for f in checkpoint_files(dest if there else src):  # holes kept: never a link into the cache
                target = tmp / f.relative_to(dest if there else src)
                target.parent.mkdir(parents=True, exist_ok=True)
                (link_file if there else copy_file)(f, target)
            copied = fingerprint(tmp)
            if copied != fp:
                raise UsageError(f"the copy of {src} differs from it (fingerprint {short(copied)} vs {short(fp)}): "
                                 "it changed while being copied", hint="publish again")
            ev = _evidence(evidence, tmp / EVIDENCE, fp, no_evidence)
            write_card(tmp, card.copied(fp, str(dest), ev, sig))
            write_provenance(tmp, built, ev)
            if sign_key:  # the very last step: every file above is signed
                sign_folder(tmp, sign_key)
    except OSError as e:
        import errno

        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # a full disk: the work failed (exit 4), as everywhere else
            from infertool.errors import RuntimeFailure

            raise RuntimeFailure(f"cannot publish to {dest}: {e.strerror or e}",
                                 hint="free space there, or publish to a folder with room for the weights") from None
        raise UsageError(f"cannot publish to {dest}: {e.strerror or e}", hint="a writable folder with room for the weights") from None
    return Published(str(dest), fp, ev, signature=sig).to_dict()


def run_destination(recipe: Recipe, publish: str | None) -> Path | None:
    """Where `run` publishes: --publish, else quantize.output, else resolve.default_output (None: nothing to
    publish: no quantize section, or one quantized when loaded)."""
    from infertool import backends
    from infertool.resolve import default_output

    q = recipe.quantize
    if q is None or not backends.of(q).checkpoint:
        return None
    return Path(publish or q.output or default_output(recipe.name, q.method)).expanduser().absolute()


def forbidden_for_run(cache: Path, run_dir: Path | None, res: Resolution) -> dict[str, Path | None]:
    return {"the stage cache": cache, "the run directory": run_dir,
            "the source model": Path(res.base.path) if res.base.exists and res.base.path else None,
            "INFERTOOL_HOME's environments": env_folders()}


def publish_run(run_dir: Path, manifest: RunManifest, checkpoint: Path, dest: Path,
                forbidden: Mapping[str, str | Path | None], evidence: EvidenceWriter | None = None,
                no_evidence: str | None = None,
                sign_key: str | Path | None = None) -> dict[str, Any]:  # Any: the Published record as JSON
    """Publish a run's evaluated checkpoint to ``dest`` with its card (and its evidence and signature:
    ``publish_dir``); the manifest's ``published`` record. The run's bench figures go with the evidence
    (``publish.speed``: ``evidence/speed.json``)."""
    from infertool.publish.speed import run_speed, with_speed

    check_dest(dest, forbidden)
    speed, _ = run_speed(run_dir, manifest)
    return publish_dir(checkpoint, dest, run_facts(run_dir, manifest), with_speed(evidence, speed), no_evidence,
                       run_build(run_dir, manifest), sign_key)
