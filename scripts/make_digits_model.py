"""Train the shipped toy text-to-image flow model and save it as a StableDiffusion3Pipeline folder.

    python scripts/make_digits_model.py

writes ``pipelines/toy/digits-sd3/`` (safetensors weights, about 2 MB) from a fixed seed and
prints the base model's ``digit`` reward. Needs the digit classifier
(``python scripts/make_digit_classifier.py``) for that evaluation. A few minutes on 2 CPU cores.

What is built, all offline:

- tokenizers: a byte-level BPE ``CLIPTokenizer`` (every byte with and without ``</w>``, plus
  merges for "handwritten" and "digit", 16 tokens long) shared by both CLIP encoders, and a
  small unigram ``T5Tokenizer``;
- two tiny ``CLIPTextModelWithProjection`` trained jointly with the transformer, and a
  placeholder ``T5EncoderModel`` whose output is exactly zero (see ``pipelines/toy``);
- an ``AutoencoderKL`` with spatial factor 2 (16x16x3 images <-> 4x8x8 latents) trained to
  reconstruct the digits, its ``shift_factor`` / ``scaling_factor`` set so latents have zero
  mean and unit std;
- a 2-layer ``SD3Transformer2DModel`` trained with the rectified-flow objective in the SD3
  convention: ``x_s = (1 - s) x0 + s eps``, target ``eps - x0``, ``timestep = 1000 s``,
  ``s`` logit-normal (SD3 paper, Esser et al. 2024), 10% empty prompts so CFG works;
- ``FlowMatchEulerDiscreteScheduler`` with a static shift.

Training stops early on purpose (see ``FLOW_STEPS``): the base model should score mid-range on
the ``digit`` reward so that GRPO has room to raise it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.toy import (  # noqa: E402 (after the path fix-up above)
    DIGITS_MODEL,
    GUIDANCE,
    MAX_SEQUENCE_LENGTH,
    NUM_STEPS,
    RESOLUTION,
    digit_prompt,
)
from reward_models.digits import digits_to_images, load_digit_split  # noqa: E402
from scripts.toy_build import (  # noqa: E402
    deterministic_and_quiet,
    toy_arguments,
    train_and_save,
)

if TYPE_CHECKING:
    from diffusers import StableDiffusion3Pipeline
    from transformers import CLIPTokenizer, T5Tokenizer

CLIP_LENGTH = 16  # CLIP tokens per prompt (the pipeline pads to tokenizer.model_max_length)
WORDS = ("handwritten", "digit")  # multi-character words given BPE merges
T5_LENGTHS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # zero T5 tokens seen in training
VAE_STEPS = 1500
FLOW_STEPS = 600  # mid-range reward at GUIDANCE; ~0.72 by 1000 steps, ~0.8 by 2000
SHIFT = 1.0
EVAL_SEEDS = tuple(range(8))


def build_tokenizers() -> tuple[CLIPTokenizer, T5Tokenizer]:
    """A byte-level BPE ``CLIPTokenizer`` and a unigram ``T5Tokenizer``, built offline.

    The CLIP vocabulary holds every byte-level symbol with and without the end-of-word marker
    ``</w>`` (so any text tokenizes, character by character at worst), the merges that spell
    ``WORDS``, and the start / end tokens.
    """
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer, T5Tokenizer

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols])}
    merges = []
    for word in WORDS:  # left to right: "h"+"a", "ha"+"n", ..., "handwritte"+"n</w>"
        left = word[0]
        for i, ch in enumerate(word[1:], start=1):
            right = ch + ("</w>" if i == len(word) - 1 else "")
            merges.append((left, right))
            left += right
            vocab.setdefault(left, len(vocab))
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    clip = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=CLIP_LENGTH)

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [("\u2581" + w, -1.0) for w in ("a", *WORDS, *"0123456789")]
    pieces += [(c, -3.0) for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    t5 = T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=512)
    return clip, t5


def build_pipeline(seed: int) -> StableDiffusion3Pipeline:
    """Fresh, untrained components assembled into a ``StableDiffusion3Pipeline``."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    clip_tok, t5_tok = build_tokenizers()

    def clip(hidden: int) -> CLIPTextModelWithProjection:
        config = CLIPTextConfig(
            vocab_size=len(clip_tok), hidden_size=hidden, intermediate_size=2 * hidden,
            projection_dim=32, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=CLIP_LENGTH, bos_token_id=clip_tok.bos_token_id,
            eos_token_id=clip_tok.eos_token_id, pad_token_id=clip_tok.pad_token_id,
        )
        return CLIPTextModelWithProjection(config)

    text_encoder, text_encoder_2 = clip(32), clip(32)
    joint = text_encoder.config.hidden_size + text_encoder_2.config.hidden_size
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(t5_tok), d_model=joint, d_kv=8, d_ff=8, num_layers=0, num_heads=1,
        pad_token_id=t5_tok.pad_token_id, eos_token_id=t5_tok.eos_token_id,
    ))
    torch.nn.init.zeros_(t5.encoder.final_layer_norm.weight)  # output is exactly zero
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4,
        sample_size=RESOLUTION, mid_block_add_attention=False, use_quant_conv=False,
        use_post_quant_conv=False, shift_factor=0.0, scaling_factor=1.0,
    )
    transformer = SD3Transformer2DModel(
        sample_size=RESOLUTION // 2, patch_size=2, in_channels=4, out_channels=4, num_layers=2,
        attention_head_dim=32, num_attention_heads=2, joint_attention_dim=joint,
        caption_projection_dim=64, pooled_projection_dim=2 * 32,
        pos_embed_max_size=RESOLUTION // 4,
    )
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=SHIFT), vae=vae,
        text_encoder=text_encoder, tokenizer=clip_tok, text_encoder_2=text_encoder_2,
        tokenizer_2=clip_tok, text_encoder_3=t5, tokenizer_3=t5_tok,
    )


