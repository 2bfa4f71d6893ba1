"""The ``paper:`` presets (configs/presets/paper.yaml): each resolves, through the path
``flowgrpo ablate`` takes, to the authors' published values, and builds on the digits toy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flowgrpo.cli import ablate as ablate_lib
from flowgrpo.config.io import load_config
from flowgrpo.training.trainer import Trainer

BASE = "configs/digits.yaml"
LAYOUT = ["train.batch_size=8", "train.group_size=4", "run.tensorboard=false",
          "run.progress=false", "data.eval_images_per_prompt=1"]
"""A run's --set values; each preset replaces the group size and the batch (one group)."""

FLOW_GRPO_CLIP = {"clip_low": 1e-4, "clip_high": 1e-4}
# The authors' values, read from their repositories (commit in each row), written here apart
# from the YAML: key -> value, nested dicts compared whole.
AUTHORS: dict[str, dict[str, object]] = {
    # yifan123/flow_grpo config/grpo.py pickscore_sd3, config/base.py, scripts/train_sd3.py ac4c86e
    "paper:flow_grpo": {
        "sampler.name": "sde", "sampler.params": {"noise_level": 0.7}, "sampler.num_steps": 10,
        "sampler.eval_num_steps": 40, "model.guidance": 4.5, "model.lora_rank": 32,
        "model.lora_alpha": 64, "train.group_size": 24, "train.lr": 3e-4, "train.beta": 0.01,
        "train.kl": "flow_grpo", "train.loss": "clip", "train.loss_params": FLOW_GRPO_CLIP,
        "train.adv_clip": 5.0, "train.advantage": "global_std", "train.step_selection": "all",
        "train.ema": True, "train.ema_decay": 0.9, "train.max_grad_norm": 1.0},
    # XueZeyue/DanceGRPO scripts/finetune/finetune_flux_grpo.sh 15cc71d
    "paper:dance_grpo": {
        "sampler.name": "sde", "sampler.params": {"schedule": "constant", "eta": 0.3},
        "sampler.num_steps": 16, "train.group_size": 12, "train.lr": 1e-5, "train.beta": 0.0,
        "train.loss_params": FLOW_GRPO_CLIP, "train.adv_clip": 5.0, "train.advantage": "group",
        "model.lora": False, "model.guidance": 3.5},
    # Tencent-Hunyuan/MixGRPO scripts/finetune/finetune_flux_grpo_MixGRPO.sh e5cdd6a
    "paper:mixgrpo": {
        "sampler.params": {"noise_level": 0.7}, "sampler.num_steps": 25, "train.group_size": 12,
        "train.lr": 1e-5, "train.beta": 0.0, "train.loss_params": FLOW_GRPO_CLIP,
        "train.step_selection": "window",
        "train.step_selection_params": {"size": 4, "strategy": "progressive", "stride": 1,
                                        "shift_every": 25},
        "reward.aggregation": "normalize_then_sum", "model.lora": False},
    # the same, _Flash.sh
    "paper:mixgrpo_flash": {
        "sampler.after_window": "dpm2", "sampler.flash_ratio": 0.4, "sampler.num_steps": 25,
        "train.step_selection_params": {"size": 4, "strategy": "progressive", "stride": 1,
                                        "shift_every": 20},
        "train.lr": 1e-5, "train.group_size": 12},
    # Shredded-Pork/Flash-GRPO config/dgx.py wan2_1_flash 4211013
    "paper:flash_grpo": {
        "sampler.num_steps": 20, "sampler.eval_num_steps": 50, "model.guidance": 4.5,
        "train.group_size": 4, "train.lr": 1e-4,
        "train.loss_params": {"clip_low": 1e-3, "clip_high": 1e-3}, "train.beta": 0.0,
        "train.step_selection": "flash", "train.step_selection_params": {"steps": list(range(10))},
        "train.advantage": "global_std", "train.ema": True},
    # YunzeTong/TurningPoint-GRPO config/my_grpo.py pickscore_sd3_fast 994d26a
    "paper:tp_grpo": {
        "sampler.name": "cps", "sampler.params": {"noise_level": 0.7}, "sampler.num_steps": 10,
        "model.guidance": 4.5, "train.group_size": 24, "train.lr": 3e-4,
        "train.loss_params": {"clip_low": 1e-5, "clip_high": 1e-5}, "train.beta": 0.0,
        "train.credit": "turning_point", "train.advantage": "group"},
    # NVlabs/DiffusionNFT config/nft.py, config/base.py, scripts/train_nft_sd3.py 24af555
    "paper:nft": {
        "train.objective": "nft", "sampler.name": "ode", "sampler.num_steps": 10,
        "model.guidance": 1.0, "train.group_size": 24, "train.lr": 3e-4, "train.beta": 1e-4,
        "train.kl": "velocity_mse", "train.adv_clip": 5.0, "train.ema_decay": 0.9,
        "train.objective_params": {
            "strength": 1.0, "adv_max": 5.0, "scale_by_adv_max": True, "weighting": "adaptive",
            "decay_rate": 0.001, "decay_max": 0.5, "decay_delay": 0, "draws": 9,
            "timesteps": "uniform"}},
    "paper:nft_ocr": {
        "train.objective": "nft",
        "train.objective_params": {
            "strength": 0.1, "adv_max": 5.0, "scale_by_adv_max": True, "weighting": "adaptive",
            "decay_rate": 0.0075, "decay_max": 0.999, "decay_delay": 75, "draws": 9,
            "timesteps": "uniform"}},
    # scxue/advantage_weighted_matching config/dgx_awm.py pickscore_sd3_no_cfg_1node be51372
    "paper:awm": {
        "train.objective": "awm", "sampler.name": "ode", "sampler.num_steps": 14,
        "model.guidance": 1.0, "train.group_size": 24, "train.lr": 3e-4, "train.beta": 1e-4,
        "train.loss": "clip", "train.loss_params": {"clip_low": 1.0, "clip_high": 1.0},
        "train.ema_decay": 0.99,
        "train.objective_params": {
            "weighting": "ghuber", "power": 0.25, "adv_scale": 0.2, "ema_beta": 1.0,
            "ema_decay_rate": 0.001, "ema_decay_max": 0.3, "draws": 6, "timesteps": "uniform"}},
    # jaemoo-choi/rethinking-diffusion-rl scripts/sd3/sd3_geneval_epg.sh, config/ c257000
    "paper:elbo": {
        "train.objective": "elbo", "sampler.name": "ode", "sampler.num_steps": 10,
        "model.guidance": 1.0, "train.group_size": 24, "train.lr": 3e-4,
        "train.max_grad_norm": 5.0, "train.loss": "unclipped", "train.beta": 1e-4,
        "train.kl": "velocity_mse", "train.advantage": "none", "train.adv_clip": 0.0,
        "train.objective_params": {
            "weighting": "adaptive", "cfg_division": True, "old_policy": "ema",
            "decay_rate": 0.001, "decay_max": 0.5, "decay_delay": 0, "adv_scale": 0.1,
            "draws": 9, "timesteps": "uniform"}},
    # Luo-Yihong/DGPO config/dgpo.py general_ocr_sd3_4gpu 587dfa1, README Mode 1 01ceb4b
    "paper:dgpo": {
        "train.objective": "dgpo", "sampler.name": "ode", "sampler.num_steps": 10,
        "sampler.eval_num_steps": 14, "model.guidance": 4.5, "train.group_size": 16,
        "train.beta": 0.02, "train.advantage": "global_std", "train.ema": True,
        "train.objective_params": {"beta_dpo": 100.0, "draws": 4, "weighting": "uniform",
                                   "guidance": 1.0}},
    # Shredded-Pork/TempFlow-GRPO config/dgx.py pickscore_sd3_pr 63e4def, train_sd3_pr.py e66824e
    "paper:tempflow_grpo": {
        "sampler.name": "sde", "sampler.params": {"noise_level": 0.7}, "sampler.num_steps": 10,
        "model.guidance": 4.5, "model.lora_rank": 32, "train.group_size": 24,
        "train.step_selection": "tempflow", "train.beta": 0.001, "train.kl": "exact",
        "train.advantage": "group", "train.ema_decay": 0.9},
    # Fredreic1849/BranchGRPO scripts/finetune/finetune_flux_branchgrpo_8gpus.sh 19fbb9f
    "paper:branch_grpo": {
        "sampler.params": {"schedule": "constant", "eta": 0.3}, "sampler.num_steps": 20,
        "sampler.rollout": "tree",
        "sampler.rollout_params": {"branch_at": [0, 3, 6, 9], "factor": 2, "noise_scale": 4.0},
        "train.credit": "tree", "train.group_size": 16, "train.lr": 1e-5,
        "train.loss_params": {"clip_low": 1e-3, "clip_high": 1e-3}, "train.adv_clip": 5.0,
        "train.beta": 0.0, "model.lora": False},
}


