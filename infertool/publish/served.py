"""What ``infertool serve RUN_DIR | TUNE_DIR | FOLDER | RECIPE`` serves (``served``): a run's published checkpoint,
a tune's winner, a published folder or a recipe's quantize.output, each checked by fingerprint against the record
that vouches for it."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertool.atomic import name_refusal
from infertool.errors import UsageError
from infertool.publish.checkpoint import FACTS, fingerprint, said, short
from infertool.publish.facts import published_record, read_facts, recorded_path, vouched

if TYPE_CHECKING:
    from infertool.recipe import Recipe
    from infertool.resolve import Resolution
    from infertool.summaries import RunManifest
    from infertool.verify.core import Source as VerifySource


@dataclass
class ServeTarget:
    """What ``infertool serve ARG`` serves: the resolution, what ARG was, and the checked artifact."""

    res: Resolution
    kind: str  # run | tune | published | recipe
    published: str | None = None
    fingerprint: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        return {k: v for k, v in asdict(self).items() if k != "res"}


def recipe_of_run(run_dir: Path, manifest: RunManifest, overrides: list[str] | None = None) -> Recipe:
    """The recipe a run ran (its manifest's), with ``overrides`` on top, validated as any recipe."""
    from infertool.recipe import apply_overrides, parse_overrides, validate_recipe_data

    if not isinstance(manifest.recipe, dict):
        raise UsageError(f"{run_dir / 'manifest.json'} holds no recipe", hint="a run directory `infertool run` wrote")
    data = json.loads(json.dumps(manifest.recipe))
    if overrides:
        data = apply_overrides(data, parse_overrides(list(overrides)))
    return validate_recipe_data(data, source=f"{run_dir / 'manifest.json'} (the run's recipe)")


def check_fingerprint(path: str | Path, expected: str, what: str, republish: str) -> str:
    """The fingerprint of what is at ``path`` now; a different one than ``expected`` (or nothing there) is refused
    with both fingerprints and the command that re-publishes."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise UsageError(f"{p} holds no checkpoint now (no config.json): {what} evaluated {short(expected)}",
                         hint=f"publish it again: {republish}")
    now = fingerprint(p)
    if now != expected:
        raise UsageError(f"{p} holds another checkpoint than {what} evaluated: fingerprint {now} there, {expected} "
                         "evaluated", hint=f"publish it again: {republish}")
    return now


def _served_run(p: Path, overrides: list[str]) -> ServeTarget:
    from infertool.report import load_run
    from infertool.resolve import resolve

    run_dir, manifest = load_run(p)
    pub = published_record(manifest)
    if not pub.path or not pub.fingerprint:
        raise UsageError(f"{run_dir} published no checkpoint" + (": " + pub.why if pub.why else ""),
                         hint="serve its recipe instead, or a run with quantize and eval stages")
    path = str(recorded_path(run_dir, pub.path))
    fp = check_fingerprint(path, pub.fingerprint, f"run {run_dir.name}",
                           f"infertool publish {shlex.quote(str(run_dir))} {shlex.quote(path)} --force")
    res = resolve(recipe_of_run(run_dir, manifest, overrides), candidate_path=path)
    res.notes.insert(0, f"serves {path}: the checkpoint run {run_dir.name} evaluated (fingerprint {short(fp)}, "
                        "checked)")
    return ServeTarget(res, "run", path, fp)


def _served_folder(p: Path, overrides: list[str]) -> ServeTarget:
    """A published folder (``infertool.json`` beside the weights), perhaps someone else's: its weights checked
    against the fingerprint its card records, served with the serve settings the card records that load no code,
    pick no secret and name no file elsewhere (``verify.core.untrusted_serve``, as verify takes them from its
    evidence); the others are shown, not taken: ``--set serve.X=Y`` gives them, the server's user's choice."""
    import re

    from infertool.recipe import apply_overrides, parse_overrides, validate_recipe_data
    from infertool.resolve import resolve
    from infertool.verify.core import not_taken_note, untrusted_serve

    facts = read_facts(p / FACTS)
    fp = check_fingerprint(p, str(facts.fingerprint), f"its {FACTS}",
                           f"infertool publish RUN_DIR {shlex.quote(str(p))} --force")
    taken, not_taken = untrusted_serve(dict(facts.serve or {}))
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", p.name).strip("-.")[:64] or "published"
    data: dict[str, Any] = {"name": name, "model": {"source": str(p)}, "serve": taken}  # Any: a recipe as JSON
    pairs = parse_overrides(overrides)
    recipe = validate_recipe_data(apply_overrides(data, pairs) if pairs else data,
                                  source=f"{p / FACTS}'s serve settings" + (" with --set" if pairs else ""))
    res = resolve(recipe)
    own = vouched(facts, fp)
    verdict = f"verdict {own.verdict or '?'}" if own is not None else "a verdict no run directory vouches for"
    res.notes.insert(0, f"serves {p}: a published folder, {verdict} (fingerprint {short(fp)}, checked), with the "
                        "serve settings its card records")
    keys = {k for k, _ in pairs}
    res.notes += [not_taken_note(k, v) for k, v in not_taken.items() if f"serve.{k}" not in keys]
    return ServeTarget(res, "published", str(p), fp)


def served(arg: str, overrides: list[str] | None = None, keys: list[str] | None = None) -> ServeTarget:
    """What ``infertool serve ARG`` means: a run directory (its recipe with its published checkpoint as the
    served model), a tune directory (its tuned.yaml, whose quantize.output is the winner's published copy), a
    published folder (``_served_folder``: its card's serve settings, none that loads code), or a
    recipe (a quantize.output holding ``infertool.json`` is checked the same way); its signature checked
    (``check_signature``: trusted ``keys`` or the recipe's ``verify.signing``) before anything is served."""
    target = _served(arg, overrides)
    check_signature(target, keys or [])
    return target


def check_signature(target: ServeTarget, keys: list[str]) -> None:
    """With trusted keys (--key, ``verify.signing.trusted_keys``) or ``verify.signing.required``: the served
    folder must carry a valid signature by one of them (a SignatureError, exit 6, naming the files that differ;
    a model that is no local folder has nothing signed). Without: a note says who signed it, not checked."""
    from infertool.errors import SignatureError
    from infertool.signing import check_folder, require_keys, require_valid, trusted_keys

    recipe = target.res.recipe
    spec = recipe.verify.signing if recipe.verify is not None else None
    trusted = trusted_keys(keys, spec.trusted_keys if spec is not None else None)
    cand = target.res.candidate
    local = cand.path if cand is not None and cand.path and Path(cand.path).is_dir() else None
    folder = target.published or local
    if not trusted and not (spec is not None and spec.required):
        if folder is not None:
            target.res.notes.append(f"signature: {check_folder(folder).message}")
        return
    require_keys(trusted, "serving it (--key, verify.signing.required)")
    if folder is None:
        raise SignatureError(f"a valid signature is required, and {recipe.name} serves no local published folder "
                             "(nothing signed to check)", hint="serve a run directory, a tune directory, or a "
                             "recipe whose quantize.output is a folder published with --sign-key")
    check = check_folder(folder, trusted)
    require_valid(check, folder)
    target.res.notes.insert(0, f"signature: {check.message} ({folder})")


def _served(arg: str, overrides: list[str] | None = None) -> ServeTarget:
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    overrides = list(overrides or [])
    p = Path(arg).expanduser()
    if p.is_dir() and (p / "manifest.json").exists() and not (p / "tune.json").exists():
        return _served_run(p, overrides)
    if p.is_dir() and (p / FACTS).is_file() and (p / "config.json").is_file():
        return _served_folder(p, overrides)
    if p.is_dir() and (p / "tune.json").exists():
        tuned = p / "tuned.yaml"
        if not tuned.is_file():
            raise UsageError(f"{p} has no tuned.yaml: the tune found no winner", hint="see its tune.md")
        out = _served(str(tuned), overrides)
        out.kind = "tune"
        return out
    res = resolve(load_recipe(arg, overrides))
    cand = res.candidate
    facts_file = Path(cand.path) / FACTS if cand is not None and cand.path and not cand.load_quantization else None
    if facts_file is None or not facts_file.is_file():
        return ServeTarget(res, "recipe")
    facts = read_facts(facts_file)
    assert cand is not None and cand.path is not None  # facts_file is inside it
    card_run = facts.run_dir if facts.run_dir is not None and not name_refusal(facts.run_dir) else None
    republish = f"infertool publish {shlex.quote(str(card_run or 'RUN_DIR'))} {shlex.quote(str(cand.path))} --force"
    fp = check_fingerprint(cand.path, str(facts.fingerprint), f"the card's run ({said(facts.run_id or '?', 100)})",
                           republish)
    own = vouched(facts, fp)
    if own is not None:
        res.notes.insert(0, f"serves {cand.path}: published with verdict {own.verdict or '?'} by run "
                            f"{own.run_id or '?'} (fingerprint {short(fp)}, checked)")
    else:
        res.notes.insert(0, f"serves {cand.path} (fingerprint {short(fp)}, as its {FACTS} records): its card claims "
                            f"verdict {said(facts.as_written.get('verdict'), 40)} and run "
                            f"{said(facts.as_written.get('run_id'), 100)}, not verified (no run directory records "
                            "this fingerprint)")
    return ServeTarget(res, "recipe", cand.path, fp)


def verify_source(src: str) -> VerifySource:
    """SRC of `infertool verify` as the checkpoint to verify: a published folder (its fingerprint now), a run
    directory or a tune directory (the checkpoint it published, checked against the fingerprint it recorded)."""
    from infertool.verify.core import Source

    p = Path(src).expanduser()
    if not str(src).strip() or not p.is_dir():
        raise UsageError(f"{said(src)} is not a folder", hint="give a published folder, a run directory or a tune directory")
    if (p / "manifest.json").is_file() or (p / "tune.json").is_file():
        target = _served(str(p))  # its signature: verify's plan checks it first
        if not target.published or not target.fingerprint:
            raise UsageError(f"{said(src)}: its {target.kind} published no checkpoint",
                             hint="give the published folder itself")
        return Source(Path(target.published), target.kind, target.fingerprint, target.res.recipe, str(src),
                      target.res.notes[:1])
    if not (p / "config.json").is_file():
        raise UsageError(f"{said(src)} holds no checkpoint (no config.json), no run (manifest.json) and no tune "
                         "(tune.json)", hint="give a published folder, a run directory or a tune directory")
    return Source(p, "published", fingerprint(p), None, str(src))
