"""The command line: thin Typer commands. Each parses, calls one core function, renders the result.

Heavy libraries (torch, transformers, vllm) are never imported here; backends run in their managed
environments (see infertool/envs) or inside the core functions that need them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from infertool import __version__
from infertool.commands import register_all
from infertool.commands._common import JSON_OPT, SET_OPT, handle_errors, usage_error

app = typer.Typer(
    name="infertool",
    help="Profile, quantize, evaluate, serve and benchmark self-hosted LLMs from one recipe file.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: 0 ok, 1 verdict failed, 2 bad usage or recipe, 3 environment/backend error, 4 runtime failure. Docs: README.md",
)
recipes_app = typer.Typer(help="The built-in recipes: list, show, copy.", no_args_is_help=True)
env_app = typer.Typer(help="The managed backend environments (quant, serve, ...).", no_args_is_help=True)
model_app = typer.Typer(help="Model sources: import a GGUF or the bundled model, show a model's facts.", no_args_is_help=True)
app.add_typer(recipes_app, name="recipes")
app.add_typer(env_app, name="env")
app.add_typer(model_app, name="model")

def _version_cb(value: bool) -> None:
    if value:
        typer.echo(f"infertool {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_cb, is_eager=True, help="Show the version and exit."),
) -> None:
    """Exit codes: 0 ok, 1 verdict failed, 2 bad usage or recipe, 3 environment/backend error, 4 runtime failure."""


# ----------------------------------------------------------------------------------------- validate
@app.command()
@handle_errors
def validate(
    recipe: str = typer.Argument(..., help="Recipe file, or the name of a built-in recipe."),
    overrides: Optional[List[str]] = SET_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Check a recipe: every error is listed with its field path (exit 2)."""
    from infertool.output import err, print_json
    from infertool.recipe import load_recipe, recipe_to_dict

    r = load_recipe(recipe, overrides or [])
    if as_json:
        print_json({"ok": True, "recipe": recipe_to_dict(r)})
        return
    sections = [s for s in ("model", "quantize", "eval", "profile", "serve", "bench", "run") if getattr(r, s, None) is not None]
    err.print(f"[green]✓[/] {recipe}: recipe [bold]{r.name}[/] is valid (sections: {', '.join(sections)})")


# ------------------------------------------------------------------------------------------ recipes
@recipes_app.command("list")
@handle_errors
def recipes_list(as_json: bool = JSON_OPT) -> None:
    """List the built-in recipes."""
    from rich.table import Table

    from infertool.catalog import list_builtin
    from infertool.output import out, print_json

    items = list_builtin()
    if as_json:
        print_json([{"name": r.name, "path": str(r.path), "description": r.description} for r in items])
        return
    table = Table(title="built-in recipes")
    table.add_column("name", style="bold cyan", no_wrap=True)
    table.add_column("description")
    for r in items:
        table.add_row(r.name, r.description)
    out.print(table)


@recipes_app.command("show")
@handle_errors
def recipes_show(name: str = typer.Argument(..., help="A built-in recipe's name.")) -> None:
    """Print a built-in recipe's YAML."""
    from infertool.catalog import get_builtin

    sys.stdout.write(get_builtin(name).path.read_text(encoding="utf-8"))


