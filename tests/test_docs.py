"""The reference documentation that is generated cannot drift from the code."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_recipe_reference_matches_the_schema():
    from infertool.recipe_docs import reference

    doc = (ROOT / "docs" / "recipe.md").read_text(encoding="utf-8")
    assert doc == reference(), "docs/recipe.md is stale: run `python -m infertool.recipe_docs > docs/recipe.md`"


def test_every_recipe_section_and_field_is_documented():
    from infertool.recipe import Recipe, ServeSection

    doc = (ROOT / "docs" / "recipe.md").read_text(encoding="utf-8")
    for name in Recipe.model_fields:
        assert f"| `{name}` |" in doc
    for name in ServeSection.model_fields:
        assert f"| `{name}` |" in doc


def test_readme_is_a_first_read_and_its_links_hold():
    """README.md is what a newcomer reads in five minutes: short, the two commands, the GPU quick path; the
    reference lives in docs/, and every link to it resolves."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 120
    assert "make demo" in readme and "make test" in readme and "## Your own model on a GPU box" in readme
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert links and all((ROOT / link).is_file() for link in links), links
    for doc in (ROOT / "docs").glob("*.md"):
        assert f"docs/{doc.name}" in readme, f"README does not point to {doc.name}"


def test_every_command_is_documented():
    from typer.main import get_command

    from infertool.cli import app

    commands = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md"))
    for name in get_command(app).commands:
        assert f"infertool {name}" in commands, f"`infertool {name}` is not in docs/"
