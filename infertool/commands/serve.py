"""`infertool serve RECIPE` (the default sub-command `run`), `infertool serve stop|status`: vLLM's
OpenAI-compatible server from the recipe, and the servers started with --detach."""


import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, DefaultCommandGroup, InfertoolCommand, complete_recipe, dry_run_opt, examples, handle_errors,
    recipe_arg, recipe_checks, usage_error,
)
from infertool.output import print_json

EXAMPLES = examples(
    ("infertool serve quickstart", "the quantized model, the recipe's settings; Ctrl-C stops"),
    ("infertool serve quickstart --dry-run", "the exact vLLM command and environment"),
    ("infertool serve out/runs/quickstart-<time>", "the checkpoint that run evaluated (checked by fingerprint)"),
    ("infertool serve quickstart --detach --port 8001", "return once ready; it keeps running"),
    ("infertool serve status", "the detached servers"),
    ("infertool serve stop quickstart", "the one on the recipe's serve.port"),
    ("infertool serve stop --all", "every detached server"),
    ("infertool serve llama3.3-70b-w4a16-tp4 --emit k8s > vllm.yaml", "a Kubernetes Deployment + Service"),
)

serve_app = typer.Typer(
    cls=DefaultCommandGroup,
    help="vLLM's OpenAI-compatible server from the recipe's serve section (in the serve environment). "
    "`infertool serve RECIPE` is `infertool serve run RECIPE` (`infertool serve run --help` lists its options); "
    "`stop` and `status` manage the servers started with --detach.",
    no_args_is_help=True,
    epilog=EXAMPLES,
)

PORT_OPT = typer.Option("--port", metavar="PORT", min=1, max=65535,
                        help="The server on this port.")
PID_FILE_OPT = typer.Option("--pid-file", metavar="FILE", help="The server recorded in this pid file.")
MANAGED_RECIPE = typer.Argument(metavar="RECIPE", help="The server on this recipe's serve.port.",
                                autocompletion=complete_recipe)


def register(app: typer.Typer) -> None:
    app.add_typer(serve_app, name="serve")


