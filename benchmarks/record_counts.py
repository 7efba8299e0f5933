"""How much of infertool still reads facts by string key: the measure of issue 40, the working tree beside a base.

    python benchmarks/record_counts.py [--base REV] [--json] [--detail]

Counts over every ``*.py`` under ``infertool/`` (AST based, so strings and comments never count):

  get       ``x.get("lit")`` / ``x.get('lit', default)``: a call of an attribute named ``get`` whose first argument is a
            string literal (dicts, and anything else spelled that way)
  sub       ``x["lit"]``: a subscript by a string literal, read or written (``d["k"] = v`` counts too)
  object    parameters and returns annotated with ``object`` ANYWHERE in the annotation: bare ``object``,
            ``object | None``, ``dict[str, object]``, ``Callable[[], object]``, ``list[tuple[str, object]]``, string
            annotations parsed likewise. Parameters are positional-only, ordinary and keyword-only ones; ``*args`` and
            ``**kwargs`` are shown apart (``object_var``), not in ``object``: this is the definition that gives the
            issue's 130 at 1ee76e7 (bare ``object`` only: 97; with ``*args``/``**kwargs``: 133; annotated
            assignments are not parameters and are not counted)
  getattr   ``getattr(x, "lit"[, d])`` and ``operator.itemgetter("lit", ...)`` / ``attrgetter("lit")`` with a string
            literal, and ``x.__getitem__("lit")``: lookups by name that must not grow while the others fall
  lines     lines (newline characters, as ``wc -l`` counts them)
  big       top-level modules of infertool/ over 400 lines (a package's ``__init__`` is not top-level)
  dup       class names defined more than once anywhere in infertool/ (nested classes included)

The base is extracted with ``git archive`` into a temporary directory and measured the same way, so one run prints
both sides, the ratio (tree / base) and the issue's targets with PASS or "over" for the working tree.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASE = "1ee76e7"
MAX_MODULE_LINES = 400
METRICS = ("get", "sub", "object", "object_var", "getattr", "lines")
# issue 40's targets for the working tree; getattr: "must not grow" (134 at 1ee76e7)
TARGETS = {"get": 250, "sub": 600, "object": 30, "getattr": 134, "lines": 40_000}
LOOKUP_CALLS = ("itemgetter", "attrgetter")


@dataclass
class Counts:
    """One tree's measure: per file the metrics, and the tree-wide lists."""

    files: dict[str, Counter[str]] = field(default_factory=dict)
    classes: Counter[str] = field(default_factory=Counter)

    def total(self, metric: str) -> int:
        return sum(c[metric] for c in self.files.values())

    def packages(self) -> dict[str, Counter[str]]:
        """Per top-level unit of infertool (a package, or a top-level module)."""
        out: dict[str, Counter[str]] = {}
        for rel, c in self.files.items():
            parts = rel.split("/")
            unit = parts[1] if len(parts) > 2 else parts[-1]
            out.setdefault(unit, Counter()).update(c)
        return out

    def big_modules(self) -> dict[str, int]:
        return {rel: c["lines"] for rel, c in sorted(self.files.items())
                if rel.count("/") == 1 and c["lines"] > MAX_MODULE_LINES}

    def duplicate_classes(self) -> dict[str, int]:
        return {name: n for name, n in sorted(self.classes.items()) if n > 1}

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {m: self.total(m) for m in METRICS}
        out["big_modules"] = self.big_modules()
        out["duplicate_classes"] = self.duplicate_classes()
        return out


