"""Every model family against its diffusers pipeline, on tiny models built in code.

Parity: with the Euler ODE, the same initial noise, steps and guidance, an adapter's rollout equals
the pipeline's ``output_type="latent"`` result. LoRA: an adapter trained on the adapter's
transformer, saved with ``save_lora``, loads into a fresh pipeline with ``load_lora_weights`` and
reproduces the adapter's outputs. Plus decode shapes/ranges, region maps and media writers.
"""

from __future__ import annotations

import wave

import pytest
import torch

import pipelines
from helpers.family_cases import CASES, PROMPTS, euler_rollout, pipeline_latents
from helpers.tiny_families import tiny_wan_pipeline
from pipelines import WanAdapter
from pipelines.flux import pack_latents, unpack_latents
from pipelines.media_io import save_video, save_wav

TOL = 1e-4


PARITY = [  # (family, guidance, build kwargs, adapter options, extra pipeline arguments)
    ("sd3", 1.0, {}, {}, {}),
    ("sd3", 4.0, {}, {}, {}),
    ("flux", 3.5, {}, {}, {}),  # dev: guidance embedding only
    ("flux", 3.5, {}, {"true_cfg_scale": 2.0}, {"true_cfg_scale": 2.0, "negative_prompt": ""}),
    ("flux", 0.0, {"guidance_embeds": False, "dynamic_shift": False}, {}, {}),  # schnell-like
    ("wan", 1.0, {}, {}, {}),
    ("wan", 5.0, {}, {}, {}),
    ("ace_step", 1.0, {}, {}, {}),
    ("ace_step", 4.0, {}, {}, {}),  # APG against the null condition
    ("longcat_tts", 1.0, {}, {}, {}),
    ("longcat_tts", 3.0, {}, {}, {}),  # CFG against the zero text embedding
    ("hunyuan_video", 6.0, {}, {}, {}),  # guidance embedding only
    ("hunyuan_video", 6.0, {}, {"true_cfg_scale": 3.0, "negative_prompt": "blurry"},
     {"true_cfg_scale": 3.0, "negative_prompt": "blurry"}),
    ("flux_kontext", 3.5, {}, {}, {}),
    ("flux_kontext", 3.5, {}, {"true_cfg_scale": 2.0},
     {"true_cfg_scale": 2.0, "negative_prompt": ""}),
    ("flux_kontext", 0.0, {"guidance_embeds": False, "dynamic_shift": False}, {}, {}),
    ("qwen_image", 1.0, {}, {}, {}),
    ("qwen_image", 4.0, {}, {}, {"true_cfg_scale": 4.0, "negative_prompt": " "}),  # true CFG
]


@pytest.mark.parametrize(("family", "guidance", "build", "options", "extra"), PARITY,
                         ids=[f"{p[0]}-g{p[1]}{'-truecfg' if p[3] else ''}" for p in PARITY])
def test_euler_rollout_matches_pipeline(family, guidance, build, options, extra, monkeypatch):
    case = CASES[family]
    adapter = case.make(build, **options)
    if family == "ace_step":  # the adapter's APG is the pipeline's with momentum 0 (stateless)
        from diffusers.guiders.adaptive_projected_guidance import MomentumBuffer
        from diffusers.pipelines.ace_step import pipeline_ace_step

        monkeypatch.setattr(pipeline_ace_step, "MomentumBuffer", lambda momentum: MomentumBuffer(0))
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ref = pipeline_latents(case, adapter, x, guidance, **extra).float()
    ours = euler_rollout(adapter, x, guidance)
    diff = (ours - ref).abs().max().item()
    print(f"parity {family} guidance={guidance} {options or ''}: max abs diff {diff:.3g}")
    assert ours.shape == ref.shape
    assert diff <= TOL
    assert (ours - x).abs().max() > 1e-2  # the rollout moved


def test_noise_matches_pipeline_draw():
    """Same generator, same initial latents as each pipeline's prepare_latents (FLUX packed)."""
    for family in ("flux", "wan", "ace_step"):
        adapter = CASES[family].make()
        ours = adapter.noise(2, torch.Generator().manual_seed(3))
        pipe = adapter.pipeline
        g = torch.Generator().manual_seed(3)
        if family == "flux":
            ref, _ = pipe.prepare_latents(2, 4, 16, 16, torch.float32, "cpu", g)
        elif family == "wan":
            ref = pipe.prepare_latents(2, 16, 16, 16, 5, torch.float32, "cpu", g)
        else:
            ref = pipe.prepare_latents(2, 4.0, torch.float32, "cpu", g)
        assert torch.equal(ours, ref), family


