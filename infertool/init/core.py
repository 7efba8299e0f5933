"""``init_recipe``, the command's core: make the recipe, apply --set, render it as commented YAML (each
choice's reason above its key, values through yaml.safe_dump), write it, validate it as every command reads it,
and plan it."""

from __future__ import annotations

import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.atomic import move_into_place, remove_inside, write_text
from infertool.errors import UsageError
from infertool.init.base import Choice, init_target, one_line
from infertool.init.make import make_recipe
from infertool.init.options import InitOptions, Pins
from infertool.init.shape import in_recipe_order
from infertool.schema import YAMLValue

if TYPE_CHECKING:
    from infertool.plan import PlanResult
    from infertool.recipe import Recipe


COMMENT_WIDTH = 110

COMMENT_WIDTH = 110

# ------------------------------------------------------------------------------------------- YAML
_SECTIONS = ("model", "target", "quantize", "eval", "profile", "serve", "bench", "run", "tune")


def _comment(text: str, indent: int) -> list[str]:
    pad = " " * indent
    width = max(40, COMMENT_WIDTH - indent - 2)
    return [f"{pad}# {line}" for line in textwrap.wrap(one_line(text), width, break_long_words=False,
                                                        break_on_hyphens=False)] or []


def yaml_value(value: YAMLValue) -> str:
    """One value as YAML on one line (yaml.safe_dump quotes whatever needs quoting)."""
    import json

    import yaml

    if isinstance(value, str) and one_line(value) != value.strip() or isinstance(value, str) and value != value.strip():
        return json.dumps(value)  # a JSON string is a YAML double-quoted scalar: escapes keep it on one line
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=2**31 - 1, allow_unicode=False)
    text = text.removesuffix("\n...\n").rstrip("\n")
    if "\n" in text:
        return json.dumps(value)
    return text


def render_yaml(recipe: dict, decisions: list[Choice], header: list[str] | None = None) -> str:
    """The recipe as YAML with each decision's reason as comments above its key (wrapped, one line each)."""
    why: dict[str, list[Choice]] = {}
    for d in decisions:
        why.setdefault(d.field, []).append(d)
    lines: list[str] = []
    for h in header or []:
        lines += _comment(h, 0)
    if lines:
        lines.append("")
    placed: set[str] = set()

    def comments(path: str, indent: int) -> None:
        for d in why.get(path, []):
            prefix = {"error": "DOES NOT FIT: ", "warning": "NOTE: "}.get(d.level, "")
            text = d.why if d.why.startswith(prefix.strip()) else prefix + d.why
            lines.extend(_comment(text, indent))
        placed.add(path)

    def emit(key: str, value: YAMLValue, indent: int, path: str) -> None:
        comments(path, indent)
        pad = " " * indent
        block = isinstance(value, dict) and value and (path in _SECTIONS or any(f"{path}.{k}" in why for k in value))
        if block and isinstance(value, dict):
            lines.append(f"{pad}{yaml_value(key)}:")
            for k, v in value.items():
                emit(k, v, indent + 2, f"{path}.{k}")
        else:
            lines.append(f"{pad}{yaml_value(key)}: {yaml_value(value)}")

    for key, value in recipe.items():
        if key in _SECTIONS and lines and lines[-1] != "":
            lines.append("")
        emit(key, value, 0, key)
    rest = [d for d in decisions if d.field not in placed]
    if rest:
        lines.append("")
        for d in rest:
            lines += _comment(f"{d.field}: {d.why}", 0)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- the command's core
@dataclass
class InitResult:
    path: str | None  # the file written; None when printed to stdout
    text: str
    recipe: dict
    decisions: list[Choice]
    target: str
    plan: PlanResult  # the written recipe's plan (what `infertool plan FILE` says)
    original_plan: PlanResult | None  # the original model with the same serve settings (when the eval serves it)
    fits: bool
    reasons: list[str]
    advice: list[str]

    @property
    def exit_code(self) -> int:
        return 0 if self.fits else 1

    def to_dict(self) -> dict:
        return {"ok": self.fits, "exit_code": self.exit_code, "path": self.path, "target": self.target,
                "fits": self.fits, "reasons": self.reasons, "advice": self.advice, "recipe": self.recipe,
                "decisions": [d.to_dict() for d in self.decisions], "yaml": self.text, "plan": self.plan.to_dict(),
                "original_plan": self.original_plan.to_dict() if self.original_plan else None}


def default_out(recipe: dict) -> Path:
    return Path(f"{recipe['name']}.yaml")


