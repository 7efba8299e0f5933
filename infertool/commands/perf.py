"""`infertool perf`: the performance model (predictions with intervals, fitted from measurements), its store of
points and its cross-validation (docs/performance-model.md)."""


from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from infertool.commands._common import JSON_OPT, InfertoolCommand, examples, handle_errors

if TYPE_CHECKING:
    from infertool.perfmodel.api import PointsReport, PredictReport
    from infertool.perfmodel.cv import CvReport

perf_app = typer.Typer(help="Predict TTFT, TPOT, tok/s and $ per 1M tokens with intervals, fitted from measurements.",
                       no_args_is_help=True)

EXAMPLES = examples(
    ("infertool perf predict --model llama-3.1-8b --gpu H100-SXM --weights fp8 --input-len 1024 --output-len 256 "
     "--concurrency 32 --slo-tpot 50", "intervals, the max concurrency under the SLO, the measurement that narrows"),
    ("infertool perf points", "what the store holds, each point predicted with its source withheld"),
    ("infertool perf add out/runs/quickstart-<time>", "your own measurements into the store"),
    ("infertool perf cv --json", "leave-one-source-out cross-validation: error and interval coverage"),
)
STORE_OPT = typer.Option("--store", metavar="DIR", help="Fit from ONLY the point files in DIR (*.jsonl, sources.json) "
                         "instead of the published points plus yours; also INFERTOOL_PERF_STORE.")


def register(app: typer.Typer) -> None:
    app.add_typer(perf_app, name="perf")


def _progress(text: str) -> None:
    from infertool.output import err, esc

    err.print(f"[dim]{esc(text)}[/]")


