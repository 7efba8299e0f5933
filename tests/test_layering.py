"""The package graph reads top-down: no import cycle of any length between infertool's packages or modules
(lazy imports inside functions count), no module imports another package's private names, the leaves stay
leaves, and there is one free-port helper, one process-group stopper, one way to register a command, and one
way to write or delete a file (infertool.atomic). Issue 40: one class per name, no top-level module over 400 lines,
one JSONL reader (infertool.inputs), and a value read from JSON indexed by a string literal only in the readers of
foreign formats (infertool's own files are read through their producer's record, by attribute)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "infertool"


@functools.cache  # parsed once per session: every test reads the same trees, none changes them
def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        out[".".join(rel.parts)] = ast.parse(path.read_text(encoding="utf-8"))
    return out


def _imports(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, [a.name for a in node.names]))
    return found


def _unit(module: str) -> str | None:
    """The top-level unit of infertool a module belongs to (a package or a top-level module)."""
    parts = module.split(".")
    if parts[0] != "infertool" or len(parts) < 2:
        return None
    return parts[1]


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    units = {_unit(m) for m in mods} - {None}
    edges: dict[str, set[str]] = {}
    for name, tree in mods.items():
        src = _unit(name)
        for target, names in _imports(tree):
            targets = [target] + [f"{target}.{n}" for n in names]
            for t in targets:
                dst = _unit(t)
                if dst in units and dst != src and src is not None and not dst.startswith("_"):
                    edges.setdefault(src, set()).add(dst)
    return edges


def _module_graph() -> dict[str, set[str]]:
    """infertool's modules and the modules each imports (lazy imports inside functions included). A package's face
    is its ``__init__``: ``from pkg import name`` reads the face, ``from pkg import submodule`` the submodule."""
    mods = _modules()
    edges: dict[str, set[str]] = {}
    for name, tree in mods.items():
        for target, names in _imports(tree):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods or f"{target}.{n}.__init__" in mods]
            face = f"{target}.__init__" if f"{target}.__init__" in mods else target
            for t in subs + ([face] if len(subs) < len(names) or not names else []):
                t = f"{t}.__init__" if f"{t}.__init__" in mods else t
                if t in mods and t != name:
                    edges.setdefault(name, set()).add(t)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle path per strongly connected component of more than one node (Tarjan's algorithm), as
    [a, b, ..., a]: a cycle of any length, the shortest one through the component's first node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for n in sorted(edges):
        if n not in index:
            connect(n)
    return [_shortest_cycle(edges, c) for c in sorted(components)]


def _shortest_cycle(edges: dict[str, set[str]], component: list[str]) -> list[str]:
    """The shortest path from the component's first node back to itself, inside the component (breadth first)."""
    start, inside = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(edges.get(node, set()) & inside):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return path[::-1] + [start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def _shown(cycles: list[list[str]]) -> str:
    return "; ".join(" -> ".join(c) for c in cycles)


def test_cycle_finder_sees_any_length_and_lazy_imports() -> None:
    """The finder itself: a cycle of three (and of two) with its path, and an import inside a function is an edge."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"x": {"y"}, "y": {"x", "z"}, "z": set()}) == [["x", "y", "x"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    lazy = ast.parse("def f():\n    if True:\n        from infertool.evaluate.decode import DecodePhase\n")
    assert _imports(lazy) == [("infertool.evaluate.decode", ["DecodePhase"])]


def test_module_graph_sees_a_package_face() -> None:
    """A name taken from a package is an edge to its ``__init__`` (a cycle through a face is a cycle), a submodule
    taken from it an edge to that submodule."""
    edges = _module_graph()
    assert "infertool.resolve.__init__" in edges["infertool.commands.quantize"]  # from infertool.resolve import ...
    assert "infertool.quantize.core" in edges["infertool.commands.quantize"]  # from infertool.quantize import core
    assert "infertool.bench.core" in edges["infertool.bench.__init__"]


def test_no_package_cycles() -> None:
    """Packages (and top-level modules) import down only: no cycle of any length, lazy imports included."""
    cycles = _cycles(_graph())
    assert not cycles, "package import cycles: " + _shown(cycles)


def test_no_module_cycles() -> None:
    """Modules too, inside a package and across them (evaluate.decode -> server_engine -> phases -> decode once
    closed a cycle through two lazy imports; envs.manage <-> envs.runner another)."""
    cycles = _cycles(_module_graph())
    assert not cycles, "module import cycles: " + _shown(cycles)


def test_no_private_names_across_packages():
    bad = []
    for name, tree in _modules().items():
        for target, names in _imports(tree):
            if _unit(target) is None or _unit(target) == _unit(name):
                continue
            for n in names:
                if n.startswith("_") and n != "__version__":
                    bad.append(f"{name} imports {target}.{n}")
            if any(part.startswith("_") and part not in ("__init__",) for part in target.split(".")[1:]):
                bad.append(f"{name} imports private module {target}")
    assert not bad, "\n".join(bad)


def test_leaves_stay_leaves():
    edges = _graph()
    assert edges.get("perf", set()) <= {"errors"}, edges.get("perf")
    assert edges.get("procs", set()) == set(), edges.get("procs")
    assert edges.get("errors", set()) == set()
    for leaf in ("records", "capability", "schema", "net", "outpaths", "faults"):  # every layer writes, types, contracts and talks HTTP with these
        assert edges.get(leaf, set()) == set(), (leaf, edges.get(leaf))
    assert edges.get("atomic", set()) <= {"outpaths", "faults"}, edges.get("atomic")  # its checks and its test hook
    assert edges.get("summaries", set()) <= {"records"}, edges.get("summaries")
    for user in ("plan", "profile", "serve"):
        assert "perf" in edges.get(user, set()), f"{user} should take its math and host facts from infertool.perf"


def _defs(tree: ast.Module) -> set[str]:
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_one_free_port_helper_and_one_group_stopper():
    mods = _modules()
    for name, tree in mods.items():
        defs = _defs(tree)
        if name != "infertool.procs":
            assert not defs & {"free_port", "_free_port", "group_members", "_stop_group", "stop_group"}, name
        src = (PKG.parent / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8")
        if name != "infertool.procs":
            assert "os.killpg" not in src, f"{name} signals a process group itself: use infertool.procs.stop_group"
            assert ".bind((" not in src or name == "infertool.serve.lint", f"{name} binds sockets itself: use infertool.procs"


def test_host_facts_decided_in_one_place():
    for name, tree in _modules().items():
        if name == "infertool.perf.host":
            continue
        src = (PKG.parent / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8")
        for needle in ("/proc/driver/nvidia", "/proc/cpuinfo", "/proc/meminfo", "nvidia-smi\""):
            assert needle not in src, f"{name} reads {needle} itself: ask infertool.perf.host"


def test_commands_register_one_way():
    """cli.py defines no command of its own: every command module under infertool/commands has register(app)."""
    cli = _modules()["infertool.cli"]
    decorated = [n.name for n in ast.walk(cli) if isinstance(n, ast.FunctionDef)
                 and any("command" in ast.unparse(d) for d in n.decorator_list)]
    assert decorated == [], decorated
    for path in (PKG / "commands").glob("*.py"):
        if path.name.startswith("_"):
            continue
        assert "register" in _defs(ast.parse(path.read_text(encoding="utf-8"))), path.name


def test_every_file_write_goes_through_atomic():
    """Whole files or none: a rename into place lives in infertool.atomic only (write_text / write_json /
    atomic_path / atomic_dir / replace_dir / move_into_place), and JSON is written by its one writer."""
    bad = []
    for name, tree in _modules().items():
        if name == "infertool.atomic":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = ast.unparse(node.func)
                if f in ("os.replace", "os.rename", "shutil.move", "json.dump"):
                    bad.append(f"{name}:{node.lineno} {f}")
                if f.endswith(".write_text") or f.endswith(".write_bytes"):
                    bad.append(f"{name}:{node.lineno} {f}")
    assert not bad, "writes outside infertool.atomic:\n" + "\n".join(bad)


DELETERS = ("shutil.rmtree", "os.remove", "os.unlink", "os.rmdir", "os.removedirs")
DELETER_NAMES = {d.rsplit(".", 1)[1] for d in DELETERS}


def _deletions(name: str, tree: ast.Module) -> list[str]:
    """Every deletion a module makes itself: a call of shutil.rmtree, os.remove / unlink / rmdir / removedirs,
    Path.unlink / rmdir (any ``.unlink(`` / ``.rmdir(`` call), or one of those names imported from os or shutil."""
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            bad += [f"{name}:{node.lineno} from {node.module} import {a.name}" for a in node.names
                    if a.name in DELETER_NAMES]
        if isinstance(node, ast.Call):
            f = ast.unparse(node.func)
            if f in DELETERS or (isinstance(node.func, ast.Attribute) and node.func.attr in ("unlink", "rmdir")):
                bad.append(f"{name}:{node.lineno} {f}")
    return bad


def test_deletion_rule_catches_planted_examples() -> None:
    planted = ast.parse("import os, shutil\nfrom shutil import rmtree\n"
                        "def clean(p):\n    shutil.rmtree(p, ignore_errors=True)\n    os.remove(p)\n"
                        "    (p / 'x').unlink(missing_ok=True)\n    p.rmdir()\n    rmtree(p)\n")
    assert _deletions("planted", planted) == [
        "planted:2 from shutil import rmtree", "planted:4 shutil.rmtree", "planted:5 os.remove",
        "planted:6 (p / 'x').unlink", "planted:7 p.rmdir"]
    fine = ast.parse("from infertool.atomic import remove_inside\nremove_inside(p, root, ignore_errors=True)\n")
    assert _deletions("fine", fine) == []


def test_every_deletion_goes_through_remove_inside() -> None:
    """Nothing outside a folder the caller owns is ever deleted: every deletion is atomic.remove_inside(target,
    inside), so no module but infertool.atomic removes a file or a folder itself."""
    bad = [d for name, tree in _modules().items() if _unit(name) != "atomic" for d in _deletions(name, tree)]
    assert not bad, "deletions outside infertool.atomic (use atomic.remove_inside):\n" + "\n".join(bad)


MAX_FUNCTION_LINES = 120


def test_no_function_over_120_lines():
    """A reader sees a function's steps: none is longer than 120 lines (issue 24: make_recipe was 251)."""
    long = []
    for name, tree in _modules().items():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES:
                long.append(f"{name}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)")
    assert not long, "functions over 120 lines:\n" + "\n".join(long)


# The one registry shape (infertool.registry.Registry) and the one registry of each kind: worker tasks, stages
# (run's and tune's), quantization backends, recipe checks, each filled in one place. Commands register with the
# Typer app through their module's register(app) (test_commands_register_one_way).
REGISTRIES = {"infertool.tasks", "infertool.stages.registry", "infertool.backends.registry", "infertool.checks.registry"}


def test_one_registry_of_tasks_stages_checks_and_backends():
    """One Registry class (infertool.registry), one instance per kind, in its registry module; no second registry
    elsewhere: no other class named *Registry, no `register*` function, no module-level *REGISTRY* / *BACKENDS* /
    *STAGES* / *CHECKS* table (the stage names' Literal, the backend tables, the pipeline's parallel stage
    tables and the task_defs modules were such second lists); the builtin lists are BUILTIN."""
    bad, instances = [], {}
    for name, tree in _modules().items():
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef) and n.name.endswith("Registry") and name != "infertool.registry":
                bad.append(f"{name}: class {n.name}")
            if isinstance(n, ast.Call) and ast.unparse(n.func).split("[")[0] == "Registry":
                instances.setdefault(name, []).append(n.lineno)
        if name in REGISTRIES or name == "infertool.registry" or name.startswith("infertool.commands."):
            continue
        for n in tree.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.lstrip("_").startswith("register"):
                bad.append(f"{name}: def {n.name}")
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id != "BUILTIN" and any(
                        w in t.id.upper() for w in ("REGISTRY", "BACKENDS", "STAGES", "CHECKS")):
                    bad.append(f"{name}: {t.id} = ...")
    assert not bad, "a second registry:\n" + "\n".join(bad)
    assert {m: len(lines) for m, lines in instances.items()} == dict.fromkeys(REGISTRIES, 1), instances
    assert _graph().get("registry", set()) <= {"errors"}, "the registry shape is a leaf"


def test_the_launcher_owns_ports():
    """Servers infertool starts get their port from the launcher (picked at start, picked again when taken):
    free_port() is called in infertool.serve.launcher only."""
    callers = sorted(name for name, tree in _modules().items()
                     if any(isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] == "free_port"
                            for n in ast.walk(tree)))
    assert callers == ["infertool.serve.launcher"], callers


def test_resolve_is_the_only_constructor_of_model_refs_and_targets():
    """ModelRef and Target (infertool.resolve) are made by resolve() only: command-line models are its inputs
    (Overrides), a candidate elsewhere is Resolution.candidate_at(path), a target resolve.target_for(...)."""
    bad = []
    for name, tree in _modules().items():
        if name == "infertool.resolve":
            continue
        imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and n.module == "infertool.resolve" for a in n.names}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                f = ast.unparse(n.func)
                if (f in ("ModelRef", "Target") and f in imported) or f in ("resolve.ModelRef", "resolve.Target"):
                    bad.append(f"{name}:{n.lineno} {f}(...)")
    assert not bad, "\n".join(bad)


