"""Wan2.2 (TI2V-5B per-token timesteps; A14B two experts), HunyuanVideo and Qwen-Image against
their diffusers pipelines, on tiny models built in code: Euler parity within 1e-5 (with and without
guidance), the initial noise, LoRA round trips through ``load_lora_weights``, decoding, region
maps, option errors, and the family contract (one training step through the unchanged trainer).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import pipelines
from flowgrpo.rl.reference import reference
from flowgrpo.testing import check_family_contract
from helpers.family_cases import (
    PROMPTS,
    STEPS,
    WAN22_A14B,
    euler_rollout,
    pipeline_latents,
)
from helpers.family_cases import VARIANT_CASES as CASES
from helpers.tiny_video import tiny_wan22_a14b_pipeline
from pipelines.flux import pack_latents
from pipelines.wan import WanAdapter

TOL = 1e-5
TRUE_CFG = {"true_cfg_scale": 3.0, "negative_prompt": "blurry"}
QWEN_CFG = {"true_cfg_scale": 4.0, "negative_prompt": " "}  # the adapter's default negative

PARITY = [  # (case, guidance, adapter options, extra pipeline arguments)
    ("wan22_ti2v", 1.0, {}, {}),
    ("wan22_ti2v", 5.0, {}, {}),
    ("wan22_a14b", 1.0, {}, {}),
    ("wan22_a14b", 4.0, {}, {}),
    ("wan22_a14b", 4.0, {"guidance_scale_2": 2.5}, {"guidance_scale_2": 2.5}),
    ("wan22_a14b", 4.0, {"lora_expert": "low"}, {}),
    ("wan22_a14b", 1.0, {"guidance_scale_2": 3.0}, {"guidance_scale_2": 3.0}),  # no CFG at all
    ("hunyuan_video", 6.0, {}, {}),  # guidance embedding only
    ("hunyuan_video", 1.0, {}, {}),
    ("hunyuan_video", 6.0, TRUE_CFG, TRUE_CFG),  # true CFG on top of the embedding
    ("qwen_image", 1.0, {}, {"true_cfg_scale": 1.0}),
    ("qwen_image", 4.0, {}, QWEN_CFG),  # true CFG with the per-token norm rescale
    ("qwen_image", 4.0, {"negative_prompt": "blurry, low quality"},
     {"true_cfg_scale": 4.0, "negative_prompt": "blurry, low quality"}),
]


def ident(options: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in options.items()
                    if isinstance(v, str | int | float)) or "default"


def make(name: str, build: dict | None = None, **options: Any) -> pipelines.FlowAdapter:
    return CASES[name][1].make(build, **options)


@pytest.mark.parametrize(("name", "guidance", "options", "extra"), PARITY,
                         ids=[f"{p[0]}-g{p[1]}-{ident(p[2])}" for p in PARITY])
def test_euler_rollout_matches_pipeline(name, guidance, options, extra):
    case = CASES[name][1]
    adapter = case.make(**options)
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ref = pipeline_latents(case, adapter, x, guidance, **extra).float()
    ours = euler_rollout(adapter, x, guidance)
    diff = (ours - ref).abs().max().item()
    print(f"parity {name} guidance={guidance} {options or ''}: max abs diff {diff:.3g}")
    assert ours.shape == ref.shape
    assert diff <= TOL
    assert (ours - x).abs().max() > 1e-2  # the rollout moved


def test_two_experts_split_where_the_pipeline_splits():
    """Shift 3, 5 steps: sigmas 1, .923 run ``transformer`` (t >= 875), .818, .667, .429 run
    ``transformer_2``; the pipeline's calls go to the same experts. A batch that straddles the
    boundary gives each sample its own expert's velocity."""
    adapter = make("wan22_a14b")
    pipe = adapter.pipeline
    sigmas = adapter.schedule(STEPS)
    assert adapter.high_noise(sigmas[:-1]).tolist() == [True, True, False, False, False]
    seen: list[str] = []
    hooks = [m.register_forward_hook(lambda *_, n=n: seen.append(n))
             for n, m in (("high", pipe.transformer), ("low", pipe.transformer_2))]
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    euler_rollout(adapter, x, 4.0)
    ours, seen[:] = list(seen), []
    pipeline_latents(CASES["wan22_a14b"][1], adapter, x, 4.0)
    for h in hooks:
        h.remove()
    assert ours == ["high"] * 2 + ["low"] * 3  # CFG: one batched call per step
    assert seen == ["high"] * 4 + ["low"] * 6  # the pipeline: two calls per step
    cond = adapter.encode(PROMPTS)
    sigma = torch.tensor([0.95, 0.5])
    with torch.no_grad():
        mixed = adapter.velocity(x, sigma, cond, 4.0)
        apart = torch.cat([adapter.velocity(x[i:i + 1], sigma[i:i + 1], cond.index([i]), 4.0)
                           for i in range(2)])
    torch.testing.assert_close(mixed, apart, rtol=0, atol=1e-6)
    # The same pipeline without a boundary runs `transformer` only: the experts do differ.
    single = WanAdapter(pipeline=tiny_wan22_a14b_pipeline(boundary_ratio=None), **WAN22_A14B)
    assert single.frozen_expert is None
    assert (euler_rollout(single, x, 4.0) - euler_rollout(adapter, x, 4.0)).abs().max() > 1e-2


