"""`infertool serve` on the console: the launch before it starts (or as the dry run), the manifests of --emit k8s,
the ready line, and the detached servers' ``status`` / ``stop``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertool.capability import RunContext
from infertool.errors import UsageError
from infertool.output import err, esc, out, plain, print_json
from infertool.serve import lifecycle

if TYPE_CHECKING:
    from infertool.serve.k8s import K8sOptions
    from infertool.serve.launcher import ServerStatus
    from infertool.serve.lifecycle import ServePlan


def k8s_flags(emit: str | None, **given: Any) -> K8sOptions | None:  # Any: each flag's value
    """The --emit k8s options, checked (``k8s.k8s_options``: exit 2 with the form expected); None without --emit.
    An option given without --emit k8s is a usage error, not silently ignored."""
    from infertool.serve.k8s import k8s_options

    chosen = {k: v for k, v in given.items() if v not in (None, [])}
    if emit is None:
        if chosen:
            flags = ", ".join("--" + k.replace("_", "-").replace("tolerations", "toleration") for k in chosen)
            raise UsageError(f"{flags}: options of --emit k8s",
                             hint="infertool serve RECIPE --emit k8s " + flags.split(",")[0] + " ...")
        return None
    return k8s_options(**chosen)


def print_emit(plan: ServePlan, as_json: bool) -> None:
    """Kubernetes manifests on stdout (comments say what to create first); starts nothing, writes no file.
    With --json: one JSON object (``manifests``: the documents as a list, ``comments``: the header lines)."""
    for note in plan.res.notes:
        err.print(f"note: {note}", markup=False, soft_wrap=True)
    if as_json:
        print_json(plan.to_dict())
    else:
        sys.stdout.write(plan.k8s_yaml())


def print_plan(serve_plan: ServePlan, as_json: bool) -> None:
    """The launch (model, notes, lint, KV cache; with --dry-run the environment and the command) on stdout for a
    dry run, else on stderr before the server starts."""
    plan, dry_run = serve_plan.launch, serve_plan.options.dry_run
    assert plan is not None  # not an --emit plan
    if as_json and dry_run:
        print_json(serve_plan.to_dict())
        return
    console = out if dry_run else err
    console.print(f"model: {plan.model.label} ({plan.model.path})", markup=False, soft_wrap=True)
    for note in serve_plan.res.notes:
        console.print(f"[yellow]note:[/] {esc(note)}", soft_wrap=True)
    for issue in plan.issues:
        style = {"error": "bold red", "warning": "yellow"}.get(issue.level, "dim")
        console.print(f"[{style}]{issue.level}:[/] {esc(issue.field)}: {esc(issue.message)}", soft_wrap=True)
        if issue.hint:
            console.print(f"  [dim]hint: {esc(issue.hint)}[/]", soft_wrap=True)
    for note in plan.spec.notes + plan.notes:
        console.print(f"[yellow]note:[/] {esc(note)}", soft_wrap=True)
    if kv := plan.kv:
        conc = kv.max_concurrency_at_max_len
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


def context(plan: ServePlan, as_json: bool) -> RunContext:
    """The RunContext of a command's server: its progress lines on stderr; once it answers, the result as JSON
    (--json) or one line saying where it is and how it stops."""
    detached = plan.options.detach
    port = plan.launch.spec.port if plan.launch is not None else None

    def on_event(ev: dict[str, Any]) -> None:  # Any: RunContext's event values
        kind = ev.get("event")
        if kind == "log":
            err.print(ev["message"], soft_wrap=True, markup=False)
        if kind != "ready":
            return
        r: lifecycle.ServeResult = ev["result"]
        if as_json:
            print_json(r.to_dict() if detached else {k: v for k, v in r.to_dict().items() if k != "pid_file"})
        elif detached:
            err.print(f"[green]ready[/] in {r.ready_s:.0f} s at [bold]{esc(r.url)}[/] (pid {r.pid}); "
                      f"`infertool serve stop --port {port}` stops it", soft_wrap=True)
        else:
            err.print(f"[green]ready[/] in {r.ready_s:.0f} s at [bold]{esc(r.url)}[/]; Ctrl-C stops it", soft_wrap=True)

    return RunContext(on_event=on_event, user="serve")


def manage(action: str, recipe: str | None, overrides: list[str] | None, port: int | None, pid_file: Path | None,
           all_: bool, as_json: bool) -> None:
    """`serve stop` / `serve status`: the servers RECIPE (its serve.port), --port or --pid-file chooses (at most
    one of them), else every detached one."""
    chosen = [what for what, v in (("RECIPE", recipe), ("--port", port), ("--pid-file", pid_file)) if v is not None]
    if len(chosen) > 1 or (all_ and chosen):
        raise UsageError(f"{' and '.join(chosen + (['--all'] if all_ else []))} each choose servers: give one",
                         hint=f"infertool serve {action} [RECIPE | --port PORT | --pid-file FILE | --all]")
    if overrides and recipe is None:
        raise UsageError("--set changes a RECIPE: give the recipe too",
                         hint=f"infertool serve {action} RECIPE --set serve.port=N")
    if recipe is not None:
        from infertool.recipe import load_recipe
        from infertool.resolve import resolve

        port = resolve(load_recipe(recipe, overrides or [])).serve.port
    files = lifecycle.detached_files(port=port, pid_file=pid_file)
    if action == "status":
        listing = pid_file is None and port is None
        _print_status(lifecycle.status(files, named=pid_file is not None, listing=listing), as_json)
        return
    stopped = lifecycle.stop(files, every=all_)
    if as_json:
        print_json({"stopped": [s.to_dict() for s in stopped]})
        return
    for s in stopped:
        what = "stopped" if s.was_alive else "was not running; removed its pid file"
        err.print(f"[green]✓[/] {esc(s.record.url)} (pid {s.record.pid}) {what}", soft_wrap=True)


def _print_status(rows: list[ServerStatus], as_json: bool) -> None:
    from rich.table import Table

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
            cells: tuple[str | int | None, ...] = (r.pid_file, r.error, None, None, None)
        else:
            state = r.state + (f" ({r.probe})" if r.alive and r.probe else "")
            cells = (rec.url, state, rec.pid, rec.served_model_name or rec.model, rec.log)
        table.add_row(*(plain("-" if v is None else str(v)) for v in cells))
    out.print(table)
