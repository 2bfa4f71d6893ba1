"""LTX-2 (``ltx2``) against diffusers' ``LTX2Pipeline`` on a tiny model built in code: Euler
parity of both the video and the audio latents within 1e-5 with and without CFG (a negative
prompt, the x0-space rescale, spatio-temporal and modality guidance), the noise draw of both
parts, decoding both parts with the pipeline's decoders, log-prob weights and region maps over
both parts, a LoRA round trip through ``load_lora_weights``, and option errors."""

from __future__ import annotations

import pytest
import torch

import pipelines
import samplers
from helpers.family_cases import CASES, PROMPTS, STEPS, euler_rollout
from helpers.lora import assert_folder_and_lora_round_trip
from helpers.tiny_ltx2 import LTX2_CALL
from pipelines.base import LOGPROB_WEIGHT

TOL = 1e-5
CASE = CASES["ltx2"]

PARITY = [  # (guidance, adapter options, the matching pipeline arguments)
    (1.0, {"audio_guidance_scale": None}, {"audio_guidance_scale": 1.0}),
    (1.0, {}, {}),  # the audio's CFG (7.0) alone: the video's guidance is 1
    (3.0, {}, {}),
    (4.0, {"negative_prompt": "blurry, jittery", "audio_guidance_scale": 5.0,
           "guidance_rescale": 0.0, "audio_guidance_rescale": 0.3},
     {"negative_prompt": "blurry, jittery", "audio_guidance_scale": 5.0,
      "guidance_rescale": 0.0, "audio_guidance_rescale": 0.3}),
    (3.0, {"stg_scale": 1.0, "stg_blocks": [1], "modality_scale": 3.0},
     {"stg_scale": 1.0, "audio_stg_scale": 1.0, "spatio_temporal_guidance_blocks": [1],
      "modality_scale": 3.0, "audio_modality_scale": 3.0}),
]


def pipeline_call(adapter, x, guidance, steps=STEPS, prompts=PROMPTS, **extra):
    """The pipeline from the adapter's flat latents ``x``: the packed video tokens as given (the
    pipeline takes packed video latents as they are) and the audio tokens un-normalised (it
    normalises the audio latents it is given)."""
    video, audio = adapter.split(x)
    vae = adapter.pipeline.audio_vae
    audio = adapter.pipeline._denormalize_audio_latents(audio, vae.latents_mean, vae.latents_std)
    return adapter.pipeline(prompt=list(prompts), num_inference_steps=steps,
                            guidance_scale=guidance, latents=video.clone(),
                            audio_latents=audio.clone(), **{**LTX2_CALL, **extra})


@pytest.mark.parametrize(("guidance", "options", "call"), PARITY,
                         ids=[f"g{g}-{'-'.join(o) or 'default'}" for g, o, _ in PARITY])
def test_euler_rollout_matches_pipeline(guidance, options, call):
    adapter = CASE.make(**options)
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ref = pipeline_call(adapter, x, guidance, output_type="latent", **call)
    ours = euler_rollout(adapter, x, guidance)
    video, audio = adapter.unpacked(ours)
    assert video.shape == ref.frames.shape == (2, 4, 3, 4, 4)
    assert audio.shape == ref.audio.shape == (2, 2, 5, 2)
    diffs = [(video - ref.frames).abs().max().item(), (audio - ref.audio).abs().max().item()]
    print(f"parity ltx2 guidance={guidance} {options or ''}: max abs diff video {diffs[0]:.3g} "
          f"audio {diffs[1]:.3g}")
    assert max(diffs) <= TOL
    moved = [(a - b).abs().max() for a, b in zip(adapter.split(ours), adapter.split(x))]
    assert min(moved) > 1e-2  # both parts moved


def test_guidance_options_reach_their_part():
    """The audio's CFG scale changes the audio velocity only; STG changes both."""
    plain = CASE.make()
    x = plain.noise(2, torch.Generator().manual_seed(0))
    cond = plain.encode(PROMPTS)
    sigma = torch.full((2,), 0.6)
    with torch.no_grad():
        base = plain.split(plain.velocity(x, sigma, cond, 3.0))
        louder = plain.split(CASE.make(audio_guidance_scale=2.0).velocity(x, sigma, cond, 3.0))
        stg = plain.split(CASE.make(stg_scale=1.0, stg_blocks=[0]).velocity(x, sigma, cond, 3.0))
    torch.testing.assert_close(louder[0], base[0], rtol=0, atol=0)
    assert (louder[1] - base[1]).abs().max() > 1e-3
    assert all((a - b).abs().max() > 1e-4 for a, b in zip(stg, base))


