"""Counts of loose typing in a package, per subpackage and overall (docs/development.md keeps the tables).

    python scripts/type_counts.py [PACKAGE_DIR]      (default: infertool)
    python scripts/type_counts.py --uncommented [PACKAGE_DIR]   (list them: path:line: annotation)

Columns:
  any_ann   annotations that name Any anywhere (parameters, returns, annotated assignments; dict[str, Any] counts)
  bare_any  annotations that are exactly Any
  uncommented  annotations naming Any without a `# Any: why` comment on one of their lines (the rule: none)
  get_lit   .get("...") calls with a string-literal key (a dict read where a typed field could be)
  or_get    (x or {}).get( chains
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import Counter
from pathlib import Path

COLUMNS = ("any_ann", "bare_any", "uncommented", "get_lit", "or_get")
ANY_COMMENT = "# Any:"


def names(node: ast.expr, ident: str) -> bool:
    """Whether an annotation names ``ident`` anywhere (``x.ident`` too; string annotations parsed)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id == ident:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == ident:
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and ident in sub.value:
            try:
                inner = ast.parse(sub.value, mode="eval").body
            except SyntaxError:
                continue
            if names(inner, ident):
                return True
    return False


def _names_any(node: ast.expr) -> bool:
    return names(node, "Any")


def _is_bare_any(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any") or (
        isinstance(node, ast.Constant) and node.value == "Any")


def _annotations(tree: ast.AST) -> list[ast.expr]:
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            out.append(node.annotation)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            out.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            out.append(node.returns)
    return out


def _is_empty_dict(node: ast.expr) -> bool:
    return (isinstance(node, ast.Dict) and not node.keys) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict"
        and not node.args and not node.keywords)


def _any_comment_lines(source: str) -> set[int]:
    """The lines holding a `# Any: why` comment."""
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT and tok.string.startswith(ANY_COMMENT)}


def uncommented_any(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, annotation) for each annotation naming Any with no `# Any:` comment on any of its lines."""
    tree = ast.parse(source, filename=filename)
    commented = _any_comment_lines(source)
    out = []
    for ann in _annotations(tree):
        lines = range(ann.lineno, (ann.end_lineno or ann.lineno) + 1)
        if _names_any(ann) and not commented.intersection(lines):
            out.append((ann.lineno, ast.unparse(ann)))
    return sorted(out)


def count_file(path: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    counts["uncommented"] = len(uncommented_any(source, str(path)))
    for ann in _annotations(tree):
        if _names_any(ann):
            counts["any_ann"] += 1
        if _is_bare_any(ann):
            counts["bare_any"] += 1
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
            continue
        if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            counts["get_lit"] += 1
        target = node.func.value
        if isinstance(target, ast.BoolOp) and isinstance(target.op, ast.Or) and _is_empty_dict(target.values[-1]):
            counts["or_get"] += 1
    return counts


def main(argv: list[str]) -> int:
    args = argv[1:]
    listing = "--uncommented" in args
    args = [a for a in args if a != "--uncommented"]
    root = Path(args[0] if args else "infertool")
    if listing:
        found = [(path, line, ann) for path in sorted(root.rglob("*.py"))
                 for line, ann in uncommented_any(path.read_text(encoding="utf-8"), str(path))]
        for path, line, ann in found:
            print(f"{path}:{line}: {ann}")
        return 1 if found else 0
    per: dict[str, Counter[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        group = f"{root.name}/{rel.parts[0]}/" if len(rel.parts) > 1 else f"{root.name}/*.py"
        per.setdefault(group, Counter()).update(count_file(path))
    total: Counter[str] = Counter()
    for c in per.values():
        total.update(c)
    width = max(len(g) for g in [*per, "overall"])
    print(f"| {'package'.ljust(width)} | " + " | ".join(COLUMNS) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("-" * (len(c) + 2) for c in COLUMNS) + "|")
    for group, c in [*sorted(per.items()), ("overall", total)]:
        print(f"| {group.ljust(width)} | " + " | ".join(str(c[k]).rjust(len(k)) for k in COLUMNS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
