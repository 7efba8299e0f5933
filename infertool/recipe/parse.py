"""A recipe's YAML: a SafeLoader that refuses duplicate keys and exotic tags, parse errors as RecipeErrors, and
``--set`` overrides."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Sequence
from typing import Any

import yaml

from infertool.errors import RecipeError, RecipeIssue, UsageError
from infertool.schema import YAMLValue

RECIPES_HINT = (
    "`infertool recipes list` shows the built-in recipes; "
    "`infertool recipes copy NAME .` copies one to edit"
)

Override = tuple[str, YAMLValue]  # a --set: the dotted key and its value, read as YAML


# the tags a recipe may spell out (``!!str 8``, ``!!int "8"``): plain text, numbers, booleans, null, lists and
# mappings. Any other (!!binary, !!timestamp, !!set, !!omap, !!pairs, !!python/..., a local !tag) is refused with
# its field path: PyYAML would turn them into bytes, dates, sets or pairs that a field then reads as text.
_YAML_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge"))


class _RecipeLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a key repeated in one mapping is an error and that a tag written out is
    one of the plain ones (``_YAML_TAGS``): the nodes with another are kept in ``bad_tags`` (refused with their field
    paths by ``_refuse_tags``, and by ``construct_object`` for whoever loads without that check)."""

    def __init__(self, stream: Any) -> None:  # Any: what PyYAML's loader reads (text, bytes or a stream)
        super().__init__(stream)
        self.bad_tags: dict[int, tuple[yaml.Node, str]] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:  # Any: PyYAML's index (its stubs: Any)
        event = self.peek_event()
        tag = getattr(event, "tag", None)  # None: an alias, or no tag written (resolved implicitly)
        node = super().compose_node(parent, index)
        if tag not in (None, "!") and tag not in _YAML_TAGS and node is not None:
            self.bad_tags[id(node)] = (node, tag)
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:  # Any: the YAML value, of any shape
        if id(node) in self.bad_tags:
            raise yaml.constructor.ConstructorError(None, None, f"the tag {_short_tag(node.tag)} is not allowed in a "
                                                    "recipe (a recipe is text: write the value plainly)", node.start_mark)
        return super().construct_object(node, deep=deep)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:  # Any: YAML keys and values
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # unhashable key: SafeConstructor reports it below
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key!r} (first defined on line "
                        f"{first.start_mark.line + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _short_tag(tag: str) -> str:
    """``tag:yaml.org,2002:binary`` as it is written, ``!!binary``; a tag of 60 characters and more cut."""
    short = "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag
    return repr(short[:60] + ("..." if len(short) > 60 else ""))


def _refuse_tags(root: yaml.Node, bad: dict[int, tuple[yaml.Node, str]], source: str) -> None:
    """A RecipeError listing every node written with a tag that is not allowed, by field path and line. The walk
    visits each node once (an alias repeats a node: an alias bomb costs nothing here)."""
    issues, seen, todo = [], set(), [(root, "")]
    while todo:
        node, path = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if id(node) in bad:
            issues.append(RecipeIssue(path=path or "<recipe>", line=node.start_mark.line + 1,
                                      column=node.start_mark.column + 1,
                                      message=f"the YAML tag {_short_tag(node.tag)} is not allowed: a recipe is text; "
                                              "write the value without a tag"))
        children: list[tuple[yaml.Node, str]] = []
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = f"{path}.{key.value if isinstance(key, yaml.ScalarNode) else '?'}".lstrip(".")
                children += [(key, name), (value, name)]
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
        todo += reversed(children)  # in document order: a node an alias repeats is named where it is written
    issues.sort(key=lambda i: (i.line or 0, i.column or 0))
    raise RecipeError(source, issues, hint="a recipe holds text, numbers, booleans, lists and mappings; "
                                           "binary data, dates, sets and object tags are not read")


def parse_yaml(text: str, source: str) -> tuple[Any, yaml.Node | None]:  # Any: the YAML document, of any shape
    """Parse one YAML document; return (data, root node). Errors become RecipeError."""
    loader: _RecipeLoader | None = None
    try:
        loader = _RecipeLoader(text)
        node = loader.get_single_node()
        if node is not None and loader.bad_tags:
            _refuse_tags(node, loader.bad_tags, source)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem and "duplicate key" not in problem:
            problem = f"{problem} ({exc.context})"
        raise RecipeError(
            source,
            [
                RecipeIssue(
                    path="<yaml>",
                    message=problem,
                    line=mark.line + 1 if mark else None,
                    column=mark.column + 1 if mark else None,
                )
            ],
            hint="fix the YAML syntax; quote values that contain ':' or start with '@', '`', '%' or '*'",
        ) from None
    except yaml.YAMLError as exc:  # ReaderError (control characters) and friends
        message = (str(exc).splitlines() or ["invalid YAML"])[0]
        line, column = _offset_to_position(text, getattr(exc, "position", None))
        raise RecipeError(
            source, [RecipeIssue(path="<yaml>", message=message, line=line, column=column)]
        ) from None
    except RecursionError:
        raise RecipeError(
            source, [RecipeIssue(path="<yaml>", message="the YAML is nested too deeply")]
        ) from None
    except ValueError as exc:  # int() of a 5000-digit number: Python's limit on integer text
        raise RecipeError(
            source, [RecipeIssue(path="<yaml>", message=f"a value cannot be read: {str(exc)[:120]}")]
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, node


def _offset_to_position(text: str, offset: int | None) -> tuple[int | None, int | None]:
    if offset is None or not 0 <= offset <= len(text):
        return None, None
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def compose_quietly(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_RecipeLoader)
    except (yaml.YAMLError, RecursionError):
        return None


def check_top_level(data: YAMLValue, source: str) -> dict[str, Any]:  # Any: the recipe's YAML values
    if data is None:
        raise RecipeError(
            source,
            [RecipeIssue(path="<recipe>", message="the recipe is empty", line=None)],
            hint=RECIPES_HINT,
        )
    if not isinstance(data, dict):
        raise RecipeError(
            source,
            [
                RecipeIssue(
                    path="<recipe>",
                    message="the top level of a recipe must be a mapping of sections "
                    f"(name:, model:, quantize:, ...), not a {type_name(data)}",
                    line=1,
                    column=1,
                )
            ],
            hint=RECIPES_HINT,
        )
    return data


def type_name(value: YAMLValue) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, datetime.date):
        return "date"
    return type(value).__name__


# --------------------------------------------------------------------------------------------
# Overrides: --set quantize.group_size=64
# --------------------------------------------------------------------------------------------

_OVERRIDE_EXAMPLE = "e.g. --set quantize.group_size=64 or --set profile.batch=[1,8]"


def short_repr(value: YAMLValue | Override) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_overrides(items: list[str]) -> list[Override]:
    """Parse ``key.path=value`` items; the value is read as YAML (64 -> int, true -> bool, [1,2] -> list)."""
    parsed: list[Override] = []
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise UsageError(
                f"bad override {short_repr(item)}: expected KEY=VALUE with a dotted key",
                hint=_OVERRIDE_EXAMPLE,
            )
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise UsageError(f"bad override {short_repr(item)}: the key is empty", hint=_OVERRIDE_EXAMPLE)
        if any(not segment.strip() for segment in key.split(".")) or key != key.replace(" ", ""):
            raise UsageError(
                f"bad override {short_repr(item)}: the key {key!r} has an empty segment or spaces",
                hint=_OVERRIDE_EXAMPLE,
            )
        if raw == "":
            value: YAMLValue = ""
        else:
            try:
                value = yaml.load(raw, Loader=_RecipeLoader)  # noqa: S506 - a SafeLoader subclass
            except (yaml.YAMLError, RecursionError, ValueError) as exc:  # ValueError: a 5000-digit int
                problem = getattr(exc, "problem", None) or str(exc)[:120]
                raise UsageError(
                    f"bad override {short_repr(item)}: the value is not valid YAML ({problem})",
                    hint="quote the value, e.g. --set 'serve.served_model_name=\"@my-model\"'",
                ) from None
        parsed.append((key, value))
    return parsed


def apply_overrides(data: dict[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:  # Any: the recipe's YAML values
    """Return a copy of ``data`` with each (dotted key, value) set; intermediate mappings are created."""
    result = copy.deepcopy(data)
    for key, value in overrides:
        segments = key.split(".")
        if not key or any(not s for s in segments):
            raise UsageError(f"bad override key {short_repr(key)}: empty segment", hint=_OVERRIDE_EXAMPLE)
        current: dict[Any, Any] = result  # Any: the recipe's YAML data, nested
        for depth, segment in enumerate(segments[:-1]):
            child = current.get(segment)
            here = ".".join(segments[: depth + 1])
            if child is None:
                child = {}
                current[segment] = child
            elif isinstance(child, list):
                if segments[depth + 1].isdigit():
                    raise UsageError(
                        f"cannot apply override {short_repr(key)}: {here!r} is a list and list indices are "
                        "not supported in overrides",
                        hint=f"set the whole list instead, e.g. --set {here}=[1,8,32]",
                    )
                raise UsageError(
                    f"cannot apply override {short_repr(key)}: {here!r} is a list, not a mapping",
                    hint=f"set the whole value instead, e.g. --set {here}=[...]",
                )
            elif not isinstance(child, dict):
                raise UsageError(
                    f"cannot apply override {short_repr(key)}: {here!r} is a {type_name(child)} "
                    f"({child!r}), not a mapping",
                    hint=f"set {here} itself, or remove it from the recipe first",
                )
            current = child
        current[segments[-1]] = value
    return result


def normalise_overrides(
    overrides: Sequence[str] | Sequence[Override] | None,
) -> list[Override]:
    result: list[Override] = []
    for item in overrides or []:
        if isinstance(item, str):
            result.extend(parse_overrides([item]))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            result.append((item[0], item[1]))
        else:
            raise UsageError(f"bad override {short_repr(item)}: expected 'KEY=VALUE'", hint=_OVERRIDE_EXAMPLE)
    return result

