"""Train the shipped toy text-to-video flow model and save it as a WanPipeline folder.

    python scripts/make_digits_video_model.py

writes ``pipelines/toy/digits-video-wan/`` (safetensors weights, under 1 MB) from a fixed seed
and prints the base model's ``digit_motion`` reward. Needs the digit classifier
(``python scripts/make_digit_classifier.py``). About 15 minutes on 2 CPU cores.

The clips: scikit-learn's 8x8 digits crossing a black 16x16 frame in 5 frames, right, left, down
or up (:func:`reward_models.digits.moving_digits`, the cross coordinate jittered by up to 2
pixels), captioned ``"a handwritten digit 7 moving left"``.

What is built, all offline:

- a unigram ``T5Tokenizer`` over the captions' words and a 1-layer ``UMT5EncoderModel`` trained
  with the transformer;
- an ``AutoencoderKLWan`` with spatial and temporal factor 2 (5 frames of 3x16x16 <-> latents
  ``[4, 3, 8, 8]``: the first frame alone, then pairs, as Wan's causal VAE does), trained to
  reconstruct the clips from its posterior means plus a little noise (so that what the flow
  generates near them decodes cleanly); ``latents_mean`` / ``latents_std`` are set per channel
  from the clips' posterior means, so the transformer sees zero-mean, unit-std latents;
- a 2-layer ``WanTransformer3DModel`` (patch 1x2x2: 48 tokens per clip) trained with the
  rectified-flow objective in Wan's convention: ``x_s = (1 - s) x0 + s eps``, target
  ``eps - x0``, ``timestep = 1000 s``, ``s`` logit-normal, 10% empty captions so CFG works;
- ``FlowMatchEulerDiscreteScheduler`` with a static shift.

``FLOW_STEPS`` leaves the base model mid-range on the reward: it moves the digit the asked way
(motion about 0.94) but draws the asked digit only sometimes (about 0.26 without CFG, 0.50 with
CFG 3), which gives GRPO room to raise it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.toy import (  # noqa: E402 (after the path fix-up above)
    DIGITS_VIDEO_MODEL,
    VIDEO_FRAMES,
    VIDEO_MAX_SEQUENCE_LENGTH,
    VIDEO_NUM_STEPS,
    VIDEO_SIZE,
    digit_video_prompt,
)
from reward_models.digits import DIRECTIONS, load_digit_split, moving_digits  # noqa: E402
from scripts.toy_build import (  # noqa: E402
    deterministic_and_quiet,
    toy_arguments,
    train_and_save,
)

if TYPE_CHECKING:
    from diffusers import WanPipeline
    from transformers import T5Tokenizer

Z_DIM = 4
LATENT_NOISE = 0.25  # latent noise in VAE training, relative to the latents' std
VAE_STEPS = 600
FLOW_STEPS = 6000
BATCH = 32
SHIFT = 1.0
LAYERS = 2
FFN = 128
JITTER = 2  # pixels the digit's cross coordinate may move off centre in the training clips
EVAL_SEEDS = (0, 1)


def build_tokenizer() -> T5Tokenizer:
    """A unigram ``T5Tokenizer`` whose pieces are the captions' words (any text still
    tokenizes, letter by letter at worst)."""
    from transformers import T5Tokenizer

    words = ("a", "handwritten", "digit", "moving", *DIRECTIONS, *"0123456789")
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [("\u2581" + w, -1.0) for w in words]
    pieces += [(c, -3.0) for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=512)


def build_pipeline(seed: int) -> WanPipeline:
    """Fresh, untrained components assembled into a ``WanPipeline``."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id,
    ))
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=Z_DIM, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[True],
        latents_mean=[0.0] * Z_DIM, latents_std=[1.0] * Z_DIM, scale_factor_temporal=2,
        scale_factor_spatial=2,
    )
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32, in_channels=Z_DIM,
        out_channels=Z_DIM, text_dim=32, freq_dim=64, ffn_dim=FFN, num_layers=LAYERS,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                       transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=SHIFT))


