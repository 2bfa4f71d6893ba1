"""The distribution: every package listed, the shipped configs found from any folder, and a built
wheel installed into a fresh virtual environment that runs from another folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from flowgrpo.config.io import DEFAULT_CONFIG, recipes, resolve_config
from flowgrpo.data.files import SHIPPED, shipped_file
from helpers import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_python_package_is_in_the_distribution():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("flowgrpo", "samplers", "reward_models", "pipelines")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found <= listed, f"add to pyproject's packages: {sorted(found - listed)}"
    assert mapped == {"flowgrpo.configs": "configs"} and "flowgrpo.configs" in listed


def test_shipped_configs_resolve_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert DEFAULT_CONFIG == SHIPPED / "digits.yaml" and DEFAULT_CONFIG.is_file()
    for given in ("configs/sd35_ocr.yaml", "configs/sd35_ocr", "sd35_ocr"):
        assert resolve_config(given) == SHIPPED / "sd35_ocr.yaml"
    assert shipped_file("configs/prompts/ocr_example.jsonl") == SHIPPED / "prompts" / \
        "ocr_example.jsonl"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "sd35_ocr.yaml").write_text("model: {}\n")  # a user's own wins
    assert resolve_config("configs/sd35_ocr.yaml") == Path("configs/sd35_ocr.yaml")
    assert resolve_config("nope.yaml") == Path("nope.yaml")
    names = [name for name, _ in recipes()]
    assert "digits.yaml" in names and "sd35_pickscore.yaml" in names
    assert all(about for _, about in recipes())


def _run(args: list[str], cwd: Path, env: dict, timeout: int = 600) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs_from_another_folder(tmp_path):
    """Build the wheel, install it into a new virtual environment (sharing this one's
    site-packages, so nothing is downloaded) and use it from a folder holding nothing."""
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
        ".ruff_cache", "tests", "benchmarks"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(dist), str(source)], tmp_path, env)
    (wheel,) = dist.glob("flowgrpo-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
          "--no-index", "--force-reinstall", str(wheel)], tmp_path, env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    flowgrpo = env_dir / "bin" / "flowgrpo"

    where = _run([str(python), "-c", "import flowgrpo, pipelines; print(flowgrpo.__file__); "
                  "print(pipelines.__file__)"], elsewhere, env).split()
    assert all(Path(p).is_relative_to(env_dir) for p in where), where  # the wheel, not ROOT
    listed = _run([str(flowgrpo), "config", "--recipes"], elsewhere, env)
    assert str(env_dir) in listed and "sd35_pickscore.yaml" in listed
    default = _run([str(flowgrpo), "config"], elsewhere, env)
    assert "path: digits" in default
    recipe = _run([str(flowgrpo), "config", "configs/sd35_ocr.yaml"], elsewhere, env)
    assert "prompts: configs/prompts/ocr_example.jsonl" in recipe
    assert "rewards: aesthetic" in _run([str(flowgrpo), "list"], elsewhere, env)
    out = _run([str(flowgrpo), "train", "-q", "--set", "run.epochs=1", "--set",
                "run.eval_every=0", "--set", "train.batch_size=8", "--set", "train.group_size=4",
                "--set", "sampler.num_steps=4", "--set", "data.eval_images_per_prompt=1",
                "--set", "run.output_dir=run"], elsewhere, env)
    assert (elsewhere / "run" / "checkpoints" / "step_1").is_dir(), out
    assert not list(elsewhere.glob("*.py")) and not (elsewhere / "configs").exists()


def test_every_extra_the_docs_name_is_in_pyproject():
    """``pip install ...[name]`` in the README and docs names an extra of ``pyproject.toml``, and
    no piece is called an "optional extra" unless a pip extra installs it (f5_tts has a script)."""
    import re

    extras = set(PYPROJECT["project"]["optional-dependencies"])
    texts = {p.name: p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]}
    named = {(name, extra) for name, text in texts.items()
             for group in re.findall(r"pip install[^\n`]*?\[([\w,\- ]+)\]", text)
             for extra in group.split(",")}
    assert named, "the README names no extra"
    assert {extra.strip() for _, extra in named} <= extras, sorted(named)
    for name, text in texts.items():
        assert "optional extra)" not in text, name
