"""``Registry.registered`` and ``Registry.snapshot``: a temporary registration leaves the
registry exactly as it found it (objects and origins), on a normal exit and on an error."""

from __future__ import annotations

import pytest

from flowgrpo.registry import Registry, UnknownNameError, origin_of


def first():
    return 1


def second():
    return 2


def fresh() -> Registry:
    registry = Registry("thing")
    registry._entry_points = {}  # no installed entry points: the test sees only its own names
    registry.register("kept")(first)
    return registry


def test_registered_adds_a_name_for_the_block_only():
    registry = fresh()
    with registry.registered("temporary", second) as obj:
        assert obj is second
        assert registry.get("temporary") is second
        assert "temporary" in registry.names()
    assert "temporary" not in registry
    assert registry.names() == ["kept"]
    assert registry.origins() == {"kept": origin_of(first)}
    with pytest.raises(UnknownNameError):
        registry.get("temporary")


def test_registered_restores_a_replaced_name_and_its_origin():
    registry = fresh()
    registry._origins["kept"] = "entry point demo 1.0 (demo:kept)"
    with registry.registered("kept", second):
        assert registry.get("kept") is second
        assert registry.origin("kept") == origin_of(second)
    assert registry.get("kept") is first
    assert registry.origin("kept") == "entry point demo 1.0 (demo:kept)"


def test_registered_restores_on_an_error():
    registry = fresh()
    with pytest.raises(RuntimeError), registry.registered("temporary", second):
        raise RuntimeError("inside")
    assert "temporary" not in registry


def test_snapshot_drops_additions_and_brings_back_removals():
    registry = fresh()
    with registry.snapshot() as same:
        assert same is registry
        registry.register("new")(second)
        name = registry.add(lambda: 3)
        registry._items.pop("kept")
        registry._origins.pop("kept")
    assert registry.names() == ["kept"]
    assert name not in registry._items
    assert registry.get("kept") is first
    assert registry.origins() == {"kept": origin_of(first)}


def test_snapshot_restores_on_an_error():
    registry = fresh()
    with pytest.raises(RuntimeError), registry.snapshot():
        registry.register("new")(second)
        raise RuntimeError("inside")
    assert registry.names() == ["kept"]
