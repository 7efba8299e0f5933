"""The recipe reference, generated from the schema itself (infertool/recipe/), so that it cannot drift:
docs/recipe.md is this module's output, and a test fails when they differ
(`python -m infertool.recipe_docs > docs/recipe.md` regenerates it).
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Callable, Literal, Union, cast, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

INTRO = """# Recipe reference

Generated from the schema (`infertool/recipe.py`) by `python -m infertool.recipe_docs`; a test checks that
this file matches it. Every section is optional except `name` and `model`; unknown keys are errors. A value
in `--set a.b=VALUE` is read as YAML. Field names follow the libraries they feed (vLLM's flags under `serve`,
GPTQModel's names under `quantize`).

Limits: a recipe file is at most 1 MiB. Every number has the range a real deployment could have (shown
below; e.g. `max_model_len` ≤ 10,000,000 tokens, parallel sizes ≤ 1024, KV space ≤ 65536 GiB,
`bench.requests` ≤ 1,000,000), and a boolean is never accepted as a number. `group_size` is -1 or a power
of two from 16 to 1024. Paths, model references, hosts and names are single-line text (no line breaks or
control characters), names at most 200 characters. At most 50 errors are listed; the rest are counted.
"""


def _type_name(annotation: Any) -> str:  # Any: a typing form (Annotated, Union, a model...)
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *meta = get_args(annotation)
        text = _type_name(base)
        bounds = []
        for m in meta:
            for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "len ≥"),
                              ("max_length", "len ≤")):
                for c in getattr(m, "metadata", []) if isinstance(m, FieldInfo) else [m]:
                    v = getattr(c, attr, None)
                    if v is not None:
                        bounds.append(f"{sym} {v}")
        return text + (f" ({', '.join(bounds)})" if bounds else "")
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        names = [_type_name(a) for a in args]
        return " or ".join(names)
    if origin in (list, tuple):
        args = list(get_args(annotation))
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        k, v = get_args(annotation) or (str, Any)
        return f"mapping {_type_name(k)} → {_type_name(v)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(metadata: list) -> str:
    out = []
    for c in metadata:
        for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "at least"),
                          ("max_length", "len ≤")):
            v = getattr(c, attr, None)
            if v is not None:
                out.append(f"{sym} {v}")
    return f" ({', '.join(out)})" if out else ""


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        try:
            value = cast(Callable[[], Any], field.default_factory)()  # the recipe's factories take no data
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            return "(defaults)"
        return f"`{value!r}`"
    value = field.default
    return "`null`" if value is None else f"`{value!r}`".replace("|", "\\|")


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """Every model reachable from root, in the order they are first met."""
    seen: list[type[BaseModel]] = []

    def walk(annotation: Any) -> None:  # Any: a typing form
        origin = get_origin(annotation)
        if origin is not None:
            for a in get_args(annotation):
                walk(a)
            return
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and annotation not in seen:
            seen.append(annotation)
            for f in annotation.model_fields.values():
                walk(f.annotation)
                for m in f.metadata:
                    walk(m) if not isinstance(m, FieldInfo) else None

    walk(root)
    return seen


def _doc(model: type[BaseModel]) -> str:
    text = (model.__doc__ or "").strip()
    return " ".join(text.split()) if text and not text.startswith("!!!") else ""


def reference() -> str:
    from infertool.recipe import Recipe

    parts = [INTRO]
    for model in _models(Recipe):
        parts += [f"## {model.__name__}", ""]
        if _doc(model):
            parts += [_doc(model), ""]
        parts += ["| field | type | default |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            parts.append(f"| `{name}` | {_type_name(field.annotation)}{_bounds(field.metadata)} | {_default(field)} |")
        parts.append("")
    return "\n".join(parts)


if __name__ == "__main__":  # pragma: no cover - the regeneration command
    import sys

    sys.stdout.write(reference())