def train_vae(vae: torch.nn.Module, images: torch.Tensor, steps: int, gen: torch.Generator) -> None:
    """Fit the autoencoder to ``images`` ``[N, 3, H, W]`` in [-1, 1] (MSE plus a light KL term).

    Then sets ``shift_factor`` / ``scaling_factor`` from the posterior means, so that the latents
    the transformer sees, ``(z - shift) * scale``, have zero mean and unit std.
    """
    optimizer = torch.optim.AdamW(vae.parameters(), lr=2e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 2e-3, total_steps=max(steps, 1))
    vae.train().requires_grad_(True)
    for _ in range(steps):
        x = images[torch.randint(len(images), (64,), generator=gen)]
        posterior = vae.encode(x).latent_dist
        z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=gen)
        loss = F.mse_loss(vae.decode(z).sample, x) + 1e-4 * posterior.kl().mean() / z[0].numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    vae.eval().requires_grad_(False)
    with torch.no_grad():
        mean = vae.encode(images).latent_dist.mean
    vae.register_to_config(shift_factor=round(mean.mean().item(), 4),
                           scaling_factor=round(1.0 / mean.std().item(), 4))


def encode(
    pipe: StableDiffusion3Pipeline, prompts: list[str], t5_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prompt_embeds [B, 16 + t5_length, 64], pooled [B, 64])`` exactly as the pipeline does."""
    embeds, _, pooled, _ = pipe.encode_prompt(
        prompt=prompts, prompt_2=None, prompt_3=None, device=torch.device("cpu"),
        do_classifier_free_guidance=False, max_sequence_length=t5_length,
    )
    return embeds, pooled


def train_flow(
    pipe: StableDiffusion3Pipeline,
    latents: tuple[torch.Tensor, torch.Tensor],
    labels: torch.Tensor,
    steps: int,
    gen: torch.Generator,
    eval_every: int = 0,
) -> None:
    """Rectified flow on scaled latents (posterior ``(mean, std)``, ``[N, 4, 8, 8]`` each).

    The transformer and both CLIP encoders learn together; each step encodes the 11 distinct
    prompts (10 digits and the empty prompt) once and indexes them.
    """
    vae, transformer = pipe.vae, pipe.transformer
    modules = [transformer, pipe.text_encoder, pipe.text_encoder_2]
    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / 200))
    prompts = [digit_prompt(d) for d in range(10)] + [""]
    weights = torch.tensor([0.4 if n == MAX_SEQUENCE_LENGTH else 0.075 for n in T5_LENGTHS])
    mean, std = latents
    for m in modules:
        m.train().requires_grad_(True)
    for step in range(1, steps + 1):
        idx = torch.randint(len(mean), (64,), generator=gen)
        z = mean[idx] + std[idx] * torch.randn(mean[idx].shape, generator=gen)
        x0 = (z - vae.config.shift_factor) * vae.config.scaling_factor
        which = torch.where(torch.rand(64, generator=gen) < 0.1, 10, labels[idx])  # dropout
        t5_length = T5_LENGTHS[int(torch.multinomial(weights, 1, generator=gen))]
        embeds, pooled = encode(pipe, prompts, t5_length)
        s = torch.sigmoid(torch.randn(64, generator=gen))  # logit-normal(0, 1)
        eps = torch.randn(x0.shape, generator=gen)
        xs = (1 - s[:, None, None, None]) * x0 + s[:, None, None, None] * eps
        v = transformer(hidden_states=xs, timestep=1000 * s, encoder_hidden_states=embeds[which],
                        pooled_projections=pooled[which]).sample
        loss = F.mse_loss(v, eps - x0)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        warmup.step()
        if eval_every and step % eval_every == 0:
            for m in modules:
                m.eval()
            rewards = {g: evaluate(pipe, g) for g in (1.0, 3.0)}
            print(f"step {step} loss {loss.item():.4f} reward {rewards}", flush=True)
            for m in modules:
                m.train()
    for m in modules:
        m.eval().requires_grad_(False)


@torch.no_grad()
def sample(
    pipe: StableDiffusion3Pipeline,
    digits: list[int],
    seeds: list[int],
    guidance: float = GUIDANCE,
    steps: int = NUM_STEPS,
    t5_length: int = MAX_SEQUENCE_LENGTH,
) -> torch.Tensor:
    """Pipeline samples ``[B, 3, 16, 16]`` in [0, 1]; sample ``i`` uses ``Generator(seeds[i])``."""
    return pipe(
        prompt=[digit_prompt(d) for d in digits], height=RESOLUTION, width=RESOLUTION,
        num_inference_steps=steps, guidance_scale=guidance, max_sequence_length=t5_length,
        generator=[torch.Generator().manual_seed(s) for s in seeds], output_type="pt",
    ).images


def evaluate(
    pipe: StableDiffusion3Pipeline,
    guidance: float = GUIDANCE,
    steps: int = NUM_STEPS,
    t5_length: int = MAX_SEQUENCE_LENGTH,
) -> float:
    """Mean ``digit`` reward over digits 0-9 x ``EVAL_SEEDS`` (80 samples)."""
    from reward_models import Media
    from reward_models.digits import digit_reward

    digits = [d for d in range(10) for _ in EVAL_SEEDS]
    seeds = [s for _ in range(10) for s in EVAL_SEEDS]
    images = sample(pipe, digits, seeds, guidance, steps, t5_length)
    out = digit_reward()(Media("image", images), [digit_prompt(d) for d in digits],
                         [{"digit": d} for d in digits])
    return round(out.scores.mean().item(), 4)


def make_digits_model(
    vae_steps: int = VAE_STEPS, flow_steps: int = FLOW_STEPS, seed: int = 0, eval_every: int = 0
) -> StableDiffusion3Pipeline:
    """Build and train the toy pipeline; deterministic on CPU for a given ``seed``.

    Deterministic algorithms are switched on for the duration (the backward of indexing the
    prompt embeddings accumulates in a thread-dependent order otherwise).
    """
    with deterministic_and_quiet():
        return _make_digits_model(vae_steps, flow_steps, seed, eval_every)


def _make_digits_model(
    vae_steps: int, flow_steps: int, seed: int, eval_every: int
) -> StableDiffusion3Pipeline:
    gen = torch.Generator().manual_seed(seed)
    pipe = build_pipeline(seed)
    pipe.set_progress_bar_config(disable=True)
    grids, labels, _, _ = load_digit_split()
    images = digits_to_images(grids, RESOLUTION) * 2 - 1
    train_vae(pipe.vae, images, vae_steps, gen)
    with torch.no_grad():
        posterior = pipe.vae.encode(images).latent_dist
    train_flow(pipe, (posterior.mean, posterior.std), labels, flow_steps, gen, eval_every)
    return pipe


def main() -> None:
    """Train, save the folder (replacing an old one), and report the base reward."""
    args = toy_arguments(__doc__, DIGITS_MODEL, VAE_STEPS, FLOW_STEPS)
    pipe = train_and_save(make_digits_model, args)
    print(f"base digit reward (digits 0-9 x seeds {EVAL_SEEDS[0]}-{EVAL_SEEDS[-1]}), "
          f"{RESOLUTION}x{RESOLUTION}, {NUM_STEPS} Euler steps, scheduler shift {SHIFT}:")
    for guidance in sorted({1.0, GUIDANCE, 3.0}):
        for t5_length in (MAX_SEQUENCE_LENGTH, 256):
            reward = evaluate(pipe, guidance, NUM_STEPS, t5_length)
            print(f"  guidance {guidance}, max_sequence_length {t5_length}: {reward}")


if __name__ == "__main__":
    main()
