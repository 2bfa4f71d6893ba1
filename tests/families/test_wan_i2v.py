"""Wan image-to-video (``wan_i2v``) against ``WanImageToVideoPipeline``, on tiny models built in
code: Wan2.1 I2V (CLIP image embeddings; mask + first-frame latents on the channels), Wan2.2
I2V-A14B (two experts split at 0.9, no image encoder) and Wan2.2 TI2V-5B (``expand_timesteps``).

Euler parity within 1e-5 with and without CFG, per-sample first frames against one pipeline call
per sample, the condition and initial noise the pipeline prepares, the experts' split, decoding,
LoRA round trips through ``load_lora_weights``, loading a TI2V ``WanPipeline`` folder, option
errors, and the family contract on a ``.jsonl`` of first frames.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import pipelines
from flowgrpo.testing import check_family_contract
from helpers.family_cases import PROMPTS, STEPS, Case, euler_rollout, pipeline_latents
from helpers.tiny_families import tiny_wan_pipeline
from helpers.tiny_video import tiny_wan22_ti2v_pipeline
from helpers.tiny_wan_i2v import (
    FIRST_FRAME,
    WAN_I2V,
    WAN_I2V_CALL,
    _call,
    picture,
    tiny_wan22_i2v_a14b_pipeline,
    tiny_wan22_ti2v_i2v_pipeline,
    tiny_wan_i2v_pipeline,
)
from pipelines.base import LOGPROB_WEIGHT
from pipelines.wan_i2v import WanI2VAdapter

TOL = 1e-5
A14B = dict(height=16, width=16, num_frames=5, max_sequence_length=16, image=FIRST_FRAME)
TI2V = dict(height=32, width=64, num_frames=5, max_sequence_length=16, image=FIRST_FRAME)
CASES = {
    "wan21": Case(tiny_wan_i2v_pipeline, WanI2VAdapter, WAN_I2V, WAN_I2V_CALL, output="frames"),
    "wan22_a14b": Case(tiny_wan22_i2v_a14b_pipeline, WanI2VAdapter, A14B, _call(A14B),
                       output="frames"),
    "wan22_ti2v": Case(tiny_wan22_ti2v_i2v_pipeline, WanI2VAdapter, TI2V, _call(TI2V),
                       output="frames"),
}

PARITY = [  # (case, guidance, adapter options, extra pipeline arguments)
    ("wan21", 1.0, {}, {}),
    ("wan21", 5.0, {}, {}),
    ("wan21", 5.0, {"negative_prompt": "blurry, static"}, {"negative_prompt": "blurry, static"}),
    ("wan22_a14b", 1.0, {}, {}),
    ("wan22_a14b", 3.5, {}, {}),
    ("wan22_a14b", 3.5, {"guidance_scale_2": 2.0}, {"guidance_scale_2": 2.0}),
    ("wan22_a14b", 3.5, {"lora_expert": "low"}, {}),
    ("wan22_ti2v", 1.0, {}, {}),
    ("wan22_ti2v", 5.0, {}, {}),
]


def ident(options: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in options.items()) or "default"


def make(name: str, **options: Any) -> WanI2VAdapter:
    return CASES[name].make(**options)


@pytest.mark.parametrize(("name", "guidance", "options", "extra"), PARITY,
                         ids=[f"{p[0]}-g{p[1]}-{ident(p[2])}" for p in PARITY])
def test_euler_rollout_matches_pipeline(name, guidance, options, extra):
    case = CASES[name]
    adapter = case.make(**options)
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ref = pipeline_latents(case, adapter, x, guidance, **extra).float()
    ours = euler_rollout(adapter, x, guidance)
    diff = (ours - ref).abs().max().item()
    print(f"parity wan_i2v {name} guidance={guidance} {options or ''}: max abs diff {diff:.3g}")
    assert ours.shape == ref.shape == x.shape
    assert diff <= TOL
    assert (ours - x).abs().max() > 1e-2  # the rollout moved


@pytest.mark.parametrize("name", list(CASES))
def test_each_sample_animates_its_own_first_frame(name):
    """Three samples, first frames A, B, A from their metadata (B of another size): each
    sample's rollout equals the pipeline's call with its own image; A is encoded once; another
    first frame gives another video."""
    adapter = make(name)
    frames = [picture(24, 40, seed=1), picture(40, 24, seed=2)]
    metadata = [{"image": frames[i]} for i in (0, 1, 0)]
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[1]]
    vae, calls = adapter.pipeline.vae, []
    encode = vae.encode
    vae.encode = lambda *a, **k: (calls.append(1), encode(*a, **k))[1]
    cond = adapter.encode_inputs(prompts, metadata)
    del vae.encode
    assert len(calls) == 2  # A once, B once
    x = adapter.noise(3, torch.Generator().manual_seed(4))
    sigmas = adapter.schedule(STEPS)
    y = x.clone()
    with torch.no_grad():
        for k in range(STEPS):
            y = y + (sigmas[k + 1] - sigmas[k]) * adapter.velocity(y, sigmas[k].expand(3), cond,
                                                                 4.0)
    call = {k: v for k, v in CASES[name].call.items() if k != "image"}
    for i in range(3):
        out = adapter.pipeline(image=metadata[i]["image"], prompt=prompts[i],
                               num_inference_steps=STEPS, guidance_scale=4.0,
                               latents=x[i:i + 1].clone(), output_type="latent", **call).frames
        assert (y[i:i + 1] - out).abs().max() <= TOL
    assert (y[1] - y[2]).abs().max() > 1e-3  # same prompt, another first frame


@pytest.mark.parametrize("name", list(CASES))
def test_condition_and_noise_are_the_pipelines(name):
    """``image_latents`` (and the mask the velocity adds) equal ``prepare_latents``'s condition
    for the same image; the initial noise equals its draw; Wan2.1's ``image_embeds`` equal
    ``encode_image``."""
    adapter = make(name)
    pipe, o = adapter.pipeline, CASES[name].options
    image = picture(20, 28, seed=3)
    pixels = pipe.video_processor.preprocess(image, height=o["height"], width=o["width"])
    z = pipe.vae.config.z_dim
    out = pipe.prepare_latents(pixels.float(), 2, z, o["height"], o["width"], o["num_frames"],
                               torch.float32, "cpu", torch.Generator().manual_seed(3))
    assert torch.equal(adapter.noise(2, torch.Generator().manual_seed(3)), out[0])
    cond = adapter.encode_inputs(PROMPTS, [{"image": image}] * 2).tensors
    if adapter.expand_timesteps:
        torch.testing.assert_close(cond["image_latents"], out[1], rtol=0, atol=1e-6)
        assert cond[LOGPROB_WEIGHT].shape == (2, 1, 2, 1, 1)
        assert cond[LOGPROB_WEIGHT].flatten(1).tolist() == [[0.0, 1.0]] * 2
    else:
        torch.testing.assert_close(cond["image_latents"], out[1][:, 4:], rtol=0, atol=1e-6)
        mask = out[1][:, :4]
        assert mask[:, :, 0].eq(1).all() and mask[:, :, 1:].eq(0).all()
        assert LOGPROB_WEIGHT not in cond
    if name == "wan21":
        ref = pipe.encode_image(image, "cpu")
        assert cond["image_embeds"].shape == (2, 17, 16)
        torch.testing.assert_close(cond["image_embeds"], ref.expand(2, -1, -1), rtol=0, atol=0)
    else:
        assert "image_embeds" not in cond


def test_image_embeddings_and_latents_both_condition_wan21():
    """Wan2.1's velocity depends on the CLIP embeddings and on the first frame's latents."""
    adapter = make("wan21")
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    cond = adapter.encode(PROMPTS)
    sigma = torch.full((2,), 0.7)
    with torch.no_grad():
        base = adapter.velocity(x, sigma, cond, 5.0)
        for key in ("image_embeds", "image_latents"):
            other = pipelines.Cond(dict(cond.tensors))
            other.tensors[key] = torch.randn_like(cond.tensors[key])
            assert (adapter.velocity(x, sigma, other, 5.0) - base).abs().max() > 1e-4, key


def test_a_tensor_first_frame_is_in_zero_one():
    """A ``[3, h, w]`` tensor in [0, 1] encodes as the same picture given as a PIL image (a
    solid colour, which every resize keeps): CLIP's processor does not rescale it by 1/255 again,
    as it would in the pipeline."""
    import numpy as np
    from PIL import Image

    adapter = make("wan21")
    solid = Image.new("RGB", (40, 24), (120, 30, 200))
    tensor = torch.from_numpy(np.asarray(solid).copy()).permute(2, 0, 1).float() / 255
    ours, pil = adapter.encode_image(tensor), adapter.encode_image(solid)
    for key in ("image_embeds", "image_latents"):
        torch.testing.assert_close(ours[key], pil[key], rtol=0, atol=1e-5)
    pipe = adapter.pipeline
    twice = pipe.image_processor(images=tensor[None], return_tensors="pt")  # rescaled again
    states = pipe.image_encoder(**twice, output_hidden_states=True).hidden_states[-2]
    assert (states - pil["image_embeds"]).abs().max() > 0.1


def test_a14b_experts_split_at_its_boundary():
    """I2V-A14B's boundary 0.9: sigmas 1, .923 run ``transformer`` (t >= 900), .818, .667, .429
    ``transformer_2``, as in the pipeline (CFG: one batched call per step here, two there)."""
    adapter = make("wan22_a14b")
    assert adapter.boundary_ratio == 0.9
    pipe = adapter.pipeline
    seen: list[str] = []
    hooks = [m.register_forward_hook(lambda *_, n=n: seen.append(n))
             for n, m in (("high", pipe.transformer), ("low", pipe.transformer_2))]
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    euler_rollout(adapter, x, 3.5)
    ours, seen[:] = list(seen), []
    pipeline_latents(CASES["wan22_a14b"], adapter, x, 3.5)
    for h in hooks:
        h.remove()
    assert ours == ["high"] * 2 + ["low"] * 3
    assert seen == ["high"] * 4 + ["low"] * 6


def test_ti2v_first_frame_is_the_image_at_timestep_zero():
    """TI2V: the model sees the image's latents as the first latent frame, its tokens at
    timestep 0; a stochastic rollout through the trainer's sampler ends on them exactly, and
    their log-density weight is 0."""
    import samplers
    from flowgrpo.rl.rollout import RolloutSpec, rollout

    adapter = make("wan22_ti2v")
    cond = adapter.encode(PROMPTS)
    image = cond.tensors["image_latents"]
    seen = []
    hook = adapter.transformer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs), with_kwargs=True)
    x = adapter.noise(2, torch.Generator().manual_seed(0))  # [2, 8, 2, 2, 4]: 4 tokens each
    with torch.no_grad():
        adapter.velocity(x, torch.tensor([0.5, 0.25]), cond, 1.0)
    hook.remove()
    assert torch.equal(seen[0]["timestep"], torch.tensor([[0, 0, 500, 500], [0, 0, 250, 250.0]]))
    assert torch.equal(seen[0]["hidden_states"][:, :, :1], image)
    assert torch.equal(seen[0]["hidden_states"][:, :, 1:], x[:, :, 1:])
    sampler = samplers.build("sde")
    spec = RolloutSpec(sampler=sampler, guidance=1.0)
    traj = rollout(adapter, spec, cond, x, adapter.schedule(4), torch.tensor([[0, 1, 2]] * 2),
                   torch.Generator().manual_seed(1))
    torch.testing.assert_close(traj.final[:, :, :1], image, rtol=0, atol=1e-6)
    assert (traj.latents[:, 2, :, :1] - image).abs().max() > 1e-2  # noisy on the way


def test_decode_shape_range_and_pipeline_match():
    adapter = make("wan21")
    x = adapter.noise(2, torch.Generator().manual_seed(2))
    media = adapter.decode(x)
    assert adapter.modality == "video"
    assert media.shape == (2, 5, 3, 16, 16) and media.dtype == torch.float32
    assert 0.0 <= media.min() and media.max() <= 1.0
    out = adapter.pipeline(prompt=list(PROMPTS), num_inference_steps=1, guidance_scale=1.0,
                           latents=x.clone(), output_type="pt", **CASES["wan21"].call).frames
    assert (adapter.decode(euler_rollout(adapter, x, 1.0, steps=1)) - out).abs().max() <= TOL


@pytest.mark.parametrize(("name", "options", "guidance"),
                         [("wan21", {}, 5.0), ("wan22_a14b", {"lora_expert": "low"}, 3.5)])
def test_lora_round_trip_through_diffusers(name, options, guidance, tmp_path):
    """A LoRA written with ``save_lora`` and read into a fresh pipeline with ``load_lora``
    (diffusers' ``load_lora_weights``) reproduces the adapter and the pipeline."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    case = CASES[name]
    adapter = case.make(**options)
    x = adapter.noise(2, torch.Generator().manual_seed(5))
    base = euler_rollout(adapter, x, guidance, steps=3)
    adapter.add_lora(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                target_modules=list(adapter.default_lora_targets)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in adapter.transformer.named_parameters():
            if "lora_B" in n:  # gaussian init leaves B at zero: perturb it
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    state = get_peft_model_state_dict(adapter.transformer)
    adapter.save_lora(str(tmp_path), state, adapter.transformer.peft_config["default"].to_dict())
    tuned = euler_rollout(adapter, x, guidance, steps=3)
    assert (tuned - base).abs().max() > 1e-3
    fresh = case.make(**options)
    fresh.load_lora(str(tmp_path))
    out = fresh.pipeline(prompt=list(PROMPTS), num_inference_steps=3, guidance_scale=guidance,
                         latents=x.clone(), output_type="latent", **case.call).frames
    assert (euler_rollout(fresh, x, guidance, steps=3) - tuned).abs().max() <= TOL
    assert (out - tuned).abs().max() <= TOL


def test_ti2v_loads_from_a_wan_pipeline_folder(tmp_path):
    """The TI2V-5B checkpoint's folder names ``WanPipeline``; ``wan_i2v`` loads it as
    ``WanImageToVideoPipeline`` (the model path check accepts it) and animates a first frame."""
    from flowgrpo.config.schema import ModelConfig
    from flowgrpo.training.hub import check_model_path

    tiny_wan22_ti2v_pipeline(seed=0).save_pretrained(str(tmp_path))
    assert json.loads((tmp_path / "model_index.json").read_text())["_class_name"] == "WanPipeline"
    check_model_path(ModelConfig(family="wan_i2v", path=str(tmp_path)))
    adapter = pipelines.load("wan_i2v", str(tmp_path), **TI2V)
    assert adapter.expand_timesteps and adapter.latent_shape() == (8, 2, 2, 4)
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    y = euler_rollout(adapter, x, 5.0, steps=2)
    assert y.shape == x.shape and torch.isfinite(y).all()


def _text_to_video_as_i2v():
    from diffusers import WanImageToVideoPipeline

    t2v = tiny_wan_pipeline()
    return WanImageToVideoPipeline(tokenizer=t2v.tokenizer, text_encoder=t2v.text_encoder,
                                   vae=t2v.vae, scheduler=t2v.scheduler,
                                   transformer=t2v.transformer)


def _without_image_encoder():
    pipe = tiny_wan_i2v_pipeline()
    pipe.image_encoder = None
    return pipe


BAD = [  # (pipeline builder, adapter options, message)
    (tiny_wan_i2v_pipeline, {"max_sequence_length": 16}, "set max_sequence_length: 512"),
    (tiny_wan_i2v_pipeline, {"height": 20}, "wan_i2v: height and width must be multiples of 16"),
    (tiny_wan_i2v_pipeline, {"num_frames": 6}, "wan_i2v: num_frames must be 4k"),
    (tiny_wan_i2v_pipeline, {"guidance_scale_2": 2.0}, "wan_i2v: guidance_scale_2 needs"),
    (tiny_wan22_i2v_a14b_pipeline, {"lora_expert": "mid"}, "wan_i2v: lora_expert must be"),
    (_text_to_video_as_i2v, {}, "text-to-video checkpoint is family wan"),
    (tiny_wan_pipeline, {}, "needs a WanImageToVideoPipeline"),
    (_without_image_encoder, {}, "has no image_encoder"),
]


@pytest.mark.parametrize(("build", "options", "match"), BAD, ids=[b[2][:24] for b in BAD])
def test_option_errors_are_one_line(build, options, match):
    with pytest.raises(ValueError, match=match) as err:
        WanI2VAdapter(pipeline=build(), **{**WAN_I2V, **options})
    assert "\n" not in str(err.value)


def test_a_sample_without_a_first_frame_is_refused():
    adapter = make("wan22_a14b", image=None)
    with pytest.raises(ValueError, match=r"samples \[1\] have no first frame") as err:
        adapter.encode_inputs(PROMPTS, [{"image": FIRST_FRAME}, {}])
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="wan_i2v: a source image must be"):
        adapter.encode_inputs(PROMPTS[:1], [{"image": 3}])
    assert len(make("wan22_a14b").encode_inputs(PROMPTS, [{"image": FIRST_FRAME}, {}])) == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["wan22_a14b", "wan22_ti2v"])
def test_family_contract_on_first_frames(name, tmp_path):
    """The family contract with the unchanged trainer on a ``.jsonl`` whose lines bring their
    own first frames: ratio 1 under every sampler, one update that changes LoRA weights only
    (the frozen expert untouched), a checkpoint whose LoRA loads back."""
    folder = tmp_path / "model"
    CASES[name].make().pipeline.save_pretrained(str(folder))
    (tmp_path / "frames").mkdir()
    for i in range(2):
        picture(24, 40, seed=10 + i).save(tmp_path / "frames" / f"{i}.png")
    rows = tmp_path / "i2v.jsonl"
    rows.write_text("".join(json.dumps({"prompt": p, "image": f"frames/{i}.png"}) + "\n"
                            for i, p in enumerate(["the boat drifts", "the kite rises"])))
    options = {k: v for k, v in CASES[name].options.items() if k != "image"}
    check_family_contract("wan_i2v", folder, options, tmp_path / "run", prompts=str(rows),
                          guidance=3.5)
