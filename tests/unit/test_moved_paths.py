"""The module paths of the flat layout (README, "Changelog") still import, as the module each
became, with a DeprecationWarning naming the new path; and every old path has its file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import flowgrpo

COMPAT = Path(flowgrpo.__file__).with_name("_compat")


def test_every_old_path_has_its_file_and_every_file_an_old_path():
    files = {f.stem for f in COMPAT.glob("*.py")} - {"__init__"}
    assert files == set(flowgrpo._MOVED)
    for old, new in flowgrpo._MOVED.items():  # each file's docstring names where it went
        assert f"``flowgrpo.{new}``" in (COMPAT / f"{old}.py").read_text(), old


def test_each_old_path_is_the_new_module_and_says_where_it_went():
    code = """
import importlib, sys, warnings
import flowgrpo
bad = []
for old, new in sorted(flowgrpo._MOVED.items()):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        module = importlib.import_module(f"flowgrpo.{old}")
    target = importlib.import_module(f"flowgrpo.{new}")
    said = [str(w.message) for w in seen if w.category is DeprecationWarning]
    if module is not target or said != [f"flowgrpo.{old} moved to flowgrpo.{new}"]:
        bad.append((old, module.__name__, said))
    if getattr(flowgrpo, old) is not target:
        bad.append((old, "attribute"))
print(bad)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_importing_flowgrpo_imports_no_old_path_and_finds_them_in_compat():
    code = ("import sys, importlib.util, flowgrpo; "
            "print(sorted(m for m in sys.modules if '_compat' in m)); "
            "print(importlib.util.find_spec('flowgrpo.grpo').origin)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert Path(out[1]) == COMPAT / "grpo.py"
