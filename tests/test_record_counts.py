"""benchmarks/record_counts.py, the measure of issue 40, counts what it says on planted source."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("record_counts", ROOT / "benchmarks" / "record_counts.py")
assert _spec is not None and _spec.loader is not None
record_counts = importlib.util.module_from_spec(_spec)
sys.modules["record_counts"] = record_counts
_spec.loader.exec_module(record_counts)

PLANTED = '''\
import operator
from operator import itemgetter

class Figure:
    class Figure:  # nested: a second definition of the name
        pass

def f(a: object, b: "object", *args: object, c: object | None = None, d: dict[str, object] = {},
      e: int = 0, **kw: object) -> object:
    x = a.get("k")
    y = a.get("k", 1)
    z = a.get(key)          # not a literal
    w = a.get(1)            # not a string
    q = "no.get('x') in a string"
    a["one"] = a["two"]     # two subscripts
    a[0], a[name]           # neither
    getattr(a, "attr")
    getattr(a, "attr", None)
    getattr(a, name)
    operator.itemgetter("k")
    itemgetter("k", "j")
    operator.attrgetter("k")
    a.__getitem__("k")
    return b

def g(s: str) -> list[tuple[str, object]]:
    return []

async def h(x: int) -> int:
    return x
'''


def test_counts_planted_source() -> None:
    c, classes = record_counts.count_source(PLANTED)
    assert c["get"] == 2
    assert c["sub"] == 2
    # a, "object", c (object | None), d (dict[str, object]), the return of f and g; not e, not h
    assert c["object"] == 6
    assert c["object_var"] == 2  # *args and **kw, shown apart
    assert c["getattr"] == 6  # two getattr, two itemgetter, attrgetter, __getitem__
    assert c["lines"] == PLANTED.count("\n")
    assert classes == ["Figure", "Figure"]


def test_measure_lists_big_modules_and_duplicate_classes(tmp_path: Path) -> None:
    pkg = tmp_path / "infertool"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "big.py").write_text("class A:\n    pass\n" + "x = 1\n" * 400)
    (pkg / "small.py").write_text("class A:\n    pass\nclass B:\n    pass\n")
    (pkg / "sub" / "__init__.py").write_text("d = {}\nd.get('k')\n" + "x = 1\n" * 500)  # not top-level
    counts = record_counts.measure(tmp_path)
    assert counts.big_modules() == {"infertool/big.py": 402}
    assert counts.duplicate_classes() == {"A": 2}
    assert counts.total("get") == 1
    packages = counts.packages()
    assert packages["sub"]["get"] == 1 and packages["big.py"]["lines"] == 402


def test_measures_a_revision_beside_the_tree(tmp_path: Path) -> None:
    """--base: the revision's package comes out of git archive and is measured the same way."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "infertool").mkdir()
    (tmp_path / "infertool" / "m.py").write_text("d = {}\nd.get('a')\nd['b']\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    (tmp_path / "infertool" / "m.py").write_text("d = {}\n")
    base = record_counts.measure_revision("HEAD", repo=tmp_path)
    tree = record_counts.measure(tmp_path)
    assert (base.total("get"), base.total("sub")) == (1, 1)
    assert (tree.total("get"), tree.total("sub")) == (0, 0)
    text = record_counts.report(tree, base, "HEAD")
    assert "get" in text and "PASS" in text
