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