def test_noise_is_the_pipelines_video_then_audio_draw():
    adapter = CASE.make()
    ours = adapter.noise(2, torch.Generator().manual_seed(3))
    assert ours.dtype == torch.float32 and ours.shape == (2, 48 * 4 + 5 * 4)
    pipe, g = adapter.pipeline, torch.Generator().manual_seed(3)
    video = pipe.prepare_latents(2, 4, 32, 32, 5, 0.0, torch.float32, "cpu", g)
    audio = pipe.prepare_audio_latents(2, 2, 5, 8, 0.0, torch.float32, "cpu", g)
    assert torch.equal(adapter.split(ours)[0], video) and torch.equal(adapter.split(ours)[1], audio)
    # a sample's noise is its own generator's: the same alone and in a batch
    again = adapter.initial_noise([torch.Generator().manual_seed(s) for s in (3, 4)], None)
    assert torch.equal(again[:1], adapter.noise(1, torch.Generator().manual_seed(3)))
    assert not torch.equal(again[0], again[1])


@pytest.mark.parametrize("conditioned", [False, True])
def test_decode_of_both_parts_matches_the_pipeline(conditioned):
    """The pipeline decodes its 2-step result (video frames and vocoder waveform) as the
    adapter decodes the same rollout. The timestep-conditioned decoder gets the timestep with no
    noise blended in: the pipeline draws that noise after its latent draws from one generator."""
    options = dict(decode_timestep=0.05, decode_noise_scale=0.0)
    adapter = CASE.make({"timestep_conditioning": conditioned}, **options)
    x = adapter.noise(1, torch.Generator().manual_seed(2))
    out = pipeline_call(adapter, x, 1.0, steps=2, prompts=PROMPTS[:1], output_type="pt",
                        audio_guidance_scale=1.0, generator=torch.Generator().manual_seed(7),
                        **options)
    video, audio = adapter.decode_video_audio(
        euler_rollout(CASE.make({"timestep_conditioning": conditioned}, audio_guidance_scale=1.0),
                      x, 1.0, steps=2, prompts=PROMPTS[:1]))
    assert video.shape == out.frames.shape == (1, 5, 3, 32, 32) and video.dtype == torch.float32
    assert audio.shape == out.audio.shape and audio.shape[:2] == (1, 2)
    assert (video - out.frames.float()).abs().max() <= TOL
    assert (audio - out.audio.float()).abs().max() <= TOL
    # `media` picks what `decode` returns, so what a reward scores
    heard = CASE.make({"timestep_conditioning": conditioned}, media="audio", **options)
    assert heard.modality == "audio" and heard.sample_rate == 16000
    torch.testing.assert_close(heard.decode(x), adapter.decode_video_audio(x)[1], rtol=0, atol=0)
    assert adapter.modality == "video" and adapter.decode(x).shape == (1, 5, 3, 32, 32)
    if conditioned:  # decode noise is each video's own and reaches the decoder
        noisy = CASE.make(decode_timestep=0.05, decode_noise_scale=0.3, decode_seed=7)
        one = noisy.decode(x)
        torch.testing.assert_close(noisy.decode(torch.cat([x, noisy.noise(1)]))[:1], one,
                                   rtol=0, atol=TOL)
        assert (one - adapter.decode(x)).abs().max() > 1e-3


def test_log_prob_weights_cover_both_parts():
    """With the default weights a step's log-prob is the mean over every element of both
    parts; ``video_weight`` / ``audio_weight`` weigh each part's elements, so zeroing one leaves
    the other's share of the mean."""
    adapter = CASE.make()
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    cond = adapter.encode(PROMPTS)
    assert LOGPROB_WEIGHT not in cond.tensors
    sigmas = adapter.schedule(STEPS)
    with torch.no_grad():
        v = adapter.velocity(x, sigmas[1].expand(2), cond, 3.0)
    tr = samplers.build("sde").transition(v, x, sigmas[1], sigmas[2])
    x_next = tr.sample(torch.Generator().manual_seed(1))
    lp = -(x_next - tr.mean) ** 2 / (2 * tr.std ** 2) - torch.log(tr.std) - 0.9189385332046727
    per_part = [p.flatten(1).sum(1) for p in adapter.split(lp)]
    total = x.shape[1]
    torch.testing.assert_close(tr.log_prob(x_next), (per_part[0] + per_part[1]) / total)
    for wv, wa in ((1.0, 0.0), (0.0, 1.0), (0.5, 3.0)):
        weighted = adapter.__class__(pipeline=adapter.pipeline, video_weight=wv, audio_weight=wa,
                                     **CASE.options)
        weight = weighted.encode(PROMPTS).tensors[LOGPROB_WEIGHT]
        assert weight.shape == x.shape
        got = tr.log_prob(x_next, weight=weight)
        torch.testing.assert_close(got, (wv * per_part[0] + wa * per_part[1]) / total)
        assert (got - tr.log_prob(x_next)).abs().min() > 1e-4  # each part's weight counts
        assert torch.equal(pipelines.Cond(weighted.encode(PROMPTS).tensors).index([1]).tensors[
            LOGPROB_WEIGHT], weight[1:])