def test_ti2v_feeds_one_timestep_per_token():
    adapter = make("wan22_ti2v")
    seen = []
    hook = adapter.transformer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["timestep"]), with_kwargs=True)
    x = adapter.noise(2)  # [2, 8, 2, 2, 4]: 2 latent frames of 1 x 2 tokens (2x2 patches)
    with torch.no_grad():
        adapter.velocity(x, torch.tensor([0.5, 0.25]), adapter.encode(PROMPTS), 1.0)
    hook.remove()
    assert torch.equal(seen[0], torch.tensor([[500.0] * 4, [250.0] * 4]))


@pytest.mark.parametrize("name", list(CASES))
def test_noise_matches_pipeline_draw(name):
    adapter = make(name)
    ours = adapter.noise(2, torch.Generator().manual_seed(3))
    o, g = CASES[name][1].options, torch.Generator().manual_seed(3)
    if name == "qwen_image":  # packed [2, 4, 16] from a [2, 1, 4, 4, 4] draw
        ref = adapter.pipeline.prepare_latents(2, 4, 32, 32, torch.float32, "cpu", g)
    else:
        c = adapter.latent_shape()[0]
        ref = adapter.pipeline.prepare_latents(2, c, o["height"], o["width"], o["num_frames"],
                                               torch.float32, "cpu", g)
    assert torch.equal(ours, ref)


