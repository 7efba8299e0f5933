"""One grammar for every command: the same option for the same thing, JSON errors under --json (usage errors
too), --force before any overwrite, readable help with examples, shell completion, --version with the
environments, and the README's exit codes. Fast: CliRunner over the real command tree, a few subprocesses."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from infertool.cli import app
from tests.conftest import ROOT, run_cli

runner = CliRunner()


def _tree() -> list[tuple[tuple[str, ...], object]]:
    """(path, click command) for every command and group under `infertool`."""
    found = []

    def walk(path: tuple[str, ...], cmd) -> None:
        found.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(path + (name,), sub)

    walk((), typer.main.get_command(app))
    return found


TREE = _tree()
LEAVES = [(p, c) for p, c in TREE if not hasattr(c, "commands")]
GROUPS = [(p, c) for p, c in TREE if hasattr(c, "commands")]
IDS = lambda items: [" ".join(p) or "infertool" for p, _ in items]  # noqa: E731


def _options(cmd) -> list:
    return [p for p in cmd.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]


# ------------------------------------------------------------------------------- 1. one name per thing
def test_the_same_option_means_the_same_thing_everywhere():
    """Every visible option name is used one way across the tree: a flag everywhere or a value everywhere,
    with the same short alias; --out always has -o, nothing is called --output."""
    seen: dict[str, set] = {}
    for path, cmd in LEAVES:
        for p in _options(cmd):
            for name in p.opts:
                if name.startswith("--"):
                    shorts = tuple(sorted(o for o in p.opts if not o.startswith("--")))
                    seen.setdefault(name, set()).add((p.is_flag, p.multiple, shorts))
    assert "--output" not in seen
    mixed = {n: kinds for n, kinds in seen.items() if len(kinds) > 1}
    assert not mixed, mixed
    assert seen["--out"] == {(False, False, ("-o",))}
    assert seen["--force"] == {(True, False, ())} and seen["--dry-run"] == {(True, False, ())}
    assert seen["--json"] == {(True, False, ())} and seen["--set"] == {(False, True, ())}


def test_every_command_takes_json():
    for path, cmd in LEAVES:
        assert "--json" in {o for p in _options(cmd) for o in p.opts}, path


def test_every_recipe_command_takes_set_and_json():
    for path, cmd in LEAVES:
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        if args and args[0].metavar == "RECIPE" and args[0].required:
            names = {o for p in _options(cmd) for o in p.opts}
            assert {"--set", "--json"} <= names, path


def test_bench_writes_its_report_with_out(tmp_path):
    """bench's JSON report file is `--out FILE` / `-o FILE` like every other output; an existing one needs --force
    (refused before any server is contacted)."""
    report = tmp_path / "bench.json"
    report.write_text("mine\n")
    for flag in ("--out", "-o"):
        r = runner.invoke(app, ["bench", "quickstart", "--url", "http://127.0.0.1:9/v1", flag, str(report)])
        assert r.exit_code == 2 and "already exists" in r.stderr and "--force" in r.stderr, r.output
    assert report.read_text() == "mine\n"
    r = runner.invoke(app, ["bench", "quickstart", "--output", str(report)])
    assert r.exit_code == 2 and "No such option" in r.stderr


def test_quantize_check_is_also_dry_run():
    cmd = dict(LEAVES)[("quantize",)]
    check = next(p for p in cmd.params if p.name == "check")
    assert set(check.opts) == {"--check", "--dry-run"}


def test_run_rerun_replaces_the_valued_force(tmp_path):
    r = runner.invoke(app, ["run", "quickstart", "--rerun", "evl", "--dry-run", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "evl" in r.stderr and "stages:" in r.stderr
    r = runner.invoke(app, ["run", "quickstart", "--dry-run", "--json", "--out", str(tmp_path), "--stages", "model",
                            "--rerun", "model"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["stages"]["model"]["reuse"] is False


# ------------------------------------------------------------------------------- 2. JSON usage errors
def _json_error(r, code: int = 2) -> dict:
    assert r.exit_code == code, r.output
    data = json.loads(r.stdout)
    assert data["ok"] is False and data["exit_code"] == code and data["message"] and data["hint"]
    return data


@pytest.mark.parametrize("path", [p for p, _ in TREE], ids=IDS(TREE))
def test_unknown_option_under_json_is_json_on_every_command(path):
    r = runner.invoke(app, [*path, "--no-such-option", "--json"])
    data = _json_error(r)
    assert data["error"] == "UsageError" and "--no-such-option" in data["message"]
    assert "No such option" in r.stderr  # the message for people stays on stderr


@pytest.mark.parametrize("path", [p for p, c in LEAVES if any(a.required for a in c.params if a.param_type_name == "argument")],
                         ids=lambda p: " ".join(p))
def test_missing_argument_under_json_is_json(path):
    r = runner.invoke(app, [*path, "--json"])
    data = _json_error(r)
    assert data["message"].startswith("Missing argument") and f"infertool {' '.join(path)}" in data["hint"]
    assert "Missing argument" in r.stderr


def test_bad_value_and_unknown_command_under_json():
    data = _json_error(runner.invoke(app, ["plan", "quickstart", "--context", "lots", "--json"]))
    assert "--context" in data["message"]
    data = _json_error(runner.invoke(app, ["serve", "stop", "--port", "x", "--json"]))
    assert "--port" in data["message"]
    data = _json_error(runner.invoke(app, ["no-such-command", "--json"]))
    assert "no-such-command" in data["message"]
    data = _json_error(runner.invoke(app, ["env", "nope", "--json"]))
    assert "nope" in data["message"]
    # without --json: people's message only, nothing on stdout
    r = runner.invoke(app, ["plan"])
    assert r.exit_code == 2 and r.stdout == "" and "Missing argument 'RECIPE'" in r.stderr


def test_usage_error_json_through_the_real_entry_point():
    r = run_cli("plan", "--json")
    assert r.returncode == 2
    assert json.loads(r.stdout) == {
        "ok": False, "error": "UsageError", "message": "Missing argument 'RECIPE'.",
        "hint": "usage: infertool plan [OPTIONS] RECIPE; `infertool plan --help` lists the options",
        "exit_code": 2, "log_path": None}
    assert "Missing argument 'RECIPE'" in r.stderr and "Traceback" not in r.stderr


def test_json_after_double_dash_is_not_a_request_for_json():
    r = runner.invoke(app, ["validate", "--", "--json"])
    assert r.exit_code == 2 and r.stdout == ""


# ------------------------------------------------------------------------------- 3. --force, whole files
def test_recipes_copy_into_a_folder(tmp_path):
    r = runner.invoke(app, ["recipes", "copy", "quickstart", str(tmp_path / "newdir") + "/"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "newdir").is_dir() and (tmp_path / "newdir" / "quickstart.yaml").is_file()
    r = runner.invoke(app, ["recipes", "copy", "smollm2-w8-cpu", str(tmp_path / "newdir"), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["path"] == str(tmp_path / "newdir" / "smollm2-w8-cpu.yaml")
    r = runner.invoke(app, ["recipes", "copy", "quickstart", str(tmp_path / "newdir") + "/"])
    assert r.exit_code == 2 and "--force" in r.stderr
    r = runner.invoke(app, ["recipes", "copy", "quickstart", str(tmp_path / "newdir") + "/", "--force"])
    assert r.exit_code == 0
    r = runner.invoke(app, ["recipes", "copy", "quickstart", str(tmp_path / "mine.yaml")])
    assert r.exit_code == 0 and (tmp_path / "mine.yaml").is_file()
    assert sorted(p.name for p in (tmp_path / "newdir").iterdir()) == ["quickstart.yaml", "smollm2-w8-cpu.yaml"]


def test_export_lm_eval_refuses_to_overwrite_without_force(tmp_path):
    dest = tmp_path / "lm"
    r = runner.invoke(app, ["eval", "export-lm-eval", "synthetic-mc", str(dest), "--json"])
    assert r.exit_code == 0, r.output
    files = {p.name: p.read_bytes() for p in dest.iterdir()}
    some = next(p for p in dest.iterdir() if p.suffix == ".jsonl")
    some.write_text("edited\n")
    r = runner.invoke(app, ["eval", "export-lm-eval", "synthetic-mc", str(dest)])
    assert r.exit_code == 2 and "--force" in r.stderr and "already exist" in r.stderr
    assert some.read_text() == "edited\n"  # nothing written
    r = runner.invoke(app, ["eval", "export-lm-eval", "synthetic-mc", str(dest), "--force"])
    assert r.exit_code == 0
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == files  # whole files, no temporary ones left


def test_eval_and_profile_outputs_need_force(tmp_path):
    (tmp_path / "results.json").write_text("{}")
    data = _json_error(runner.invoke(app, ["eval", "quickstart", "--out", str(tmp_path), "--json"]))
    assert "results.json" in data["message"] and "--force" in data["hint"]
    (tmp_path / "profile.json").write_text("{}")
    data = _json_error(runner.invoke(app, ["profile", "quickstart", "-o", str(tmp_path), "--json"]))
    assert "profile.json" in data["message"] and "--force" in data["hint"]


def test_atomic_write_leaves_the_old_file_on_failure(tmp_path):
    from infertool.atomic import atomic_path, write_text

    target = tmp_path / "f.txt"
    write_text(target, "old\n")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


# ------------------------------------------------------------------------------- 4. readable help
NOISE = re.compile(r"<(str|int|float|path|bool|list|.* range)[^>]*>|\{\w+\}|\[\[")


@pytest.mark.parametrize("path", [p for p, _ in TREE], ids=IDS(TREE))
def test_help_has_no_python_types(path):
    r = runner.invoke(app, [*path, "--help"])
    assert r.exit_code == 0, r.output
    assert not NOISE.search(r.stdout), NOISE.search(r.stdout).group(0)
    assert r.stdout.startswith(f"Usage: infertool {' '.join(path)}".rstrip())


def test_help_metavars_read_like_the_readme():
    def helptext(*path: str) -> str:
        return runner.invoke(app, [*path, "--help"]).stdout

    assert "Usage: infertool plan [OPTIONS] RECIPE\n" in helptext("plan")
    assert "--set KEY=VALUE" in helptext("plan") and "-o, --out DIR" in helptext("quantize")
    assert "-o, --out FILE" in helptext("bench") and "--url URL" in helptext("bench")
    assert "Usage: infertool recipes copy [OPTIONS] NAME DEST" in helptext("recipes", "copy")
    assert "Usage: infertool env setup [OPTIONS] [NAME]..." in helptext("env", "setup")
    assert "--max-items N" in helptext("eval", "run") and "--engine hf|vllm|openai" in helptext("eval", "run")
    assert "Usage: infertool serve status [OPTIONS] [RECIPE]" in helptext("serve", "status")


# ------------------------------------------------------------------------------- 5. completion
def test_completion_options_and_completions():
    r = runner.invoke(app, ["--help"])
    assert "--install-completion" in r.stdout and "--show-completion" in r.stdout

    def complete(words: str) -> list[str]:
        env = {"_INFERTOOL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
        return run_cli(env=env).stdout.split()

    assert complete("infertool pl") == ["plan"]
    assert {"quickstart", "quickstart-tune"} <= set(complete("infertool plan quick"))
    assert {"stop", "status", "smollm2-w8-cpu"} <= set(complete("infertool serve s"))
    assert "--dry-run" in complete("infertool serve quickstart --dr")


# ------------------------------------------------------------------------------- 6. --version
def _fake_env(tmp_home: Path, name: str, packages: dict) -> None:
    from infertool.envs.state import MARKER, get_spec, infertool_source

    d = tmp_home / "envs" / name
    (d / "bin").mkdir(parents=True)
    (d / "bin" / "python").write_text("")
    (d / MARKER).write_text(json.dumps({"variant": "cpu", "packages": packages, "fingerprint": get_spec(name).fingerprint("cpu"),
                                        "infertool": infertool_source().to_dict()}))


def test_version_lists_each_environment_without_a_subprocess(tmp_home, monkeypatch):
    _fake_env(tmp_home, "quant", {"gptqmodel": "7.7.0", "torch": "2.14.1", "transformers": "5.24.0"})

    def no(*a, **k):
        raise AssertionError("--version must not start a process")

    monkeypatch.setattr(subprocess, "run", no)
    monkeypatch.setattr(subprocess, "Popen", no)
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("infertool ")
    assert "  quant: torch 2.14.1, transformers 5.24.0, gptqmodel 7.7.0 (cpu)" in lines
    assert "  serve: not set up" in lines and "  llmcompressor: not set up" in lines
    r = runner.invoke(app, ["--version", "--json"])
    data = json.loads(r.stdout)
    assert data["envs"]["quant"] == {"status": "ready", "variant": "cpu", "reason": None,
                                     "packages": {"torch": "2.14.1", "transformers": "5.24.0", "gptqmodel": "7.7.0"}}
    assert data["envs"]["serve"]["status"] == "missing"
    assert runner.invoke(app, ["--json", "--version"]).stdout == r.stdout  # either order


def test_root_json_without_version_is_a_usage_error():
    data = _json_error(runner.invoke(app, ["--json", "plan", "quickstart"]))
    assert "goes after the command" in data["message"]


# ------------------------------------------------------------------------------- 7. examples
MAIN = [("quantize",), ("eval",), ("eval", "run"), ("serve",), ("serve", "run"), ("bench",), ("run",), ("tune",), ("verify",),
        ("plan",), ("profile",)]


@pytest.mark.parametrize("path", MAIN, ids=lambda p: " ".join(p))
def test_main_commands_show_examples_line_by_line(path):
    out = runner.invoke(app, [*path, "--help"]).stdout
    assert "\n  Examples:\n" in out
    block = out.split("\n  Examples:\n", 1)[1]
    commands = [line.strip() for line in block.splitlines() if line.strip().startswith("infertool ")]
    assert len(commands) >= 3
    verb = "eval" if path[0] == "eval" else path[0]
    assert any(c.startswith(f"infertool {verb} ") for c in commands)
    for c in commands:  # each example on its own line, whole (no rewrapping)
        assert f"\n    {c}\n" in out + "\n"


# ------------------------------------------------------------------------------- 8. exit codes
def test_documented_exit_codes_match_errors_module():
    from infertool import errors

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    table = dict(re.findall(r"^\s*\|\s*(\d+)\s*\|\s*(.+?)\s*\|\s*$", text, flags=re.M))
    assert set(table) == {"0", "1", "2", "3", "4", "5", "6", "130"}
    assert "internal" in table[str(errors.EXIT_INTERNAL)] and "signature" in table[str(errors.EXIT_SIGNATURE)]
    assert "usage" in table[str(errors.EXIT_USAGE)] and "environment" in table[str(errors.EXIT_BACKEND)]
    assert "runtime" in table[str(errors.EXIT_RUNTIME)] and "verdict" in table[str(errors.EXIT_VERDICT_FAILED)]
    assert "tune" in table["1"]
