"""The reference documentation that is generated cannot drift from the code."""

from __future__ import annotations

import re
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


# --- docs a person reads: short paragraphs, and every command page opens with an example ---------------------

MAX_PARAGRAPH_WORDS = 80
# Not held to the limit: recipe.md, generated from the schema's descriptions (test above).
LONG_PARAGRAPHS_ALLOWED = {"recipe.md"}
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")


def prose_paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a Markdown text, each as one string. Fenced and indented code blocks, tables,
    headings and HTML comments are not prose; a list item counts as a paragraph of its own."""
    out: list[str] = []
    cur: list[str] = []
    fence = None

    def flush():
        if cur:
            out.append(" ".join(cur))
            cur.clear()

    for line in text.splitlines():
        s = line.strip()
        if fence:
            if s.startswith(fence):
                fence = None
            continue
        if s.startswith(("```", "~~~")):
            flush()
            fence = s[:3]
            continue
        if not s or s.startswith(("|", "#", "<!--")) or (line.startswith("    ") and not cur):
            flush()
            continue
        if _ITEM.match(line):
            flush()
        cur.append(s)
    flush()
    return out


def _read_docs() -> dict[str, str]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(f.relative_to(ROOT)): f.read_text(encoding="utf-8") for f in files}


def test_prose_paragraph_counter():
    text = "One two three.\n\n```bash\nnot prose at all\n```\n\n| a | b |\n|---|---|\n\n- item one\n  goes on\n- two\n"
    assert prose_paragraphs(text) == ["One two three.", "- item one goes on", "- two"]


def test_no_prose_paragraph_is_over_80_words():
    """A reader meets short paragraphs: README.md and every page under docs/ (lists count per item)."""
    long = []
    for name, text in _read_docs().items():
        if Path(name).name in LONG_PARAGRAPHS_ALLOWED:
            continue
        for para in prose_paragraphs(text):
            words = len(para.split())
            if words > MAX_PARAGRAPH_WORDS:
                long.append(f"{name}: {words} words: {para[:70]}...")
    assert not long, "split these paragraphs (at most 80 words each):\n" + "\n".join(long)


def _command_pages() -> dict[str, Path]:
    return {p.stem: p for p in sorted((ROOT / "docs" / "commands").glob("*.md"))}


def test_every_command_has_a_page_listed_in_the_index():
    from typer.main import get_command

    from infertool.cli import app

    pages = _command_pages()
    index = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    for name in get_command(app).commands:
        page = {"compare": "report"}.get(name, name)
        assert page in pages, f"docs/commands/{page}.md is missing (`infertool {name}`)"
    for stem in pages:
        assert f"(commands/{stem}.md)" in index, f"docs/commands.md does not link commands/{stem}.md"


def test_every_command_page_opens_with_an_example_before_its_options():
    """What it answers, an example (and its output), then the options table, then the details."""
    for stem, page in _command_pages().items():
        lines = page.read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# infertool "), f"{stem}.md: the title names the command"
        first_code = next((i for i, line in enumerate(lines) if line.startswith("```")), None)
        first_table = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
        assert first_code is not None, f"{stem}.md has no example"
        assert first_table is not None, f"{stem}.md has no options table"
        assert first_code < first_table, f"{stem}.md: the example comes before the options table"
        prose_before = [line for line in lines[1:first_code] if line.strip()]
        assert prose_before, f"{stem}.md: one sentence says what the command answers before the example"
        assert "| option |" in "\n".join(lines[first_table:]), f"{stem}.md: the options table has an option column"


def test_tune_page_leads_with_the_common_case():
    text = (ROOT / "docs" / "commands" / "tune.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings[0] == "Tune for my GPU and my traffic", headings
    details = text.index("## Tune details")
    for internal in ("1,024", "1 - (1 - c)/K", "OUTPUT_SETTINGS"):  # the sample, the looks' confidence, the settings
        assert text.index(internal) > details, f"{internal!r} belongs to the details at the end"


def test_relative_links_and_anchors_in_the_docs_resolve():
    def slugs(text: str) -> set[str]:
        text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}

    broken = []
    for name, text in _read_docs().items():
        here = (ROOT / name).parent
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = link.partition("#")
            target = here / path if path else ROOT / name
            if not target.exists():
                broken.append(f"{name}: {link}")
            elif anchor and target.is_file() and anchor not in slugs(target.read_text(encoding="utf-8")):
                broken.append(f"{name}: {link} (no such heading)")
    assert not broken, broken


def test_every_option_is_in_its_command_page_table():
    """The options tables come from --help: an option added to a command without its row fails here."""
    from typer.main import get_command

    from infertool.cli import app

    missing = []

    def walk(cmd, top):
        if hasattr(cmd, "commands"):
            for sub in cmd.commands.values():
                walk(sub, top)
            return
        page = (ROOT / "docs" / "commands" / f"{ {'compare': 'report'}.get(top, top) }.md").read_text(encoding="utf-8")
        for param in cmd.params:
            if param.param_type_name != "option" or param.hidden or param.name == "help":
                continue
            if f"| `{param.opts[0]}`" not in page:
                missing.append(f"{top}: {param.opts[0]}")

    for name, cmd in get_command(app).commands.items():
        walk(cmd, name)
    assert not missing, missing
