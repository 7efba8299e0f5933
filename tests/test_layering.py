"""The package graph reads top-down: no import cycle of any length between infertool's packages or modules
(lazy imports inside functions count), no module imports another package's private names, the leaves stay
leaves, and there is one free-port helper, one process-group stopper, one way to register a command, and one
way to write or delete a file (infertool.atomic)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "infertool"


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
    """infertool's modules and the modules each imports (lazy imports inside functions included)."""
    mods = _modules()
    edges: dict[str, set[str]] = {}
    for name, tree in mods.items():
        for target, names in _imports(tree):
            for t in [target] + [f"{target}.{n}" for n in names]:
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
    for leaf in ("atomic", "records", "capability", "schema", "net"):  # every layer writes, types, contracts and talks HTTP with these
        assert edges.get(leaf, set()) == set(), (leaf, edges.get(leaf))
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
    bad = [d for name, tree in _modules().items() if name != "infertool.atomic" for d in _deletions(name, tree)]
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
