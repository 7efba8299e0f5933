"""`infertool model import|info`: model sources."""


from pathlib import Path
from typing import Annotated, Optional

import typer

from infertool.commands._common import JSON_OPT, InfertoolCommand, force_opt, handle_errors, usage_error

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
    from infertool.models.sources import copy_model_dir, locate
    from infertool.models.info import model_info
    from infertool.output import StageProgress, err, esc, print_json

    if not (source.startswith("bundled:") or source.lower().endswith(".gguf")):
        raise usage_error(f"{source!r} is neither bundled:NAME nor a .gguf file",
                     hint="a Hugging Face directory needs no import: use it as model.source directly")
    with StageProgress("model import") as progress:  # with --json too: the result on stdout, progress on stderr
        resolved = locate(source, layers=layers, dtype=dtype, convert=True, on_event=progress.on_event).require()
    assert resolved.path is not None  # require(): it is here
    path = copy_model_dir(resolved.path, dest, force=force)
    info = model_info(path)
    if as_json:
        print_json({"source": source, "dest": str(path), "cache": str(resolved.path), "reused": resolved.cached, "info": info.to_dict()})
        return
    err.print(f"[green]✓[/] {esc(source)} -> {esc(path)} ({info.num_layers} layers, {info.weight_bytes / 1e6:.1f} MB, "
              f"{'reused cached conversion' if resolved.cached else 'converted'})")


@model_app.command("info", cls=InfertoolCommand)
@handle_errors
def model_info_cmd(
    path: Annotated[str, typer.Argument(metavar="MODEL", help="A Hugging Face model directory (or bundled:NAME once imported).")],
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Architecture facts later stages need, read from config.json and safetensors headers (no weights loaded)."""
    from infertool.models.info import model_info
    from infertool.output import kv_table, out, print_json

    target = path
    if path.startswith("bundled:") or path.lower().endswith(".gguf"):
        from infertool.models.sources import locate

        target = str(locate(path, convert=True).require().path)
    info = model_info(target)
    if as_json:
        print_json(info.to_dict())
        return
    q = info.quantization
    qdesc = "none" if not q else ", ".join(f"{k}={q[k]}" for k in ("quant_method", "bits", "group_size", "sym", "desc_act") if k in q) or str(q)
    rows = [
        ("path", info.path),
        ("architecture", ", ".join(info.architectures) or info.model_type),
        ("layers", info.num_layers),
        ("hidden size", info.hidden_size),
        ("intermediate size", info.intermediate_size),
        ("attention heads", info.num_attention_heads),
        ("KV heads", info.num_key_value_heads),
        ("head dim", info.head_dim),
        ("vocab", info.vocab_size),
        ("max positions", info.max_position_embeddings),
        ("tie_word_embeddings", info.tie_word_embeddings),
        ("dtype", f"{info.dtype} (stored: {info.stored_dtype})"),
        ("weights", f"{info.weight_bytes:,} bytes ({info.weight_bytes / 2**20:.1f} MiB) in {len(info.weight_files)} file(s), {info.tensors} tensors"),
        ("KV cache per token (bf16)", f"{info.kv_bytes_per_token_bf16:,} bytes" if info.kv_bytes_per_token_bf16 else "unknown"),
        ("quantization", qdesc),
        ("tokenizer / chat template", f"{'yes' if info.has_tokenizer else 'no'} / {'yes' if info.has_chat_template else 'no'}"),
    ]
    if info.num_experts:
        rows.insert(7, ("experts (active per token)", f"{info.num_experts} ({info.num_experts_per_tok})"))
    out.print(kv_table(rows, title="model info"))
