"""Rich markup in recipe, path, model or server text is shown as it is (issue 15, finding 5): `[/]`, `[bold]`
and `[link=...]` in paths and values print literally, never restyle, link or crash a command (MarkupError was a
45-line traceback, exit 1); terminal control characters are shown as escapes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from infertool import output
from infertool.cli import app
from infertool.errors import UsageError
from tests.fakes import layout_model

MARKUP = "x[/]y[bold]b[link=file:/e.vil]l[/link]"


@pytest.fixture
def wide(monkeypatch):
    """Wide consoles, so a literal value is never wrapped across lines in the captured output."""
    for console in (output.out, output.err):
        monkeypatch.setattr(console, "width", 2000)


def _run(*args: str):
    r = CliRunner().invoke(app, list(args))
    text = r.output + (r.stderr if r.stderr_bytes is not None else "")
    assert "Traceback" not in text and "internal error" not in text and "MarkupError" not in text, text
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r, text


def test_markup_in_paths_and_values_prints_literally(tmp_path, wide):
    d = tmp_path / f"d{MARKUP}"
    d.mkdir(parents=True)  # its `/` makes folders: the path still holds `[/]`
    recipe = d / "r.yaml"
    # a small model directory laid out here (config and safetensors headers): `quantize --check` reads no weights,
    # needs no managed environment (the bundled GGUF would: its conversion runs in the quant environment), and its
    # memory and disk checks pass on any machine
    model = layout_model(d / "model", "smollm2-135m", shards=1)
    recipe.write_text(f"name: hostile\nmodel:\n  source: {json.dumps(str(model))}\nquantize:\n  method: gptq\n  bits: 4\n"
                      "  group_size: 64\nserve:\n  max_model_len: 4096\n")
    out_dir = str(tmp_path / f"q{MARKUP}")
    cases = [
        (("validate", str(recipe)), {0}, [str(recipe)]),
        (("plan", str(recipe)), {0, 1}, []),
        (("serve", str(recipe), "--dry-run", "--set", f'quantize.output="{out_dir}"'), {0}, [out_dir]),
        (("serve", "quickstart", "--dry-run", "--set", f'serve.served_model_name="{MARKUP}"'), {0}, [MARKUP]),
        (("quantize", str(recipe), "--check", "--set", f'quantize.output="{out_dir}"'), {0}, [out_dir]),
        (("validate", str(d / "missing.yaml")), {2}, [str(d / "missing.yaml")]),
        (("model", "info", str(d)), {2}, [str(d)]),
        (("report", str(d)), {2}, [str(d)]),
    ]
    for args, codes, literals in cases:
        r, text = _run(*args)
        assert r.exit_code in codes, (args, r.exit_code, text)
        for lit in literals:
            assert lit in text, (args, lit, text)


def test_model_info_of_a_directory_named_with_markup(tmp_path, wide):
    m = layout_model(tmp_path / f"m{MARKUP}", "llama-3.1-8b", shards=1)
    r, text = _run("model", "info", str(m))
    assert r.exit_code == 0, text
    assert str(m) in text


def test_an_error_message_with_markup_prints_literally(capsys, monkeypatch):
    monkeypatch.setattr(output.err, "width", 2000)
    output.render_error(UsageError(f"bad {MARKUP}", hint=f"try [red]{MARKUP}"))
    err = capsys.readouterr().err
    assert f"error: bad {MARKUP}" in err and f"hint: try [red]{MARKUP}" in err


def test_internal_error_text_with_markup_is_one_line(monkeypatch):
    """A bug whose message holds markup still ends in the one-line internal error (exit 5), not a traceback."""
    import infertool.commands.recipes as recipes

    def boom(*a, **k):
        raise RuntimeError(f"closing tag {MARKUP}")

    monkeypatch.setattr("infertool.recipe.load_recipe", boom)
    monkeypatch.delenv("INFERTOOL_DEBUG", raising=False)
    r = CliRunner().invoke(app, ["validate", "quickstart"])
    assert r.exit_code == 5 and isinstance(r.exception, SystemExit), r.output
    assert f"RuntimeError: closing tag {MARKUP}" in r.output.replace("\n", "")
    assert recipes  # imported for the patch target's module


def test_report_of_a_run_directory_named_with_markup(tmp_path, wide):
    from tests.report_fixture import make_run_dir

    run = make_run_dir(tmp_path / f"runs{MARKUP}")
    r, text = _run("report", str(run))
    assert r.exit_code == 0, text
    assert str(run / "report.html") in text


def test_control_characters_and_markup_in_helpers():
    assert output.esc("a[/]\x1b[31mb\x07[bold]") == "a\\[/]\\x1b[31mb\\x07\\[bold]"  # `[31m` is no tag
    assert output.plain("[bold]x\u202e").plain == "[bold]x\\u202e"
    assert output.visible("tab\tnew\nline") == "tab\tnew\nline"
    t = output.kv_table([("k[/]", "[link=file:/x]v")], title="t[/]")
    from rich.console import Console

    c = Console(width=200, record=True)
    c.print(t)
    text = c.export_text()
    assert "k[/]" in text and "[link=file:/x]v" in text and "t[/]" in text
    assert json.dumps(output.to_jsonable({"a": MARKUP})) == json.dumps({"a": MARKUP})
