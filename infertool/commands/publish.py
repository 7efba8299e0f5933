"""`infertool publish SRC DEST`: the checkpoint a run or a tune evaluated (or a published folder), with its
model card, copied to a folder, or uploaded to S3 (boto3) or a Hugging Face model repository (huggingface_hub)."""


from typing import TYPE_CHECKING, Annotated, Optional

import typer

from infertool.commands._common import JSON_OPT, InfertoolCommand, dry_run_opt, examples, handle_errors

if TYPE_CHECKING:
    from infertool.publish import PublishResult

EXAMPLES = examples(
    ("infertool publish out/runs/quickstart-<time> /models/smollm2-w4", "a real copy, with MODEL_CARD.md"),
    ("infertool publish out/runs/quickstart-<time> /models/smollm2-w4 --sign-key keys/private.pem", "signed (model.sig)"),
    ("infertool publish out/quickstart-gptq s3://bucket/models/smollm2-w4 --dry-run", "the boto3 calls it would make"),
    ("infertool publish out/quickstart-gptq hf://my-org/smollm2-w4 --dry-run", "the huggingface_hub call"),
)


def register(app: typer.Typer) -> None:
    app.command("publish", cls=InfertoolCommand, epilog=EXAMPLES)(handle_errors(publish))


def publish(
    src: Annotated[str, typer.Argument(metavar="SRC", help="A run directory, a tune directory, or a published folder.")],
    dest: Annotated[str, typer.Argument(metavar="DEST", help="A folder, s3://bucket/prefix or hf://org/name.")],
    dry_run: Annotated[bool, dry_run_opt("Check SRC and DEST and print what would be copied (the exact library calls for s3:// and hf://).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace a DEST folder infertool did not publish, or one changed since (never a folder without config.json, the home folder or SRC).")] = False,
    no_evidence: Annotated[bool, typer.Option("--no-evidence", help="Publish without evidence/ (the candidate's outputs as served, which `infertool verify` re-checks; writing it serves the checkpoint once).")] = False,
    sign_key: Annotated[Optional[str], typer.Option("--sign-key", metavar="PRIVATE.pem", help="Sign every file of DEST with this EC private key (model-signing's model.sig beside the model; `infertool keys new` makes one). Only its public fingerprint is recorded.")] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Copy the checkpoint SRC evaluated, checked by content fingerprint, with its model card and its evidence (the
    candidate's outputs as served with the recorded serve settings, for `infertool verify`), to DEST."""
    from infertool import publish as pub
    from infertool.output import StageProgress, print_json

    plan = pub.plan(src, pub.PublishOptions(dest=dest, dry_run=dry_run, force=force, evidence=not no_evidence,
                                             sign_key=sign_key))
    if dry_run:
        result = pub.run(plan)
    else:
        with StageProgress("publish") as progress:
            result = pub.run(plan, progress.on_event)
    if as_json:
        print_json(result.to_dict())
    else:
        _render(result)


def _render(result: "PublishResult") -> None:
    import shlex

    from infertool.output import err, esc, out, visible
    from infertool.publish import said, short

    p, claimed = result.plan, result.plan.facts.claimed
    words = said(claimed["verdict"], 40) if claimed is not None and "verdict" in claimed else "no verdict"
    verdict = f"not verified (its card claims {words})" if claimed is not None else str(p.facts.verdict or "?")
    if p.dry_run:
        ev = p.evidence
        lines = [f"would publish {p.folder} (fingerprint {short(p.fingerprint)}, verdict {verdict}) to {p.dest}", *p.calls,
                 f"would capture evidence/ by serving {ev.capture.serves} with the recorded serve settings: "
                 f"{shlex.join(ev.capture.argv)}" if ev.capture is not None else
                 f"would copy the source's evidence ({ev.copies}), checked" if ev.copies is not None else
                 f"uploads its evidence ({ev.uploads}) with the weights" if ev.uploads is not None else
                 f"no evidence: {ev.missing}"]
        if p.signature is not None:
            lines.append(f"would sign every file of {p.dest} ({p.signature.file}, key {short(p.signature.key_fingerprint)})")
        for line in lines:
            out.print(visible(line), markup=False, soft_wrap=True)
        return
    style = "green" if verdict == "PASS" else "red"
    pub = result.published
    where = (pub.path if pub is not None else None) or p.dest
    err.print(f"[{style}]published[/] {esc(p.folder)} to [bold]{esc(where)}[/] (fingerprint {esc(short(p.fingerprint))}, "
              f"verdict [{style}]{esc(verdict)}[/])", soft_wrap=True)
    block = pub.evidence if pub is not None else None
    if block is not None and block.fingerprint:
        err.print(f"evidence {esc(short(block.fingerprint))}: {esc(block.files)} files, {esc(block.bytes)} bytes, "
                  f"engine {esc(block.engine)}; re-check: infertool verify {esc(shlex.quote(where))}", soft_wrap=True)
    elif block is not None:
        err.print(f"no evidence: {esc(block.missing)}", soft_wrap=True)
    sig = pub.signature if pub is not None else None
    if sig is not None:
        err.print(f"signed: {esc(sig.file)} by key {esc(short(sig.key_fingerprint))}; check: infertool verify "
                  f"{esc(shlex.quote(where))} --key PUBLIC.pem", soft_wrap=True)
