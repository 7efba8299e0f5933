"""`infertool report RUN_DIR` and `infertool compare RUN_A RUN_B`."""


from typing import Annotated

import typer

from infertool.commands._common import JSON_OPT, InfertoolCommand, handle_errors


def register(app: typer.Typer) -> None:
    app.command("report", cls=InfertoolCommand)(handle_errors(report))
    app.command("compare", cls=InfertoolCommand)(handle_errors(compare))


def report(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run directory written by `infertool run`.")],
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Write report.md and a self-contained report.html (plots embedded) into the run directory."""
    from rich.markup import escape

    from infertool.output import err, print_json
    from infertool.report import write_report

    res = write_report(run_dir)
    if as_json:
        print_json(res.to_dict())
        return
    err.print(f"[green]✓[/] {escape(res.files['report.md'])}\n[green]✓[/] {escape(res.files['report.html'])}", soft_wrap=True)
    for what, why in res.not_read.items():
        err.print(f"[yellow]not read:[/] {escape(what)}: {escape(why)}", soft_wrap=True)
    for why in res.figures_not_embedded.values():
        err.print(f"[yellow]figure not embedded:[/] {escape(why)}", soft_wrap=True)


def compare(
    run_a: Annotated[str, typer.Argument(metavar="RUN_A", help="The first run directory.")],
    run_b: Annotated[str, typer.Argument(metavar="RUN_B", help="The second run directory.")],
    all_rows: Annotated[bool, typer.Option("--all", help="Show unchanged figures too.")] = False,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """What changed between two runs: recipe fields, verdicts, sizes, latencies, throughputs."""
    from rich.markup import escape
    from rich.table import Table

    from infertool.output import err, out, print_json
    from infertool.report import compare as compare_two

    res = compare_two(run_a, run_b)
    if as_json:
        print_json(res.to_dict())
        return
    for note in res.notes:
        err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if res.recipe_changes:
        t = Table("field", "A", "B", title="recipe changes")
        for ch in res.recipe_changes:
            t.add_row(escape(ch.field), escape(str(ch.a)), escape(str(ch.b)))
        out.print(t)
    t = Table(title=f"A = {escape(res.a)}\nB = {escape(res.b)}")
    for c in ("metric", "A", "B", "B/A"):
        t.add_column(c, justify="left" if c == "metric" else "right")
    for r in [r for r in res.rows if all_rows or r.changed]:
        fa, fb = (f"{v:.4g}" if isinstance(v, float) else str(v) for v in (r.a, r.b))
        t.add_row(escape(r.metric), escape(fa), escape(fb), f"{r.ratio:.3f}" if r.ratio is not None else "")
    out.print(t)
