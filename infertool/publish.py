"""The artifact you ship: the checkpoint a run (or a tune) evaluated, copied whole to where it is served from,
with a model card beside it, and checked by content before anything serves it.

- ``fingerprint(dir)``: a checkpoint's content fingerprint, the same for the stage-cache entry and every copy
  of it (no modification time, no file of the card, no hidden file enters it): every small file hashed whole,
  each weight file by its size, its safetensors header and 16 sampled blocks (``data.fingerprint``'s cheap
  identity, less its mtime); the card, its facts and the evidence folder (``evidence/``) are not the model;
- ``publish_dir(src, dest, facts, forbidden)``: the copy, through a temporary folder beside DEST and a rename
  (``atomic.replace_refusal`` decides what an existing DEST may be replaced), with ``MODEL_CARD.md`` (for
  people) and ``infertool.json`` (the same facts as data, with ``fingerprint``); never a link into the cache;
- ``run_facts`` / ``publish_run``: what `run` publishes (its recipe, verdict and gates, inputs, serve settings);
- ``served``: what ``infertool serve RUN_DIR | TUNE_DIR | RECIPE`` means, the fingerprint checked;
- ``plan`` / ``run``: `infertool publish SRC DEST` as a capability (a directory; ``s3://`` and ``hf://``
  through boto3 and huggingface_hub, printed as calls with ``dry_run``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from infertool.atomic import (OutputPathError, atomic_dir, copy_file, file_kind, name_refusal, remove_inside,
                              replace_refusal, write_json, write_text)
from infertool.capability import RunContext
from infertool.errors import BackendError, UsageError
from infertool.inputs import size_text

if TYPE_CHECKING:
    from infertool.recipe import Recipe
    from infertool.resolve import Resolution

CARD = "MODEL_CARD.md"
FACTS = "infertool.json"
EVIDENCE = "evidence"  # infertool.verify.evidence.DIRNAME: the evidence folder beside the weights (not the model)
TUNE_PUBLISHED = "published.json"  # a tune directory's record of its winner's published copy
FACTS_VERSION = 1


# ------------------------------------------------------------------------------------------ fingerprint
MAX_DEPTH = 32  # folders inside a checkpoint folder, at most


def _entries(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every entry of the checkpoint under ``root`` but its folders, as (relative path, ``lstat``), sorted: links
    are not followed (a link is an entry, never what it names), no hidden part, not the card or its facts at the
    top, nor the evidence folder there (``EVIDENCE``). A folder nested deeper than MAX_DEPTH: a UsageError."""
    out: list[tuple[str, os.stat_result]] = []
    stack: list[tuple[Path, tuple[str, ...]]] = [(root, ())]
    while stack:
        folder, rel = stack.pop()
        if len(rel) > MAX_DEPTH:
            raise UsageError(f"{said(folder)}: folders nested deeper than {MAX_DEPTH} levels: not a checkpoint")
        try:
            with os.scandir(folder) as it:
                for e in it:
                    if e.name.startswith(".") or (not rel and e.name in (CARD, FACTS, EVIDENCE)):
                        continue
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        stack.append((Path(e.path), (*rel, e.name)))
                    else:
                        out.append(("/".join((*rel, e.name)), st))
        except OSError as e:  # a folder it may not read, one removed meanwhile
            raise UsageError(f"{said(folder)}: cannot read it: {e.strerror or e}") from None
    return sorted(out, key=lambda x: x[0])


def _files(root: Path) -> list[Path]:
    """The checkpoint's regular files (``_entries``): what a copy copies and an upload uploads."""
    return [root / rel for rel, st in _entries(root) if stat.S_ISREG(st.st_mode)]


def refusals(root: Path) -> list[str]:
    """Why the checkpoint under ``root`` cannot be published as it stands: each entry that is not a regular file
    (a link, inside the folder or out of it; a fifo, a socket, a device), named, with the reason. Links are
    refused, not copied as links: a link is served and uploaded as what it names, which can change after the
    fingerprint was taken, and one that leaves the folder copies a file the checkpoint does not hold."""
    real = root.resolve()
    out = []
    for rel, st in _entries(root):
        if stat.S_ISREG(st.st_mode):
            continue
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(root / rel)
            to = Path(os.path.normpath((real / rel).parent / target))
            if to == real or real in to.parents:
                out.append(f"{said(rel)} is a link to {said(target)}, inside the folder: publish copies regular files "
                           "only (replace the link by the file it names)")
            else:
                out.append(f"{said(rel)} is a link to {said(target)}, outside {said(root)}: publish copies only what "
                           "the checkpoint folder holds")
        else:
            out.append(f"{said(rel)} is {file_kind(st.st_mode)}: publish copies regular files only")
    return out


