"""Model-backed rewards on tiny models built in code: CLIP, PickScore, aesthetic, CLAP, media.

The tiny models come from ``helpers.tiny_rewards`` (each builds once per process).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import reward_models
from helpers.tiny_rewards import (
    OPEN_CLIP_CFG,
    tiny_aesthetic_head,
    tiny_clap_dir,
    tiny_hf_clip_dir,
    tiny_open_clip,
    tmpdir,
)
from reward_models import Media
from reward_models.media import (
    decode_png,
    decode_wav,
    encode_png,
    encode_wav,
    normalize,
    resample,
    resize_crop,
    to_pil,
)

COLORS = {
    "red": (0.9, 0.1, 0.1), "green": (0.1, 0.8, 0.2), "blue": (0.1, 0.2, 0.9),
    "yellow": (0.9, 0.9, 0.1), "purple": (0.6, 0.1, 0.7), "white": (0.95, 0.95, 0.95),
}


def color_batch(seed: int = 0, size: int = 32) -> tuple[torch.Tensor, list[str]]:
    """Solid color images with a little noise ``[6, 3, size, size]`` and their color prompts."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.tensor(list(COLORS.values()))[:, :, None, None].expand(-1, -1, size, size)
    images = (base + 0.05 * torch.randn(base.shape, generator=gen)).clamp(0, 1)
    return images, [f"a {name} picture" for name in COLORS]


def matched_vs_shuffled(reward) -> tuple[torch.Tensor, torch.Tensor]:
    images, prompts = color_batch(seed=123)
    meta = [{} for _ in prompts]
    matched = reward(Media("image", images), prompts, meta).scores
    shuffled = reward(Media("image", images), prompts[1:] + prompts[:1], meta).scores
    return matched, shuffled


def test_clip_trained_tiny_model_prefers_matching_prompts_and_round_trips():
    """After a short contrastive fit, matching image/prompt pairs beat shuffled ones (the score
    depends on both), and a model saved as a local-dir folder scores the same when reloaded."""
    import open_clip
    from safetensors.torch import save_file

    name = tiny_open_clip()
    torch.manual_seed(0)
    model = open_clip.create_model(name, pretrained=None)
    tokenizer = open_clip.get_tokenizer(name)
    untrained = reward_models.get("clip", model=model, tokenizer=tokenizer, device="cpu")
    gap_before = [s.mean() for s in matched_vs_shuffled(untrained)]
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    texts = tokenizer(color_batch()[1])
    for step in range(30):
        images, _ = color_batch(seed=step)
        pixels = normalize(resize_crop(images, 32), open_clip.OPENAI_DATASET_MEAN,
                           open_clip.OPENAI_DATASET_STD)
        logits, _ = model.get_logits(pixels, texts)
        target = torch.arange(len(images))
        loss = (torch.nn.functional.cross_entropy(logits, target)
                + torch.nn.functional.cross_entropy(logits.T, target)) / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
    reward = reward_models.get("clip", model=model, tokenizer=tokenizer, device="cpu")
    matched, shuffled = matched_vs_shuffled(reward)
    assert (matched > shuffled).all()
    assert matched.mean() - shuffled.mean() > 0.3 > gap_before[0] - gap_before[1]

    folder = tmpdir("openclip-trained")
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": OPEN_CLIP_CFG}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "open_clip_model.safetensors"))
    loaded = reward_models.get("clip", model=f"local-dir:{folder}", device="cpu")
    torch.testing.assert_close(matched_vs_shuffled(loaded)[0], matched, atol=1e-5, rtol=1e-5)
    clipscore = reward_models.get("clip", model=model, tokenizer=tokenizer, device="cpu",
                                  scale=2.5, clamp=True)
    torch.testing.assert_close(matched_vs_shuffled(clipscore)[0], 2.5 * matched.clamp_min(0))


def test_pickscore_trained_tiny_model_prefers_matching_prompts_and_round_trips():
    """Same check for PickScore through transformers ``from_pretrained`` folders; the score is
    ``exp(logit_scale) * cos`` and ``normalize`` divides it by 26."""
    from transformers import CLIPModel, CLIPProcessor

    source = tiny_hf_clip_dir()
    model, processor = CLIPModel.from_pretrained(source), CLIPProcessor.from_pretrained(source)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    prompts = color_batch()[1]
    tokens = processor.tokenizer(prompts, padding=True, return_tensors="pt")
    for step in range(30):
        images, _ = color_batch(seed=step)
        pixels = processor.image_processor(images=images, do_rescale=False,
                                           return_tensors="pt")["pixel_values"]
        loss = model(**tokens, pixel_values=pixels, return_loss=True).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    reward = reward_models.get("pickscore", model=model, processor=processor, device="cpu")
    matched, shuffled = matched_vs_shuffled(reward)
    assert (matched > shuffled).all()
    scale = float(model.logit_scale.detach().exp())
    assert (matched.mean() - shuffled.mean()) / scale > 0.3

    folder = tmpdir("pickscore-trained")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    loaded = reward_models.get("pickscore", model=str(folder), processor=str(folder), device="cpu")
    torch.testing.assert_close(matched_vs_shuffled(loaded)[0], matched, atol=1e-4, rtol=1e-5)
    normalized = reward_models.get("pickscore", model=str(folder), processor=str(folder),
                                   device="cpu", normalize=True)
    torch.testing.assert_close(matched_vs_shuffled(normalized)[0], matched / 26, atol=1e-5,
                               rtol=1e-5)