@perf_app.command("predict", cls=InfertoolCommand, epilog=EXAMPLES)
@handle_errors
def predict(
    model: Annotated[str, typer.Option("--model", metavar="KEY", help="A known architecture (infertool/models/known.py), e.g. llama-3.1-8b.")],
    gpu: Annotated[str, typer.Option("--gpu", metavar="KIND", help="A GPU kind of the table (H100-SXM, L4, ...) or cpu.")],
    weights: Annotated[str, typer.Option("--weights", metavar="FMT", help="bf16 | fp16 | fp8 | w8a8-int8 | w4a16 | w8a16 | fp32.")] = "bf16",
    gpus: Annotated[int, typer.Option("--gpus", min=1, max=64, metavar="N", help="Tensor-parallel degree.")] = 1,
    input_len: Annotated[int, typer.Option("--input-len", min=1, max=2_000_000, metavar="TOKENS", help="Prompt tokens per request.")] = 512,
    output_len: Annotated[int, typer.Option("--output-len", min=1, max=1_000_000, metavar="TOKENS", help="Output tokens per request.")] = 256,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=100_000, metavar="N", help="Closed-loop clients.")] = 1,
    engine: Annotated[Optional[str], typer.Option("--engine", metavar="vllm==X.Y.Z", help="The vLLM release (default: the store's).")] = None,
    price: Annotated[Optional[float], typer.Option("--price", min=0, max=10_000, metavar="USD", help="$ per GPU-hour (default: the GPU table's assumed price).")] = None,
    slo_tpot: Annotated[Optional[float], typer.Option("--slo-tpot", min=0.001, max=1e6, metavar="MS", help="TPOT bound for the max concurrency.")] = None,
    slo_ttft: Annotated[Optional[float], typer.Option("--slo-ttft", min=0.001, max=1e7, metavar="MS", help="TTFT bound for the max concurrency.")] = None,
    store: Annotated[Optional[str], STORE_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """TTFT, TPOT, output tok/s and $ per 1M output tokens with 80 % / 95 % intervals, why an interval is wide,
    the highest concurrency under the SLO and the single measurement that would narrow the prediction most."""
    from infertool.output import print_json
    from infertool.perfmodel import api

    q = api.make_query(model, gpu, gpus=gpus, weights=weights, input_len=input_len, output_len=output_len,
                       concurrency=concurrency, engine=engine, price=price)
    report = api.predict(q, slo_tpot_ms=slo_tpot, slo_ttft_ms=slo_ttft, store_dir=store)
    if as_json:
        print_json(report.to_dict())
    else:
        _render_prediction(report)


def _render_prediction(r: "PredictReport") -> None:
    from infertool.output import kv_table, out

    p, q = r.prediction, r.prediction.query
    where = q.gpu if q.gpus == 1 else f"{q.gpus}x {q.gpu}"
    rows = [("setup", f"{q.model} {q.weights} on {where}, {q.input_len} in / {q.output_len} out, concurrency "
                      f"{q.concurrency}"),
            ("TTFT", p.ttft_ms.text()), ("TPOT", p.tpot_ms.text()), ("output tok/s", p.output_tps.text())]
    if p.usd_per_mtok is not None:
        rows.append(("$ per 1M output", p.usd_per_mtok.text()))
    if r.max_concurrency is not None:
        mc = r.max_concurrency
        rows.append(("max concurrency", f"{mc.value} (80 %: {mc.lo80}-{mc.hi80}) under {mc.slo}"))
    rows.append(("store", f"{p.support} of {r.store_points} points on {q.gpu}"))
    for w in p.wide:
        rows.append(("wide", w))
    if r.narrowing is not None:
        rows.append(("narrow it", r.narrowing.text()))
    out.print(kv_table(rows))


@perf_app.command("points", cls=InfertoolCommand, epilog=EXAMPLES)
@handle_errors
def points(
    store: Annotated[Optional[str], STORE_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """What the store holds: each point's source, setup and workload, what it measured, and what the model
    predicts for it with the point's own source withheld (inside its 80 % interval?)."""
    from infertool.output import print_json
    from infertool.perfmodel import api

    report = api.list_points(store, _progress)
    if as_json:
        print_json(report.to_dict())
    else:
        _render_points(report)


def _render_points(r: "PointsReport") -> None:
    from rich.table import Table

    from infertool.output import out, plain

    t = Table(title=plain(f"{len(r.rows)} points ({', '.join(r.folders)})"))
    for col in ("id", "source", "gpu", "model", "weights", "workload", "metric", "measured", "predicted (80 %)", "in"):
        t.add_column(col, overflow="fold")
    for row in r.rows:
        pred = (f"{row.predicted:.4g} ({row.lo80:.3g}-{row.hi80:.3g})"
                if row.predicted is not None and row.lo80 is not None and row.hi80 is not None else row.note)
        gpu = row.gpu if row.gpus == 1 else f"{row.gpus}x {row.gpu}"
        t.add_row(*(plain(x) for x in (row.id, row.source, gpu, row.model, row.weights, row.workload,
                                       row.metric or "", f"{row.measured:.4g}" if row.measured is not None else "",
                                       pred, {True: "yes", False: "NO", None: ""}[row.inside80])))
    out.print(t)


@perf_app.command("add", cls=InfertoolCommand, epilog=EXAMPLES)
@handle_errors
def add(
    dirs: Annotated[List[str], typer.Argument(metavar="DIR...", help="Run, bench or tune directories.")],
    store: Annotated[Optional[str], STORE_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Add the measurements of run, bench or tune directories to your store (the same directory twice adds
    nothing); the next prediction is fitted with them."""
    from infertool.measurements import add_measurements
    from infertool.output import err, esc, print_json

    report = add_measurements(dirs, store)
    if as_json:
        print_json(report.to_dict())
        return
    for d, n in report.added.items():
        err.print(f"{esc(d)}: {n} point{'s' if n != 1 else ''} added ({report.found[d]} found) to {esc(report.folder)}",
                  soft_wrap=True)


@perf_app.command("cv", cls=InfertoolCommand, epilog=EXAMPLES)
@handle_errors
def cv(
    store: Annotated[Optional[str], STORE_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Leave-one-source-out cross-validation per metric: median absolute % error and the coverage of the
    nominal 80 % and 95 % intervals (each source predicted by the model fitted without it)."""
    from infertool.output import print_json
    from infertool.perfmodel import api

    report = api.cross_validation(store, _progress)
    if as_json:
        print_json(report.to_dict())
    else:
        _render_cv(report)


def _render_cv(r: "CvReport") -> None:
    from rich.table import Table

    from infertool.output import out, plain

    t = Table(title=plain(f"leave-one-source-out: {r.points} points, {r.sources} sources"))
    for col in ("metric", "points", "sources", "median |error|", "in 80 %", "in 95 %", "80 % width"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    pct = lambda v: "-" if v is None else f"{v:.1f} %"  # noqa: E731
    for row in r.rows:
        t.add_row(row.metric, str(row.points), str(row.sources), pct(row.mdape), pct(row.coverage80),
                  pct(row.coverage95), pct(row.width80))
    out.print(t)


@perf_app.command("init-store", cls=InfertoolCommand, epilog=EXAMPLES)
@handle_errors
def init_store(
    folder: Annotated[str, typer.Argument(metavar="DIR", help="A new or empty folder.")],
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Copy the published point files and sources.json into DIR, to edit (withhold points) and use with --store."""
    from infertool.output import err, esc, print_json
    from infertool.perfmodel.store import init_store as copy_published

    files = copy_published(folder)
    if as_json:
        print_json({"folder": folder, "files": [str(f) for f in files]})
    else:
        err.print(f"copied {len(files)} files to {esc(folder)}; use it with --store {esc(folder)}", soft_wrap=True)
