"""`infertool serve RECIPE` (the default sub-command `run`), `infertool serve stop|status`: vLLM's
OpenAI-compatible server from the recipe, and the servers started with --detach."""


from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, DefaultCommandGroup, InfertoolCommand, complete_recipe, dry_run_opt, examples, handle_errors,
    recipe_arg, usage_error,
)
if TYPE_CHECKING:
    from infertool.serve.launcher import ServerStatus

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
                             "evaluated and published, checked by content fingerprint.")],
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
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Launch vLLM's OpenAI-compatible server from the recipe's serve section; Ctrl-C (or SIGTERM) stops it,
    --detach leaves it running."""
    from infertool import serve
    from infertool.publish import served

    serve.lifecycle.check_timeout(timeout)  # before the recipe: exit 2 for nan, inf, -1, 0, 1e400
    k8s = _k8s_options(emit, replicas=replicas, max_replicas=max_replicas, autoscaler=autoscaler, pvc=pvc,
                       node_selector=node_selector, tolerations=toleration, model_from=model_from,
                       prometheus_url=prometheus_url, gpus_per_node=gpus_per_node)
    options = serve.ServeOptions(dry_run=dry_run, detach=detach, pid_file=pid_file, timeout_s=timeout, log=log,
                                 force=force, emit=emit, k8s=k8s)
    # a per-class tune directory (tune.classes.ROUTING, named here: importing tune would slow every serve start)
    if (Path(recipe).expanduser() / "routing.json").is_file():
        if emit is None:
            raise usage_error(f"{recipe} is a per-class tune: a configuration per traffic class (routing.json)",
                              hint=f"serve one class's: infertool serve {Path(recipe) / 'tuned-<class>.yaml'}; or all "
                                   f"of them, routed: infertool serve {recipe} --emit k8s")
        _emit_routed(Path(recipe).expanduser(), k8s, _with_port(overrides, port), as_json)
        return
    res = served(recipe, _with_port(overrides, port)).res  # RUN_DIR | TUNE_DIR | RECIPE, its artifact checked
    if emit is not None or dry_run:  # the check registry: the same findings as validate, plan and every dry run
        from infertool.commands._common import recipe_checks

        recipe_checks(res, "emit" if emit is not None else "serve")
    if emit is not None:  # the replicas: --replicas, else the fleet sizing for target.peak_rps
        from infertool.plan import fleet_replicas
        from infertool.serve.k8s import with_replicas

        options.k8s = with_replicas(k8s, *fleet_replicas(res))
    plan = serve.plan(res, options)
    if emit is not None:
        _emit_k8s(plan, as_json)
        return
    _render_plan(plan, as_json)
    if dry_run:
        if plan.errors:
            raise typer.Exit(2)
        return
    serve.run(plan, serve_context(as_json))


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
    _manage("stop", recipe, overrides, port, pid_file, all_, as_json)


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
    _manage("status", recipe, overrides, port, pid_file, all_, as_json)


def _with_port(overrides, port: int | None) -> list[str]:
    """--port means serve.port, the same on every serve sub-command."""
    sets = list(overrides or [])
    if port is not None:
        sets.append(f"serve.port={port}")
    return sets


def _k8s_options(emit: str | None, **given):
    """The --emit k8s options, checked (infertool.serve.k8s.k8s_options: exit 2 with the form expected); None
    without --emit. An option given without --emit k8s is a usage error, not silently ignored."""
    from infertool.serve.k8s import k8s_options

    chosen = {k: v for k, v in given.items() if v not in (None, [])}
    if emit is None:
        if chosen:
            flags = ", ".join("--" + k.replace("_", "-").replace("tolerations", "toleration") for k in chosen)
            raise usage_error(f"{flags}: options of --emit k8s", hint="infertool serve RECIPE --emit k8s " + flags.split(",")[0] + " ...")
        return None
    return k8s_options(**chosen)


def _emit_routed(tune_dir: Path, k8s, overrides: list[str], as_json: bool) -> None:
    """A per-class tune directory (routing.json): a Deployment and Service per configuration, and the HTTPRoute
    that routes each class to its own (``infertool.tune.classes.routed_manifests``), each recipe checked as
    --emit k8s checks one."""
    import sys

    from infertool.commands._common import recipe_checks
    from infertool.output import print_json
    from infertool.tune.classes import routed_manifests

    emitted = routed_manifests(tune_dir, k8s, overrides, checks=lambda res: recipe_checks(res, "emit"))
    if as_json:
        print_json(emitted.to_dict())
        return
    sys.stdout.write(emitted.yaml())


def _emit_k8s(plan, as_json: bool = False) -> None:
    """Kubernetes manifests on stdout (comments say what to create first); starts nothing, writes no file.
    With --json: one JSON object (``manifests``: the documents as a list, ``comments``: the header lines),
    never YAML."""
    import sys

    from infertool.output import err, print_json

    for note in plan.res.notes:
        err.print(f"note: {note}", markup=False, soft_wrap=True)
    if as_json:
        print_json(plan.to_dict())
        return
    sys.stdout.write(plan.k8s_yaml())


def _render_plan(serve_plan, as_json: bool) -> None:
    """The launch (model, notes, lint, KV cache; with --dry-run the environment and the command) on stdout for a
    dry run, else on stderr before the server starts."""
    from rich.markup import escape

    from infertool.output import err, out, print_json

    plan, dry_run = serve_plan.launch, serve_plan.options.dry_run
    notes = list(serve_plan.res.notes)
    if as_json and dry_run:
        print_json(serve_plan.to_dict())
        return
    console = out if dry_run else err
    console.print(f"model: {plan.model.label} ({plan.model.path})", markup=False, soft_wrap=True)
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    for issue in plan.issues:
        style = {"error": "bold red", "warning": "yellow"}.get(issue.level, "dim")
        console.print(f"[{style}]{issue.level}:[/] {escape(issue.field)}: {escape(issue.message)}", soft_wrap=True)
        if issue.hint:
            console.print(f"  [dim]hint: {escape(issue.hint)}[/]", soft_wrap=True)
    for note in plan.spec.notes + plan.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if plan.kv:
        kv, conc = plan.kv, plan.kv.max_concurrency_at_max_len
        tail = (f"; max_model_len {kv.max_model_len:,} -> {conc:.1f} full-length requests"
                if kv.max_model_len and conc is not None else "")
        console.print(f"[dim]KV cache: {kv.capacity_tokens:,} tokens in {kv.kv_cache_space_gib:g} GiB "
                      f"({kv.kv_bytes_per_token:,.0f} B/token){tail}[/]", soft_wrap=True)
    if dry_run:
        out.print("[bold]environment[/] (set on top of yours):")
        for k, v in sorted(plan.spec.display_env().items()):
            out.print(f"  {k}={v}", soft_wrap=True, markup=False)
        out.print("[bold]command[/]:")
        out.print(plan.spec.shell_line(), soft_wrap=True, markup=False)


def serve_context(as_json: bool):
    """The RunContext of a command's server: its progress lines on stderr; once it answers, the result as JSON
    (--json) or one line saying where it is and how it stops."""
    from infertool.capability import RunContext
    from infertool.output import err, esc, print_json

    def on_event(ev: dict) -> None:
        if ev.get("event") == "log":
            err.print(ev["message"], soft_wrap=True, markup=False)
            return
        if ev.get("event") != "ready":
            return
        r = ev["result"]
        if as_json:
            print_json(r.to_dict() if ev.get("detached") else {k: v for k, v in r.to_dict().items() if k != "pid_file"})
        elif ev.get("detached"):
            port = r.launch.get("port")
            err.print(f"[green]ready[/] in {r.ready_s:.0f} s at [bold]{esc(r.url)}[/] (pid {r.pid}); "
                      f"`infertool serve stop --port {port}` stops it", soft_wrap=True)
        else:
            err.print(f"[green]ready[/] in {r.ready_s:.0f} s at [bold]{esc(r.url)}[/]; Ctrl-C stops it", soft_wrap=True)

    return RunContext(on_event=on_event, user="serve")


def _manage(action: str, recipe: str | None, overrides, port: int | None, pid_file: Path | None,
            all_: bool, as_json: bool) -> None:
    from infertool import serve
    from infertool.output import err, esc, print_json

    chosen = [what for what, v in (("RECIPE", recipe), ("--port", port), ("--pid-file", pid_file)) if v is not None]
    if len(chosen) > 1 or (all_ and chosen):
        raise usage_error(f"{' and '.join(chosen + (['--all'] if all_ else []))} each choose servers: give one",
                          hint=f"infertool serve {action} [RECIPE | --port PORT | --pid-file FILE | --all]")
    if overrides and recipe is None:
        raise usage_error("--set changes a RECIPE: give the recipe too", hint=f"infertool serve {action} RECIPE --set serve.port=N")
    if recipe is not None:
        from infertool.recipe import load_recipe
        from infertool.resolve import resolve

        port = resolve(load_recipe(recipe, overrides or [])).serve.port
    files = serve.lifecycle.detached_files(port=port, pid_file=pid_file)
    if action == "status":
        listing = pid_file is None and port is None
        _render_status(serve.lifecycle.status(files, named=pid_file is not None, listing=listing), as_json)
        return
    stopped = serve.lifecycle.stop(files, every=all_)
    if as_json:
        print_json({"stopped": [s.to_dict() for s in stopped]})
        return
    for s in stopped:
        what = "stopped" if s.was_alive else "was not running; removed its pid file"
        err.print(f"[green]✓[/] {esc(s.record.url)} (pid {s.record.pid}) {what}", soft_wrap=True)


def _render_status(rows: "list[ServerStatus]", as_json: bool) -> None:
    from rich.table import Table

    from infertool.output import err, out, plain, print_json

    if as_json:
        print_json({"servers": [r.to_dict() for r in rows]})
        return
    if not rows:
        err.print("no detached servers")
        return
    table = Table(title="detached servers")
    for col in ("url", "state", "pid", "model", "log"):
        table.add_column(col)
    for r in rows:
        rec = r.record
        if r.error or rec is None:
            cells: tuple[object, ...] = (r.pid_file, r.error, None, None, None)
        else:
            state = r.state + (f" ({r.probe})" if r.alive and r.probe else "")
            cells = (rec.url, state, rec.pid, rec.served_model_name or rec.model, rec.log)
        table.add_row(*(plain("-" if v is None else str(v)) for v in cells))
    out.print(table)
