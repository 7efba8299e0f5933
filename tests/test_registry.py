"""The one registry shape (infertool.registry.Registry): explicit and lazy "module:object" entries in registration
order, sources, plugins from an entry-point group (a fake distribution's entry point), freeze, and the errors."""

from __future__ import annotations

import sys
from importlib import metadata
from importlib.metadata import EntryPoint

import pytest

from infertool.errors import UsageError
from infertool.registry import Registry, RegistryError, load


@pytest.fixture
def fake_plugin(tmp_path, monkeypatch):
    """A module ``fake_plugin`` on sys.path, not imported yet."""
    (tmp_path / "fake_plugin.py").write_text("ALPHA, BETA = 10, 20\n\n\ndef pairs():\n    return [('gamma', 30)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_plugin", raising=False)
    yield "fake_plugin"
    sys.modules.pop("fake_plugin", None)


def test_explicit_and_lazy_entries_in_registration_order(fake_plugin):
    reg: Registry[int] = Registry("thing")
    reg.register("one", 1)
    reg.register("alpha", "fake_plugin:ALPHA")
    assert fake_plugin not in sys.modules  # a lazy entry is imported on its first get, not before
    assert reg.get("alpha") == 10 and fake_plugin in sys.modules
    assert reg.names() == ["one", "alpha"] and reg.values() == [1, 10] and reg.items() == [("one", 1), ("alpha", 10)]


def test_unknown_names_duplicates_and_freeze():
    reg: Registry[int] = Registry("widget", group="infertool.widgets")
    reg.register("a", 1)
    with pytest.raises(RegistryError, match="a widget named 'a' is already registered"):
        reg.register("a", 2)
    with pytest.raises(UsageError) as e:
        reg.get("b")
    assert e.value.message == "unknown widget 'b'" and e.value.hint == "known widgets: a"
    reg.freeze()
    with pytest.raises(RegistryError, match="frozen .* 'c' cannot be added.*entry-point group 'infertool.widgets'"):
        reg.register("c", 3)
    assert reg.names() == ["a"]
    with pytest.raises(RegistryError, match="not a 'package.module:object' name"):
        load("no_colon")


def test_check_and_name_of_refuse_a_wrong_entry_whole():
    def even(name: str, obj: int, before: list[str]) -> None:
        if obj % 2:
            raise RegistryError(f"{name} after {before} is odd")

    reg: Registry[int] = Registry("number", check=even, name_of=str)
    reg.register("2", 2)
    with pytest.raises(RegistryError, match=r"3 after \['2'\] is odd"):
        reg.register("3", 3)
    with pytest.raises(RegistryError, match="the number listed as '6' is named '4'"):
        reg.register("6", 4)
    assert reg.names() == ["2"]


def test_sources_and_entry_points_are_read_once_when_asked(fake_plugin, monkeypatch):
    """A plugin's entry point (a fake distribution's, group infertool.things) is read only when the registry is
    listed or misses a name, after the built-in entries and the sources, and imported on its first get."""
    asked: list[str] = []

    def entry_points(*, group: str) -> list[EntryPoint]:
        asked.append(group)
        return [EntryPoint(name="beta", value="fake_plugin:BETA", group=group)]

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    reg: Registry[int] = Registry("thing", group="infertool.things", sources=("fake_plugin:pairs",))
    reg.register("one", 1)
    reg.freeze()
    assert reg.get("one") == 1 and asked == [] and fake_plugin not in sys.modules  # a known name reads no plugin
    assert reg.get("beta") == 20 and asked == ["infertool.things"]
    assert reg.names() == ["one", "gamma", "beta"] and reg.get("gamma") == 30
    assert asked == ["infertool.things"]  # read once
