"""The image-editing families against their diffusers pipelines, on tiny models built in code.

``flux_kontext`` (``FluxKontextPipeline``) and ``flux2_klein`` (``Flux2KleinPipeline``): with the
Euler ODE, the same noise, the same source image(s), steps and guidance, an adapter's rollout
equals the pipeline's ``output_type="latent"`` result; the reference preprocessing is the
pipeline's; a LoRA saved with ``save_lora`` loads back through ``load_lora_weights``; the family
contract with the unchanged trainer on a ``.jsonl`` of edits; region maps land on the generated
tokens only.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

import pipelines
from flowgrpo.config.io import from_dict
from flowgrpo.rl.replay import replay_step
from flowgrpo.testing import check_family_contract
from helpers.tiny_editing import (
    KLEIN_LAYERS,
    tiny_flux2_klein_pipeline,
    tiny_flux_kontext_pipeline,
)
from pipelines.flux import pack_latents
from pipelines.flux2 import Flux2KleinAdapter, patch_tokens
from pipelines.flux_kontext import FluxKontextAdapter
from reward_models import REWARDS, RewardOutput

PROMPTS = ["a red cube on a table", "two dogs"]
STEPS = 4
TOL = 1e-5

KONTEXT = dict(height=16, width=16, max_sequence_length=16)
# the pipeline generates the adapter's size with max_area = height * width
KONTEXT_CALL = dict(height=16, width=16, max_sequence_length=16, max_area=256, _auto_resize=False)
KLEIN = dict(height=64, width=64, max_sequence_length=32, text_encoder_out_layers=KLEIN_LAYERS)
KLEIN_CALL = dict(height=64, width=64, max_sequence_length=32,
                  text_encoder_out_layers=KLEIN_LAYERS)


def picture(height: int, width: int, seed: int = 0):
    from PIL import Image

    pixels = np.random.RandomState(seed).rand(height, width, 3) * 255
    return Image.fromarray(pixels.astype(np.uint8))


def kontext(build: dict | None = None, **options: Any) -> FluxKontextAdapter:
    pipe = tiny_flux_kontext_pipeline(seed=0, **(build or {}))
    pipe.set_progress_bar_config(disable=True)
    return FluxKontextAdapter(pipeline=pipe, **{**KONTEXT, **options})


def klein(is_distilled: bool = False, **options: Any) -> Flux2KleinAdapter:
    pipe = tiny_flux2_klein_pipeline(seed=0, is_distilled=is_distilled)
    pipe.set_progress_bar_config(disable=True)
    return Flux2KleinAdapter(pipeline=pipe, **{**KLEIN, **options})


def rollout(adapter: pipelines.FlowAdapter, x: torch.Tensor, cond: pipelines.Cond,
            guidance: float, steps: int = STEPS) -> torch.Tensor:
    """The Euler ODE ``x <- x + (s' - s) v`` over the adapter's schedule, in float32."""
    sigmas = adapter.schedule(steps)
    y = x.clone()
    with torch.no_grad():
        for k in range(steps):
            v = adapter.velocity(y, sigmas[k].expand(len(y)), cond, guidance).float()
            y = y + (sigmas[k + 1] - sigmas[k]) * v
    return y


def klein_grid(adapter: Flux2KleinAdapter, x: torch.Tensor) -> torch.Tensor:
    """Adapter tokens -> the ``[B, 4C, h/2, w/2]`` latents the pipeline takes."""
    h, w = adapter.token_grid_size()
    return x.permute(0, 2, 1).reshape(len(x), -1, h, w)


def edits(images: Any) -> list[dict] | None:
    return None if images is None else [{"image": images} for _ in PROMPTS]


# ------------------------------------------------------------------------------ Kontext parity
KONTEXT_PARITY = [  # (reference_size, source size, guidance, true CFG scale, build)
    ("output", (16, 16), 3.5, 1.0, {}),
    ("output", (24, 20), 2.5, 1.0, {}),  # the pipeline gets the source at the output size
    ("source", (20, 28), 3.5, 1.0, {}),  # a reference grid unlike the output's (5x7 tokens)
    ("source", (20, 28), 3.5, 2.0, {}),  # true CFG: the negative sees the same reference
    ("source", (20, 28), 0.0, 1.0, {"guidance_embeds": False}),  # no guidance embedding
    (None, None, 3.5, 1.0, {}),  # no source: plain text-to-image, as image=None
]


@pytest.mark.parametrize(("mode", "size", "guidance", "true_cfg", "build"), KONTEXT_PARITY,
                         ids=[f"{p[0]}-{p[1]}-g{p[2]}-cfg{p[3]}{'-noembed' if p[4] else ''}"
                              for p in KONTEXT_PARITY])
def test_kontext_euler_rollout_matches_pipeline(mode, size, guidance, true_cfg, build):
    adapter = kontext(build, reference_size=mode or "output", true_cfg_scale=true_cfg)
    pipe = adapter.pipeline
    source = None if size is None else picture(*size)
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    cond = adapter.encode_inputs(PROMPTS, edits(source))
    ours = rollout(adapter, x, cond, guidance)
    given = source
    if mode == "output" and source is not None:
        given = pipe.image_processor.resize(source, 16, 16)  # the pipeline's own resize
    extra = {"true_cfg_scale": true_cfg, "negative_prompt": ""} if true_cfg > 1 else {}
    ref = pipe(image=given, prompt=list(PROMPTS), num_inference_steps=STEPS,
               guidance_scale=guidance, latents=x.clone(), output_type="latent",
               **KONTEXT_CALL, **extra).images.float()
    diff = (ours - ref).abs().max().item()
    print(f"parity flux_kontext {mode} {size} guidance={guidance} true_cfg={true_cfg}: "
          f"max abs diff {diff:.3g}")
    assert ours.shape == ref.shape == x.shape
    assert diff <= TOL
    assert (ours - x).abs().max() > 1e-2
    if source is not None:
        tokens = {"output": 16, "source": 35}[mode]
        assert cond.tensors["image_latents"].shape == (2, tokens, 16)
        assert cond.tensors["image_ids"][:, :, 0].eq(1).all()


def test_kontext_noise_is_the_pipelines_draw():
    adapter = kontext()
    ours = adapter.noise(2, torch.Generator().manual_seed(3))
    ref, _, ids, _ = adapter.pipeline.prepare_latents(None, 2, 4, 16, 16, torch.float32, "cpu",
                                                      torch.Generator().manual_seed(3))
    assert torch.equal(ours, ref)
    assert torch.equal(adapter.image_ids("cpu"), ids)


class Captured(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__("captured")
        self.value = value


@pytest.mark.parametrize("mode", ["auto", "source", "output"])
def test_kontext_reference_preprocessing_is_the_pipelines(mode, tmp_path, monkeypatch):
    """The pixels the adapter encodes are those the pipeline hands to ``prepare_latents``
    (``auto``: the nearest Kontext training resolution, ~1 MP; read from a file path)."""
    from diffusers.utils import load_image

    adapter = kontext(reference_size=mode)
    pipe = adapter.pipeline
    path = tmp_path / "src.png"
    picture(30, 52).save(path)

    def capture(image, *args, **kwargs):
        raise Captured(image)

    monkeypatch.setattr(pipe, "prepare_latents", capture)
    given = load_image(str(path))
    if mode == "output":
        given = pipe.image_processor.resize(given, 16, 16)
    with pytest.raises(Captured) as seen:
        pipe(image=given, prompt="x", **{**KONTEXT_CALL, "_auto_resize": mode == "auto"})
    ours = adapter.reference_pixels(str(path))
    expected = {"auto": (1, 3, 752, 1392), "source": (1, 3, 28, 52), "output": (1, 3, 16, 16)}
    assert ours.shape == expected[mode]
    torch.testing.assert_close(ours, seen.value.value.float(), rtol=0, atol=0)


def test_kontext_sources_as_path_pil_or_tensor_encode_alike(tmp_path):
    from torchvision.transforms.functional import pil_to_tensor

    adapter = kontext()
    image = picture(16, 16, seed=3)
    image.save(tmp_path / "a.png")
    tensor = pil_to_tensor(image).float() / 255
    conds = [adapter.encode_inputs(PROMPTS[:1], [{"image": v}])
             for v in (str(tmp_path / "a.png"), image, tensor)]
    for c in conds[1:]:
        torch.testing.assert_close(c.tensors["image_latents"], conds[0].tensors["image_latents"])
    other = adapter.encode_inputs(PROMPTS[:1], [{"image": picture(16, 16, seed=4)}])
    assert not torch.equal(other.tensors["image_latents"], conds[0].tensors["image_latents"])


# ------------------------------------------------------------------------------ klein parity
KLEIN_PARITY = [  # (distilled, guidance, reference sizes (h, w), reference_size)
    (False, 1.0, [(64, 64)], "output"),
    (False, 4.0, [(64, 64)], "output"),  # CFG against "" on the base model
    (False, 4.0, [(72, 100)], "source"),  # the pipeline's crop to multiples of 16 (64 x 96)
    (False, 4.0, [(72, 100), (64, 64)], "source"),  # two references: T = 10, 20
    (False, 4.0, None, "output"),  # no reference: text-to-image
    (True, 1.0, [(64, 64)], "output"),  # step-distilled: no CFG
]


@pytest.mark.parametrize(("distilled", "guidance", "sizes", "mode"), KLEIN_PARITY,
                         ids=[f"{'distilled' if p[0] else 'base'}-g{p[1]}-"
                              f"{len(p[2]) if p[2] else 0}ref-{p[3]}" for p in KLEIN_PARITY])
def test_klein_euler_rollout_matches_pipeline(distilled, guidance, sizes, mode):
    adapter = klein(distilled, reference_size=mode)
    images = None if sizes is None else [picture(h, w, seed=i) for i, (h, w) in enumerate(sizes)]
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    cond = adapter.encode_inputs(PROMPTS, edits(images))
    ours = rollout(adapter, x, cond, guidance)
    ref = adapter.pipeline(image=images, prompt=list(PROMPTS), num_inference_steps=STEPS,
                           guidance_scale=guidance, latents=klein_grid(adapter, x).clone(),
                           output_type="latent", **KLEIN_CALL).images.float()
    diff = (adapter.vae_latents(ours) - ref).abs().max().item()
    print(f"parity flux2_klein distilled={distilled} guidance={guidance} refs={sizes} {mode}: "
          f"max abs diff {diff:.3g}")
    assert ours.shape == x.shape == (2, 16, 16)
    assert diff <= TOL
    assert (ours - x).abs().max() > 1e-2
    if images is not None:
        ids = cond.tensors["image_ids"][0]
        times = sorted(set(ids[:, 0].tolist()))
        assert times == [10 * (i + 1) for i in range(len(images))]
        assert cond.tensors["image_latents"].shape[1] == len(ids)


def test_klein_noise_and_schedule_are_the_pipelines():
    """Same draw as ``prepare_latents``; the shift depends on the step count (empirical mu)."""
    adapter = klein()
    pipe = adapter.pipeline
    ours = adapter.noise(2, torch.Generator().manual_seed(3))
    ref, ids = pipe.prepare_latents(2, 4, 64, 64, torch.float32, "cpu",
                                    torch.Generator().manual_seed(3))
    assert torch.equal(ours, ref)
    assert torch.equal(adapter.latent_ids("cpu"), ids[0])
    seen = {}

    def keep(pipe, i, t, tensors):
        seen.setdefault(pipe.num_timesteps, pipe.scheduler.sigmas.clone())
        return tensors

    for steps in (3, 8):
        pipe(prompt="x", num_inference_steps=steps, output_type="latent",
             callback_on_step_end=keep, **KLEIN_CALL)
        torch.testing.assert_close(adapter.schedule(steps), seen[steps].float(), rtol=0, atol=0)
    # mu = compute_empirical_mu(L, N) moves with N: the 8-step grid is not the 3-step one's
    # shift applied to more points
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    assert compute_empirical_mu(16, 3) != compute_empirical_mu(16, 8)
    sigma = adapter.schedule(8)[4]  # shift(mu_8, 0.5) vs shift(mu_3, 0.5)
    assert abs(float(sigma) - float(pipe.scheduler.time_shift(compute_empirical_mu(16, 3), 1.0,
                                                               torch.tensor(0.5)))) > 1e-3


def test_klein_reference_preprocessing_is_the_pipelines(monkeypatch):
    """``source``: the pipeline's rule, including the scale-down of references over 1024^2
    pixels; ``output``: a reference of another size is scaled to cover the output and
    center-cropped; a tensor reference is taken as its 8-bit image."""
    from PIL import Image
    from torchvision.transforms.functional import pil_to_tensor

    def capture(images, *args, **kwargs):
        raise Captured(images)

    adapter = klein(reference_size="source")
    pipe = adapter.pipeline
    monkeypatch.setattr(pipe, "prepare_image_latents", capture)
    big = picture(1000, 1100, seed=5)
    with pytest.raises(Captured) as seen:
        pipe(image=big, prompt="x", **KLEIN_CALL)
    ours = adapter.reference_pixels(big)
    assert ours.shape == (1, 3, 976, 1072)
    torch.testing.assert_close(ours, seen.value.value[0], rtol=0, atol=0)
    tensor = pil_to_tensor(big).float() / 255
    torch.testing.assert_close(adapter.reference_pixels(tensor), ours, rtol=0, atol=0)

    adapter.reference_size = "output"  # 128 x 128 -> 64 x 64: what the pipeline gets
    square = picture(128, 128, seed=6)
    with pytest.raises(Captured) as seen:
        pipe(image=square.resize((64, 64), Image.Resampling.LANCZOS), prompt="x", **KLEIN_CALL)
    torch.testing.assert_close(adapter.reference_pixels(square), seen.value.value[0], rtol=0,
                               atol=0)
    wide = picture(128, 192, seed=6)  # -> 64 x 96, then the processor's center crop to 64 x 64
    covered = wide.resize((96, 64), Image.Resampling.LANCZOS)
    crop = pipe.image_processor.preprocess(covered, height=64, width=64, resize_mode="crop")
    torch.testing.assert_close(adapter.reference_pixels(wide), crop, rtol=0, atol=0)
    torch.testing.assert_close(crop, pipe.image_processor.preprocess(
        covered.crop((16, 0, 80, 64)), height=64, width=64), rtol=0, atol=0)


# ------------------------------------------------------------------------------ LoRA, decode
@pytest.mark.parametrize("family", ["flux_kontext", "flux2_klein"])
def test_lora_round_trip_through_diffusers(family, tmp_path):
    """A LoRA on the default targets, saved with ``save_lora``, loads into a fresh pipeline with
    ``load_lora`` (``load_lora_weights``) and reproduces the adapter, and the pipeline (with the
    same source image) reproduces it too."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    make = kontext if family == "flux_kontext" else klein
    source = picture(16, 16) if family == "flux_kontext" else picture(64, 64)
    guidance = 3.5 if family == "flux_kontext" else 4.0
    adapter = make()
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(5))
    cond = adapter.encode_inputs(PROMPTS, edits(source))
    base = rollout(adapter, x, cond, guidance, steps=2)
    transformer = adapter.transformer
    adapter.add_lora(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                target_modules=list(adapter.default_lora_targets)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    state = get_peft_model_state_dict(transformer)
    if family == "flux2_klein":
        assert any("to_qkv_mlp_proj" in k for k in state)  # the single-stream blocks too
    adapter.save_lora(str(tmp_path), state, transformer.peft_config["default"].to_dict())
    tuned = rollout(adapter, x, cond, guidance, steps=2)
    assert (tuned - base).abs().max() > 1e-3

    fresh = make()
    fresh.load_lora(str(tmp_path))
    loaded = rollout(fresh, x, fresh.encode_inputs(PROMPTS, edits(source)), guidance, steps=2)
    assert (loaded - tuned).abs().max() <= TOL
    if family == "flux_kontext":
        out = fresh.pipeline(image=source, prompt=list(PROMPTS), num_inference_steps=2,
                             guidance_scale=guidance, latents=x.clone(), output_type="latent",
                             **KONTEXT_CALL).images
        assert (out.float() - tuned).abs().max() <= TOL
    else:
        out = fresh.pipeline(image=source, prompt=list(PROMPTS), num_inference_steps=2,
                             guidance_scale=guidance, latents=klein_grid(fresh, x),
                             output_type="latent", **KLEIN_CALL).images
        assert (out.float() - fresh.vae_latents(tuned)).abs().max() <= TOL


@pytest.mark.parametrize("family", ["flux_kontext", "flux2_klein"])
def test_decode_shape_range_and_pipeline_match(family):
    adapter = kontext() if family == "flux_kontext" else klein()
    size = 16 if family == "flux_kontext" else 64
    source = picture(size, size)
    call = KONTEXT_CALL if family == "flux_kontext" else KLEIN_CALL
    x = adapter.noise(2, torch.Generator().manual_seed(2))
    media = adapter.decode(x)
    assert adapter.modality == "image"
    assert media.shape == (2, 3, size, size) and media.dtype == torch.float32
    assert 0 <= media.min() and media.max() <= 1
    latents = x if family == "flux_kontext" else klein_grid(adapter, x)
    out = adapter.pipeline(image=source, prompt=list(PROMPTS), num_inference_steps=1,
                           guidance_scale=1.0, latents=latents.clone(), output_type="pt", **call)
    x1 = rollout(adapter, x, adapter.encode_inputs(PROMPTS, edits(source)), 1.0, steps=1)
    assert (adapter.decode(x1) - out.images.float()).abs().max() <= 1e-4


# ------------------------------------------------------------------------------ regions
@pytest.mark.parametrize("family", ["flux_kontext", "flux2_klein"])
def test_position_weights_cover_the_generated_tokens_only(family):
    """Latents (and so region maps) are the generated tokens; the reference tokens sit in the
    condition. A token is a 16-pixel square here too (FLUX packing / FLUX.2 patchify)."""
    adapter = kontext(reference_size="source") if family == "flux_kontext" else klein(
        reference_size="source")
    source = picture(20, 28) if family == "flux_kontext" else picture(72, 100)
    cond = adapter.encode_inputs(PROMPTS, edits(source))
    x = adapter.noise(2)
    side = 16 if family == "flux_kontext" else 64  # output pixels; both 4 x 4 tokens
    regions = torch.rand(2, side, side)
    w = adapter.position_weights(regions, x)
    assert w.shape == (2, 16, 1) and (w * x).shape == x.shape
    assert cond.tensors["image_latents"].shape[1] != x.shape[1]  # 35 / 24 reference tokens
    v = adapter.velocity(x, torch.full((2,), 0.5), cond, 1.0)
    assert v.shape == x.shape
    # token t = row * 4 + col covers pixels [16 r, 16 r + 16) x [16 c, 16 c + 16) of the
    # 16-pixel token grid (vae 2x for the tiny Kontext, 8x for klein, then 2x2 patches)
    cells = torch.nn.functional.interpolate(regions[:, None], size=(4, 4), mode="area")
    torch.testing.assert_close(w[..., 0], cells.flatten(1))
    if family == "flux_kontext":
        vae_cells = torch.nn.functional.interpolate(regions[:, None], size=(8, 8), mode="area")
        torch.testing.assert_close(w[..., 0],
                                   pack_latents(vae_cells.expand(-1, 4, -1, -1)).mean(-1))
    else:
        torch.testing.assert_close(w[..., 0], patch_tokens(cells)[..., 0])


# ------------------------------------------------------------------------------ trainer
SETUP = {  # family: (pipeline builder, adapter options, source image side)
    "flux_kontext": (tiny_flux_kontext_pipeline, dict(KONTEXT), 16),
    "flux2_klein": (tiny_flux2_klein_pipeline,
                    dict(KLEIN, text_encoder_out_layers=list(KLEIN_LAYERS)), 64),
}


def corner():
    """Brightness, with region scores that differ between samples only in the top-left
    quarter of the 4 x 4 grid (the other cells score 0.5)."""

    def reward(media, prompts, metadata):
        assert all("image" in m for m in metadata)  # the edit's source reaches the reward
        img = media.data.float().mean(1)
        cells = torch.nn.functional.adaptive_avg_pool2d(img[:, None], (4, 4))[:, 0]
        regions = torch.full_like(cells, 0.5)
        regions[:, :2, :2] = cells[:, :2, :2]
        return RewardOutput(img.flatten(1).mean(1), regions=regions)

    return reward


@pytest.fixture(scope="module", autouse=True)
def corner_edit_reward():
    """``corner_edit_test`` registered for this module's tests only."""
    with REWARDS.registered("corner_edit_test", corner):
        yield


def edit_setup(family: str, tmp_path) -> tuple[Any, Any]:
    """A saved tiny pipeline folder and a ``.jsonl`` of two edits (image paths relative to it)."""
    build, _, side = SETUP[family]
    folder = tmp_path / "model"
    build(seed=0).save_pretrained(str(folder))
    (tmp_path / "src").mkdir()
    for i in range(2):
        picture(side, side, seed=10 + i).save(tmp_path / "src" / f"{i}.png")
    rows = tmp_path / "edits.jsonl"
    rows.write_text("".join(json.dumps({"prompt": p, "image": f"src/{i}.png"}) + "\n"
                            for i, p in enumerate(["make it red", "add a hat"])))
    return folder, rows


@pytest.mark.slow
@pytest.mark.parametrize("family", ["flux_kontext", "flux2_klein"])
def test_family_contract(family, tmp_path):
    """tests/families/test_family_contract.py's contract on a prompt set of edits: every stochastic
    sampler replays with ratio 1, one update changes only LoRA weights, the checkpoint's LoRA
    loads back (velocities compared with the samples' own source images)."""
    folder, rows = edit_setup(family, tmp_path)
    check_family_contract(family, folder, SETUP[family][1], tmp_path / "run", prompts=str(rows))


@pytest.mark.parametrize("family", ["flux_kontext", "flux2_klein"])
def test_region_reward_lands_on_generated_tokens(family, tmp_path):
    """A region reward on an edit: one map per cell over the generated tokens only, advantages
    only in the cells where the samples differ, per-region log-probs that average to the
    plain one (the maps tile the latents exactly), ratio 1 per region, one finite update."""
    from flowgrpo.training.trainer import Trainer

    folder, rows = edit_setup(family, tmp_path)
    t = Trainer.from_config(from_dict({
        "model": {"family": family, "path": str(folder), "options": SETUP[family][1],
                  "guidance": 1.0, "lora_rank": 4, "lora_alpha": 4},
        "reward": {"name": "corner_edit_test"},
        "data": {"prompts": str(rows), "eval_images_per_prompt": 1},
        "sampler": {"num_steps": 2},
        "train": {"group_size": 2, "batch_size": 4, "lr": 1e-2, "beta": 0.1},
        "run": {"epochs": 1, "output_dir": str(tmp_path / "run"), "progress": False,
                "tensorboard": False},
    }))
    batch = t.sample(0)
    sources = [m["image"] for m in batch.metadata]
    refs = batch.traj.cond.tensors["image_latents"]  # each sample encodes its own source
    for i in range(4):
        for j in range(4):
            assert torch.equal(refs[i], refs[j]) == (sources[i] == sources[j])
    assert batch.traj.latents.shape[-2:] == (16, 16)  # 16 generated tokens, no reference
    adv, _ = t.advantages(batch)  # sets the cells' maps: position_weights of one-hot cells
    assert batch.regions.shape == (16, 16, 1)
    torch.testing.assert_close(batch.regions[..., 0], torch.eye(16))  # cell p = token p (4x4)
    pos = adv.reshape(4, 4, 4)
    inside = torch.zeros(4, 4, dtype=torch.bool)
    inside[:2, :2] = True
    assert torch.all(pos[:, ~inside] == 0) and pos[:, inside].abs().max() > 0
    idx = torch.arange(4)
    per_region = replay_step(t.adapter, t.sampler, batch.traj, idx, 0, 1.0,
                             regions=batch.regions).log_prob
    plain = replay_step(t.adapter, t.sampler, batch.traj, idx, 0, 1.0).log_prob
    assert per_region.shape == (4, 16)
    torch.testing.assert_close(per_region.mean(1), plain, rtol=0, atol=1e-5)
    torch.testing.assert_close(plain, batch.traj.log_probs[:, 0], rtol=0, atol=1e-6)
    t.update(batch, adv, 0)
    assert all(torch.isfinite(p).all() for p in t.adapter.transformer.parameters())


# ------------------------------------------------------------------------------ options, errors
def test_load_from_a_local_folder(tmp_path):
    for family, (build, options, side) in SETUP.items():
        folder = tmp_path / family
        build(seed=0).save_pretrained(str(folder))
        loaded = pipelines.load(family, str(folder), **options)
        adapter = kontext() if family == "flux_kontext" else klein()
        x = adapter.noise(2, torch.Generator().manual_seed(0))
        meta = edits(picture(side, side))
        sigma = torch.full((2,), 0.7)
        with torch.no_grad():
            a = adapter.velocity(x, sigma, adapter.encode_inputs(PROMPTS, meta), 1.0)
            b = loaded.velocity(x, sigma, loaded.encode_inputs(PROMPTS, meta), 1.0)
        torch.testing.assert_close(a, b)


def test_bad_options_and_inputs_raise_one_line_errors():
    def one_line(match: str, fn, *args, **kwargs):
        with pytest.raises(ValueError, match=match) as err:
            fn(*args, **kwargs)
        assert "\n" not in str(err.value)

    one_line("reference_size must be one of", kontext, reference_size="big")
    one_line("multiples of 4", kontext, height=18)
    one_line("reference_size must be one of", klein, reference_size="auto")
    one_line("multiples of 16", klein, height=72)
    one_line("text_encoder_out_layers", klein, text_encoder_out_layers=(9, 18, 27))
    k = kontext(reference_size="source")
    one_line("have no source 'image'", k.encode_inputs, PROMPTS, [{"image": picture(16, 16)}, {}])
    one_line("different sizes", k.encode_inputs, PROMPTS,
             [{"image": picture(16, 16)}, {"image": picture(16, 32)}])
    one_line("different sizes", k.encode_inputs, PROMPTS,  # same token count, other grid
             [{"image": picture(20, 28)}, {"image": picture(28, 20)}])
    one_line("must be \\[3, h, w\\]", k.encode_inputs, PROMPTS[:1], [{"image": torch.rand(2, 8)}])
    # encoded one by one (as the trainer does) then concatenated: equal token counts (35),
    # different grids; the model takes one id set per batch, so the call is refused
    cond = pipelines.Cond.cat([k.encode_inputs(PROMPTS[:1], [{"image": picture(*size)}])
                               for size in ((20, 28), (28, 20))])
    one_line("different sizes", k.velocity, k.noise(2), torch.ones(2), cond, 1.0)
    b = klein()
    one_line("too small", b.encode_inputs, PROMPTS[:1], [{"image": picture(32, 64)}])
    one_line("differ in number or size", b.encode_inputs, PROMPTS,
             [{"image": picture(64, 64)}, {"image": [picture(64, 64), picture(64, 64)]}])
    distilled = klein(True)
    cond = distilled.encode(PROMPTS)
    assert "neg_prompt_embeds" not in cond.tensors
    one_line("step-distilled", distilled.velocity, distilled.noise(2), torch.ones(2), cond, 4.0)


def test_trainer_facing_attributes():
    for adapter in (kontext(), klein()):
        assert adapter.condition_keys == ("image",)
        assert adapter.per_prompt_encoding  # text padded to a fixed length; references per sample
        assert "vae" in adapter.text_encoder_names  # the VAE encodes sources with the encoders
    assert FluxKontextAdapter.pipeline_classes == ("FluxKontextPipeline",)
    assert Flux2KleinAdapter.pipeline_classes == ("Flux2KleinPipeline",)
    assert {"flux_kontext", "flux2_klein"} <= set(pipelines.names())