def said(value: object, limit: int = 200) -> str:
    """A value from a file or a folder someone else made, for a message or a note (``output.quoted``)."""
    from infertool.output import quoted

    return quoted(value, limit)


def fingerprint(path: str | Path) -> str:
    """The content fingerprint of a checkpoint folder (see the module docstring): 64 hex digits. Equal for a
    folder and its copy (other mtimes, a card beside it); different for other weights, shapes or configs."""
    from infertool.data.fingerprint import SMALL_FILE, WEIGHT_SUFFIXES, file_sha256, weight_file_identity

    root = Path(path).expanduser()
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder: there is no checkpoint to fingerprint")
    files: dict[str, object] = {}
    for rel, st in _entries(root):  # a link or a special file by what it is: never followed, never read
        f = root / rel
        if stat.S_ISLNK(st.st_mode):
            files[rel] = {"link": os.readlink(f)}
        elif not stat.S_ISREG(st.st_mode):
            files[rel] = {"kind": file_kind(st.st_mode)}
        elif f.suffix in WEIGHT_SUFFIXES or st.st_size > SMALL_FILE:
            files[rel] = {k: v for k, v in weight_file_identity(f).items() if k != "mtime_ns"}
        else:
            files[rel] = file_sha256(f)
    data = json.dumps({"v": FACTS_VERSION, "files": files}, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def short(fp: str | None) -> str:
    return (fp or "?")[:16]


# ------------------------------------------------------------------------------------------ where
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
        claimed = _read_facts(facts_file)["fingerprint"]
        now = fingerprint(folder)
    except (UsageError, OSError) as e:
        return f"its {FACTS} or its files cannot be read as infertool's ({said(e, 200)})"
    if now != claimed:
        return (f"it changed since infertool published it (fingerprint {short(now)} now, {short(claimed)} in its "
                f"{FACTS}): a file in it was added, removed or changed, and publish replaces only its own copy")
    return None


def check_source(folder: Path) -> None:
    """The checkpoint under ``folder`` holds regular files only (``refusals``): a UsageError naming the others."""
    why = refusals(folder)
    if why:
        more = f"; and {len(why) - 5} more" if len(why) > 5 else ""
        raise UsageError(f"cannot publish {said(folder)}: " + "; ".join(why[:5]) + more,
                         hint="a published checkpoint is regular files: copy what a link names into the folder, "
                              "or remove what should not ship")


def check_room(folder: Path, dest: Path) -> None:
    """The file system DEST is on has room for the copy of ``folder``: the bytes its files hold on disk (a sparse
    file's holes take none, and stay holes in the copy), before a byte is copied."""
    need = sum(getattr(st, "st_blocks", st.st_size // 512 + 1) * 512 for _, st in _entries(folder)
               if stat.S_ISREG(st.st_mode)) + 2**20
    where = dest
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if need > free:
        raise UsageError(f"cannot publish to {said(dest)}: the copy needs {size_text(need)} and its file system "
                         f"has {size_text(free)} free", hint="free some space, or publish to another disk")


def env_folders() -> Path:
    from infertool.envs.paths import envs_root

    return envs_root()


# ------------------------------------------------------------------------------------------ the copy
EvidenceWriter = Callable[[Path, str], dict]  # (the evidence folder to write, the fingerprint) -> infertool.json's block


def _evidence(write: EvidenceWriter | None, folder: Path, fp: str, why_not: str | None) -> dict:
    """infertool.json's ``evidence`` block: what ``write`` wrote into ``folder`` (``infertool.verify.capture``), else
    {"missing": why} (and no stale evidence folder is left beside the weights)."""
    if write is not None:
        block = write(folder, fp)
        if block.get("fingerprint"):
            return block
        why_not = str(block.get("missing") or "not captured")
    if folder.exists() or folder.is_symlink():
        remove_inside(folder, folder.parent)
    return {"missing": why_not or "publish wrote no evidence"}


def publish_dir(src: str | Path, dest: Path, facts: dict, evidence: EvidenceWriter | None = None,
                no_evidence: str | None = None) -> dict:
    """Copy the checkpoint ``src`` to ``dest`` whole (a temporary folder beside it, then a rename), with the card
    and ``infertool.json``; the copy's fingerprint must be the source's. ``evidence`` writes ``evidence/`` (inside
    the temporary folder: the published folder appears with it, or not at all) and returns infertool.json's
    ``evidence`` block; without it, ``no_evidence`` says why there is none. Returns {path, fingerprint, evidence}."""
    src = Path(src)
    check_source(src)
    fp = fingerprint(src)
    if (dest / "config.json").is_file() and not dest.is_symlink() and fingerprint(dest) == fp:
        ev = _evidence(evidence, dest / EVIDENCE, fp, no_evidence)  # already there (a re-run that reused quantize):
        facts = {**facts, "fingerprint": fp, "path": str(dest), "evidence": ev}  # the card says this run, the
        write_json(dest / FACTS, facts)  # weights are not copied again
        write_text(dest / CARD, model_card(facts))
        return {"path": str(dest), "fingerprint": fp, "evidence": ev}
    try:
        check_room(src, dest)
        with atomic_dir(dest) as tmp:
            for f in _files(src):  # a copy of what the fingerprint covers, holes kept: never a link into the cache
                target = tmp / f.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                copy_file(f, target)
            copied = fingerprint(tmp)
            if copied != fp:
                raise UsageError(f"the copy of {src} differs from it (fingerprint {short(copied)} vs {short(fp)}): "
                                 "it changed while being copied", hint="publish again")
            ev = _evidence(evidence, tmp / EVIDENCE, fp, no_evidence)
            facts = {**facts, "fingerprint": fp, "path": str(dest), "evidence": ev}
            write_json(tmp / FACTS, facts)
            write_text(tmp / CARD, model_card(facts))
    except OSError as e:
        raise UsageError(f"cannot publish to {dest}: {e.strerror or e}", hint="a writable folder with room for the weights") from None
    return {"path": str(dest), "fingerprint": fp, "evidence": ev}


def serve_commands(where: str) -> dict:
    q = shlex.quote(where)
    return {"serve": f"infertool serve {q}", "k8s": f"infertool serve {q} --emit k8s > vllm.yaml"}


def gate_rows(gates: list) -> list[dict]:
    from infertool.evaluate.verdict import Gate

    rows = []
    for g in gates or []:
        g = Gate.from_dict(g)
        if g.status == "n/a":
            continue
        rows.append({"name": g.name, "metric": g.metric, "estimate": g.estimate, "lo": g.lo, "hi": g.hi,
                     "threshold": g.threshold, "status": g.status})
    return rows


def run_facts(run_dir: Path, manifest) -> dict:
    """What a run's card says, as data: the source model, the method and its settings, the verdict and each gate,
    the run, its input fingerprints, the serve settings the candidate was scored with, the command that serves it."""
    from infertool import __version__

    recipe = manifest.recipe or {}
    q = recipe.get("quantize") or {}
    from infertool.summaries import EvalStageSummary

    ev = manifest.stages.get("eval")
    summary = ev.summary_as(EvalStageSummary) if ev is not None and ev.summary is not None else None
    res = manifest.resolution or {}
    return {"v": FACTS_VERSION, "infertool": __version__,
            "published": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source_model": {"source": (recipe.get("model") or {}).get("source"),
                             "label": ((res.get("base") or {}).get("label"))},
            "method": {k: v for k, v in q.items() if k not in ("output",) and v is not None},
            "label": (res.get("candidate") or {}).get("label"),
            "verdict": getattr(summary, "verdict", None), "reason": getattr(summary, "reason", None),
            "suite": getattr(summary, "suite", None), "engine": getattr(summary, "engine", None),
            "gates": gate_rows(getattr(summary, "gates", None) or []),
            "recipe": manifest.recipe_name, "run_id": run_dir.name, "run_dir": str(run_dir.absolute()),
            "inputs": manifest.inputs, "serve": (res.get("serve") or {}).get("serve"), "target": manifest.target,
            "commands": serve_commands(str(run_dir.absolute()))}


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*[]|#!~"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;"})


def _shown(value: object) -> str:
    """A value on one line: every control or format character (a newline, ESC, a bidi override) as its escape."""
    from infertool.output import escaped

    return escaped(value)


def cell(v: object) -> str:
    """A value in the card's Markdown text (a list item, a table cell): one line, its Markdown and HTML
    characters escaped (no tag, link, image, heading, code fence or table column can come of it)."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else _shown(v).translate(_MD_SPECIAL)


def code(v: object) -> str:
    """A value as a Markdown code span (shown as it is: no markup inside one), on one line, its fence longer
    than any run of backticks in it."""
    import re

    text = _shown(v)
    ticks = "`" * (max((len(r) for r in re.findall("`+", text)), default=0) + 1)
    return f"{ticks} {text} {ticks}" if "`" in text else f"`{text}`"


def model_card(f: dict) -> str:
    """MODEL_CARD.md: the facts for people, every value escaped (``cell``, ``code``); a card whose facts nothing
    vouched for (``claimed``) quotes what it claimed, under a heading that says so, and asserts no verdict."""
    src = f.get("source_model") or {}
    claimed = f.get("claimed")
    if isinstance(claimed, dict):
        lines = [f"# Checkpoint {code(short(f.get('fingerprint')))}", "",
                 f"Published by infertool {cell(f.get('infertool'))} on {cell(f.get('published'))} from a folder whose "
                 f"own card nothing vouches for: no run directory records its fingerprint.", "",
                 "- **Verdict: not verified**", f"- **Fingerprint:** {code(f.get('fingerprint'))}", "",
                 "## What the source folder's card claims (not verified)", ""]
        lines += [f"- {cell(k)}: \"{cell(v)}\"" for k, v in claimed.items()] + [""]
        return "\n".join(lines)
    lines = [f"# {cell(f.get('label') or f.get('recipe'))}", "",
             f"Published by infertool {cell(f.get('infertool'))} on {cell(f.get('published'))}.", "",
             f"- **Source model:** {cell(src.get('label') or src.get('source'))}",
             "- **Method:** " + ", ".join(f"{cell(k)} {cell(v)}" for k, v in (f.get("method") or {}).items() if not isinstance(v, dict))
             + "".join(f"; {cell(k)}: " + ", ".join(f"{cell(a)} {cell(b)}" for a, b in v.items())
                       for k, v in (f.get("method") or {}).items() if isinstance(v, dict)),
             f"- **Verdict: {cell(f.get('verdict'))}**" + (f" — {cell(f.get('reason'))}" if f.get("reason") else "")
             + (f" (suite {cell(f.get('suite'))}, engine {cell(f.get('engine'))})" if f.get("suite") else ""),
             f"- **Run:** {cell(f.get('run_id'))} ({code(f.get('run_dir'))})",
             f"- **Fingerprint:** {code(f.get('fingerprint'))}", ""]
    if f.get("verdict") not in ("PASS", None):
        lines += [f"**This checkpoint did not pass its eval ({cell(f.get('verdict'))}).** It is published so that "
                  "you can decide; read the gates below before serving it.", ""]
    if f.get("gates"):
        lines += ["| gate | metric | estimate | interval | threshold | status |", "|---|---|---|---|---|---|"]
        lines += [f"| {cell(g['name'])} | {cell(g['metric'])} | {cell(g['estimate'])} | [{cell(g['lo'])}, {cell(g['hi'])}] "
                  f"| {cell(g['threshold'])} | {cell(g['status'])} |" for g in f["gates"]]
        lines.append("")
    serve = f.get("serve") or {}
    if serve:
        lines += ["## Scored with these serve settings", ""]
        lines += [f"- {cell(k)}: {cell(v)}" for k, v in serve.items() if v not in (None, [], {})] + [""]
    inputs = {k: v for k, v in (f.get("inputs") or {}).items() if k != "sha256"}
    if inputs:
        lines += ["## Inputs (content fingerprints)", ""]
        lines += [f"- {cell(k)}: {code(json.dumps(v, sort_keys=True))}" for k, v in inputs.items()] + [""]
    lines += evidence_lines(f)
    if f.get("run_dir"):  # the commands from the run directory, shell-quoted here: never a card's own text
        cmds = serve_commands(str(f["run_dir"]))
        lines += ["## Serve it", "", "```bash", _shown(cmds["serve"]), _shown(cmds["k8s"]), "```", ""]
    return "\n".join(lines)


def evidence_lines(f: dict) -> list[str]:
    """The card's Evidence section: the evidence's fingerprint and the command that re-checks the checkpoint
    against it (``infertool verify``), or that it carries none and why."""
    ev = f.get("evidence")
    if not isinstance(ev, dict):
        return []
    lines = ["## Evidence", ""]
    if ev.get("fingerprint"):
        where = shlex.quote(str(f.get("path") or "DEST"))
        lines += [f"- **Evidence fingerprint:** {code(ev.get('fingerprint'))} ({cell(ev.get('files'))} files, "
                  f"{cell(ev.get('bytes'))} bytes, engine {cell(ev.get('engine'))})",
                  "- The candidate's outputs as served (prompt log-probabilities, the decode path, lm-eval "
                  "documents) are in `evidence/`. Re-check this checkpoint under another engine, setting or machine:",
                  "", "```bash", _shown(f"infertool verify {where}"), "```", ""]
    else:
        lines += [f"This checkpoint carries no evidence: {cell(ev.get('missing'))}. It serves as it is; "
                  "`infertool verify` has nothing to compare it with.", ""]
    return lines


# ------------------------------------------------------------------------------------------ run / tune
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


def publish_run(run_dir: Path, manifest, checkpoint: Path, dest: Path, forbidden: dict,
                evidence: EvidenceWriter | None = None, no_evidence: str | None = None) -> dict:
    """Publish a run's evaluated checkpoint to ``dest`` with its card (and its evidence: ``publish_dir``); the
    manifest's ``published`` record."""
    check_dest(dest, forbidden)
    return publish_dir(checkpoint, dest, run_facts(run_dir, manifest), evidence, no_evidence)


# ------------------------------------------------------------------------------------------ what serve means
@dataclass
class Served:
    """What ``infertool serve ARG`` serves: the resolution, what ARG was, and the checked artifact."""

    res: Resolution
    kind: str  # run | tune | recipe
    published: str | None = None
    fingerprint: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "res"}


