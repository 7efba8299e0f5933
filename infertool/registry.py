"""THE registry shape: one ``Registry[T]`` for stages, quantization backends, recipe checks and worker tasks.

A registry maps names to objects, in registration order (an order some registries give a meaning: a stage's
graph order, a method's default backend). It is filled explicitly, in one place per kind:

- ``register(name, obj)``, or ``register(name, "package.module:object")``: a lazy entry, imported on its first
  ``get`` (so ``infertool --help`` imports no capability, and no heavy library);
- ``sources``: ``"package.module:function"`` names of functions returning more ``(name, obj)`` pairs (a worker
  task registry reads the backends' tasks so), called when the registry is first listed or misses a name;
- ``group``: an ``importlib.metadata`` entry-point group (``infertool.backends``): another installed package's
  entries, read only when the registry is listed or misses a name, after the built-in ones;
- ``freeze()`` once start-up has filled it: a later ``register`` raises ``RegistryError``;
- ``name_of``: an entry's own name (``lambda s: s.name``), which must be the name it is listed under;
- ``check(name, obj, before)``: called with each entry as it is added or resolved, and the names registered
  before it (a stage's dependencies come before it, a backend's schema has the fields the recipe reads); it raises
  ``RegistryError`` for a mistake in the code that declared the entry, which is then not added.

An unknown name is a ``UsageError`` naming the known entries. A leaf: the standard library and errors only.
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

from infertool.errors import UsageError

T = TypeVar("T")


class RegistryError(ValueError):
    """A mistake in the code that fills a registry: a name registered twice, a registration after ``freeze``, an
    entry that fails the registry's ``check``."""


def load(target: str) -> object:
    """The object a ``"package.module:attr"`` (or ``"package.module:attr.sub"``) string names."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise RegistryError(f"{target!r} is not a 'package.module:object' name")
    obj: object = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    def __init__(self, kind: str, *, group: str | None = None, sources: tuple[str, ...] = (),
                 check: Callable[[str, T, list[str]], None] | None = None,
                 name_of: Callable[[T], str] | None = None) -> None:
        self.kind = kind  # "stage", "backend", ...: what its errors call an entry
        self.name_of = name_of  # an entry's own name, which must be the name it is listed under
        self.group = group
        self.sources = sources
        self.check = check
        self.by_name: dict[str, T | str] = {}  # name -> object, or a lazy "module:object" until its first get
        self.frozen = False
        self._extended = not (group or sources)  # the sources and entry points were read

    def register(self, name: str, obj: T | str) -> T | str:
        """Add ``obj`` (or a lazy ``"module:object"`` name of it) under ``name``; returns it. A name is
        registered once; nothing is registered after ``freeze``."""
        if self.frozen:
            where = f" or through the entry-point group {self.group!r}" if self.group else ""
            raise RegistryError(f"the {self.kind} registry is frozen (start-up is over): {name!r} cannot be added; "
                                f"list it where the {self.kind}s are listed{where}")
        self._add(name, obj)
        return obj

    def _add(self, name: str, obj: T | str) -> None:
        if name in self.by_name:
            raise RegistryError(f"a {self.kind} named {name!r} is already registered")
        if not isinstance(obj, str):
            self._checked(name, obj, list(self.by_name))
        self.by_name[name] = obj

    def _checked(self, name: str, obj: T, before: list[str]) -> T:
        if self.name_of is not None and self.name_of(obj) != name:
            raise RegistryError(f"the {self.kind} listed as {name!r} is named {self.name_of(obj)!r}")
        if self.check is not None:
            self.check(name, obj, before)
        return obj

    def freeze(self) -> None:
        self.frozen = True

    def _extend(self) -> None:
        """Read the sources, then the entry-point group, once (after the entries registered by name)."""
        if self._extended:
            return
        self._extended = True
        for source in self.sources:
            make = load(source)
            if not callable(make):
                raise RegistryError(f"{source!r} (a source of {self.kind}s) is not callable")
            for name, obj in make():
                self._add(name, obj)
        if self.group:
            from importlib import metadata  # here: a registry without a group (the worker's tasks) never reads it

            for ep in metadata.entry_points(group=self.group):
                self._add(ep.name, ep.value)

    def get(self, name: str) -> T:
        """The entry ``name`` (a lazy one imported now); unknown: a UsageError naming the known ones."""
        if name not in self.by_name:
            self._extend()
        try:
            entry = self.by_name[name]
        except KeyError:
            raise UsageError(f"unknown {self.kind} {name!r}",
                             hint=f"known {self.kind}s: {', '.join(self.names()) or 'none'}") from None
        if not isinstance(entry, str):
            return entry
        obj: T = load(entry)  # type: ignore[assignment]  # the object a lazy entry names is declared a T
        order = list(self.by_name)
        self.by_name[name] = self._checked(name, obj, order[:order.index(name)])
        return obj

    def names(self) -> list[str]:
        """Every name, in registration order (built-in entries first, then the sources', then plugins')."""
        self._extend()
        return list(self.by_name)

    def values(self) -> list[T]:
        """Every entry, in registration order (lazy ones imported now)."""
        return [self.get(n) for n in self.names()]

    def items(self) -> list[tuple[str, T]]:
        return [(n, self.get(n)) for n in self.names()]
