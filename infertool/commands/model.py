"""`infertool model import|info`: model sources."""


from pathlib import Path
from typing import Annotated, Optional

import typer

from infertool.commands._common import JSON_OPT, InfertoolCommand, force_opt, handle_errors

model_app = typer.Typer(help="Model sources: import a GGUF or the bundled model, show a model's facts.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")


# -------------------------------------------------------------------------------------------- model
@model_app.command("import", cls=InfertoolCommand)
@handle_errors
def model_import(
    source: Annotated[str, typer.Argument(metavar="SOURCE", help="bundled:smollm2-135m or a .gguf file.")],
    dest: Annotated[Path, typer.Argument(metavar="DIR", help="Directory to write the Hugging Face model to.")],
    layers: Annotated[Optional[int], typer.Option("--layers", min=1, max=10_000, metavar="N", help="Keep only the first N decoder layers (test fixtures).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", metavar="bf16|fp16|fp32", help="The saved weights' dtype.")] = "bf16",
    force: Annotated[bool, force_opt("Replace an existing DIR.")] = False,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Convert a GGUF (or the bundled model) into a safetensors directory with tokenizer and chat template."""
    from infertool.models.sources import import_model
    from infertool.output import StageProgress, err, esc, print_json

    with StageProgress("model import") as progress:  # with --json too: the result on stdout, progress on stderr
        r = import_model(source, dest, layers=layers, dtype=dtype, force=force, on_event=progress.on_event)
    if as_json:
        print_json(r.to_dict())
        return
    err.print(f"[green]✓[/] {esc(source)} -> {esc(r.dest)} ({r.info.num_layers} layers, "
              f"{r.info.weight_bytes / 1e6:.1f} MB, {'reused cached conversion' if r.reused else 'converted'})")


@model_app.command("info", cls=InfertoolCommand)
@handle_errors
def model_info_cmd(
    path: Annotated[str, typer.Argument(metavar="MODEL", help="A Hugging Face model directory (or bundled:NAME once imported).")],
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Architecture facts later stages need, read from config.json and safetensors headers (no weights loaded)."""
    from infertool.models.sources import local_model_info
    from infertool.output import kv_table, out, print_json

    info = local_model_info(path)
    if as_json:
        print_json(info.to_dict())
        return
    out.print(kv_table(info.rows(), title="model info"))
