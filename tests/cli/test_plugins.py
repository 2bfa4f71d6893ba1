"""Plug-ins from outside the package: ``module:attribute`` and ``file.py:attribute`` references in
config, entry points of installed distributions, where ``flowgrpo list`` says each comes from, and
the one-line errors of references that cannot be loaded."""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
import textwrap

import pytest
import torch
import yaml

import flowgrpo
import reward_models
from flowgrpo import registry as plugins
from flowgrpo.cli.catalogue import registries
from flowgrpo.cli.main import main
from flowgrpo.config.io import load_config
from flowgrpo.errors import ConfigError, PluginError
from flowgrpo.registry import Registry, UnknownNameError
from helpers import ROOT
from reward_models import REWARDS, Media

README = (ROOT / "README.md").read_text()
# the README's custom reward and its YAML, as the README shows them
SHARPNESS = re.search(r"```python\n# my_rewards.py\n(.*?)```", README, re.S).group(1)
README_YAML = re.search(r"```yaml\n(reward:\n.*?)```", README, re.S).group(1)


@pytest.fixture(autouse=True)
def restore_registries():
    """Every registry as it was before the test (references resolved, callables added)."""
    kept = [reg for _, reg in registries()]
    with contextlib.ExitStack() as stack:
        for reg in kept:
            stack.enter_context(reg.snapshot())
        yield
    for reg in kept:
        reg.rescan()


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(SHARPNESS)
    return path