def add_random_lora(adapter: pipelines.FlowAdapter) -> dict[str, torch.Tensor]:
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    adapter.add_lora(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                target_modules=list(adapter.default_lora_targets)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in adapter.transformer.named_parameters():
            if "lora_B" in n:  # gaussian init leaves B at zero: perturb it
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    state = get_peft_model_state_dict(adapter.transformer)
    assert state, "no LoRA layer matched default_lora_targets"
    return state


ROUND_TRIP = [  # (case, adapter options, guidance, extra pipeline arguments)
    ("wan22_ti2v", {}, 1.0, {}),
    ("wan22_a14b", {}, 4.0, {}),
    ("wan22_a14b", {"lora_expert": "low"}, 4.0, {}),
    ("hunyuan_video", {}, 6.0, {}),
    ("qwen_image", {}, 4.0, QWEN_CFG),
]


@pytest.mark.parametrize(("name", "options", "guidance", "extra"), ROUND_TRIP,
                         ids=[f"{r[0]}-{ident(r[1])}" for r in ROUND_TRIP])
def test_lora_round_trip_through_diffusers(name, options, guidance, extra, tmp_path):
    """A LoRA on the adapter's transformer, written with ``save_lora`` and read into a fresh
    pipeline with ``load_lora`` (diffusers' ``load_lora_weights``), reproduces the adapter and
    the pipeline. Wan2.2 A14B: the LoRA lands in the chosen expert only."""
    case = CASES[name][1]
    adapter = case.make(**options)
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(5))
    steps = 3  # A14B: sigmas 1, .857, .6 -> both experts run
    base = euler_rollout(adapter, x, guidance, steps=steps)
    state = add_random_lora(adapter)
    adapter.save_lora(str(tmp_path), state, adapter.transformer.peft_config["default"].to_dict())
    tuned = euler_rollout(adapter, x, guidance, steps=steps)
    assert (tuned - base).abs().max() > 1e-3

    fresh = case.make(**options)
    fresh.load_lora(str(tmp_path))
    loaded = euler_rollout(fresh, x, guidance, steps=steps)
    out = fresh.pipeline(prompt=list(PROMPTS), num_inference_steps=steps, guidance_scale=guidance,
                         latents=x.clone(), output_type="latent", **case.call, **extra)
    out = getattr(out, case.output)
    assert (loaded - tuned).abs().max() <= TOL
    assert (out.float() - tuned).abs().max() <= TOL
    if name == "wan22_a14b":
        def has_lora(module):
            return any("lora_" in n for n, _ in module.named_parameters())

        low = options.get("lora_expert") == "low"
        assert has_lora(fresh.pipeline.transformer_2) == low
        assert has_lora(fresh.pipeline.transformer) != low
        other = case.make(lora_expert="high" if low else "low")
        with pytest.raises(ValueError, match="set lora_expert"):
            other.load_lora(str(tmp_path))


@pytest.mark.parametrize("lora_expert", ["high", "low"])
def test_two_expert_reference_is_the_base_model(lora_expert):
    """With the LoRA on one expert, the trainer's reference (LoRA disabled) is the base model at
    every sigma, and the LoRA changes the velocity only where its expert runs."""
    adapter = make("wan22_a14b", lora_expert=lora_expert)
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    cond = adapter.encode(PROMPTS)
    sigmas = {"high": torch.full((2,), 0.95), "low": torch.full((2,), 0.5)}
    with torch.no_grad():
        base = {k: adapter.velocity(x, s, cond, 4.0) for k, s in sigmas.items()}
        add_random_lora(adapter)
        tuned = {k: adapter.velocity(x, s, cond, 4.0) for k, s in sigmas.items()}
        with reference(adapter):
            ref = {k: adapter.velocity(x, s, cond, 4.0) for k, s in sigmas.items()}
    for k in sigmas:
        assert torch.equal(ref[k], base[k])
        assert ((tuned[k] - base[k]).abs().max() > 1e-3) == (k == lora_expert)
    frozen = adapter.frozen_expert
    assert not any(p.requires_grad for p in frozen.parameters())
    assert not any("lora_" in n for n, _ in frozen.named_parameters())


EXPECTED_MEDIA = {  # name: (modality, decoded shape for 2 samples), values in [0, 1]
    "wan22_ti2v": ("video", (2, 5, 3, 32, 64)),
    "wan22_a14b": ("video", (2, 5, 3, 16, 16)),
    "hunyuan_video": ("video", (2, 5, 3, 16, 16)),
    "qwen_image": ("image", (2, 3, 32, 32)),
}


@pytest.mark.parametrize("name", list(EXPECTED_MEDIA))
def test_decode_shape_range_and_pipeline_match(name):
    case = CASES[name][1]
    adapter = case.make()
    modality, shape = EXPECTED_MEDIA[name]
    assert adapter.modality == modality
    x = adapter.noise(2, torch.Generator().manual_seed(2))
    media = adapter.decode(x)
    assert media.shape == shape and media.dtype == torch.float32
    assert 0.0 <= media.min() and media.max() <= 1.0
    # The pipeline decodes its 2-step result as the adapter decodes the same rollout (2 steps:
    # Qwen-Image's stretched schedule cannot run 1).
    pipe_out = adapter.pipeline(prompt=list(PROMPTS), num_inference_steps=2, guidance_scale=1.0,
                                latents=x.clone(), output_type="pt", **case.call)
    x2 = euler_rollout(adapter, x, 1.0, steps=2)
    assert (adapter.decode(x2) - getattr(pipe_out, case.output).float()).abs().max() <= TOL


