"""Config: every bad input fails at load time with a message naming key, value and choices."""

import pytest
import yaml

from flowgrpo.config.io import (
    apply_overrides,
    describe_fields,
    from_dict,
    load_config,
    to_dict,
    to_yaml,
)
from flowgrpo.errors import ConfigError


def test_default_config_loads_and_round_trips(tmp_path):
    cfg = load_config()
    assert cfg.model.path == "digits"
    path = tmp_path / "c.yaml"
    path.write_text(to_yaml(cfg))
    assert to_dict(load_config(path)) == to_dict(cfg)


def test_overrides_parse_values_as_yaml():
    cfg = load_config(None, ["train.lr=1e-4", "sampler.params.noise_level=0.5",
                             "model.lora=false", "train.group_size=4", "train.batch_size=8"])
    assert cfg.train.lr == pytest.approx(1e-4)
    assert cfg.sampler.params == {"noise_level": 0.5}
    assert cfg.model.lora is False
    assert apply_overrides({}, ["a.b.c=[1, 2]"]) == {"a": {"b": {"c": [1, 2]}}}


BAD = [
    ({"train": {"lrr": 1e-3}}, ["train.lrr", "did you mean train.lr?", "valid keys"]),
    ({"modle": {}}, ["modle", "valid keys", "model"]),
    ({"train": {"lr": "fast"}}, ["train.lr", "float", "fast"]),
    ({"train": {"group_size": 2.5}}, ["train.group_size", "int"]),
    ({"model": {"lora": "yes"}}, ["model.lora", "bool"]),
    ({"train": {"lr": -1.0}}, ["train.lr", "-1.0", "> 0"]),
    ({"sampler": {"num_steps": 1}}, ["sampler.num_steps", ">= 2"]),
    ({"sampler": {"name": "ddim"}}, ["sampler.name", "ddim", "sde", "cps"]),
    ({"sampler": {"params": {"bogus": 1}}}, ["sampler.params", "bogus"]),
    ({"train": {"loss": "ppo"}}, ["train.loss", "ppo", "clip", "sapo"]),
    ({"train": {"advantage": "zscore"}}, ["train.advantage", "group", "global_std"]),
    ({"reward": {"name": "nope"}}, ["reward.name", "nope", "digit"]),
    ({"reward": {"components": [{"name": "digit", "wieght": 1}]}}, ["components[0]", "wieght"]),
    ({"reward": {"aggregation": "avg"}}, ["reward.aggregation", "normalize_then_sum"]),
    ({"model": {"family": "sdxl"}}, ["model.family", "sdxl", "sd3"]),
    ({"model": {"dtype": "int8"}}, ["model.dtype", "bfloat16"]),
    ({"model": {"compile": "fast"}}, ["model.compile", "'' (off)", "max-autotune"]),
    ({"train": {"optimizer_kernel": "apex"}}, ["train.optimizer_kernel", "fused", "foreach"]),
    ({"train": {"group_size": 8, "batch_size": 12}}, ["train.batch_size", "12", "multiple",
                                                      "group_size"]),
    ({"train": {"group_size": 1}}, ["train.group_size", ">= 2"]),
    ({"train": {"batch_size": 16, "train_batch_size": 32}}, ["train.train_batch_size", "32"]),
    ({"train": {"step_selection": "window", "step_selection_params": {"size": 10}},
      "sampler": {"num_steps": 10}}, ["train.step_selection_params", "size 10", "does not fit"]),
    ({"train": {"step_selection": "window", "step_selection_params": {"strategy": "sliding"}}},
     ["train.step_selection_params", "sliding", "progressive"]),
    ({"sampler": {"window_size": 2}}, ["sampler.window_size", "moved", "train.step_selection"]),
    ({"train": {"loss_params": {"clip_hgih": 1}}}, ["train.loss_params", "clip_hgih",
                                                    "did you mean clip_high"]),
    ({"train": {"objective": "ppo"}}, ["train.objective", "ppo", "ratio"]),
    ({"train": {"objective_params": {"temperature": 1}}}, ["train.objective_params",
                                                           "temperature"]),
    ({"train": {"step_selection": "every"}}, ["train.step_selection", "all", "flash", "window"]),
    ({"train": {"step_selection": "flash", "step_selection_params": {"stepz": [1]}}},
     ["train.step_selection_params", "stepz"]),
    ({"train": {"credit": "process"}}, ["train.credit", "outcome", "turning_point"]),
    ({"train": {"credit": "turning_point", "credit_params": {"balanse": False}}},
     ["train.credit_params", "balanse"]),
    ({"train": {"views": 2, "enhancer": "llm"}}, ["train.enhancer", "template", "remote"]),
    ({"train": {"views": 2, "enhancer_params": {"templatez": []}}}, ["train.enhancer_params",
                                                                      "templatez"]),
    ({"train": {"views": 2, "credit": "turning_point"}}, ["train.views", "outcome"]),
    ({"train": {"views": -1}}, ["train.views", ">= 0"]),
    ({"reward": {"params": {"sizee": 8}}}, ["reward.params", "sizee"]),
    ({"reward": {"components": [{"name": "digit", "params": {"sizee": 8}}]}},
     ["reward.components[0].params", "sizee"]),
    ({"sampler": {"after_window": "dpm3"}}, ["after_window", "dpm2"]),
    ({"run": {"epochs": 0}}, ["run.epochs", ">= 1"]),
]


@pytest.mark.parametrize("data,needles", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_config_fails_with_a_clear_message(data, needles):
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_bad_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["train.lr"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    path = tmp_path / "list.yaml"
    path.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(path)


def test_bad_config_fails_before_any_model_loads(monkeypatch):
    import pipelines

    def boom(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(pipelines, "load", boom)
    from flowgrpo.cli.main import main

    assert main(["train", "--set", "train.loss=nope"]) == 2


def test_every_field_has_help():
    text = describe_fields()
    assert "per process" in text
    for line in text.splitlines():
        if line.startswith("  "):
            assert "# " in line and len(line.split("# ", 1)[1]) > 5, line