def clips(grids: torch.Tensor, labels: torch.Tensor, gen: torch.Generator):
    """Every digit in every direction: videos ``[4N, 3, F, H, W]`` in [-1, 1] (the VAE's
    layout), digit labels ``[4N]`` and direction indexes ``[4N]``."""
    names = list(DIRECTIONS)
    n = len(grids)
    which = torch.arange(len(names)).repeat_interleave(n)
    offsets = torch.randint(-JITTER, JITTER + 1, (len(which),), generator=gen)
    video = moving_digits(grids.repeat(len(names), 1, 1), [names[int(i)] for i in which],
                          VIDEO_SIZE, VIDEO_FRAMES, offsets)
    return video.permute(0, 2, 1, 3, 4) * 2 - 1, labels.repeat(len(names)), which


def train_vae(vae: torch.nn.Module, video: torch.Tensor, steps: int, gen: torch.Generator) -> None:
    """Fit the autoencoder to ``video`` on its posterior means plus ``LATENT_NOISE`` (MSE), then
    set ``latents_mean`` / ``latents_std`` per channel from the means.

    The loss reads the decoder's output before ``AutoencoderKLWan`` clamps it to [-1, 1]: the
    clips' black background sits at -1, where the clamp would stop every gradient.
    """
    optimizer = torch.optim.AdamW(vae.parameters(), lr=3e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 3e-3, total_steps=max(steps, 1))
    chunks: list[torch.Tensor] = []
    hook = vae.decoder.register_forward_hook(lambda module, args, out: chunks.append(out))
    vae.train().requires_grad_(True)
    try:
        for _ in range(steps):
            x = video[torch.randint(len(video), (BATCH,), generator=gen)]
            chunks.clear()
            z = vae.encode(x).latent_dist.mean
            z = z + LATENT_NOISE * z.detach().std() * torch.randn(z.shape, generator=gen)
            vae.decode(z)
            loss = F.mse_loss(torch.cat(chunks, dim=2), x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    finally:
        hook.remove()
    vae.eval().requires_grad_(False)
    mean = latents_of(vae, video)
    vae.register_to_config(
        latents_mean=[round(v, 4) for v in mean.mean(dim=(0, 2, 3, 4)).tolist()],
        latents_std=[round(v, 4) for v in mean.std(dim=(0, 2, 3, 4)).tolist()],
    )


@torch.no_grad()
def latents_of(vae: torch.nn.Module, video: torch.Tensor) -> torch.Tensor:
    """Posterior means of ``video``, encoded in chunks (the latents the flow learns)."""
    return torch.cat([vae.encode(chunk).latent_dist.mean for chunk in video.split(256)])


def train_flow(
    pipe: WanPipeline,
    latents: torch.Tensor,
    labels: torch.Tensor,
    directions: torch.Tensor,
    steps: int,
    gen: torch.Generator,
    eval_every: int = 0,
) -> None:
    """Rectified flow on normalised latents; the transformer and the text encoder learn
    together, each step encoding the 41 distinct captions (and the empty one) once."""
    vae, transformer, encoder = pipe.vae, pipe.transformer, pipe.text_encoder
    params = [*transformer.parameters(), *encoder.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / 200))
    names = list(DIRECTIONS)
    prompts = [digit_video_prompt(d, n) for n in names for d in range(10)] + [""]
    shape = (1, Z_DIM, 1, 1, 1)
    mu = torch.tensor(vae.config.latents_mean).view(shape)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape)
    for m in (transformer, encoder):
        m.train().requires_grad_(True)
    for step in range(1, steps + 1):
        idx = torch.randint(len(latents), (BATCH,), generator=gen)
        x0 = (latents[idx] - mu) * inv_std
        caption = directions[idx] * 10 + labels[idx]
        caption = torch.where(torch.rand(BATCH, generator=gen) < 0.1, len(prompts) - 1, caption)
        embeds, _ = pipe.encode_prompt(prompt=prompts, do_classifier_free_guidance=False,
                                       max_sequence_length=VIDEO_MAX_SEQUENCE_LENGTH,
                                       device=torch.device("cpu"))
        s = torch.sigmoid(torch.randn(BATCH, generator=gen))
        eps = torch.randn(x0.shape, generator=gen)
        xs = (1 - s.view(-1, 1, 1, 1, 1)) * x0 + s.view(-1, 1, 1, 1, 1) * eps
        v = transformer(hidden_states=xs, timestep=1000 * s, encoder_hidden_states=embeds[caption],
                        return_dict=False)[0]
        loss = F.mse_loss(v, eps - x0)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        warmup.step()
        if eval_every and step % eval_every == 0:
            for m in (transformer, encoder):
                m.eval()
            print(f"step {step} loss {loss.item():.4f} reward {evaluate(pipe)}", flush=True)
            for m in (transformer, encoder):
                m.train()
    for m in (transformer, encoder):
        m.eval().requires_grad_(False)