def published_record(manifest) -> dict:
    """A manifest's ``published`` record as strings only (a crafted one reads as nothing published, with its why)."""
    pub = manifest.published.to_dict() if manifest.published is not None else {}
    return {k: v for k, v in pub.items() if k in ("path", "fingerprint", "why") and isinstance(v, str) and v.strip()}


def recipe_of_run(run_dir: Path, manifest, overrides: list[str] | None = None):
    """The recipe a run ran (its manifest's), with ``overrides`` on top, validated as any recipe."""
    return _recipe_of_run(run_dir, manifest, list(overrides or []))


def _recipe_of_run(run_dir: Path, manifest, overrides: list[str]):
    from infertool.recipe import apply_overrides, parse_overrides, validate_recipe_data

    if not isinstance(manifest.recipe, dict):
        raise UsageError(f"{run_dir / 'manifest.json'} holds no recipe", hint="a run directory `infertool run` wrote")
    data = json.loads(json.dumps(manifest.recipe))
    if overrides:
        data = apply_overrides(data, parse_overrides(list(overrides)))
    return validate_recipe_data(data, source=f"{run_dir / 'manifest.json'} (the run's recipe)")


def verify(path: str | Path, expected: str, what: str, republish: str) -> str:
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


def served(arg: str, overrides: list[str] | None = None) -> Served:
    """What ``infertool serve ARG`` means: a run directory (its recipe with its published checkpoint as the
    served model), a tune directory (its tuned.yaml, whose quantize.output is the winner's published copy), or a
    recipe (a quantize.output holding ``infertool.json`` is checked the same way)."""
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    overrides = list(overrides or [])
    p = Path(arg).expanduser()
    if p.is_dir() and (p / "manifest.json").exists() and not (p / "tune.json").exists():
        from infertool.report import load_run

        run_dir, manifest = load_run(p)
        pub = published_record(manifest)
        if not pub.get("path") or not pub.get("fingerprint"):
            raise UsageError(f"{run_dir} published no checkpoint" + (": " + str(pub["why"]) if pub.get("why") else ""),
                             hint="serve its recipe instead, or a run with quantize and eval stages")
        path = str(recorded_path(run_dir, pub["path"]))
        fp = verify(path, pub["fingerprint"], f"run {run_dir.name}",
                    f"infertool publish {shlex.quote(str(run_dir))} {shlex.quote(path)} --force")
        recipe = _recipe_of_run(run_dir, manifest, overrides)
        res = resolve(recipe, candidate_path=path)
        res.notes.insert(0, f"serves {path}: the checkpoint run {run_dir.name} evaluated (fingerprint {short(fp)}, "
                            "checked)")
        return Served(res, "run", path, fp)
    if p.is_dir() and (p / "tune.json").exists():
        tuned = p / "tuned.yaml"
        if not tuned.is_file():
            raise UsageError(f"{p} has no tuned.yaml: the tune found no winner", hint="see its tune.md")
        out = served(str(tuned), overrides)
        out.kind = "tune"
        return out
    recipe = load_recipe(arg, overrides)
    res = resolve(recipe)
    cand = res.candidate
    facts_file = Path(cand.path) / FACTS if cand is not None and cand.path and not cand.load_quantization else None
    if facts_file is None or not facts_file.is_file():
        return Served(res, "recipe")
    facts = _read_facts(facts_file)
    assert cand is not None and cand.path is not None  # facts_file is inside it
    card_run = facts.get("run_dir") if isinstance(facts.get("run_dir"), str) and not name_refusal(facts["run_dir"]) else None
    republish = f"infertool publish {shlex.quote(str(card_run or 'RUN_DIR'))} {shlex.quote(str(cand.path))} --force"
    fp = verify(cand.path, str(facts.get("fingerprint")), f"the card's run ({said(facts.get('run_id') or '?', 100)})",
                republish)
    own = vouched(facts, fp)
    if own is not None:
        res.notes.insert(0, f"serves {cand.path}: published with verdict {own.get('verdict') or '?'} by run "
                            f"{own.get('run_id') or '?'} (fingerprint {short(fp)}, checked)")
    else:
        res.notes.insert(0, f"serves {cand.path} (fingerprint {short(fp)}, as its {FACTS} records): its card claims "
                            f"verdict {said(facts.get('verdict'), 40)} and run {said(facts.get('run_id'), 100)}, "
                            "not verified (no run directory records this fingerprint)")
    return Served(res, "recipe", cand.path, fp)


