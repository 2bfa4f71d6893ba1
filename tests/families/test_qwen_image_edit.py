"""``qwen_image_edit`` (``QwenImageEditPipeline``) and ``qwen_image_edit_plus``
(``QwenImageEditPlusPipeline``) against their diffusers pipelines, on tiny models built in code.

With the Euler ODE, the same noise, source image(s), steps and true CFG scale, an adapter's
rollout equals the pipeline's ``output_type="latent"`` result, at the pipelines' reference areas
(about 1 MP for the VAE; the plus pipeline's 384^2 for the text encoder) and at the small ones
the tiny cases use (the pipelines' area constants patched to match). The pipelines take one
prompt per call, so their reference is one call per prompt; the adapter pads one batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import pipelines
from helpers.family_cases import CASES, PROMPTS, euler_rollout
from helpers.tiny_qwen_image_edit import SOURCE
from pipelines.qwen_image_edit import CONDITION_AREA, REFERENCE_AREA

TOL = 1e-5
STEPS = 4
SMALL = 64 * 64  # the tiny cases' reference (and condition) area
EDIT = "diffusers.pipelines.qwenimage.pipeline_qwenimage_edit"
PLUS = "diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus"


def picture(height: int, width: int, seed: int = 0):
    from PIL import Image

    pixels = np.random.RandomState(seed).rand(height, width, 3) * 255
    return Image.fromarray(pixels.astype(np.uint8))


def make(family: str, build: dict | None = None, **options: Any) -> pipelines.FlowAdapter:
    return CASES[family].make(build, **options)


def areas(family: str, area: int | None) -> dict[str, int]:
    """The adapter options of a reference area (``None``: the pipelines' defaults)."""
    if area is None:
        return {"reference_area": REFERENCE_AREA} | (
            {"condition_area": CONDITION_AREA} if family.endswith("plus") else {})
    return {"reference_area": area} | ({"condition_area": area} if family.endswith("plus") else {})


def patch_pipeline_areas(monkeypatch, family: str, area: int | None) -> None:
    """Make the pipeline resize its references to ``area`` pixels, as the adapter does: the plus
    pipeline reads module constants; the edit pipeline hard-codes ``1024 * 1024`` in its call to
    ``calculate_dimensions``, which is replaced by one that takes ``area`` instead."""
    if area is None:
        return
    if family.endswith("plus"):
        monkeypatch.setattr(f"{PLUS}.CONDITION_IMAGE_SIZE", area)
        monkeypatch.setattr(f"{PLUS}.VAE_IMAGE_SIZE", area)
    else:
        import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit

        original = edit.calculate_dimensions
        monkeypatch.setattr(edit, "calculate_dimensions", lambda _, ratio: original(area, ratio))


def pipeline_rollout(adapter, images: Any, x: torch.Tensor, guidance: float,
                     steps: int = STEPS, prompts: list[str] = PROMPTS) -> torch.Tensor:
    """The pipeline's own loop from ``x``, one call per prompt (the pipelines' batch size)."""
    extra = {"true_cfg_scale": guidance, "negative_prompt": " "} if guidance > 1 else {}
    out = [adapter.pipeline(image=images, prompt=p, num_inference_steps=steps, height=32,
                            width=32, latents=x[i:i + 1].clone(), output_type="latent",
                            **extra).images for i, p in enumerate(prompts)]
    return torch.cat(out).float()


# ------------------------------------------------------------------------------ parity
PARITY = [  # (family, reference area (None: the pipelines'), guidance, source sizes, build)
    ("qwen_image_edit", SMALL, 1.0, [(24, 40)], {}),
    ("qwen_image_edit", SMALL, 4.0, [(24, 40)], {}),  # true CFG, the negative reads the image
    ("qwen_image_edit", None, 4.0, [(24, 40)], {}),  # the pipeline's ~1 MP: 800 x 1312
    ("qwen_image_edit_plus", SMALL, 1.0, [(24, 40)], {}),
    ("qwen_image_edit_plus", SMALL, 4.0, [(24, 40)], {}),
    ("qwen_image_edit_plus", SMALL, 4.0, [(24, 40), (48, 32)], {}),  # two references
    ("qwen_image_edit_plus", None, 4.0, [(24, 40)], {}),  # 384^2 / 1024^2
    ("qwen_image_edit_plus", SMALL, 4.0, [(24, 40)], {"zero_cond_t": True}),  # 2511-like
]


# the pipelines' ~1 MP reference (4096 tokens, a VAE pass at 800 x 1312) takes ~10 s a case
@pytest.mark.parametrize(("family", "area", "guidance", "sizes", "build"), [
    pytest.param(*p, marks=[pytest.mark.slow] if p[1] is None else [],
                 id=f"{p[0]}-{'default' if p[1] is None else p[1]}-g{p[2]}-"
                    f"{len(p[3])}ref{'-zerocond' if p[4] else ''}") for p in PARITY])
def test_euler_rollout_matches_pipeline(family, area, guidance, sizes, build, monkeypatch):
    images = [picture(h, w, seed=i) for i, (h, w) in enumerate(sizes)]
    source = images if len(images) > 1 else images[0]
    adapter = make(family, build, image=source, **areas(family, area))
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ours = euler_rollout(adapter, x, guidance, steps=STEPS)
    patch_pipeline_areas(monkeypatch, family, area)
    ref = pipeline_rollout(adapter, source, x, guidance)
    diff = (ours - ref).abs().max().item()
    print(f"parity {family} area={area or 'default'} guidance={guidance} refs={sizes} {build}: "
          f"max abs diff {diff:.3g}")
    assert ours.shape == ref.shape == x.shape == (2, 4, 16)
    assert diff <= TOL
    assert (ours - x).abs().max() > 1e-2
    shapes = adapter.encode(PROMPTS[:1]).tensors["image_shapes"][0].tolist()
    if area is None:  # ~1 MP at the source's aspect ratio, sides multiples of 32: 800 x 1312
        assert shapes[0] == [1, 50, 82]
    assert len(shapes) == len(images)


def test_samples_with_their_own_sources_match_each_alone():
    """A batch of different sources (metadata ``"image"``): each row's encoding and velocity are
    those of the sample encoded alone (its embeddings padded with masked zeros)."""
    adapter = make("qwen_image_edit_plus")
    a, b = picture(24, 40, seed=3), picture(24, 40, seed=4)
    cond = adapter.encode_inputs(PROMPTS, [{"image": a}, {"image": [b]}])
    x = adapter.noise(2, torch.Generator().manual_seed(2))
    sigma = torch.full((2,), 0.6)
    with torch.no_grad():
        v = adapter.velocity(x, sigma, cond, 4.0)
        for i, source in enumerate((a, b)):
            alone = adapter.encode_inputs(PROMPTS[i:i + 1], [{"image": source}])
            n = alone.tensors["prompt_embeds"].shape[1]
            torch.testing.assert_close(cond.tensors["prompt_embeds"][i, :n],
                                       alone.tensors["prompt_embeds"][0])
            assert cond.tensors["prompt_mask"][i].sum() == n
            torch.testing.assert_close(cond.tensors["image_latents"][i],
                                       alone.tensors["image_latents"][0])
            mine = adapter.velocity(x[i:i + 1], sigma[:1], alone, 4.0)
            torch.testing.assert_close(v[i:i + 1], mine, rtol=0, atol=1e-6)
    assert not torch.equal(cond.tensors["image_latents"][0], cond.tensors["image_latents"][1])


class Captured(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__("captured")
        self.value = value


@pytest.mark.parametrize("family", ["qwen_image_edit", "qwen_image_edit_plus"])
def test_default_reference_preprocessing_is_the_pipelines(family, tmp_path, monkeypatch):
    """At the default areas the adapter gives the VAE and the text encoder the pipeline's own
    inputs (read from a file path): ~1 MP for the VAE (30 x 52 -> 768 x 1344), the same image
    (edit) or ~384^2 (plus: 288 x 512) for the text encoder."""
    from diffusers.utils import load_image

    adapter = make(family, **areas(family, None))
    pipe = adapter.pipeline
    path = tmp_path / "src.png"
    picture(30, 52).save(path)
    seen = {}
    encode = pipe.encode_prompt

    def keep_prompt_image(*args, image=None, **kwargs):
        seen.setdefault("condition", image)
        return encode(*args, image=image, **kwargs)

    def capture(image, *args, **kwargs):
        raise Captured(image)

    monkeypatch.setattr(pipe, "encode_prompt", keep_prompt_image)
    monkeypatch.setattr(pipe, "prepare_latents", capture)
    with pytest.raises(Captured) as vae_input:
        pipe(image=load_image(str(path)), prompt="x", height=32, width=32)
    condition, pixels = adapter.prepare_references(adapter.load_sources(str(path)))
    theirs = vae_input.value.value
    theirs = theirs[0] if isinstance(theirs, list) else theirs
    assert pixels[0].shape == theirs.shape == (1, 3, 1, 768, 1344)
    torch.testing.assert_close(pixels[0], theirs, rtol=0, atol=0)
    ours = condition[0] if isinstance(condition, list) else condition
    want = seen["condition"][0] if isinstance(seen["condition"], list) else seen["condition"]
    assert ours.size == want.size == ((512, 288) if family.endswith("plus") else (1344, 768))
    assert np.array_equal(np.asarray(ours), np.asarray(want))


# ------------------------------------------------------------------------------ noise, decode
def test_noise_is_the_pipelines_draw():
    adapter = make("qwen_image_edit")
    ours = adapter.noise(2, torch.Generator().manual_seed(3))
    ref, image_latents = adapter.pipeline.prepare_latents(
        None, 2, 4, 32, 32, torch.float32, "cpu", torch.Generator().manual_seed(3))
    assert image_latents is None
    assert ours.shape == (2, 4, 16) and ours.dtype == torch.float32
    assert torch.equal(ours, ref)
    assert not torch.equal(ours, adapter.noise(2, torch.Generator().manual_seed(4)))


@pytest.mark.parametrize("family", ["qwen_image_edit", "qwen_image_edit_plus"])
def test_decode_matches_the_pipeline(family, monkeypatch):
    adapter = make(family)
    x = adapter.noise(2, torch.Generator().manual_seed(2))
    media = adapter.decode(x)
    assert adapter.modality == "image"
    assert media.shape == (2, 3, 32, 32) and media.dtype == torch.float32
    assert 0 <= media.min() and media.max() <= 1
    patch_pipeline_areas(monkeypatch, family, SMALL)
    source = adapter.image
    from diffusers.utils import load_image

    out = [adapter.pipeline(image=load_image(source), prompt=p, num_inference_steps=2,
                            height=32, width=32, latents=x[i:i + 1].clone(),
                            output_type="pt").images for i, p in enumerate(PROMPTS)]
    x2 = euler_rollout(adapter, x, 1.0, steps=2)
    assert (adapter.decode(x2) - torch.cat(out).float()).abs().max() <= 1e-4


# ------------------------------------------------------------------------------ LoRA
@pytest.mark.parametrize("family", ["qwen_image_edit", "qwen_image_edit_plus"])
def test_lora_round_trip_through_diffusers(family, tmp_path, monkeypatch):
    """A LoRA on the default targets, saved with ``save_lora``, loads into a fresh pipeline with
    ``load_lora`` and reproduces the adapter, and the pipeline reproduces it too."""
    from diffusers.utils import load_image
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    adapter = make(family)
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(5))
    base = euler_rollout(adapter, x, 4.0, steps=2)
    transformer = adapter.transformer
    adapter.add_lora(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                target_modules=list(adapter.default_lora_targets)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    state = get_peft_model_state_dict(transformer)
    assert any("add_q_proj" in k for k in state) and any("attn.to_q" in k for k in state)
    adapter.save_lora(str(tmp_path), state, transformer.peft_config["default"].to_dict())
    tuned = euler_rollout(adapter, x, 4.0, steps=2)
    assert (tuned - base).abs().max() > 1e-3

    fresh = make(family)
    fresh.load_lora(str(tmp_path))
    loaded = euler_rollout(fresh, x, 4.0, steps=2)
    assert (loaded - tuned).abs().max() <= TOL
    patch_pipeline_areas(monkeypatch, family, SMALL)
    other = make(family)
    other.pipeline.load_lora_weights(str(tmp_path))
    out = pipeline_rollout(other, load_image(SOURCE), x, 4.0, steps=2)
    assert (out - tuned).abs().max() <= TOL


# ------------------------------------------------------------------------------ options, errors
def test_bad_options_and_inputs_raise_one_line_errors():
    def one_line(match: str, fn, *args, **kwargs):
        with pytest.raises(ValueError, match=match) as err:
            fn(*args, **kwargs)
        assert "\n" not in str(err.value)

    one_line("qwen_image_edit: reference_area must be a pixel count", make, "qwen_image_edit",
             reference_area=100)
    one_line("reference_area must be a pixel count", make, "qwen_image_edit",
             reference_area="1MP")
    one_line("qwen_image_edit_plus: condition_area must be", make, "qwen_image_edit_plus",
             condition_area=0)
    one_line("multiples of 16", make, "qwen_image_edit", height=40)
    edit = make("qwen_image_edit", image=None)
    one_line("samples \\[0, 1\\] have no source image", edit.encode, PROMPTS)
    one_line("samples \\[1\\] have no source image", edit.encode_inputs, PROMPTS,
             [{"image": picture(32, 32)}, {}])
    one_line("one source image per sample.*qwen_image_edit_plus", edit.encode_inputs,
             PROMPTS[:1], [{"image": [picture(32, 32), picture(32, 32)]}])
    one_line("different sizes", edit.encode_inputs, PROMPTS,
             [{"image": picture(32, 32)}, {"image": picture(24, 48)}])
    one_line("less elongated", edit.encode_inputs, PROMPTS[:1], [{"image": picture(8, 400)}])
    one_line("must be \\[3, h, w\\]", edit.encode_inputs, PROMPTS[:1],
             [{"image": torch.rand(2, 8)}])
    # encoded one by one and concatenated, as a caller may: one img_shapes per batch
    cond = pipelines.Cond.cat([edit.encode_inputs(PROMPTS[:1], [{"image": picture(*size)}])
                               for size in ((32, 64), (64, 32))])
    one_line("different sizes", edit.velocity, edit.noise(2), torch.ones(2), cond, 1.0)
    plus = make("qwen_image_edit_plus", image=None)
    one_line("empty list", plus.encode_inputs, PROMPTS[:1], [{"image": []}])
    one_line("different sizes", plus.encode_inputs, PROMPTS,
             [{"image": picture(32, 32)}, {"image": [picture(32, 32), picture(32, 32)]}])


def test_tensor_and_path_sources_encode_as_their_image(tmp_path):
    from torchvision.transforms.functional import pil_to_tensor

    adapter = make("qwen_image_edit")
    image = picture(32, 48, seed=3)
    image.save(tmp_path / "a.png")
    tensor = pil_to_tensor(image).float() / 255
    conds = [adapter.encode_inputs(PROMPTS[:1], [{"image": v}])
             for v in (str(tmp_path / "a.png"), image, tensor)]
    for c in conds[1:]:
        for k, v in c.tensors.items():
            torch.testing.assert_close(v, conds[0].tensors[k], rtol=0, atol=0)


def test_trainer_facing_attributes():
    for family in ("qwen_image_edit", "qwen_image_edit_plus"):
        adapter = make(family)
        assert adapter.condition_keys == ("image",)
        assert not adapter.per_prompt_encoding  # the batch's embeddings share their padding
        assert "vae" in adapter.text_encoder_names  # the VAE encodes sources with the encoder
        x = adapter.noise(2)
        w = adapter.position_weights(torch.rand(2, 32, 32), x)
        assert w.shape == (2, 4, 1)  # the generated tokens only
    assert pipelines.FAMILIES.get("qwen_image_edit").pipeline_classes == ("QwenImageEditPipeline",)
    assert pipelines.FAMILIES.get("qwen_image_edit_plus").pipeline_classes == (
        "QwenImageEditPlusPipeline",)