def init_recipe(model: str, *, gpu: str | None = None, cpu: bool = False, out: str | None = None,
                force: bool = False, on_event: Callable | None = None,
                options: InitOptions | None = None) -> InitResult:
    """Make the recipe (``options``: --method, --slo, --traffic, --set), apply --set to it, write it (through a
    temporary file and a rename; ``out`` "-": not written), validate the written text with load_recipe and plan
    it as `infertool plan` would."""
    import tempfile

    from infertool import plan as planning
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    target = init_target(gpu, cpu)
    dest = None if out == "-" else Path(out).expanduser() if out else None
    if dest is not None and dest.exists() and not force:
        raise UsageError(f"{dest} already exists", hint="pass --force to replace it, or choose another --out")
    if dest is not None and dest.is_dir():
        raise UsageError(f"{dest} is a directory", hint="--out names the recipe file to write (or - for stdout)")
    options = options or InitOptions()
    pins = options.pins()  # a malformed --set is refused before any work
    recipe, decisions = make_recipe(model, target, on_event=on_event, options=options)
    recipe, decisions = _apply_sets(recipe, decisions, options.sets, pins)
    if dest is None and out != "-":
        dest = default_out(recipe)
        if dest.exists() and not force:
            raise UsageError(f"{dest} already exists", hint="pass --force to replace it, or choose another --out")
    count = recipe["serve"].get("tensor_parallel_size", 1)
    header = [
        f"{recipe['name']}: written by `infertool init` for {model} on {target.describe(count)}.",
        ("Each value says why it was chosen. Check it: `infertool plan FILE`, `infertool quantize FILE --check`. "
         "Answer the question: `infertool run FILE` quantizes, evaluates the quantized model against the original "
         "(PASS / FAIL / INCONCLUSIVE), serves it and benchmarks the traffic below."),
    ]
    text = render_yaml(recipe, decisions, header)

    folder = dest.parent if dest is not None else Path(tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{(dest.name if dest else 'recipe.yaml')}.{uuid.uuid4().hex[:8]}.tmp.yaml"
    try:
        write_text(tmp, text)
        written = _validated(tmp, model, options.sets)  # it parses and validates, as every command reads it
        plan = planning.plan(resolve(written), planning.PlanOptions(predict=True))  # with the model's intervals
        original = None
        if written.eval is not None and written.eval.engine == "vllm" and written.quantize is not None:
            original = planning.plan(resolve(load_recipe(str(tmp), ["serve.model=original"])))
        if dest is not None:
            _publish(tmp, dest, force)
    finally:
        remove_inside(tmp, folder)
    reasons = list(plan.reasons) + [f"the original model (which the eval serves with these settings): {r}"
                                    for r in (original.reasons if original else list[str]())]
    fits = plan.fits and (original is None or original.fits)
    advice = [d.why.removeprefix("DOES NOT FIT: ") for d in decisions if d.level == "error"]
    return InitResult(str(dest) if dest is not None else None, text, recipe, decisions, target.describe(count),
                      plan, original, fits, reasons, advice)


def _validated(tmp: Path, model: str, sets: list[str]) -> Recipe:
    """The recipe written to ``tmp``, loaded as every command loads it. Its errors name init's recipe for
    ``model`` and the --set values, not the temporary file (never kept, so its line numbers are left out)."""
    from infertool.errors import RecipeError, RecipeIssue
    from infertool.recipe import load_recipe

    try:
        return load_recipe(str(tmp))
    except RecipeError as e:
        made = f"the recipe init made for {one_line(model)[:200]}" + (" with --set" if sets else "")
        issues = [RecipeIssue(i.path, i.message) for i in e.issues]
        error = RecipeError(made, issues, hint="fix the --set values named above" if sets else e.hint)
        error.message = made + e.message.removeprefix(e.source)  # "N errors (the first M listed)" kept
        error.args = (error.message,)
        raise error from None


def _apply_sets(recipe: dict, decisions: list[Choice], sets: list[str], pins: Pins) -> tuple[dict, list[Choice]]:
    """--set KEY=VALUE applied to the recipe (the parser every command's --set uses); each said in the recipe.
    The values the fit decided from (``InitOptions.pins``) are already in it, with the fit's reasons."""
    from infertool.recipe import apply_overrides, parse_overrides

    pairs = parse_overrides(list(sets))
    if not pairs:
        return recipe, decisions
    for key, value in pairs:
        _refuse_section_replaced(recipe, key, value)
    recipe = apply_overrides(recipe, pairs)
    for key, value in pairs:
        decided = key in pins.keys and any(d.field == key or key.startswith(d.field + ".") for d in decisions)
        decisions.append(Choice(key, value, "set on the command line (--set); the fit above decided with it"
                                  if decided else "set on the command line (--set)"))
    return recipe, in_recipe_order(recipe, decisions)


# the sections init's fit is: a --set may change their fields, not remove them
_FITTED_SECTIONS = ("model", "serve")


def _refuse_section_replaced(recipe: dict, key: str, value: YAMLValue) -> None:
    """A --set whose key names a section (a mapping init made) and whose value is not a mapping: refused with the
    key, before the recipe is rendered (``--set serve=`` would leave the recipe without its serve settings)."""
    node: object = recipe
    for segment in key.split("."):
        node = node.get(segment) if isinstance(node, dict) else None
    if not isinstance(node, dict) or isinstance(value, dict) or (value is None and key not in _FITTED_SECTIONS):
        return
    fields = ", ".join(list(node)[:3]) + (", ..." if len(node) > 3 else "")
    kind = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list"}.get(type(value), "")
    shown = ("an empty value" if value == "" else "null" if value is None
             else f"{kind or type(value).__name__} ({one_line(repr(value))[:40]})")
    raise UsageError(f"--set {key}: {key} is a section of settings ({fields}), not one value; got {shown}",
                     hint=f"set one of its fields, e.g. --set {key}.{next(iter(node), 'FIELD')}=VALUE"
                          + ("" if key in _FITTED_SECTIONS else f", or remove the section with --set {key}=null"))


def _publish(tmp: Path, dest: Path, force: bool) -> None:
    """Rename the temporary file into place; without ``force`` never replace a file that appeared meanwhile."""
    tmp.chmod(0o644)
    try:
        move_into_place(tmp, dest, replace=force)
    except FileExistsError:
        raise UsageError(f"{dest} already exists", hint="pass --force to replace it, or choose another --out") from None