def _read_facts(path: Path) -> dict:
    from infertool.report import MAX_JSON_BYTES, Unreadable, read_json_inside

    try:
        doc = read_json_inside(path.parent, path.name)
    except (FileNotFoundError, Unreadable) as e:
        raise UsageError(f"{path}: not readable: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("fingerprint"), str):
        raise UsageError(f"{path} is not infertool's card data (no fingerprint; at most {MAX_JSON_BYTES:,} bytes of JSON)",
                         hint="publish the checkpoint again with `infertool publish`")
    return doc


# ------------------------------------------------------------------------------------------ `infertool publish`
@dataclass
class PublishOptions:
    dest: str
    dry_run: bool = False
    force: bool = False  # replace a DEST folder infertool did not publish (still never one replace_refusal keeps)
    evidence: bool = True  # write DEST/evidence/ (--no-evidence: False)


@dataclass
class PublishPlan:
    """What `infertool publish` copies and where: the folder (checkpoint + card), the kind of destination, and
    for an object store or a hub the exact library calls."""

    src: str
    kind: str  # run | tune | published
    folder: str  # the checkpoint's folder to copy (verified)
    fingerprint: str
    dest: str
    scheme: str  # dir | s3 | hf
    facts: dict = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    dry_run: bool = False
    evidence: dict = field(default_factory=dict)  # {"capture": what it serves and asks} or {"missing": why}

    def to_dict(self) -> dict:
        return asdict(self)


def recorded_path(record_dir: Path, value: str) -> Path:
    """A ``path`` a record holds (a manifest's ``published``, a tune's published.json), a relative one read from the
    directory that holds the record, never from the current folder."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else Path(os.path.normpath(record_dir.absolute() / p))


def _tune_record(tune_dir: Path) -> tuple[Path, str]:
    """A tune directory's published.json: (the winner's published folder, its fingerprint); a record without a
    ``path`` or ``fingerprint`` string is refused (UsageError) naming the field."""
    f = tune_dir / TUNE_PUBLISHED
    if not f.is_file():
        raise UsageError(f"{said(tune_dir)}: the tune published no winner (no {TUNE_PUBLISHED})", hint="see its tune.md")
    rec = _read_facts(f)
    path = rec.get("path")
    if not isinstance(path, str) or not path.strip() or name_refusal(path):
        shown = json.dumps(path)[:100] if "path" in rec else "missing"
        raise UsageError(f"{f}: its `path` is {shown}, not the folder the tune published the winner to",
                         hint="tune again: it writes the record whole")
    return recorded_path(tune_dir, path), rec["fingerprint"]


def vouched(facts: dict, fp: str) -> dict | None:
    """The facts of a published folder's card as infertool's own record has them (None: nothing vouches for
    them). The card's ``run_dir`` must be a run directory whose manifest records that it published this
    fingerprint (its facts are then rebuilt from the manifest, not read from the card), or a tune directory whose
    published.json does (the tune wrote the card beside the winner). Anything else the card says is a claim."""
    where = facts.get("run_dir")
    if not isinstance(where, str) or not where.strip() or name_refusal(where) or not Path(where).is_absolute():
        return None
    d = Path(where)
    try:
        if (d / "tune.json").is_file():
            return facts if _tune_record(d)[1] == fp else None
        if (d / "manifest.json").is_file():
            from infertool.report import load_run

            run_dir, manifest = load_run(d)
            return run_facts(run_dir, manifest) if published_record(manifest).get("fingerprint") == fp else None
    except (UsageError, OSError):
        return None
    return None


CLAIMED = ("label", "recipe", "verdict", "reason", "run_id", "run_dir", "published", "infertool")


def claimed_facts(facts: dict) -> dict:
    """What a card nothing vouches for says, kept as data: its words (strings and numbers, each cut) under
    ``claimed``, with no verdict, gates, inputs or commands of infertool's own."""
    from infertool import __version__

    words = facts["claimed"] if isinstance(facts.get("claimed"), dict) else facts  # a card that was a claim already
    said = {k: (v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)[:200])
            for k, v in words.items() if k in CLAIMED and v is not None}
    return {"v": FACTS_VERSION, "infertool": __version__,
            "published": datetime.now(timezone.utc).isoformat(timespec="seconds"), "verdict": None, "claimed": said}