@pytest.mark.parametrize("family", ["sd3", "flux", "wan", "ace_step", "longcat_tts",
                                    "hunyuan_video", "qwen_image", "flux_kontext"])
def test_lora_round_trip_through_diffusers(family, tmp_path):
    """A LoRA added with the adapter's ``add_lora``, written with ``save_lora`` and read into a
    fresh pipeline with ``load_lora`` (diffusers' ``load_lora_weights``, or peft's injection for
    a pipeline without a LoRA loader) reproduces the adapter and the unchanged pipeline."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    case = CASES[family]
    adapter = case.make()
    guidance = 1.0 if family != "flux" else 3.5
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(5))
    base = euler_rollout(adapter, x, guidance, steps=2)

    transformer = adapter.transformer
    adapter.add_lora(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                target_modules=list(adapter.default_lora_targets)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_B" in name:  # gaussian init leaves B at zero: perturb it
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    state = get_peft_model_state_dict(transformer)
    assert state, "no LoRA layer matched default_lora_targets"
    adapter.save_lora(str(tmp_path), state, transformer.peft_config["default"].to_dict())
    tuned = euler_rollout(adapter, x, guidance, steps=2)
    assert (tuned - base).abs().max() > 1e-3  # the LoRA changes the outputs

    fresh = case.make()
    fresh.load_lora(str(tmp_path))
    loaded = euler_rollout(fresh, x, guidance, steps=2)
    out = fresh.pipeline(prompt=list(PROMPTS), num_inference_steps=2, guidance_scale=guidance,
                         latents=x.clone(), output_type="latent", **case.call)
    assert (loaded - tuned).abs().max() <= TOL
    assert (getattr(out, case.output).float() - tuned).abs().max() <= TOL


EXPECTED_MEDIA = {  # family: (modality, decoded shape for 2 samples, value range)
    "sd3": ("image", (2, 3, 16, 16), (0.0, 1.0)),
    "flux": ("image", (2, 3, 16, 16), (0.0, 1.0)),
    "wan": ("video", (2, 5, 3, 16, 16), (0.0, 1.0)),
    "ace_step": ("audio", (2, 2), (-1.0, 1.0)),  # [B, channels, samples]
    "longcat_tts": ("audio", (2, 1, 96), (-1.0, 1.0)),  # 12 frames x 8 samples, mono
    "hunyuan_video": ("video", (2, 5, 3, 16, 16), (0.0, 1.0)),
    "flux_kontext": ("image", (2, 3, 16, 16), (0.0, 1.0)),
}


@pytest.mark.parametrize("family", list(EXPECTED_MEDIA))
def test_decode_shape_range_and_pipeline_match(family):
    case = CASES[family]
    adapter = case.make()
    modality, shape, (lo, hi) = EXPECTED_MEDIA[family]
    assert adapter.modality == modality
    x = adapter.noise(2, torch.Generator().manual_seed(2))
    media = adapter.decode(x)
    assert media.shape[: len(shape)] == shape and media.dtype == torch.float32
    assert lo <= media.min() and media.max() <= hi
    if family == "ace_step":
        assert media.dim() == 3 and adapter.sample_rate == 8
    # The pipeline decodes its 1-step result exactly as the adapter decodes the same rollout.
    pipe_out = adapter.pipeline(prompt=list(PROMPTS), num_inference_steps=1, guidance_scale=1.0,
                                latents=x.clone(), output_type="pt", **case.call)
    x1 = euler_rollout(adapter, x, 1.0, steps=1)
    ref = getattr(pipe_out, case.output).float()
    if modality == "audio":  # the adapters clip to [-1, 1]; a pipeline may not
        ref = ref.clamp(lo, hi)
    assert (adapter.decode(x1) - ref).abs().max() <= TOL


def test_flux_position_weights_follow_packing():
    adapter = CASES["flux"].make()  # 16x16 pixels -> 8x8x4 latents -> 4x4 tokens of 16
    regions = torch.rand(2, 16, 16)
    x = adapter.noise(2)
    w = adapter.position_weights(regions, x)
    assert w.shape == (2, 16, 1) and (w * x).shape == x.shape
    # Same as mapping onto the VAE latent grid first and packing it: token = its 2x2 cells.
    cells = torch.nn.functional.interpolate(regions[:, None], size=(8, 8), mode="area")
    packed = pack_latents(cells.expand(-1, 4, -1, -1).contiguous())
    torch.testing.assert_close(w[..., 0], packed.mean(-1))
    assert torch.equal(pack_latents(unpack_latents(x, 8, 8)), x)


def test_wan_position_weights_cover_every_frame():
    adapter = CASES["wan"].make()
    x = adapter.noise(2)  # [2, 16, 2, 2, 2]
    regions = torch.zeros(2, 16, 16)
    regions[:, :8, :8] = 1.0  # top-left quarter of every frame
    w = adapter.position_weights(regions, x)
    assert w.shape == (2, 1, 1, 2, 2) and (w * x).shape == x.shape
    corner = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert torch.equal(w.expand_as(x)[:, 3, 1], corner.expand(2, 2, 2))  # channel 3, frame 1


def test_ace_step_position_weights_and_turbo_guard():
    adapter = CASES["ace_step"].make()
    x = adapter.noise(2)  # [2, 16, 8]
    w = adapter.position_weights(torch.arange(4.0).repeat(2, 1), x)  # 4 time cells -> 16 frames
    assert w.shape == (2, 16, 1) and torch.equal(w[0, ::4, 0], torch.arange(4.0))
    spectro = torch.arange(4.0).repeat(2, 3, 1)  # [B, 3 frequency rows, 4 time cells]
    assert torch.equal(adapter.position_weights(spectro, x), w)
    turbo = CASES["ace_step"].make({"is_turbo": True})
    cond = turbo.encode(PROMPTS)
    assert "neg_encoder_hidden_states" not in cond.tensors
    with pytest.raises(ValueError, match="guidance-distilled"):
        turbo.velocity(x, torch.ones(2), cond, 4.0)


def test_wan_takes_flow_shift_from_a_unipc_scheduler():
    from diffusers import UniPCMultistepScheduler

    euler = CASES["wan"].make()
    pipe = tiny_wan_pipeline(shift=3.0)
    pipe.scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction",
                                             use_flow_sigmas=True, flow_shift=3.0)
    unipc = WanAdapter(pipeline=pipe, **CASES["wan"].options)
    torch.testing.assert_close(unipc.schedule(6), euler.schedule(6), rtol=0, atol=1e-6)
    assert unipc.schedule(6)[0] == 1.0 and unipc.schedule(6)[-1] == 0.0


@pytest.mark.parametrize("family", ["flux", "wan", "ace_step", "longcat_tts", "hunyuan_video",
                                    "qwen_image", "flux_kontext"])
def test_load_from_a_local_folder(family, tmp_path):
    case = CASES[family]
    adapter = case.make()
    adapter.pipeline.save_pretrained(tmp_path)
    loaded = pipelines.load(family, str(tmp_path), **case.options)
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    sigma = torch.full((2,), 0.7)
    with torch.no_grad():
        a = adapter.velocity(x, sigma, adapter.encode(PROMPTS), 1.0)
        b = loaded.velocity(x, sigma, loaded.encode(PROMPTS), 1.0)
    torch.testing.assert_close(a, b)


def test_save_video_and_wav(tmp_path):
    from PIL import Image

    frames = torch.rand(5, 3, 16, 12)
    written = save_video(frames, tmp_path / "clip.gif", fps=8)
    gif = Image.open(written[0])
    assert gif.n_frames == 5 and gif.size == (12, 16)
    assert Image.open(written[1]).size == (3 * 12, 2 * 16)  # 3 columns, 2 rows
    audio = torch.linspace(-1, 1, 64).repeat(2, 1)
    audio[1] *= -0.5
    path = save_wav(audio, 8000, tmp_path / "a.wav")
    with wave.open(str(path)) as f:
        params = (f.getnchannels(), f.getsampwidth(), f.getframerate(), f.getnframes())
        assert params == (2, 2, 8000, 64)
        pcm = torch.frombuffer(bytearray(f.readframes(64)), dtype=torch.int16).view(64, 2).t()
    torch.testing.assert_close(pcm.float() / 32767, audio, rtol=0, atol=1 / 32767)
