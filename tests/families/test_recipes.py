"""Every shipped recipe loads, validates and resolves; its model section builds a working adapter
when the model path points at a tiny pipeline of the same family built in code."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.config.io import load_config
from flowgrpo.data.prompts import load_prompts
from flowgrpo.training.model_setup import load_adapter
from helpers import ROOT
from helpers.family_cases import CASES
from helpers.family_cases import VARIANT_CASES as NEXT_CASES

# Recipes of another variant of their family's tiny model (CASES["wan"] is Wan2.1).
RECIPE_CASES = {"wan22_ti2v": NEXT_CASES["wan22_ti2v"][1],
                "wan22_t2v_a14b": NEXT_CASES["wan22_a14b"][1]}

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_recipes_are_found():
    names = {p.stem for p in CONFIGS}
    assert {"digits", "sd35_pickscore", "sd35_ocr", "sd35_fast", "flux_pickscore", "wan_t2v",
            "audio_ace_step", "tts_longcat", "tts_f5", "wan22_ti2v", "wan22_t2v_a14b",
            "hunyuan_video", "qwen_image_pickscore", "flux2_klein_edit_ocr",
            "flux_kontext_edit_ocr", "digit_edit", "digits_discrete", "wan_i2v", "ltx_video",
            "ltx2_video_audio", "qwen_image_edit_ocr", "z_image_pickscore"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_recipe_resolves_on_a_tiny_model(path, tmp_path):
    cfg = load_config(path)
    assert load_prompts(cfg.data.prompts)
    if cfg.model.path == "digits":
        return  # the shipped model itself is exercised by the toy and smoke tests
    case = RECIPE_CASES.get(path.stem) or CASES.get(cfg.model.family)
    if case is None:
        pytest.skip(f"{cfg.model.family} has no shared tiny case (an optional extra, or a "
                    "pipeline that only its own test file drives)")
    folder = tmp_path / "model"
    case.make().pipeline.save_pretrained(str(folder))
    known = {**case.call, **case.options}
    size = {k: v for k, v in known.items() if k in ("height", "width")}
    overrides = [f"model.path={folder}", "model.dtype=float32", "model.mixed_precision=fp32"]
    overrides += [f"model.{k}={v}" for k, v in size.items()]
    overrides += [f"model.options.{k}={v}" for k, v in case.options.items() if k not in size]
    tiny = load_config(path, overrides)
    adapter = load_adapter(tiny.model)
    cond = adapter.encode(["a test prompt"])
    x = adapter.noise(1, torch.Generator().manual_seed(0))
    sigmas = adapter.schedule(tiny.sampler.num_steps)
    assert len(sigmas) == tiny.sampler.num_steps + 1 and float(sigmas[-1]) == 0.0
    with torch.no_grad():
        v = adapter.velocity(x, sigmas[:1], cond, tiny.model.guidance)
    # a velocity has the latents' shape; a discrete model's logits add the states' axis
    assert v.shape[:x.ndim] == x.shape and torch.isfinite(v).all()
