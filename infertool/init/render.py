"""The recipe as commented YAML: each choice's reason above its key (values through yaml.safe_dump)."""

from __future__ import annotations

import textwrap

from infertool.init.base import Choice, one_line
from infertool.schema import YAMLValue

COMMENT_WIDTH = 110

# ------------------------------------------------------------------------------------------- YAML
_SECTIONS = ("model", "target", "quantize", "eval", "profile", "serve", "bench", "run", "tune")


def _comment(text: str, indent: int) -> list[str]:
    pad = " " * indent
    width = max(40, COMMENT_WIDTH - indent - 2)
    return [f"{pad}# {line}" for line in textwrap.wrap(one_line(text), width, break_long_words=False,
                                                        break_on_hyphens=False)] or []


def yaml_value(value: object) -> str:
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