HTTP_CLIENTS = ("urllib.request", "http.client", "httpx", "requests", "aiohttp", "openai")


def test_one_http_policy():
    """Every exchange with a server goes through infertool.net (no redirects, a deadline per request, bounded
    bodies); only bench's load generator speaks HTTP on its own sockets, for timing, under the same rules."""
    bad = []
    for name, tree in _modules().items():
        if name == "infertool.net":
            continue
        for target, _ in _imports(tree):
            if any(target == c or target.startswith(c + ".") for c in HTTP_CLIENTS):
                bad.append(f"{name} imports {target}: talk to servers through infertool.net")
    assert not bad, "\n".join(bad)


# ---- issue 40: one class per name, no big loose module, JSON read by its readers only ----

MAX_TOP_LEVEL_LINES = 400


def _duplicate_classes(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Class names defined more than once (nested classes included), with where each one is."""
    where: dict[str, list[str]] = {}
    for name, tree in sorted(trees.items()):
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef):
                where.setdefault(n.name, []).append(f"{name}:{n.lineno}")
    return {k: v for k, v in sorted(where.items()) if len(v) > 1}


def test_duplicate_class_finder_sees_planted_ones() -> None:
    trees = {"a": ast.parse("class Figure:\n    pass\nclass Only:\n    pass\n"),
             "b": ast.parse("def f():\n    class Figure:\n        pass\n")}
    assert _duplicate_classes(trees) == {"Figure": ["a:1", "b:2"]}


def test_one_class_per_name() -> None:
    """A fact has one class (issue 40): no class name is defined twice anywhere in infertool/, private ones too."""
    dups = _duplicate_classes(_modules())
    assert not dups, "class names defined twice or more:\n" + "\n".join(f"{k}: {', '.join(v)}" for k, v in dups.items())


def _big_top_level_modules(root: Path) -> list[str]:
    return [f"{p.name} ({n} lines)" for p in sorted(root.glob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_TOP_LEVEL_LINES]


def test_big_module_finder_sees_a_planted_one(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text("x = 1\n" * 401, encoding="utf-8")
    (tmp_path / "fine.py").write_text("x = 1\n" * 400, encoding="utf-8")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("x = 1\n" * 900, encoding="utf-8")  # inside a package: its own rule
    assert _big_top_level_modules(tmp_path) == ["big.py (401 lines)"]


def test_no_top_level_module_over_400_lines() -> None:
    """The layout shows the architecture: a loose module of infertool/ that passes 400 lines becomes a package with a
    small face, or moves into the package that owns it."""
    big = _big_top_level_modules(PKG)
    assert not big, f"top-level modules over {MAX_TOP_LEVEL_LINES} lines: " + ", ".join(big)


# Calls whose result is JSON read from a file, a pipe or a line (by their last name: json.load / json.loads, the
# inputs' parsers, the run directory's and the models' readers), and a module's own function that returns one of
# them as it is. What they give is a JSON-origin value: only a reader turns it into a record.
JSON_READS = {"json.load", "json.loads", "parse_json", "parse_jsonl", "read_jsonl", "read_json", "read_json_inside",
              "read_json_file"}
# The readers of formats that are not infertool's own, at the edge where they come in: Hugging Face model files,
# the server's streamed chunks, user and public prompt datasets. Everything else reads infertool's own files, and
# reads them through the record of their producer (Record.from_dict), by attribute.
JSON_READERS = {"infertool.inputs", "infertool.models.info", "infertool.bench.client", "infertool.bench.datasets"}


def _callee(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id == "json":
            return "json." + func.attr
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _is_json_read(node: ast.expr, readers: set[str]) -> bool:
    """A reader call, maybe behind ``await`` or ``or {}``."""
    if isinstance(node, ast.Await):
        node = node.value
    if isinstance(node, ast.BoolOp):
        return any(_is_json_read(v, readers) for v in node.values)
    return isinstance(node, ast.Call) and _callee(node.func) in readers


def _literal_lookup(node: ast.AST) -> ast.expr | None:
    """The expression indexed when node is ``x.get("lit"...)`` or ``x["lit"]``."""
    lit = lambda e: isinstance(e, ast.Constant) and isinstance(e.value, str)  # noqa: E731
    if isinstance(node, ast.Subscript) and lit(node.slice):
        return node.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and node.args and lit(node.args[0])):
        return node.func.value
    return None


def _json_literal_lookups(tree: ast.Module, name: str) -> list[str]:
    """``name:line lookup`` for each ``x.get("lit")`` / ``x["lit"]`` where, in the same function, x is a JSON read
    itself, a name bound from one (``=``, ``:=``, a for loop or comprehension over one), or a value looked up in one
    (``data["a"]["b"]``, ``sub = data.get("a")`` then ``sub["b"]``)."""
    readers = JSON_READS | {f.name for f in _functions(tree) if any(
        isinstance(n, ast.Return) and n.value is not None and _is_json_read(n.value, JSON_READS) for n in ast.walk(f))}
    found: set[tuple[int, str]] = set()
    for func in _functions(tree):
        tainted: set[str] = set()

        def origin(expr: ast.expr) -> bool:
            if _is_json_read(expr, readers):
                return True
            if isinstance(expr, ast.Name):
                return expr.id in tainted
            if isinstance(expr, ast.BoolOp):
                return any(origin(v) for v in expr.values)
            inner = _literal_lookup(expr)
            return inner is not None and origin(inner)

        for _ in range(3):  # bindings in any order (loops): a few passes reach the fixed point
            for n in ast.walk(func):
                bound: list[tuple[list[ast.expr], ast.expr]] = []
                if isinstance(n, ast.Assign):
                    bound.append((n.targets, n.value))
                elif isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
                    bound.append(([n.target], n.value))
                elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
                    bound.append(([n.target], n.iter))
                for targets, value in bound:
                    if origin(value):
                        tainted.update(x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name))
        for n in ast.walk(func):
            inner = _literal_lookup(n)
            if inner is not None and origin(inner):
                found.add((n.lineno, ast.unparse(n)[:80]))
    return [f"{name}:{line} {text}" for line, text in sorted(found)]


def test_json_lookup_finder_sees_planted_ones() -> None:
    planted = ast.parse(
        "import json\n"
        "from infertool import inputs\n"
        "def _load(p):\n"
        "    return json.loads(p.read_text())\n"                     # the module's own reader
        "def f(p, text, row):\n"
        "    data = json.loads(text)\n"
        "    a = data.get('a')\n"                                    # 7
        "    for n, doc in inputs.parse_jsonl(text, p, 'w'):\n"
        "        doc['b']\n"                                         # 9
        "    m = _load(p) or {}\n"
        "    m.get('c', {}).get('d')\n"                              # 11: both
        "    sub = data['e']\n"                                      # 12
        "    sub['f']\n"                                             # 13
        "    row.get('g')\n"                                         # a caller's dict: not a JSON read here
        "    with open(p) as fh:\n"
        "        spec = json.load(fh)\n"
        "    return spec['out'], [r['h'] for r in json.loads(text)], read_json_inside(p, 'm.json').get('i')\n"
        "def g(data):\n"
        "    return data.get('a')\n")                                # another function's name: not tainted
    assert _json_literal_lookups(planted, "p") == [
        "p:7 data.get('a')", "p:9 doc['b']", "p:11 m.get('c', {})", "p:11 m.get('c', {}).get('d')",
        "p:12 data['e']", "p:13 sub['f']", "p:17 r['h']", "p:17 read_json_inside(p, 'm.json').get('i')",
        "p:17 spec['out']"]
    typed = ast.parse("def f(text):\n    r = Result.from_dict(json.loads(text))\n    return r.score\n")
    assert _json_literal_lookups(typed, "t") == []


def test_json_read_by_its_reader_only() -> None:
    """JSON exists only at file edges (issue 40): outside the readers of foreign formats, nothing indexes a value read
    from JSON by a string literal; infertool's own files are read through their producer's record, by attribute."""
    bad = [hit for name, tree in _modules().items() if name not in JSON_READERS
           for hit in _json_literal_lookups(tree, name)]
    assert not bad, "JSON-origin values indexed by a string literal outside the readers:\n" + "\n".join(bad)


JSON_PARSERS = {"json.load", "json.loads", "parse_json"}


def _jsonl_loops(tree: ast.Module, name: str) -> list[str]:
    """``name:line`` of each loop (for, or a comprehension) that parses JSON in its body: a JSONL reader of its own."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.For, ast.AsyncFor, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            body = n.body if isinstance(n, (ast.For, ast.AsyncFor)) else [n]
            if any(isinstance(c, ast.Call) and _callee(c.func) in JSON_PARSERS for b in body for c in ast.walk(b)):
                found.append(f"{name}:{n.lineno}")
    return found


def test_jsonl_loop_finder_sees_planted_ones() -> None:
    planted = ast.parse("import json\nfrom infertool import inputs\n"
                        "def a(text):\n    for n, line in enumerate(text.splitlines(), 1):\n        x = inputs.parse_json(line)\n"
                        "def b(lines):\n    return [json.loads(l) for l in lines]\n"
                        "def c(text, p):\n    return inputs.parse_jsonl(text, p, 'what')\n")
    assert _jsonl_loops(planted, "p") == ["p:4", "p:7"]


def test_one_jsonl_reader() -> None:
    """One JSONL reader (issue 40): a loop that parses a line at a time is infertool.inputs.parse_jsonl / read_jsonl,
    nowhere else."""
    loops = [hit for name, tree in _modules().items() if name != "infertool.inputs" for hit in _jsonl_loops(tree, name)]
    assert not loops, "JSONL read line by line outside infertool.inputs (use inputs.parse_jsonl):\n" + "\n".join(loops)
