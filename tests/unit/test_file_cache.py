"""The one file cache of the rewards: keyed by path, variant and modification time, LRU-bounded,
and a loader's errors pass through unchanged."""

from __future__ import annotations

import os

import pytest

from reward_models.cache import FileCache


def test_a_file_is_loaded_once_per_variant_and_again_when_rewritten(tmp_path):
    seen = []

    def load(name: str, mode: str) -> str:
        seen.append((name, mode))
        with open(name) as f:
            return f"{mode}:{f.read()}"

    cache = FileCache(load)
    path = tmp_path / "a.txt"
    path.write_text("one")
    assert cache.get(path, "x") == cache.get(str(path), "x") == "x:one"
    assert cache.get(path, "y") == "y:one"
    assert cache.loads == 2 and seen == [(str(path), "x"), (str(path), "y")]
    path.write_text("two")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert cache.get(path, "x") == "x:two"


def test_the_least_recently_used_file_goes_first(tmp_path):
    cache = FileCache(lambda name: name, max_items=2)
    a, b, c = (tmp_path / n for n in "abc")
    for p in (a, b, c):
        p.write_text("")
    cache.get(a), cache.get(b), cache.get(a), cache.get(c)  # b is the oldest use
    assert [key[0] for key in cache.items] == [str(a), str(c)]


def test_a_loaders_error_reaches_the_caller(tmp_path):
    def load(name: str) -> str:
        raise ValueError(f"cannot read {name}")

    cache = FileCache(load)
    with pytest.raises(ValueError, match="cannot read .*missing"):
        cache.get(tmp_path / "missing")
    assert not cache.items
