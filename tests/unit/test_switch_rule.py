"""A piece switched on the command line (or by keyword sections, an ablation cell or a preset)
brings its own defaults: the params the config file wrote for the piece it named never leak into
another piece, and params the user gives for the chosen piece are kept and checked."""

from __future__ import annotations

import pytest

from flowgrpo.api import with_reward
from flowgrpo.cli.ablate import parse_grid, plan
from flowgrpo.config.io import SWITCH_HELP, SWITCH_RULE, describe_fields, load_config, read_config
from flowgrpo.config.pieces import SLOTS
from flowgrpo.errors import ConfigError

# (file, the switch, the key whose file value must not leak, what the chosen piece then holds)
SWITCHES = [
    ("digits", ["sampler.name=ode", "train.objective=nft"], "sampler.params", {}),
    ("digits", ["train.loss=sapo"], "train.loss_params", {}),
    ("digits", ["model.family=flux"], "model.options", {}),
    ("tts_longcat", ["reward.name=digit"], "reward.components", []),
]


@pytest.mark.parametrize("name,switch,key,expected", SWITCHES,
                         ids=[s[1][0] for s in SWITCHES])
def test_a_switched_piece_starts_from_its_own_defaults(name, switch, key, expected):
    section, _, field = key.partition(".")
    assert read_config(name)[section][field]  # the file writes it for the piece it names
    data = {}
    try:
        config = load_config(name, switch)
        data = getattr(getattr(config, section), field)
    except ConfigError as err:  # a family switch fails later, on the path; never on options
        assert key not in str(err), err
        return
    assert data == expected


def test_the_same_name_keeps_the_file_params():
    assert load_config(None, ["sampler.name=sde"]).sampler.params == {"noise_level": 0.7}
    assert load_config(None, ["sampler.params.noise_level=0.5"]).sampler.params == {
        "noise_level": 0.5}


def test_params_the_user_gives_for_the_chosen_piece_are_kept_and_checked():
    config = load_config(None, ["train.loss=sapo", "train.loss_params.tau_pos=2.0"])
    assert config.train.loss_params == {"tau_pos": 2.0}
    # given before the switch on the command line: still the user's
    config = load_config(None, ["train.loss_params={tau_pos: 2.0}", "train.loss=sapo"])
    assert config.train.loss_params == {"tau_pos": 2.0}
    with pytest.raises(ConfigError, match="train.loss_params.*'clip_low'"):
        load_config(None, ["train.loss=sapo", "train.loss_params.clip_low=0.1"])


def test_keyword_sections_follow_the_same_rule():
    config = load_config(None, train={"loss": "sapo"})
    assert config.train.loss_params == {}
    config = load_config(None, train={"loss": "sapo", "loss_params": {"tau_pos": 2.0}})
    assert config.train.loss_params == {"tau_pos": 2.0}


def test_a_reward_mix_and_a_single_reward_replace_one_another():
    config = load_config("tts_longcat", ["reward.name=digit"])
    assert (config.reward.name, config.reward.components) == ("digit", [])
    # written together in one place, the unused one is refused, never ignored
    with pytest.raises(ConfigError, match="reward.params: .*unused when reward.components"):
        load_config(None, ["reward.components=[{name: digit}]", "reward.params={x: 1}"])
    with pytest.raises(ConfigError, match="reward.name: .*unused when reward.components"):
        load_config("tts_longcat", ["reward.name=pickscore", "reward.components=[{name: wer}]"])
    mixed = with_reward(load_config(None, ["reward.name=digit"]), [(len, 1.0), (sum, 2.0)])
    assert mixed.reward.validate() is None and mixed.reward.params == {}


def test_an_ablation_cell_that_switches_a_piece_gets_its_defaults(tmp_path):
    cells = plan(None, parse_grid(["train.loss=clip,sapo"]), [], 1, tmp_path, {})
    texts = {cell.name: cell.config_file.read_text() for cell in cells}
    assert "clip_low: 0.0001" in texts["train.loss=clip"]
    assert "clip_low" not in texts["train.loss=sapo"]


def test_every_piece_with_params_is_in_the_rule_and_the_rule_is_documented():
    for slot in SLOTS:
        if slot.params:
            assert slot.params in SWITCH_RULE[slot.key]
    text = describe_fields()
    assert text.startswith("# A key that names a piece")
    assert " ".join(line.lstrip("# ") for line in text.split("\n\n")[0].splitlines()) \
        == SWITCH_HELP


@pytest.mark.parametrize("override,fix", [
    ("train.step_selection_params={size:3}", "{size: 3}"),
    ("train.loss_params={clip_low:1e-4}", "{clip_low: 1e-4}"),
])
def test_a_colon_without_a_space_names_the_yaml_reading_and_the_fix(override, fix):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.step_selection=window", override])
    assert "as one key with no value" in str(err.value) and f"write {fix}" in str(err.value)


def test_the_same_slip_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  loss_params: {clip_low:1e-4}\n")
    with pytest.raises(ConfigError, match=rf"{path}: YAML read 'clip_low:1e-4'"):
        load_config(path)
