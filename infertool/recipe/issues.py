"""Pydantic's validation errors as RecipeIssues: each with its dotted field path (union tags dropped), its line
and column in the YAML, a plainer message and a "did you mean"."""

from __future__ import annotations

import datetime
import difflib
import types
from collections.abc import Iterable
from typing import Annotated, Any, Literal, TypeGuard, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Discriminator, Tag, ValidationError
from pydantic.fields import FieldInfo

from infertool import backends
from infertool.errors import RecipeIssue
from infertool.recipe.parse import short_repr, type_name
from infertool.recipe.root import PydanticError, Recipe

MAX_LISTED_ISSUES = 50  # errors listed one per line; the rest are counted


_Part = tuple[Literal["key", "index"], Any]


class _LocInfo:
    __slots__ = ("parts", "owner")

    def __init__(self, parts: list[_Part], owner: type[BaseModel] | None):
        self.parts = parts
        self.owner = owner  # the model that holds (or should hold) the last key, when known


def _unwrap(annotation: Any) -> tuple[Any, str | Discriminator | None]:  # Any: typing forms in and out
    """Strip Annotated/Optional layers; return the inner annotation and a discriminator, if any (a field name,
    or a callable ``Discriminator`` whose members carry ``Tag``s: the quantize section)."""
    discriminator: str | Discriminator | None = None
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            base, *metadata = get_args(annotation)
            for meta in metadata:
                if isinstance(meta, FieldInfo) and isinstance(meta.discriminator, str):
                    discriminator = meta.discriminator
                elif isinstance(meta, Discriminator):
                    discriminator = meta
            annotation = base
            continue
        if origin in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation, discriminator


def _is_model(annotation: Any) -> TypeGuard[type[BaseModel]]:  # Any: a typing form
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _tag_map(union: Any, discriminator: str | Discriminator | None) -> dict[str, type[BaseModel]]:  # Any: a typing form (a Union)
    tags: dict[str, type[BaseModel]] = {}
    for member in get_args(union):
        if get_origin(member) is Annotated:  # Annotated[Model, Tag("...")] under a callable Discriminator
            model, *metadata = get_args(member)
            tags.update({m.tag: model for m in metadata if isinstance(m, Tag) and _is_model(model)})
        elif isinstance(discriminator, str) and _is_model(member) and discriminator in member.model_fields:
            for tag in get_args(member.model_fields[discriminator].annotation):
                tags[str(tag)] = member
    return tags


def _analyse_loc(loc: Iterable[int | str]) -> _LocInfo:
    """Follow ``loc`` through the model tree: drop union tags, tell list indices from keys."""
    parts: list[_Part] = []
    annotation: Any = Recipe  # Any: a typing form, followed down the model tree
    discriminator: str | Discriminator | None = None
    owner: type[BaseModel] | None = None
    for segment in loc:
        if segment == "[key]":  # pydantic's marker for "the key itself was invalid"
            continue
        if annotation is not None:
            annotation, found = _unwrap(annotation)
            discriminator = found or discriminator
        if (
            discriminator
            and get_origin(annotation) in (Union, types.UnionType)
            and isinstance(segment, str)
        ):
            tags = _tag_map(annotation, discriminator)
            discriminator = None
            if segment in tags:
                annotation = tags[segment]
                continue
        discriminator = None
        if _is_model(annotation):
            owner = annotation
            field = annotation.model_fields.get(segment) if isinstance(segment, str) else None
            parts.append(("key", segment))
            if field is None:
                annotation = None
            else:
                annotation = field.annotation
                if isinstance(field.discriminator, str):
                    discriminator = field.discriminator
            continue
        origin = get_origin(annotation)
        if origin in (list, tuple, set) and isinstance(segment, int):
            parts.append(("index", segment))
            args = get_args(annotation)
            annotation = args[0] if args else None
            continue
        if origin is dict:
            parts.append(("key", segment))
            args = get_args(annotation)
            annotation = args[1] if len(args) == 2 else None
            continue
        parts.append(("index", segment) if isinstance(segment, int) else ("key", segment))
        annotation = None
    return _LocInfo(parts, owner)


def _format_path(parts: list[_Part]) -> str:
    pieces: list[str] = []
    for kind, value in parts:
        if kind == "index":
            pieces.append(f"[{value}]")
        else:
            key = str(value) if len(str(value)) <= 60 else str(value)[:57] + "..."
            pieces.append(f".{key}" if pieces else key)
    return "".join(pieces) or "<recipe>"


_KeyIndex = dict[str, tuple[yaml.Node, yaml.Mark]]


