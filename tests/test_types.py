"""`Any` only where a value is truly untyped, each saying why: every annotation in infertool that names `Any`
(a parameter, a return, an annotated assignment; `dict[str, Any]` included) carries a `# Any: why` comment on
one of its lines (docs/development.md, "Conventions"). scripts/type_counts.py finds them (its `uncommented`
column; `--uncommented` lists them)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("type_counts", ROOT / "scripts" / "type_counts.py")
assert _spec is not None and _spec.loader is not None
type_counts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(type_counts)


def test_every_any_in_infertool_says_why():
    found = [f"{path.relative_to(ROOT)}:{line}: {ann}"
             for path in sorted((ROOT / "infertool").rglob("*.py"))
             for line, ann in type_counts.uncommented_any(path.read_text(encoding="utf-8"), str(path))]
    assert not found, ("annotations naming Any without a `# Any: why` comment on their line (give a real type, or "
                       "say why the value is untyped):\n" + "\n".join(found))


def test_the_check_sees_an_uncommented_any():
    """A planted source: the check reports each uncommented Any (bare, nested, quoted, a return, an annotated
    assignment) and accepts a commented one, on any line of a multi-line annotation."""
    source = textwrap.dedent('''
        from typing import Any

        def bare(x: Any) -> int:
            return 0

        def nested(x: int) -> dict[str, Any]:
            return {}

        def quoted(x: "list[Any]") -> None:
            y: Any = x  # a comment, but not the one that says why

        def commented(x: Any) -> Any:  # Any: a third-party object
            z: dict[str, Any] = {}  # Any: JSON values
            return z

        def multi_line(x: dict[
                str, Any,  # Any: JSON values
        ]) -> None: ...
        ''')
    assert type_counts.uncommented_any(source) == [
        (4, "Any"), (7, "dict[str, Any]"), (10, "'list[Any]'"), (11, "Any")]


def test_the_counts_have_an_uncommented_column(tmp_path):
    (tmp_path / "m.py").write_text("from typing import Any\n\ndef f(x: Any, y: Any) -> Any:  # Any: why\n    return x\n"
                                   "\ndef g(x: Any) -> None: ...\n", encoding="utf-8")
    counts = type_counts.count_file(tmp_path / "m.py")
    assert (counts["any_ann"], counts["bare_any"], counts["uncommented"]) == (4, 4, 1)