def _load_type_counts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("type_counts", ROOT / "scripts" / "type_counts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_type_counts = _load_type_counts()


def _names_object(ann: ast.expr) -> bool:
    """Whether an annotation names ``object`` anywhere (string annotations parsed): scripts/type_counts.py's test."""
    return bool(_type_counts.names(ann, "object"))


def _str_const(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _callee(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def count_source(source: str, filename: str = "<source>") -> tuple[Counter[str], list[str]]:
    """The metrics of one module's source, and the names of the classes it defines (nested ones too)."""
    tree = ast.parse(source, filename=filename)
    c: Counter[str] = Counter(lines=source.count("\n"))
    classes: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            classes.append(node.name)
        elif isinstance(node, ast.Subscript):
            c["sub"] += _str_const(node.slice)
        elif isinstance(node, ast.Call):
            name = _callee(node.func)
            if name == "get" and isinstance(node.func, ast.Attribute) and node.args and _str_const(node.args[0]):
                c["get"] += 1
            elif name == "getattr" and len(node.args) >= 2 and _str_const(node.args[1]):
                c["getattr"] += 1
            elif name in LOOKUP_CALLS and any(_str_const(a) for a in node.args):
                c["getattr"] += 1
            elif name == "__getitem__" and node.args and _str_const(node.args[0]):
                c["getattr"] += 1
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            anns = [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs] + [node.returns]
            c["object"] += sum(1 for ann in anns if ann is not None and _names_object(ann))
            c["object_var"] += sum(1 for x in (a.vararg, a.kwarg)
                                   if x is not None and x.annotation is not None and _names_object(x.annotation))
    return c, classes


def measure(tree_root: Path, package: str = "infertool") -> Counts:
    """Count every module under tree_root/package."""
    out = Counts()
    for path in sorted((tree_root / package).rglob("*.py")):
        rel = path.relative_to(tree_root).as_posix()
        counts, classes = count_source(path.read_text(encoding="utf-8"), rel)
        out.files[rel] = counts
        out.classes.update(classes)
    return out


def measure_revision(rev: str, repo: Path = ROOT, package: str = "infertool") -> Counts:
    """The same count on a git revision: its package extracted by ``git archive`` into a temporary directory."""
    blob = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev, package],
                          check=True, capture_output=True).stdout
    with tempfile.TemporaryDirectory(prefix="record-counts-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(tmp, filter="data")
        return measure(Path(tmp), package)


def _ratio(now: int, base: int) -> str:
    return f"{now / base:.2f}" if base else "-"


def report(tree: Counts, base: Counts, rev: str, detail: bool = False) -> str:
    lines = [f"infertool/: working tree against {rev}", "",
             f"{'metric':<11}{'base':>8}{'tree':>8}{'ratio':>7}{'target':>9}  verdict"]
    for m in METRICS:
        now, was = tree.total(m), base.total(m)
        target = TARGETS.get(m)
        verdict = "-" if target is None else ("PASS" if now <= target else f"over by {now - target}")
        shown = "-" if target is None else str(target)
        lines.append(f"{m:<11}{was:>8}{now:>8}{_ratio(now, was):>7}{shown:>9}  {verdict}")
    big, dup = tree.big_modules(), tree.duplicate_classes()
    lines += [f"{'big':<11}{len(base.big_modules()):>8}{len(big):>8}{'':>7}{0:>9}  {'PASS' if not big else 'over'}",
              f"{'dup':<11}{len(base.duplicate_classes()):>8}{len(dup):>8}{'':>7}{0:>9}  {'PASS' if not dup else 'over'}",
              "", f"{'package':<24}" + "".join(f"{m:>16}" for m in ("get", "sub", "object", "getattr", "lines"))]
    now_pk, was_pk = tree.packages(), base.packages()
    for unit in sorted(set(now_pk) | set(was_pk), key=lambda u: -(now_pk.get(u, Counter())["lines"])):
        n, w = now_pk.get(unit, Counter()), was_pk.get(unit, Counter())
        lines.append(f"{unit:<24}" + "".join(f"{w[m]:>7} -> {n[m]:<6}" for m in ("get", "sub", "object", "getattr", "lines")))
    if big:
        lines += ["", "top-level modules over 400 lines: " + ", ".join(f"{k} ({v})" for k, v in big.items())]
    if dup:
        lines += ["", "class names defined twice or more: " + ", ".join(f"{k} ({v})" for k, v in dup.items())]
    if detail:
        lines += ["", "per file (tree): " + "  ".join(f"{m}" for m in METRICS)]
        for rel, c in sorted(tree.files.items()):
            lines.append(f"  {rel:<50}" + " ".join(f"{c[m]:>6}" for m in METRICS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--base", default=DEFAULT_BASE, help=f"git revision to compare with (default {DEFAULT_BASE})")
    ap.add_argument("--json", action="store_true", help="print both sides as JSON")
    ap.add_argument("--detail", action="store_true", help="also list the working tree per file")
    args = ap.parse_args(argv)
    tree, base = measure(ROOT), measure_revision(args.base)
    if args.json:
        now = tree.summary()
        verdicts = {m: {"target": t, "pass": tree.total(m) <= t} for m, t in TARGETS.items()}
        print(json.dumps({"base": {"rev": args.base, **base.summary()}, "tree": now, "targets": verdicts,
                          "packages": {u: dict(c) for u, c in sorted(tree.packages().items())}}, indent=2))
    else:
        print(report(tree, base, args.base, args.detail))
    return 0


if __name__ == "__main__":
    sys.exit(main())