def test_aesthetic_is_the_head_on_normalized_clip_embeddings():
    """The reward equals the MLP head applied to L2-normalized image embeddings, for both CLIP
    backends; wrapped key names load; pickled checkpoints are refused."""
    from reward_models.aesthetic import load_head
    from reward_models.pickscore import HFClipEncoder

    images, prompts = color_batch()
    meta = [{} for _ in prompts]
    clip_dir = tiny_hf_clip_dir()
    reward = reward_models.get("aesthetic", head=tiny_aesthetic_head(), clip_model=clip_dir,
                               device="cpu")
    scores = reward(Media("image", images), prompts, meta).scores
    encoder = HFClipEncoder(clip_dir, device="cpu")
    with torch.no_grad():
        expected = load_head(tiny_aesthetic_head())(encoder.encode_images(images))
    torch.testing.assert_close(scores, expected)
    wrapped = reward_models.get("aesthetic", head=tiny_aesthetic_head(prefix="model."),
                                clip_model=clip_dir, device="cpu")
    torch.testing.assert_close(wrapped(Media("image", images), prompts, meta).scores, scores)

    torch.manual_seed(0)
    oc = reward_models.get("aesthetic", head=tiny_aesthetic_head(), clip_backend="open_clip",
                           clip_model=tiny_open_clip(), clip_pretrained=None, device="cpu")
    assert oc(Media("image", images), prompts, meta).scores.shape == (6,)
    pickled = tmpdir("pickled") / "head.pth"
    pickled.write_bytes(b"not loaded")
    with pytest.raises(ValueError, match="safetensors"):
        load_head(str(pickled))


def test_clap_scores_audio_after_resampling_to_the_model_rate():
    """CLAP loads through ClapModel/ClapProcessor folders; audio at another rate is resampled to
    the extractor's rate, stereo is averaged to mono, and the text side matters."""
    reward = reward_models.get("clap", model=tiny_clap_dir(), device="cpu")
    t = torch.arange(16000) / 16000
    tones = torch.stack([torch.sin(2 * math.pi * f * t) for f in (220.0, 880.0)])[:, None] * 0.5
    prompts, meta = ["a low hum", "a high beep"], [{}, {}]
    at_16k = reward(Media("audio", tones, 16000), prompts, meta).scores
    at_8k = reward(Media("audio", resample(tones, 16000, 8000), 8000), prompts, meta).scores
    torch.testing.assert_close(at_16k, at_8k, atol=2e-3, rtol=0)
    stereo = reward(Media("audio", tones.repeat(1, 2, 1), 16000), prompts, meta).scores
    torch.testing.assert_close(stereo, at_16k)
    swapped = reward(Media("audio", tones, 16000), prompts[::-1], meta).scores
    assert not torch.allclose(swapped, at_16k)


def test_resize_crop_matches_open_clip_pil_preprocessing():
    """Tensor preprocessing agrees with open_clip's own PIL transform on a smooth image."""
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2

    y, x = torch.meshgrid(torch.linspace(0, 1, 96), torch.linspace(0, 1, 64), indexing="ij")
    image = torch.stack([x, y, (x + y) / 2])[None]
    ours = normalize(resize_crop(image, 32), open_clip.OPENAI_DATASET_MEAN,
                     open_clip.OPENAI_DATASET_STD)
    theirs = image_transform_v2(PreprocessCfg(size=32), is_train=False)(to_pil(image)[0])
    assert (ours[0] - theirs).abs().max() < 0.05


def test_media_wire_formats_and_resampling():
    """PNG/WAV round trips are exact (8-bit images, float32 audio); resampling a sine matches
    the analytic sine at the new rate."""
    image = torch.randint(0, 256, (3, 10, 14)).float() / 255
    assert torch.equal(decode_png(encode_png(image)), image)
    audio = torch.rand(2, 999) * 2 - 1
    decoded, rate = decode_wav(encode_wav(audio, 22050))
    assert rate == 22050 and torch.equal(decoded, audio)
    t0 = torch.arange(4410) / 44100
    out = resample(torch.sin(2 * math.pi * 440 * t0), 44100, 48000)
    t1 = torch.arange(out.shape[-1]) / 48000
    assert out.shape[-1] == 4800
    assert (out - torch.sin(2 * math.pi * 440 * t1))[100:-100].abs().max() < 1e-3
