"""No code path unpickles: the packages never import pickle-like modules, and every ``torch.load``
passes ``weights_only=True`` (checkpoints, heads and wire formats are safetensors / JSON / PNG).

The scan parses each file with :mod:`ast`, so text in docstrings and comments does not count and
a call split over lines still does. :func:`test_the_scanner_flags_bad_code` keeps the scan honest.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import ROOT

PACKAGES = ("flowgrpo", "pipelines", "reward_models", "samplers")
PICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle"}
IMPORTERS = {"__import__", "import_module"}


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a chain of names and attributes, else ``""``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def unsafe(source: str, filename: str = "<string>") -> list[str]:
    """``file:line: what`` for each pickle import or use, and each ``torch.load`` call without a
    literal ``weights_only=True`` (``import torch as th`` is followed)."""
    tree = ast.parse(source, filename)
    torch_names = {"torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            torch_names |= {a.asname for a in node.names if a.name == "torch" and a.asname}
    found = []

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PICKLERS:
                    flag(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in PICKLERS:
                flag(node, f"from {node.module} import ...")
            elif node.module == "torch" and any(a.name == "load" for a in node.names):
                flag(node, "from torch import load (call torch.load(..., weights_only=True))")
        elif isinstance(node, ast.Attribute) and _dotted(node.value) in PICKLERS:
            flag(node, f"{_dotted(node)}")
        elif isinstance(node, ast.Call):
            func = _dotted(node.func)
            keywords = {k.arg: k.value for k in node.keywords}
            if func.rpartition(".")[2] in IMPORTERS and node.args:
                name = node.args[0]
                if isinstance(name, ast.Constant) and str(name.value).split(".")[0] in PICKLERS:
                    flag(node, f"{func}({name.value!r})")
            if func.rpartition(".")[0] in torch_names and func.endswith(".load"):
                value = keywords.get("weights_only")
                if not (isinstance(value, ast.Constant) and value.value is True):
                    flag(node, f"{func}(...) without weights_only=True")
            value = keywords.get("allow_pickle")
            if value is not None and not (isinstance(value, ast.Constant) and value.value is False):
                flag(node, f"{func}(..., allow_pickle=...)")
    return found


def test_the_scanner_flags_bad_code():
    bad = {
        "import pickle": 1,
        "import pickle as p, os": 1,
        "from pickle import loads": 1,
        "import cPickle": 1,
        "import dill": 1,
        "from dill.source import getsource": 1,
        "import torch\nstate = torch.load(path)": 1,
        "import torch\nstate = torch.load(\n    path,\n    map_location='cpu',\n)": 1,
        "import torch\nstate = torch.load(path, weights_only=False)": 1,
        "import torch\nstate = torch.load(path, **options)": 1,
        "import torch as th\nstate = th.load(path)": 1,
        "from torch import load": 1,
        "import numpy as np\nx = np.load(path, allow_pickle=True)": 1,
        "import importlib\nm = importlib.import_module('pickle')": 1,
        "m = __import__('dill')": 1,
        "import pickle\nobj = pickle.load(f)": 2,
    }
    for source, count in bad.items():
        assert len(unsafe(source)) == count, (source, unsafe(source))
    assert unsafe("import torch\n\nx = torch.load(p)", "bad.py") == [
        "bad.py:3: torch.load(...) without weights_only=True"]
    good = '''
"""Checkpoints are never pickled: pickle.load is not called here."""
import torch
import pickletools  # a different module
pickled = False  # a name, not a module
state = torch.load(path, map_location="cpu", weights_only=True)
arrays = numpy.load(path, allow_pickle=False)
'''
    assert unsafe(good) == []


def _sources() -> list[Path]:
    files = []
    for package in PACKAGES:
        found = sorted((ROOT / package).rglob("*.py"))
        assert found, f"no Python files under {package}/"  # the scan must not pass vacuously
        files += found
    return files


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pickle_and_torch_load_weights_only(path: Path):
    rel = str(path.relative_to(ROOT))
    assert unsafe(path.read_text(encoding="utf-8"), rel) == []
