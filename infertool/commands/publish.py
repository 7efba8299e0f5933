"""`infertool publish SRC DEST`: the checkpoint a run or a tune evaluated (or a published folder), with its
model card, copied to a folder, or uploaded to S3 (boto3) or a Hugging Face model repository (huggingface_hub)."""


from typing import Annotated

import typer

from infertool.commands._common import JSON_OPT, InfertoolCommand, dry_run_opt, examples, handle_errors

EXAMPLES = examples(
    ("infertool publish out/runs/quickstart-<time> /models/smollm2-w4", "a real copy, with MODEL_CARD.md"),
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
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Copy the checkpoint SRC evaluated, checked by content fingerprint, with its model card and its evidence (the
    candidate's outputs as served with the recorded serve settings, for `infertool verify`), to DEST."""
    import shlex

    from infertool import publish as pub
    from infertool.output import StageProgress, err, esc, out, print_json, visible

    plan = pub.plan(src, pub.PublishOptions(dest=dest, dry_run=dry_run, force=force, evidence=not no_evidence))
    if dry_run:
        result = pub.run(plan)
    else:
        from infertool.verify.capture import writer_for_plan

        with StageProgress("publish") as progress:
            result = pub.run(plan, evidence=writer_for_plan(plan, progress.on_event))
    if as_json:
        print_json(result)
        return
    fp = pub.short(result["fingerprint"])
    facts = result["facts"]
    claimed = facts.get("claimed")
    said = pub.said(claimed["verdict"], 40) if isinstance(claimed, dict) and "verdict" in claimed else "no verdict"
    verdict = f"not verified (its card claims {said})" if isinstance(claimed, dict) else str(facts.get("verdict") or "?")
    if dry_run:
        out.print(visible(f"would publish {result['folder']} (fingerprint {fp}, verdict {verdict}) to {result['dest']}"),
                  markup=False, soft_wrap=True)
        for call in result["calls"]:
            out.print(visible(call), markup=False, soft_wrap=True)
        ev = result.get("evidence") or {}
        if "capture" in ev:
            out.print(visible(f"would capture evidence/ by serving {ev['capture']['serves']} with the recorded serve "
                              f"settings: {shlex.join(ev['capture']['argv'])}"), markup=False, soft_wrap=True)
        elif "copies" in ev:
            out.print(visible(f"would copy the source's evidence ({ev['copies']}), checked"), markup=False, soft_wrap=True)
        elif "uploads" in ev:
            out.print(visible(f"uploads its evidence ({ev['uploads']}) with the weights"), markup=False, soft_wrap=True)
        else:
            out.print(visible(f"no evidence: {ev.get('missing')}"), markup=False, soft_wrap=True)
        return
    style = "green" if verdict == "PASS" else "red"
    where = result.get("published", {}).get("path") or result["dest"]
    err.print(f"[{style}]published[/] {esc(result['folder'])} to [bold]{esc(where)}[/] (fingerprint {esc(fp)}, "
              f"verdict [{style}]{esc(verdict)}[/])", soft_wrap=True)
    ev = result.get("published", {}).get("evidence") or {}
    if ev.get("fingerprint"):
        err.print(f"evidence {esc(pub.short(ev['fingerprint']))}: {esc(ev.get('files'))} files, {esc(ev.get('bytes'))} "
                  f"bytes, engine {esc(ev.get('engine'))}; re-check: infertool verify {esc(shlex.quote(where))}",
                  soft_wrap=True)
    elif ev:
        err.print(f"no evidence: {esc(ev.get('missing'))}", soft_wrap=True)