@torch.no_grad()
def sample(pipe: WanPipeline, prompts: list[str], seeds: list[int], guidance: float = 1.0,
           steps: int = VIDEO_NUM_STEPS) -> torch.Tensor:
    """Pipeline samples ``[B, F, 3, H, W]`` in [0, 1]; sample ``i`` uses ``Generator(seeds[i])``."""
    return pipe(
        prompt=prompts, height=VIDEO_SIZE, width=VIDEO_SIZE, num_frames=VIDEO_FRAMES,
        num_inference_steps=steps, guidance_scale=guidance,
        max_sequence_length=VIDEO_MAX_SEQUENCE_LENGTH,
        generator=[torch.Generator().manual_seed(s) for s in seeds], output_type="pt",
    ).frames


def evaluate(pipe: WanPipeline, guidance: float = 1.0) -> dict[str, float]:
    """``digit_motion`` reward and its terms over every caption x ``EVAL_SEEDS``."""
    from reward_models import Media
    from reward_models.digits import digit_motion_reward

    cases = [(d, n, s) for n in DIRECTIONS for d in range(10) for s in EVAL_SEEDS]
    prompts = [digit_video_prompt(d, n) for d, n, _ in cases]
    video = sample(pipe, prompts, [s for *_, s in cases], guidance)
    out = digit_motion_reward()(Media("video", video), prompts,
                                [{"digit": d, "direction": n} for d, n, _ in cases])
    return {"reward": round(out.scores.mean().item(), 4),
            **{k: round(v, 4) for k, v in out.info.items()}}


def make_digits_video_model(vae_steps: int = VAE_STEPS, flow_steps: int = FLOW_STEPS,
                            seed: int = 0, eval_every: int = 0) -> WanPipeline:
    """Build and train the toy pipeline; deterministic on CPU for a given ``seed``."""
    with deterministic_and_quiet():
        gen = torch.Generator().manual_seed(seed)
        pipe = build_pipeline(seed)
        pipe.set_progress_bar_config(disable=True)
        grids, labels, _, _ = load_digit_split()
        video, labels, directions = clips(grids, labels, gen)
        train_vae(pipe.vae, video, vae_steps, gen)
        train_flow(pipe, latents_of(pipe.vae, video), labels, directions, flow_steps, gen,
                   eval_every)
        return pipe


def main() -> None:
    """Train, save the folder (replacing an old one), and report the base reward."""
    args = toy_arguments(__doc__, DIGITS_VIDEO_MODEL, VAE_STEPS, FLOW_STEPS, threads=2)
    pipe = train_and_save(make_digits_video_model, args)
    print(f"base reward ({VIDEO_FRAMES} frames of {VIDEO_SIZE}x{VIDEO_SIZE}, {VIDEO_NUM_STEPS} "
          f"Euler steps, seeds {EVAL_SEEDS}):")
    for guidance in (1.0, 3.0):
        print(f"  guidance {guidance}: {evaluate(pipe, guidance)}")


if __name__ == "__main__":
    main()
