"""`infertool --help` must stay light: no torch, transformers or vllm (docs/architecture.md)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["torch", "transformers", "vllm", "gptqmodel", "llmcompressor", "numpy", "pydantic"]


def _modules_after(argv: list[str]) -> set[str]:
    code = (
        "import sys, json\n"
        "from infertool.cli import app\n"
        "try:\n"
        f"    app({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return set(json.loads(r.stderr.strip().splitlines()[-1]))


def test_help_imports_nothing_heavy():
    loaded = _modules_after(["--help"])
    assert "typer" in loaded  # the check itself works
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_subcommand_help_imports_nothing_heavy():
    for argv in (["env", "--help"], ["model", "--help"], ["validate", "--help"], ["--version"]):
        loaded = _modules_after(argv)
        assert not loaded & {"torch", "transformers", "vllm", "gptqmodel"}, argv


def test_command_modules_keep_their_annotations_as_objects():
    """Typer reads every command's signature at start-up with typing.get_type_hints: a string annotation (what
    `from __future__ import annotations` makes of all of them) is compiled and evaluated there, about 400 of
    them for `infertool --help`, half of its cost over bare Python. Command modules write annotations as objects
    (a TYPE_CHECKING-only name stays quoted)."""
    from pathlib import Path

    import infertool

    root = Path(infertool.__file__).parent
    offenders = [p.name for p in [root / "cli.py", *sorted((root / "commands").glob("*.py"))]
                 if "from __future__ import annotations" in p.read_text()]
    assert not offenders, offenders