def _import(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ references, every registry
def _reexport(tmp_path, registry, name):
    """A user file that re-exports a built-in piece: ``<file>:plugged``."""
    obj = registry.get(name)
    path = tmp_path / f"plug_{registry.kind.replace(' ', '_')}.py"
    path.write_text(f"from {obj.__module__} import {obj.__qualname__} as plugged\n")
    return f"{path}:plugged", obj


@pytest.mark.parametrize("key, registry_title, builtin", [
    ("model.family", "pipelines", "sd3"),
    ("sampler.name", "samplers", "sde"),
    ("train.loss", "losses", "clip"),
    ("train.advantage", "advantages", "group"),
    ("train.objective", "objectives", "ratio"),
    ("train.step_selection", "step selections", "all"),
    ("train.credit", "credits", "outcome"),
    ("train.enhancer", "enhancers", "template"),
    ("train.pruner", "pruners", "none"),
    ("train.kl", "kl estimators", "exact"),
    ("reward.mix_mode", "mix modes", "weighted"),
])
def test_every_registry_takes_a_file_reference(tmp_path, key, registry_title, builtin):
    registry = dict(registries())[registry_title]
    reference, obj = _reexport(tmp_path, registry, builtin)
    overrides = [f"{key}={reference}"]
    if key == "train.kl":
        overrides.append("train.beta=0.01")
    config = load_config(None, overrides)
    section, field = key.split(".")
    assert getattr(getattr(config, section), field) == reference
    assert registry.get(reference) is obj
    assert registry.origin(reference) == f"file {tmp_path / reference.split(':')[0].split('/')[-1]}"
    assert reference not in registry.names()  # a reference is not a name


def test_module_reference_and_dotted_attribute(tmp_path, monkeypatch):
    (tmp_path / "scoring_pkg").mkdir()
    (tmp_path / "scoring_pkg" / "__init__.py").write_text(
        "class Holder:\n"
        "    @staticmethod\n"
        "    def score(media, prompts, metadata):\n"
        "        return [float(i) for i in range(len(prompts))]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = reward_models.get("scoring_pkg:Holder.score")
    out = reward(Media("image", torch.rand(3, 3, 8, 8)), ["a"] * 3, [{}] * 3)
    assert out.scores.tolist() == [0.0, 1.0, 2.0]
    assert REWARDS.origin("scoring_pkg:Holder.score") == "module scoring_pkg"


def test_readme_reward_loads_from_readme_yaml(reward_file, monkeypatch, tmp_path):
    assert len(SHARPNESS.strip().splitlines()) <= 10
    monkeypatch.chdir(reward_file.parent)
    config_file = tmp_path / "readme.yaml"
    config_file.write_text(README_YAML)
    config = load_config(config_file)
    assert config.reward.name == "my_rewards.py:sharpness" and config.reward.params == {
        "scale": 2.0}
    reward = reward_models.get(config.reward.name, **config.reward.params)
    flat, lines = torch.full((1, 3, 8, 8), 0.5), torch.zeros(1, 3, 8, 8)
    lines[..., ::2] = 1.0  # vertical stripes: every horizontal neighbour differs by 1
    out = reward(Media("image", torch.cat([flat, lines])), ["a", "b"], [{}, {}]).scores
    assert out.tolist() == [0.0, 2.0]


def test_module_reference_from_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    (tmp_path / "folder_rewards.py").write_text(
        "def score(media, prompts, metadata):\n    return [0.5] * len(prompts)\n")
    monkeypatch.chdir(tmp_path)
    out = reward_models.get("folder_rewards:score")(Media("image", torch.rand(1, 3, 4, 4)), ["a"],
                                                    [{}])
    assert out.scores.tolist() == [0.5] and sys.path[-1] == str(tmp_path)
    sys.modules.pop("folder_rewards")


def test_scoring_function_params_are_checked_and_applied(reward_file):
    reference = f"{reward_file}:sharpness"
    media = Media("image", torch.rand(4, 3, 8, 8))
    once = reward_models.get(reference)(media, ["p"] * 4, [{}] * 4).scores
    twice = reward_models.get(reference, scale=2.0)(media, ["p"] * 4, [{}] * 4).scores
    assert once.shape == (4,) and torch.allclose(twice, 2 * once)
    with pytest.raises(ConfigError, match=r"reward.params: sharpness got an unknown parameter "
                                          r"'scal' \(did you mean scale\?\)"):
        load_config(None, [f"reward.name={reference}", "reward.params={scal: 2}"])


def test_a_reward_class_is_a_factory(tmp_path):
    path = tmp_path / "classy.py"
    path.write_text(textwrap.dedent("""
        import torch
        from reward_models import RewardOutput

        class Constant:
            def __init__(self, value: float = 0.5):
                self.value = value

            def __call__(self, media, prompts, metadata):
                return RewardOutput(torch.full((len(prompts),), self.value))
    """))
    reward = reward_models.get(f"{path}:Constant", value=0.25)
    out = reward(Media("image", torch.rand(2, 3, 4, 4)), ["a", "b"], [{}, {}])
    assert out.scores.tolist() == [0.25, 0.25]


def test_a_changed_file_is_read_again(tmp_path):
    path = tmp_path / "changing.py"
    path.write_text("def score(media, prompts, metadata):\n    return [1.0] * len(prompts)\n")
    media = Media("image", torch.rand(2, 3, 4, 4))
    assert reward_models.get(f"{path}:score")(media, ["a"] * 2, [{}] * 2).scores.tolist() == [1, 1]
    path.write_text("def score(media, prompts, metadata):\n    return [2.0] * len(prompts)\n")
    import os

    os.utime(path, ns=(0, path.stat().st_mtime_ns + 10**9))  # a later mtime, whatever the clock
    assert reward_models.get(f"{path}:score")(media, ["a"] * 2, [{}] * 2).scores.tolist() == [2, 2]


def test_a_file_imports_its_neighbours(tmp_path):
    (tmp_path / "helpers_for_reward.py").write_text("FACTOR = 3.0\n")
    path = tmp_path / "uses_helper.py"
    path.write_text("from helpers_for_reward import FACTOR\n\n"
                    "def score(media, prompts, metadata):\n    return [FACTOR] * len(prompts)\n")
    out = reward_models.get(f"{path}:score")(Media("image", torch.rand(1, 3, 4, 4)), ["a"], [{}])
    assert out.scores.tolist() == [3.0]


# ------------------------------------------------------------------ bad references: one line
BAD_FILES = {
    "import_error.py": ("import os\nimport surely_not_installed_module\n\n"
                        "def score(media, prompts, metadata):\n    return [0.0]\n",
                        "ModuleNotFoundError: No module named 'surely_not_installed_module' "
                        "(line 2)"),
    "raises.py": ("x = 1\nraise RuntimeError('broken at import')\n",
                  "RuntimeError: broken at import (line 2)"),
    "syntax.py": ("def score(media, prompts, metadata)\n    return [0.0]\n",
                  "SyntaxError: expected ':' (line 1)"),
}


@pytest.mark.parametrize("case", ["missing file", "missing attribute", "missing module",
                                  *BAD_FILES])
def test_bad_reference_is_one_line_without_traceback(case, tmp_path, reward_file, capsys,
                                                     monkeypatch):
    monkeypatch.delenv("FLOWGRPO_DEBUG", raising=False)
    if case == "missing file":
        reference, expected = (f"{tmp_path}/nowhere.py:score",
                               f"file not found: {tmp_path / 'nowhere.py'}")
    elif case == "missing attribute":
        reference, expected = (f"{reward_file}:sharpnes",
                               f"{reward_file} has no attribute 'sharpnes' (callables there: "
                               "sharpness)")
    elif case == "missing module":
        reference, expected = ("surely_not_a_module.sub:score",
                               "importing module surely_not_a_module.sub failed: "
                               "ModuleNotFoundError: No module named 'surely_not_a_module'")
    else:
        text, message = BAD_FILES[case]
        (tmp_path / case).write_text(text)
        reference, expected = f"{tmp_path / case}:score", f"importing {tmp_path / case} " \
                                                          f"failed: {message}"
    code = main(["config", "--set", f"reward.name={reference}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err == (f"flowgrpo: config error: reward.name: reward {reference!r}: {expected}\n")


def test_an_unknown_name_mentions_references():
    with pytest.raises(ConfigError, match=r"train.loss: invalid value 'clipp'; valid choices: "
                                          r"clip, .* \(or a module:attribute or "
                                          r"path/to/file.py:attribute reference\)"):
        load_config(None, ["train.loss=clipp"])


# ------------------------------------------------------------------ entry points
@pytest.fixture
def fake_distribution(tmp_path, monkeypatch):
    """A distribution ``fake-rewards 0.3`` on ``sys.path`` whose entry points register the
    reward ``fake_sharpness`` (and a broken one, ``fake_broken``)."""
    site = tmp_path / "site"
    info = site / "fake_rewards-0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-rewards\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        "[flowgrpo.rewards]\n"
        "fake_sharpness = fake_rewards_module:sharpness\n"
        "fake_broken = fake_rewards_missing:score\n"
        "clip = fake_rewards_module:sharpness\n")
    (site / "fake_rewards_module.py").write_text(SHARPNESS)
    monkeypatch.syspath_prepend(str(site))
    REWARDS.rescan()
    with pytest.warns(UserWarning, match="registers reward 'clip', which is already built-in"):
        REWARDS.names()  # read the entry points: the one named like a built-in is ignored
    yield
    monkeypatch.undo()
    REWARDS.rescan()


def test_entry_point_registers_a_reward_that_list_shows(fake_distribution, capsys):
    assert "fake_sharpness" in REWARDS.names()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert ("  rewards: fake_sharpness <- entry point fake-rewards 0.3 "
            "(fake_rewards_module:sharpness)") in out
    assert "fake_broken <- entry point fake-rewards 0.3" in out  # listed without importing
    assert REWARDS.origin("clip") == "built-in"  # a plug-in never shadows a built-in
    config = load_config(None, ["reward.name=fake_sharpness", "reward.params={scale: 3}"])
    reward = reward_models.get(config.reward.name, **config.reward.params)
    media = Media("image", torch.rand(2, 3, 8, 8))
    module = sys.modules["fake_rewards_module"]
    assert torch.allclose(reward(media, ["a", "b"], [{}, {}]).scores,
                          module.sharpness(media, None, None, scale=3.0))


def test_a_broken_entry_point_fails_in_one_line_when_used(fake_distribution):
    with pytest.raises(PluginError) as info:
        load_config(None, ["reward.name=fake_broken"])
    assert str(info.value) == (
        "reward.name: reward 'fake_broken' (entry point fake_rewards_missing:score of "
        "fake-rewards): import failed: ModuleNotFoundError: No module named "
        "'fake_rewards_missing'")


def test_entry_points_of_every_kind_have_a_group():
    kinds = {registry.kind for _, registry in registries()}
    groups = {plugins.entry_point_group(kind) for kind in kinds}
    assert len(groups) == len(kinds) == 12
    for group in ("flowgrpo.rewards", "flowgrpo.families", "flowgrpo.samplers",
                  "flowgrpo.losses", "flowgrpo.advantages", "flowgrpo.objectives",
                  "flowgrpo.step_selections", "flowgrpo.credits", "flowgrpo.enhancers"):
        assert group in groups


# ------------------------------------------------------------------ registry and Python API
def test_registry_add_names_replaces_and_protects_builtins():
    registry: Registry = Registry("thing")

    @registry.register("own")
    def own():
        return 1

    assert registry.origin("own") == "python (test_plugins)"

    def helper():
        return 2

    name = registry.add(helper)
    assert name == "test_plugins:test_registry_add_names_replaces_and_protects_builtins.<locals>" \
                   f".helper@{id(helper):x}"
    assert registry.add(lambda: 3, name="mine") == "mine"
    assert registry.get("mine")() == 3
    registry.add(lambda: 4, name="mine")  # a redefinition replaces an earlier add
    assert registry.get("mine")() == 4
    with pytest.raises(UnknownNameError, match=r"unknown thing 'nope'; valid names: "):
        registry.get("nope")
    with pytest.raises(ValueError, match="built in and cannot be replaced"):
        REWARDS.add(lambda m, p, d: [0.0], name="digit")


def test_python_api_builds_configs_from_keywords():
    config = flowgrpo.load_config(run={"epochs": 3}, train={"lr": 1e-4})
    assert config.run.epochs == 3 and config.train.lr == 1e-4
    assert config.train.group_size == load_config().train.group_size  # the rest: the file's
    with pytest.raises(ConfigError, match="run: a section override is a dict"):
        flowgrpo.load_config(run=3)
    with pytest.raises(ConfigError, match="unknown key run.epoch "):
        flowgrpo.load_config(run={"epoch": 3})


def test_python_api_reward_callables_become_the_config_reward(reward_file):
    from flowgrpo.api import named_rewards, with_reward

    sharpness = _import(reward_file, "api_rewards").sharpness
    config = with_reward(load_config(), sharpness)
    assert config.reward.name == "api_rewards:sharpness" and config.reward.params == {}
    assert "api_rewards:sharpness" not in REWARDS  # handed to the run, not registered

    def darkness(media, prompts, metadata):
        return 1 - media.data.mean(dim=(1, 2, 3))

    mixed = with_reward(load_config(), [sharpness, (darkness, 0.5)])
    assert [(c["name"].split(":")[-1], c["weight"]) for c in mixed.reward.components] == [
        ("sharpness", 1.0), ("test_python_api_reward_callables_become_the_config_reward."
                            "<locals>.darkness@" + f"{id(darkness):x}", 0.5)]
    from flowgrpo.training.reward_runner import RewardRunner

    class Image:
        modality, sample_rate = "image", None

    runner = RewardRunner(mixed.reward, Image(),
                          given=named_rewards([sharpness, (darkness, 0.5)]))
    out = runner.reward(Media("image", torch.rand(2, 3, 8, 8)), ["a", "b"], [{}, {}])
    assert set(out.components) == {"sharpness", "darkness"}  # metric keys: the short names


@pytest.mark.slow
def test_file_reward_from_yaml_equals_python_callable(tmp_path, reward_file):
    """The same reward, from YAML by file reference and from Python as a callable: identical
    metrics on the shipped toy."""
    small = {"train": {"group_size": 4, "batch_size": 8, "lr": 1e-3},
             "sampler": {"num_steps": 4}, "data": {"eval_images_per_prompt": 1},
             "run": {"epochs": 3, "eval_every": 0, "save_every": 0, "progress": False,
                     "tensorboard": False}}
    yaml_config = tmp_path / "custom.yaml"
    yaml_config.write_text(yaml.safe_dump({
        **small, "reward": {"name": f"{reward_file}:sharpness"},
        "run": {**small["run"], "output_dir": str(tmp_path / "from_yaml")}}))
    assert main(["train", str(yaml_config)]) == 0

    sharpness = _import(reward_file, "my_rewards_api").sharpness
    run = flowgrpo.train(yaml_config, reward_funcs=sharpness,  # the same file, reward replaced
                         run={**small["run"], "output_dir": str(tmp_path / "from_python")})
    from_yaml = flowgrpo.Run(tmp_path / "from_yaml")

    def strip(rows):
        return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]

    assert len(run.metrics) == 4 and strip(run.metrics) == strip(from_yaml.metrics)
    assert run.metrics[1]["reward/mean"] > 0  # sharpness of real images, not a default
    assert [row["step"] for row in run.evals] == [0, 3]
    assert run.last_checkpoint == run.path / "checkpoints" / "step_3"
    assert run.config["reward"]["name"] == "my_rewards_api:sharpness"
    trained = run.load()  # the base pipeline with the last checkpoint's LoRA
    assert any("lora_" in name for name, _ in trained.transformer.named_parameters())
    assert from_yaml.config["reward"]["name"] == f"{reward_file}:sharpness"


@pytest.mark.slow
def test_plugged_family_sampler_and_loss_train_the_toy(tmp_path, capsys):
    """A family, a sampler and a loss from one user file compose through the unchanged trainer."""
    path = tmp_path / "my_pieces.py"
    path.write_text(textwrap.dedent("""
        from flowgrpo.losses import clip_loss
        from pipelines.sd3 import SD3Adapter
        from samplers.sde import EulerMaruyamaSDE

        CALLS = []

        class MyFamily(SD3Adapter):
            pass

        class MySampler(EulerMaruyamaSDE):
            pass

        def my_loss(*args, **kwargs):
            CALLS.append(1)
            return clip_loss(*args, **kwargs)
    """))
    run = flowgrpo.train(None, model={"family": f"{path}:MyFamily", "path": "digits"},
                         sampler={"name": f"{path}:MySampler", "num_steps": 4},
                         train={"loss": f"{path}:my_loss", "group_size": 4, "batch_size": 8,
                                "loss_params": {}},
                         data={"eval_images_per_prompt": 1},
                         run={"epochs": 1, "eval_every": 0, "progress": False,
                              "tensorboard": False, "output_dir": str(tmp_path / "run")})
    row = run.metrics[-1]
    assert row["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # ratio 1 before the update
    assert row["train/grad_norm"] > 0
    module = next(m for name, m in sys.modules.items()
                  if name.startswith("flowgrpo_plugin_my_pieces"))
    assert module.CALLS  # the plugged loss ran
    assert run.config["sampler"]["name"] == f"{path}:MySampler"
    assert main(["list", str(tmp_path / "run" / "config.yaml")]) == 0
    out = capsys.readouterr().out
    for title, attribute in (("pipelines", "MyFamily"), ("samplers", "MySampler"),
                             ("losses", "my_loss")):
        assert f"  {title}: {path}:{attribute} <- file {path}" in out