def _source(src: str) -> tuple[str, Path, str, dict]:
    """SRC of `infertool publish`: (kind, checkpoint folder, fingerprint, facts) for a run directory, a tune
    directory or a published folder; the checkpoint verified against its record; the facts infertool's own (a
    card nothing vouches for: ``claimed_facts``)."""
    p = Path(src).expanduser()
    if (p / "tune.json").is_file():
        folder, fp = _tune_record(p)
        verify(folder, fp, f"tune {p.name}", f"infertool tune again, or infertool publish {shlex.quote(str(folder))} DEST")
        facts = _read_facts(folder / FACTS)
        return "tune", folder, fp, (vouched(facts, fp) if facts["fingerprint"] == fp else None) or claimed_facts(facts)
    if (p / "manifest.json").is_file():
        from infertool.report import load_run

        run_dir, manifest = load_run(p)
        pub = published_record(manifest)
        run_fp = pub.get("fingerprint")
        if not run_fp:
            raise UsageError(f"{run_dir} published no checkpoint", hint="a run with quantize and eval stages publishes one")
        path = recorded_path(run_dir, pub["path"]) if pub.get("path") else None
        for where in (path, run_dir / "quantize" / "model"):
            if where is not None and (where / "config.json").is_file() and fingerprint(where) == run_fp:
                return "run", where, run_fp, run_facts(run_dir, manifest)
        raise UsageError(f"neither {said(path)} nor the run's quantize entry holds the checkpoint run {run_dir.name} "
                         f"evaluated (fingerprint {run_fp})", hint="run it again: `infertool run` publishes it")
    if (p / FACTS).is_file():
        facts = _read_facts(p / FACTS)
        verify(p, facts["fingerprint"], f"the card in {p}", "infertool publish RUN_DIR " + shlex.quote(str(p)))
        return "published", p, facts["fingerprint"], vouched(facts, facts["fingerprint"]) or claimed_facts(facts)
    raise UsageError(f"{said(src)} is not a run directory, a tune directory or a published folder",
                     hint=f"give runs/<recipe>-<time>, a tune directory, or a folder with {FACTS}")