def _locate(
    node: yaml.Node | None, parts: list[_Part], indexes: dict[int, _KeyIndex] | None = None
) -> tuple[int | None, int | None]:
    """1-based (line, column) of the key at ``parts``; the deepest existing parent otherwise. ``indexes``
    keeps each mapping's key index between calls: locating N keys costs O(N), not O(N x keys)."""
    if node is None:
        return None, None
    indexes = {} if indexes is None else indexes
    mark = node.start_mark
    current: yaml.Node | None = node
    for kind, value in parts:
        found: tuple[yaml.Node, yaml.Mark] | None = None
        if kind == "key" and isinstance(current, yaml.MappingNode):
            found = _key_index(current, indexes).get(str(value))
        elif kind == "index" and isinstance(current, yaml.SequenceNode):
            if isinstance(value, int) and 0 <= value < len(current.value):
                item = current.value[value]
                found = (item, item.start_mark)
        if found is None:
            break
        current, mark = found
    return mark.line + 1, mark.column + 1


def _key_index(mapping: yaml.MappingNode, indexes: dict[int, _KeyIndex]) -> _KeyIndex:
    """key -> (value node, mark of the key) of one mapping, its own keys first, then those merged in (<<)."""
    index = indexes.get(id(mapping))
    if index is not None:
        return index
    index = indexes[id(mapping)] = {}  # before recursing: a merge that refers back finds it (empty)
    merged: list[yaml.MappingNode] = []
    for key_node, value_node in mapping.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            if isinstance(value_node, yaml.MappingNode):
                merged.append(value_node)
            elif isinstance(value_node, yaml.SequenceNode):
                merged.extend(v for v in value_node.value if isinstance(v, yaml.MappingNode))
            continue
        if isinstance(key_node, yaml.ScalarNode):
            index.setdefault(key_node.value, (value_node, key_node.start_mark))
    for other in merged:
        for key, found in _key_index(other, indexes).items():
            index.setdefault(key, found)
    return index


_YAML_SCALARS = (int, float, bool, datetime.date)


def _is_overridden(path: str, overridden: list[str]) -> bool:
    return any(
        path == key or path.startswith(key + ".") or path.startswith(key + "[")
        for key in overridden
    )


def _suggest(key: str, known: list[str]) -> str | None:
    """The known field a mistyped key most likely meant, if any."""
    if len(key) > 100:  # no field name is that long; difflib on it would only cost time
        return None
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return close[0]
    lowered = key.lower()
    if len(lowered) < 3:
        return None
    prefixed = [k for k in known if len(k) >= 3 and (lowered.startswith(k) or k.startswith(lowered))]
    return prefixed[0] if len(prefixed) == 1 else None


def issues_from(
    exc: ValidationError, node: yaml.Node | None, overridden: list[str]
) -> tuple[list[RecipeIssue], int]:
    """The first MAX_LISTED_ISSUES issues in file order, and how many there are: O(errors) (each key is
    located through a per-mapping index; "did you mean" is worked out for the listed ones only)."""
    issues: list[RecipeIssue] = []
    unknown: dict[int, tuple[str, type[BaseModel]]] = {}  # id(issue) -> (the unknown key, its model)
    indexes: dict[int, _KeyIndex] = {}
    for error in map(PydanticError.of, exc.errors(include_url=False)):
        info = _analyse_loc(error.loc)
        parts = list(info.parts)
        kind, message = error.kind, error.message
        refined = error.refined()
        if kind == "extra_forbidden":
            key = str(parts[-1][1]) if parts else "?"
            message = f"unknown field {short_repr(key)}"
        elif kind == "missing":
            key = str(parts[-1][1]) if parts else "?"
            message = f"missing required field {key!r}"
        elif refined is not None:
            under, message = refined
            parts.extend(("key", k) for k in under)
        elif kind in ("model_type", "model_attributes_type", "dict_type", "quantize_method"):
            message = f"expected a mapping (key: value pairs), got a {type_name(error.input)}"
        elif kind == "string_type" and isinstance(error.input, _YAML_SCALARS):
            value = error.input
            message = (
                f"{message} (got {value}, which YAML reads as a {type_name(value)}; "
                "put it in quotes)"
            )
        elif kind not in ("value_error", "bool_number"):
            value = error.input
            if value is None or isinstance(value, str | int | float | bool):
                message = f"{message} (got {short_repr(value)})"

        path = _format_path(parts)
        if _is_overridden(path, overridden):
            line, column = None, None
        else:
            line, column = _locate(node, parts, indexes)
        issue = RecipeIssue(path=path, message=message, line=line, column=column)
        issues.append(issue)
        if kind == "extra_forbidden" and info.owner is not None and parts:
            unknown[id(issue)] = (str(parts[-1][1]), info.owner)
    issues.sort(key=lambda i: (i.line is None, i.line or 0, i.column or 0))
    total = len(issues)
    issues = issues[:MAX_LISTED_ISSUES]
    for issue in issues:
        if id(issue) in unknown:
            key, owner = unknown[id(issue)]
            suggestion = _suggest(key, list(owner.model_fields))
            if suggestion:
                issue.message += f" (did you mean {suggestion!r}?)"
            elif key in (hints := getattr(owner, "FIELD_HINTS", {})):  # what a backend's schema says of a key it lacks
                issue.message += f" ({hints[key]})"
    return issues, total