def resolved(tmp_path, name: str):
    """The config ``flowgrpo ablate configs/digits.yaml --grid method=NAME`` runs."""
    grid = ablate_lib.parse_grid([f"method={name}"])
    cells = ablate_lib.plan(BASE, grid, LAYOUT, 1, tmp_path / "ablation",
                            ablate_lib.load_presets())
    return load_config(str(cells[0].config_file), [])


def test_every_paper_preset_is_in_the_table_and_shipped_with_the_others():
    presets = ablate_lib.load_presets()
    paper = {n for n in presets if n.startswith("paper:")}
    assert paper == set(AUTHORS)
    assert {"flow_grpo", "nft", "awm", "elbo"} <= set(presets)  # methods.yaml stays
    assert ablate_lib.parse_grid(["method=paper:nft,paper:awm"]) == {
        "method": ["paper:nft", "paper:awm"]}


def test_a_grid_axis_replaces_the_preset_layout(tmp_path):
    grid = ablate_lib.parse_grid(["method=paper:nft", "train.batch_size=48"])
    cells = ablate_lib.plan(BASE, grid, LAYOUT, 1, tmp_path, ablate_lib.load_presets())
    cfg = load_config(str(cells[0].config_file), [])
    assert (cfg.train.batch_size, cfg.train.group_size) == (48, 24)
    assert cells[0].name == "method=paper_nft,train.batch_size=48"