def _remote_calls(folder: Path, scheme: str, dest: str) -> list[str]:
    """The exact library calls a remote publish makes (printed with --dry-run)."""
    if scheme == "hf":
        repo = dest.removeprefix("hf://").strip("/")
        return [f"huggingface_hub.HfApi().upload_folder(folder_path={str(folder)!r}, repo_id={repo!r}, repo_type='model')"]
    bucket, _, prefix = dest.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    files = _files(folder) + beside(folder)
    return [f"boto3.client('s3').upload_file({str(f)!r}, {bucket!r}, "
            f"{'/'.join(x for x in (prefix, f.relative_to(folder).as_posix()) if x)!r})" for f in files]


def beside(folder: Path) -> list[Path]:
    """What a published folder holds beside the checkpoint and uploads with it: the card, its facts and the
    evidence folder's regular files (never a link)."""
    out = [folder / n for n in (FACTS, CARD) if (folder / n).is_file() and not (folder / n).is_symlink()]
    ev = folder / EVIDENCE
    if ev.is_dir() and not ev.is_symlink():
        out += sorted(f for f in ev.iterdir() if f.is_file() and not f.is_symlink())
    return out


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
    kind, folder, fp, facts = _source(src)
    scheme = _scheme(options.dest)
    check_source(folder)  # links and special files: refused before a copy, and never listed for an upload
    dest = options.dest
    if scheme == "dir":
        run_dir = facts.get("run_dir") if isinstance(facts.get("run_dir"), str) else None
        forbidden = {"the source": folder, "the source's run": run_dir and Path(run_dir),
                     "INFERTOOL_HOME's environments": env_folders()}
        if kind == "run":
            forbidden["the stage cache"] = Path(src).expanduser().absolute().parent / ".stages"
        dest = str(check_dest(options.dest, forbidden, force=options.force))
        check_room(folder, Path(dest))
    calls = _remote_calls(folder, scheme, options.dest) if scheme != "dir" else []
    evidence = _evidence_plan(src, kind, folder, scheme, options)
    return PublishPlan(str(src), kind, str(folder), fp, dest, scheme, facts, calls, options.dry_run, evidence)