@pytest.mark.parametrize("name", ["wan22_ti2v", "hunyuan_video"])
def test_position_weights_cover_every_frame(name):
    adapter = make(name)
    x = adapter.noise(2)  # ti2v: [2, 8, 2, 2, 4] (16x VAE); hunyuan: [2, 4, 2, 2, 2] (8x)
    o = CASES[name][1].options
    regions = torch.zeros(2, o["height"], o["width"])
    regions[:, : o["height"] // 2, : o["width"] // 2] = 1.0  # top-left quarter of every frame
    w = adapter.position_weights(regions, x)
    h, wd = x.shape[-2:]
    assert w.shape == (2, 1, 1, h, wd) and (w * x).shape == x.shape
    corner = torch.zeros(h, wd)
    corner[: h // 2, : wd // 2] = 1.0
    assert torch.equal(w.expand_as(x)[:, 1, 1], corner.expand(2, h, wd))  # channel 1, frame 1


def test_hunyuan_encodings_do_not_depend_on_the_batch():
    """Llama prompts are padded to ``max_sequence_length`` and CLIP's to 77 whatever the batch,
    with a per-sample mask: per-prompt encodings concatenate to the batch's (so
    ``per_prompt_encoding`` is True), and the velocity agrees."""
    adapter = make("hunyuan_video", **TRUE_CFG)
    assert adapter.per_prompt_encoding
    together = adapter.encode(PROMPTS)
    apart = pipelines.Cond.cat([adapter.encode([p]) for p in PROMPTS])
    for k, v in together.tensors.items():
        torch.testing.assert_close(apart.tensors[k], v, rtol=0, atol=1e-6)
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = adapter.velocity(x, torch.full((2,), 0.7), together, 6.0)
        b = adapter.velocity(x, torch.full((2,), 0.7), apart, 6.0)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert together.tensors["prompt_mask"].sum(1).tolist() == [21, 8]  # "two dogs": 8 tokens


def test_hunyuan_guidance_is_the_embedding_value():
    adapter = make("hunyuan_video")
    seen = []
    hook = adapter.transformer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["guidance"]), with_kwargs=True)
    x = adapter.noise(2)
    with torch.no_grad():
        adapter.velocity(x, torch.full((2,), 0.5), adapter.encode(PROMPTS), 6.0)
    hook.remove()
    assert torch.equal(seen[0], torch.full((2,), 6000.0))  # one call: no CFG batch doubling


def test_qwen_position_weights_follow_packing():
    adapter = make("qwen_image")  # 32x32 pixels -> 4x4x4 latents -> 2x2 tokens of 16
    regions = torch.rand(2, 32, 32)
    x = adapter.noise(2)
    w = adapter.position_weights(regions, x)
    assert w.shape == (2, 4, 1) and (w * x).shape == x.shape
    cells = torch.nn.functional.interpolate(regions[:, None], size=(4, 4), mode="area")
    packed = pack_latents(cells.expand(-1, 4, -1, -1).contiguous())
    torch.testing.assert_close(w[..., 0], packed.mean(-1))