@serve_app.command("run", cls=InfertoolCommand, epilog=EXAMPLES)
@handle_errors
def serve_run(
    recipe: Annotated[str, recipe_arg("Recipe file or built-in recipe name; or a run or tune directory: the checkpoint it "
                             "evaluated and published, checked by content fingerprint; or a published folder.")],
    overrides: Annotated[Optional[List[str]], SET_OPT] = None,
    port: Annotated[Optional[int], typer.Option("--port", metavar="PORT", min=1, max=65535, help="Listen on this port (overrides serve.port).")] = None,
    dry_run: Annotated[bool, dry_run_opt("Print the exact command and environment; start nothing.")] = False,
    detach: Annotated[bool, typer.Option("--detach", help="Return once the server is ready; it keeps running (pid file).")] = False,
    pid_file: Annotated[Optional[Path], typer.Option("--pid-file", metavar="FILE", help="Where --detach records the server (default under $INFERTOOL_HOME).")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", metavar="SECONDS", help="Start-up timeout (default serve.startup_timeout_s).")] = None,
    log: Annotated[Optional[Path], typer.Option("--log", metavar="FILE", help="The server log file (default under $INFERTOOL_HOME/logs).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Launch even when the lint finds errors.")] = False,
    emit: Annotated[Optional[str], typer.Option("--emit", metavar="k8s", help="Print Kubernetes manifests for the recipe instead of launching.")] = None,
    replicas: Annotated[Optional[int], typer.Option("--replicas", metavar="N", help="--emit k8s: replicas (default 1; the fleet sizing's count).")] = None,
    max_replicas: Annotated[Optional[int], typer.Option("--max-replicas", metavar="N", help="--emit k8s: the autoscaler's ceiling (default 2 x --replicas).")] = None,
    autoscaler: Annotated[Optional[str], typer.Option("--autoscaler", metavar="none|hpa|keda", help="--emit k8s: an HPA (External metric vllm:num_requests_waiting) or a KEDA ScaledObject.")] = None,
    node_selector: Annotated[Optional[List[str]], typer.Option("--node-selector", metavar="KEY=VALUE", help="--emit k8s: a node label the pods need (repeatable).")] = None,
    toleration: Annotated[Optional[List[str]], typer.Option("--toleration", metavar="KEY[=VALUE][:EFFECT]", help="--emit k8s: a taint the pods tolerate besides nvidia.com/gpu's (repeatable).")] = None,
    model_from: Annotated[Optional[str], typer.Option("--model-from", metavar="URI", help="--emit k8s: an init container fetches the model from s3://BUCKET/PREFIX or hf://ORG/NAME[@REV] (else a PVC).")] = None,
    pvc: Annotated[Optional[str], typer.Option("--pvc", metavar="NAME", help="--emit k8s: the PVC holding the model (default <name>-models).")] = None,
    prometheus_url: Annotated[Optional[str], typer.Option("--prometheus-url", metavar="URL", help="--emit k8s --autoscaler keda: the Prometheus KEDA queries.")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", metavar="N", help="--emit k8s: GPUs per node (default 8); more per replica: a multi-node LeaderWorkerSet.")] = None,
    keys: Annotated[Optional[List[str]], typer.Option("--key", metavar="PUBLIC.pem", help="Serve (or --emit) only a folder whose model.sig is a valid signature by this EC public key (repeatable); else exit 6, nothing started.")] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Launch vLLM's OpenAI-compatible server from the recipe's serve section; Ctrl-C (or SIGTERM) stops it,
    --detach leaves it running."""
    from infertool import serve
    from infertool.publish import served
    from infertool.serve import console

    serve.lifecycle.check_timeout(timeout)  # before the recipe: exit 2 for nan, inf, -1, 0, 1e400
    k8s = console.k8s_flags(emit, replicas=replicas, max_replicas=max_replicas, autoscaler=autoscaler, pvc=pvc,
                            node_selector=node_selector, tolerations=toleration, model_from=model_from,
                            prometheus_url=prometheus_url, gpus_per_node=gpus_per_node)
    options = serve.ServeOptions(dry_run=dry_run, detach=detach, pid_file=pid_file, timeout_s=timeout, log=log,
                                 force=force, emit=emit, k8s=k8s)
    sets = list(overrides or []) + ([] if port is None else [f"serve.port={port}"])  # --port means serve.port
    # a per-class tune directory (tune.classes.ROUTING, named here: importing tune would slow every serve start)
    if (Path(recipe).expanduser() / "routing.json").is_file():
        if emit is None:
            raise usage_error(f"{recipe} is a per-class tune: a configuration per traffic class (routing.json)",
                              hint=f"serve one class's: infertool serve {Path(recipe) / 'tuned-<class>.yaml'}; or all "
                                   f"of them, routed: infertool serve {recipe} --emit k8s")
        if keys:
            raise usage_error("--key checks one served folder; a per-class tune's routed manifests are not checked "
                              "by it yet", hint="check each class's folder: infertool verify FOLDER --key PUBLIC.pem")
        from infertool.tune.classes import routed_manifests

        assert k8s is not None  # --emit k8s
        emitted = routed_manifests(Path(recipe).expanduser(), k8s, sets, checks=lambda res: recipe_checks(res, "emit"))
        if as_json:
            print_json(emitted.to_dict())
        else:
            sys.stdout.write(emitted.yaml())
        return
    res = served(recipe, sets, keys).res  # RUN_DIR | TUNE_DIR | FOLDER | RECIPE, its artifact and signature checked
    if emit is not None or dry_run:  # the check registry: the same findings as validate, plan and every dry run
        recipe_checks(res, "emit" if emit is not None else "serve")
    if emit is not None:  # the replicas: --replicas, else the fleet sizing for target.peak_rps
        from infertool.plan import fleet_replicas
        from infertool.serve.k8s import with_replicas

        options.k8s = with_replicas(k8s, *fleet_replicas(res))
        console.print_emit(serve.plan(res, options), as_json)
        return
    plan = serve.plan(res, options)
    console.print_plan(plan, as_json)
    if dry_run and plan.errors:
        raise typer.Exit(2)
    if not dry_run:
        serve.run(plan, console.context(plan, as_json))


@serve_app.command("stop", cls=InfertoolCommand)
@handle_errors
def serve_stop(
    recipe: Annotated[Optional[str], MANAGED_RECIPE] = None,
    port: Annotated[Optional[int], PORT_OPT] = None,
    pid_file: Annotated[Optional[Path], PID_FILE_OPT] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every detached server.")] = False,
    overrides: Annotated[Optional[List[str]], SET_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Stop a server started with --detach: the one on RECIPE's serve.port, on --port, or in --pid-file;
    without any of them, the only detached server (--all: every one)."""
    from infertool.serve.console import manage

    manage("stop", recipe, overrides, port, pid_file, all_, as_json)


@serve_app.command("status", cls=InfertoolCommand)
@handle_errors
def serve_status(
    recipe: Annotated[Optional[str], MANAGED_RECIPE] = None,
    port: Annotated[Optional[int], PORT_OPT] = None,
    pid_file: Annotated[Optional[Path], PID_FILE_OPT] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every detached server (the default without RECIPE, --port or --pid-file).")] = False,
    overrides: Annotated[Optional[List[str]], SET_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """The servers started with --detach: URL, state, pid, model, log."""
    from infertool.serve.console import manage

    manage("status", recipe, overrides, port, pid_file, all_, as_json)