def source_recipe(src: str, kind: str):
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


def _evidence_plan(src: str, kind: str, folder: Path, scheme: str, options: PublishOptions) -> dict:
    """What publish does about ``DEST/evidence/``: {"capture": the server it starts (the recipe's serve settings
    on the checkpoint) and what it asks}, {"copies": a published source's evidence folder}, {"uploads": ...},
    or {"missing": why there will be none}."""
    ev = folder / EVIDENCE
    if scheme != "dir":
        return {"uploads": str(ev)} if ev.is_dir() else {"missing": f"{said(folder)} carries no evidence/ to upload"}
    if not options.evidence:
        return {"missing": "published with --no-evidence"}
    if kind == "published":
        if ev.is_dir() and not ev.is_symlink():
            return {"copies": str(ev)}
        return {"missing": "the source folder carries no evidence (publish from its run or tune directory to "
                           "capture it)"}
    from infertool.recipe import VerifySection
    from infertool.resolve import resolve
    from infertool.serve import prepare

    try:
        recipe = source_recipe(src, kind)
    except UsageError as e:  # a run or tune directory whose recipe is gone: the weights still ship, said why
        return {"missing": f"the {kind}'s recipe, whose serve settings the evidence needs, is not readable: "
                           f"{e.message.splitlines()[0][:300]}"}
    spec = (recipe.verify or VerifySection()).evidence
    if not spec.enabled:
        return {"missing": "verify.evidence.enabled is false in the recipe"}
    res = resolve(recipe, candidate_path=folder)
    launch = prepare(res, model=res.candidate_at(folder, exists=True), purpose="eval (candidate)", dry_run=True)
    return {"capture": {"serves": str(folder), "argv": launch.spec.argv, "top_k": spec.top_k,
                        "max_bytes": spec.max_bytes, "max_fraction": spec.max_fraction}}