def test_qwen_padding_is_masked_so_a_prompt_sees_no_other():
    """Prompts are padded to the batch's longest (so ``per_prompt_encoding`` is False), but
    the padding is masked: a prompt's velocity does not depend on its batch, with or without
    CFG. Positive and negative encodings share one length."""
    adapter = make("qwen_image")
    assert not adapter.per_prompt_encoding
    together = adapter.encode(PROMPTS)
    alone = adapter.encode(PROMPTS[1:])
    t = together.tensors
    assert t["prompt_embeds"].shape[1] == t["neg_prompt_embeds"].shape[1] > \
        alone.tensors["prompt_embeds"].shape[1]
    assert t["prompt_mask"][1].sum() == alone.tensors["prompt_mask"].sum()
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    for guidance in (1.0, 4.0):
        with torch.no_grad():
            a = adapter.velocity(x[1:], torch.full((1,), 0.7), together.index([1]), guidance)
            b = adapter.velocity(x[1:], torch.full((1,), 0.7), alone, guidance)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_qwen_schedule_ends_at_shift_terminal_then_zero():
    adapter = make("qwen_image")
    sigmas = adapter.schedule(4)
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0 and abs(sigmas[-2].item() - 0.02) < 1e-6
    assert (sigmas[:-1].diff() < 0).all()
    with pytest.raises(ValueError, match="at least 2 steps"):
        adapter.schedule(1)
    unstretched = make("qwen_image", {"shift_terminal": None})
    assert len(unstretched.schedule(1)) == 2


BAD_OPTIONS = [
    ("wan22_ti2v", {"lora_expert": "low"}, "two-expert"),
    ("wan22_ti2v", {"guidance_scale_2": 3.0}, "two-expert"),
    ("wan22_a14b", {"lora_expert": "both"}, "'high' or 'low'"),
    ("wan22_a14b", {"guidance_scale_2": 0.5}, ">= 1"),
    ("wan22_ti2v", {"height": 48}, "multiples of 32"),
    ("hunyuan_video", {"height": 24}, "multiples of 16"),
    ("hunyuan_video", {"num_frames": 6}, "4k \\+ 1"),
    ("hunyuan_video", {"true_cfg_scale": 0.5}, ">= 1"),
    ("hunyuan_video", {"prompt_template": {"template": "no slot", "crop_start": 0}}, "\\{\\}"),
    ("qwen_image", {"width": 40}, "multiples of 16"),
    ("qwen_image", {"max_sequence_length": 2048}, "\\[1, 1024\\]"),
]


@pytest.mark.parametrize(("name", "options", "match"), BAD_OPTIONS)
def test_bad_options_raise_one_line_errors(name, options, match):
    with pytest.raises(ValueError, match=match) as err:
        make(name, **options)
    assert "\n" not in str(err.value)


def test_wan_two_experts_without_transformer_2_is_refused():
    pipe = tiny_wan22_a14b_pipeline()
    pipe.transformer_2 = None
    with pytest.raises(ValueError, match="transformer_2"):
        WanAdapter(pipeline=pipe, **WAN22_A14B)


@pytest.mark.parametrize("name", list(CASES))
def test_load_from_a_local_folder(name, tmp_path):
    family, case = CASES[name]
    adapter = case.make()
    adapter.pipeline.save_pretrained(tmp_path)
    loaded = pipelines.load(family, str(tmp_path), **case.options)
    assert loaded.expand_timesteps if name == "wan22_ti2v" else True
    assert loaded.two_experts if name == "wan22_a14b" else True
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    for s in (0.95, 0.5):  # A14B: both experts
        sigma = torch.full((2,), s)
        with torch.no_grad():
            a = adapter.velocity(x, sigma, adapter.encode(PROMPTS), 1.0)
            b = loaded.velocity(x, sigma, loaded.encode(PROMPTS), 1.0)
        torch.testing.assert_close(a, b)


# -- the family contract (flowgrpo.testing.check_family_contract), on these pipelines ----------

CONTRACT = [("wan22_ti2v", {}), ("wan22_a14b", {}), ("wan22_a14b", {"lora_expert": "low"}),
            ("hunyuan_video", {}), ("qwen_image", {})]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "extra"), CONTRACT,
                         ids=[f"{n}-{ident(e)}" for n, e in CONTRACT])
def test_family_contract(name, extra, tmp_path):
    family, case = CASES[name]
    folder = tmp_path / "model"
    case.make().pipeline.save_pretrained(str(folder))
    check_family_contract(family, folder, {**case.options, **extra}, tmp_path)
