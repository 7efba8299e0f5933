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
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Copy the checkpoint SRC evaluated, checked by content fingerprint, with its model card, to DEST."""
    from infertool import publish as pub
    from infertool.output import err, esc, out, print_json, visible

    result = pub.run(pub.plan(src, pub.PublishOptions(dest=dest, dry_run=dry_run, force=force)))
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
        return
    style = "green" if verdict == "PASS" else "red"
    where = result.get("published", {}).get("path") or result["dest"]
    err.print(f"[{style}]published[/] {esc(result['folder'])} to [bold]{esc(where)}[/] (fingerprint {esc(fp)}, "
              f"verdict [{style}]{esc(verdict)}[/])", soft_wrap=True)