@pytest.mark.parametrize("name", sorted(AUTHORS))
def test_paper_preset_resolves_to_the_authors_values_and_builds_on_the_toy(tmp_path, name):
    cfg = resolved(tmp_path, name)
    for key, want in AUTHORS[name].items():
        section, field = key.split(".")
        got = getattr(getattr(cfg, section), field)
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-9), key
        else:
            assert got == want, key
    assert cfg.train.batch_size == cfg.train.group_size  # the preset's layout: one group
    t = Trainer.from_config(cfg)  # every piece builds with these parameters on the toy
    assert type(t.objective).__name__.lower().startswith(cfg.train.objective.split("_")[0])
    built = {"paper:nft": lambda o: o.loss_scale == 5.0, "paper:nft_ocr": lambda o: o.loss_scale
             == pytest.approx(50.0), "paper:awm": lambda o: o.ema is not None and o.adv_scale
             == 0.2, "paper:elbo": lambda o: o.old is not None and o.lp_scale == 1.0}
    assert built.get(name, lambda o: True)(t.objective)


def test_list_presets_shows_every_paper_preset():
    out = subprocess.run([sys.executable, "-m", "flowgrpo.cli.main", "ablate", "--list-presets"],
                         capture_output=True, text=True, check=True).stdout
    names = {line.split(": ", 1)[0] for line in out.splitlines()}
    assert set(AUTHORS) <= names
    assert "flow_grpo" in names