def test_position_weights_map_the_video_and_share_the_audio():
    adapter = CASE.make()
    x = adapter.noise(2)  # 3 latent frames of 4x4 tokens, then 5 audio tokens
    regions = torch.zeros(2, 32, 32)
    regions[:, :8, :8] = 1.0  # the top-left token (8 px: the tiny VAE) of every frame
    regions[1] = 0.5  # a uniform map
    w = adapter.position_weights(regions, x)
    assert w.shape == x.shape
    video, audio = adapter.split(w)
    grid = adapter.pipeline._unpack_latents(video, 3, 4, 4)  # [2, 4, 3, 4, 4]
    corner = torch.zeros(4, 4)
    corner[0, 0] = 1.0
    assert torch.equal(grid[0], corner.expand(4, 3, 4, 4))
    torch.testing.assert_close(audio[0], torch.full((5, 4), 1 / 16))  # the region's area share
    assert torch.equal(w[1], torch.full_like(w[1], 0.5))  # uniform: audio weighs like video


def test_encodings_are_declared_per_prompt():
    """Prompts are padded to ``max_sequence_length`` whatever the batch, so the family declares
    per-prompt encodings; that they concatenate to the batch's is checked for every family in
    ``tests/families/test_family_contract.py``."""
    assert pipelines.LTX2Adapter.per_prompt_encoding


def test_folder_and_lora_round_trip_through_diffusers(tmp_path):
    """The saved pipeline loads back through ``pipelines.load``; a LoRA written with
    ``save_lora`` loads with ``load_lora``, and the pipeline with that LoRA gives the adapter's
    rollout of both parts."""
    adapter = CASE.make()
    x = adapter.noise(2, torch.Generator().manual_seed(5))

    def outputs(a):
        return euler_rollout(a, x, 3.0, steps=3)

    assert_folder_and_lora_round_trip(
        adapter, lambda folder: pipelines.load("ltx2", folder, **CASE.options), tmp_path, outputs)
    assert any("audio" in n and "lora_" in n for n, _ in adapter.transformer.named_parameters())
    fresh = CASE.make()
    fresh.pipeline.load_lora_weights(str(tmp_path / "lora"))
    out = pipeline_call(fresh, x, 3.0, steps=3, output_type="latent", audio_guidance_scale=7.0)
    video, audio = adapter.unpacked(outputs(adapter))
    assert max((video - out.frames).abs().max(), (audio - out.audio).abs().max()) <= TOL


BAD_OPTIONS = [
    ({"height": 48}, "multiples of 32"),
    ({"num_frames": 6}, "2k \\+ 1"),
    ({"frame_rate": 0}, "positive"),
    ({"media": "both"}, "media must be one of video, audio"),
    ({"audio_guidance_scale": 0.5}, ">= 1"),
    ({"guidance_rescale": 1.5}, "\\[0, 1\\]"),
    ({"audio_guidance_rescale": -0.1}, "\\[0, 1\\]"),
    ({"stg_scale": -1.0}, ">= 0"),
    ({"stg_scale": 1.0, "stg_blocks": [28]}, "2 blocks"),
    ({"modality_scale": 0.5}, ">= 1"),
    ({"video_weight": 0.0, "audio_weight": 0.0}, "not both 0"),
    ({"decode_timestep": -0.1}, ">= 0"),
    ({"decode_noise_scale": 2.0}, "\\[0, 1\\]"),
    ({"num_frames": 1, "frame_rate": 1000.0}, "shorter than one audio latent frame"),
]


@pytest.mark.parametrize(("options", "match"), BAD_OPTIONS)
def test_bad_options_raise_one_line_errors(options, match):
    with pytest.raises(ValueError, match=match) as err:
        CASE.make(**options)
    assert "\n" not in str(err.value) and str(err.value).startswith("ltx2: ")


@pytest.mark.slow
def test_family_contract_scoring_the_audio_with_weighted_parts(tmp_path):
    """The shared contract (the CASES entry runs the video default) with the waveform as the
    media a reward scores and the audio weighted 4x in log-probs: rollout and replay agree (ratio
    1) through the encodings' log-prob weight, and a LoRA step trains."""
    from flowgrpo.testing import check_family_contract

    folder = tmp_path / "model"
    CASE.make().pipeline.save_pretrained(str(folder))
    check_family_contract("ltx2", folder, dict(CASE.options, media="audio", audio_weight=4.0),
                          tmp_path / "run")
