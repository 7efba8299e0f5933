"""The CLI through Typer's CliRunner (fast) and as a real subprocess (exit codes, stdout/stderr split)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from infertool import __version__
from infertool.cli import app
from tests.conftest import run_cli

runner = CliRunner()

THREE_MISTAKES = """\
name: three-mistakes
model:
  source: bundled:smollm2-135m
quantize:
  method: gptq
  grup_size: 64
profile:
  batch: [1, "x"]
serve:
  port: 99999
"""


def test_version(tmp_home):
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0
    assert r.stdout.splitlines()[0] == f"infertool {__version__}"
    assert "quant: not set up" in r.stdout


def test_help_lists_commands_and_exit_codes():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for cmd in ("validate", "recipes", "env", "model"):
        assert cmd in r.stdout
    assert "Exit codes" in r.stdout


def test_validate_ok_builtin_name():
    r = runner.invoke(app, ["validate", "quickstart"])
    assert r.exit_code == 0, r.output
    assert "valid" in r.stderr


def test_validate_json_is_the_resolved_recipe():
    r = runner.invoke(app, ["validate", "quickstart", "--json", "--set", "quantize.group_size=32"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["ok"] is True
    assert data["recipe"]["quantize"]["group_size"] == 32
    assert data["recipe"]["quantize"]["method"] == "gptq"
    assert data["recipe"]["model"]["source"] == "bundled:smollm2-135m"


def test_validate_three_mistakes_subprocess(tmp_path):
    """All three errors, each with its dotted path, exit 2, and no Python traceback anywhere."""
    p = tmp_path / "bad.yaml"
    p.write_text(THREE_MISTAKES)
    r = run_cli("validate", str(p))
    assert r.returncode == 2
    assert "3 errors" in r.stderr
    assert "quantize.grup_size (line 6" in r.stderr
    assert "did you mean 'group_size'" in r.stderr
    assert "profile.batch[1] (line 8" in r.stderr
    assert "serve.port (line 10" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert r.stdout == ""  # errors go to stderr for people


def test_validate_three_mistakes_json(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(THREE_MISTAKES)
    r = runner.invoke(app, ["validate", str(p), "--json"])
    assert r.exit_code == 2
    data = json.loads(r.stdout)
    assert data["ok"] is False and data["exit_code"] == 2
    assert [i["path"] for i in data["issues"]] == ["quantize.grup_size", "profile.batch[1]", "serve.port"]
    assert [i["line"] for i in data["issues"]] == [6, 8, 10]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("name: x\nmodel: {source: a\n", "line"),  # YAML syntax error: line and column
        ("", "empty"),
        ("- a\n- b\n", "mapping"),
    ],
)
def test_validate_bad_yaml_no_traceback(tmp_path, text, needle):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    r = run_cli("validate", str(p))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_validate_missing_file_and_bad_override(tmp_path):
    r = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2
    assert "nope.yaml" in r.stderr
    r = runner.invoke(app, ["validate", "quickstart", "--set", "no-equals-sign"])
    assert r.exit_code == 2
    assert "no-equals-sign" in r.stderr


def test_override_applied_before_validation_can_break_a_recipe():
    r = runner.invoke(app, ["validate", "quickstart", "--set", "serve.port=0"])
    assert r.exit_code == 2
    assert "serve.port" in r.stderr


def test_bad_usage_is_exit_2():
    r = runner.invoke(app, ["validate"])
    assert r.exit_code == 2
    r = runner.invoke(app, ["no-such-command"])
    assert r.exit_code == 2


def test_recipes_list_show_copy(tmp_path):
    r = runner.invoke(app, ["recipes", "list", "--json"])
    assert r.exit_code == 0
    names = {x["name"] for x in json.loads(r.stdout)}
    assert {"quickstart", "llama3.1-8b-w4a16-h100", "llama3.3-70b-w4a16-tp4"} <= names
    r = runner.invoke(app, ["recipes", "list"])
    assert r.exit_code == 0 and "quickstart" in r.stdout
    r = runner.invoke(app, ["recipes", "show", "quickstart"])
    assert r.exit_code == 0 and "name: quickstart" in r.stdout
    r = runner.invoke(app, ["recipes", "copy", "quickstart", str(tmp_path)])
    assert r.exit_code == 0, r.output
    copied = tmp_path / "quickstart.yaml"
    assert copied.read_text().startswith("# Quickstart")
    r = runner.invoke(app, ["recipes", "copy", "quickstart", str(tmp_path)])
    assert r.exit_code == 2 and "--force" in r.stderr
    r = runner.invoke(app, ["recipes", "show", "quickstrat"])
    assert r.exit_code == 2 and "quickstart" in r.stderr


def test_env_list_json_on_an_empty_home(tmp_home):
    r = runner.invoke(app, ["env", "list", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["home"] == str(tmp_home / "envs")
    assert {e["name"]: e["status"] for e in data["envs"]} == {"quant": "missing", "serve": "missing", "llmcompressor": "missing",
                                                               "lmeval": "missing"}


def test_env_doctor_with_nothing_set_up(tmp_home):
    """An environment problem: exit 3 (README's table), with the command that fixes it."""
    r = runner.invoke(app, ["env", "doctor"])
    assert r.exit_code == 3
    assert "infertool env setup" in r.stderr
    r = runner.invoke(app, ["env", "doctor", "--json"])
    assert r.exit_code == 3
    data = json.loads(r.stdout)
    assert data["ok"] is False and data["exit_code"] == 3 and "infertool env setup" in data["hint"]
    r = runner.invoke(app, ["env", "doctor", "quant", "--json"])
    assert r.exit_code == 3
    data = json.loads(r.stdout)
    assert data[0]["healthy"] is False and data[0]["status"] == "missing"


def test_env_setup_unknown_name(tmp_home):
    r = runner.invoke(app, ["env", "setup", "nosuchenv"])
    assert r.exit_code == 2
    assert "quant" in r.stderr  # lists the built-in ones


def test_model_import_refuses_a_directory_source(tmp_path):
    r = runner.invoke(app, ["model", "import", str(tmp_path), str(tmp_path / "out")])
    assert r.exit_code == 2
    assert "neither" in r.stderr


def test_model_import_missing_gguf(tmp_path):
    r = runner.invoke(app, ["model", "import", str(tmp_path / "x.gguf"), str(tmp_path / "out")])
    assert r.exit_code == 2
    assert "not found" in r.stderr


def test_model_import_without_quant_env_says_what_to_do(tmp_home, tmp_path):
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 64)
    r = runner.invoke(app, ["model", "import", str(fake), str(tmp_path / "out")], env={"INFERTOOL_IN_PROCESS": "0"})
    assert r.exit_code == 3
    assert "infertool env setup quant" in r.stderr
    assert not (tmp_path / "out").exists()


def test_model_info_missing_path(tmp_path):
    r = runner.invoke(app, ["model", "info", str(tmp_path / "nope")])
    assert r.exit_code == 2
    assert "not found" in r.stderr