def run(p: PublishPlan, ctx: RunContext | None = None, evidence: EvidenceWriter | None = None) -> dict:
    """The copy (a folder, with ``evidence`` writing its evidence/) or the upload (boto3, huggingface_hub) of a
    plan; --dry-run: nothing."""
    if p.dry_run:
        return {"dry_run": True, **p.to_dict()}
    if p.scheme == "dir":
        facts = {k: v for k, v in p.facts.items() if k not in ("fingerprint", "path", "evidence")}
        why = str(p.evidence.get("missing") or "") or None
        return {"dry_run": False, **p.to_dict(),
                "published": publish_dir(p.folder, Path(p.dest), facts, evidence, why)}
    folder = Path(p.folder)
    if not (folder / FACTS).is_file():  # a run's stage entry has no card: the card travels with the weights
        raise UsageError(f"{p.src}: upload its published folder, which holds the card",
                         hint=f"infertool publish {shlex.quote(str(Path(p.facts.get('path') or p.folder)))} {p.dest}")
    return {"dry_run": False, **p.to_dict(), "uploaded": _upload(folder, p)}


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
        for f in _files(folder) + beside(folder):
            client.upload_file(str(f), bucket, "/".join(x for x in (prefix.strip("/"), f.relative_to(folder).as_posix()) if x))
            n += 1
        return n
    except Exception as e:  # noqa: BLE001 - the library's own errors (no credentials, denied): said, not a traceback
        raise BackendError(f"publishing to {p.dest} failed: {type(e).__name__}: {str(e)[:300]}",
                           hint=f"check {lib}'s credentials (AWS_* / HF_TOKEN), or --dry-run to see the calls") from None