@recipes_app.command("copy")
@handle_errors
def recipes_copy(
    name: str = typer.Argument(..., help="A built-in recipe's name."),
    dest: Path = typer.Argument(..., help="A directory, or the file to write."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Copy a built-in recipe to edit it."""
    from infertool.catalog import copy_builtin
    from infertool.output import err

    path = copy_builtin(name, dest, force=force)
    err.print(f"[green]✓[/] wrote {path}")


# ---------------------------------------------------------------------------------------------- env
@env_app.command("setup")
@handle_errors
def env_setup(
    names: Optional[List[str]] = typer.Argument(None, help="Environments to set up (default: quant serve)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even when the environment is up to date."),
    variant: Optional[str] = typer.Option(None, "--variant", help="cpu or cuda (default: detected from the host)."),
    requirements: Optional[Path] = typer.Option(None, "--requirements", "-r", help="Define a custom environment NAME from a requirements file."),
    as_json: bool = JSON_OPT,
) -> None:
    """Create the managed environments (idempotent: an up-to-date one is left alone)."""
    from infertool.envs.manage import setup_env
    from infertool.output import StageProgress, err, print_json

    names = names or ["quant", "serve"]
    if requirements is not None and len(names) != 1:
        raise usage_error("--requirements defines one custom environment: give exactly one NAME")
    results = []
    for name in names:
        with StageProgress("setup", quiet=as_json) as progress:
            st, what = setup_env(name, force=force, variant=variant, requirements_file=requirements, on_event=progress.on_event)
        results.append({"name": name, "action": what, **st.to_dict()})
        if not as_json:
            versions = ", ".join(f"{k} {v}" for k, v in st.packages.items())
            err.print(f"[green]✓[/] {name}: {what} ({st.variant}) {versions}")
    if as_json:
        print_json(results)


@env_app.command("list")
@handle_errors
def env_list(as_json: bool = JSON_OPT) -> None:
    """Show every environment, its state and key package versions."""
    from rich.table import Table

    from infertool.envs.manage import list_envs
    from infertool.envs.paths import envs_root
    from infertool.output import out, print_json

    states = list_envs()
    if as_json:
        print_json({"home": str(envs_root()), "envs": [s.to_dict() for s in states]})
        return
    table = Table(title=f"environments in {envs_root()}")
    for col in ("name", "status", "variant", "packages", "created"):
        table.add_column(col, no_wrap=col != "packages")
    colors = {"ready": "green", "stale": "yellow", "incomplete": "red", "missing": "dim"}
    for s in states:
        table.add_row(
            s.name,
            f"[{colors.get(s.status, 'white')}]{s.status}[/]" + (f" ({s.reason})" if s.reason else ""),
            s.variant or "",
            ", ".join(f"{k} {v}" for k, v in s.packages.items()),
            (s.created or "")[:19],
        )
    out.print(table)


@env_app.command("doctor")
@handle_errors
def env_doctor(
    names: Optional[List[str]] = typer.Argument(None, help="Environments to check (default: all that exist)."),
    as_json: bool = JSON_OPT,
) -> None:
    """Check environments: imports, versions, drift since setup, broken requirements."""
    from rich.table import Table

    from infertool.envs.manage import doctor, list_envs
    from infertool.errors import EXIT_BACKEND
    from infertool.output import err, out, print_json

    if not names:
        names = [s.name for s in list_envs() if s.status != "missing"]
        if not names:
            raise usage_error("no environment is set up yet", hint="run `infertool env setup quant serve`")
    reports = []
    for name in names:
        with err.status(f"checking {name} ..."):
            reports.append(doctor(name))
    if as_json:
        print_json([r.to_dict() for r in reports])
    else:
        for r in reports:
            table = Table(title=f"{r.name}: " + ("[green]healthy[/]" if r.healthy else "[red]unhealthy[/]"), title_justify="left")
            table.add_column("check")
            table.add_column("")
            table.add_column("detail")
            for c in r.checks:
                table.add_row(c["check"], "[green]ok[/]" if c["ok"] else "[red]FAIL[/]", str(c["detail"]))
            out.print(table)
            if r.accelerator:
                acc = r.accelerator
                out.print(f"  accelerator: {'CUDA ' + ', '.join(acc.get('devices', [])) if acc.get('cuda') else 'none (CPU)'}"
                          + (f"; torch {acc['torch']}" if acc.get("torch") else ""))
            if r.hint:
                err.print(f"[yellow]hint:[/] {r.hint}")
    if not all(r.healthy for r in reports):
        raise typer.Exit(EXIT_BACKEND)


@env_app.command("remove")
@handle_errors
def env_remove(names: List[str] = typer.Argument(..., help="Environments to remove.")) -> None:
    """Delete environments (they can be set up again at any time)."""
    from infertool.envs.manage import remove_env
    from infertool.output import err

    for name in names:
        if remove_env(name):
            err.print(f"[green]✓[/] removed {name}")
        else:
            err.print(f"{name}: not present")


# -------------------------------------------------------------------------------------------- model
@model_app.command("import")
@handle_errors
def model_import(
    source: str = typer.Argument(..., help="bundled:smollm2-135m or a .gguf file."),
    dest: Path = typer.Argument(..., help="Directory to write the Hugging Face model to."),
    layers: Optional[int] = typer.Option(None, "--layers", min=1, help="Keep only the first N decoder layers (test fixtures)."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32."),
    force: bool = typer.Option(False, "--force", help="Replace an existing DEST."),
    as_json: bool = JSON_OPT,
) -> None:
    """Convert a GGUF (or the bundled model) into a safetensors directory with tokenizer and chat template."""
    from infertool.models.sources import copy_model_dir, resolve_model
    from infertool.models.info import model_info
    from infertool.output import StageProgress, err, print_json

    if not (source.startswith("bundled:") or source.lower().endswith(".gguf")):
        raise usage_error(f"{source!r} is neither bundled:NAME nor a .gguf file",
                     hint="a Hugging Face directory needs no import: use it as model.source directly")
    with StageProgress("model import", quiet=as_json) as progress:
        resolved = resolve_model(source, layers=layers, dtype=dtype, on_event=progress.on_event)
    path = copy_model_dir(resolved.path, dest, force=force)
    info = model_info(path)
    if as_json:
        print_json({"source": source, "dest": str(path), "cache": str(resolved.path), "reused": resolved.cached, "info": info.to_dict()})
        return
    err.print(f"[green]✓[/] {source} -> {path} ({info.num_layers} layers, {info.weight_bytes / 1e6:.1f} MB, "
              f"{'reused cached conversion' if resolved.cached else 'converted'})")


@model_app.command("info")
@handle_errors
def model_info_cmd(
    path: str = typer.Argument(..., help="A Hugging Face model directory (or bundled:NAME once imported)."),
    as_json: bool = JSON_OPT,
) -> None:
    """Architecture facts later stages need, read from config.json and safetensors headers (no weights loaded)."""
    from infertool.models.info import model_info
    from infertool.output import kv_table, out, print_json

    target = path
    if path.startswith("bundled:") or path.lower().endswith(".gguf"):
        from infertool.models.sources import resolve_model

        target = str(resolve_model(path).path)
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


# Command groups of the other capabilities live in infertool/commands/<name>.py, each with register(app).
register_all(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
