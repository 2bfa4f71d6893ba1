"""Train the shipped toy EDITING model and write its prompt set: rewrite the right-hand digit.

    python scripts/make_digit_edit_model.py

writes ``pipelines/toy/digit-edits-kontext/`` (a ``FluxKontextPipeline`` folder, safetensors) and
``configs/prompts/digit_edits.jsonl`` with its source images, from a fixed seed, and prints the
base model's edit reward. A few minutes on 2 CPU cores.

The task: a 16x32 image holds two handwritten digits side by side; the prompt
``"a handwritten digit 7"`` asks for the right-hand digit to become a 7 while the left one stays.
The reward (``configs/digit_edit.yaml``) is ``edit_regions``: the digit classifier on the right
half (the edit box) and ``preserve`` (SSIM to the source) on the left half, per region cell.

What is built, all offline, reusing the shipped text-to-image toy (``pipelines/toy/digits-sd3``):

- its tokenizers, its first CLIP text encoder (as ``CLIPTextModel``: FLUX reads the pooled
  output) and its zero-output T5 placeholder, frozen;
- its VAE (16x16x3 <-> 4x8x8, so a 16x32 image is 4x8x16 latents, 32 packed tokens of 16);
- a new 1+1-block ``FluxTransformer2DModel`` trained with the rectified-flow objective on
  (source, prompt) -> target pairs through the ``flux_kontext`` adapter itself (reference tokens
  appended after the noisy ones), so training and GRPO see the same model call.

Training stops early on purpose: the base model should edit correctly only part of the time, so
that GRPO has room to raise the reward.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.toy import DIGIT_EDITS_MODEL, DIGITS_MODEL, digit_prompt  # noqa: E402
from reward_models.digits import digits_to_images, load_digit_split  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "configs" / "prompts" / "digit_edits.jsonl"
SOURCES = ROOT / "configs" / "prompts" / "digit_edits"
SIDE = 16  # one digit is 16x16; an edit image is SIDE x 2 SIDE
NUM_SOURCES = 40
FLOW_STEPS = 400
BATCH = 64
POOL = 4096  # edit pairs encoded once for training
REWARD_PARAMS = {"inner": "digit", "crop": True, "crop_size": [SIDE, SIDE], "grid": [2, 4],
                 "edit_weight": 1.0, "preserve_weight": 0.5}
"""The demo's reward (``configs/digit_edit.yaml``): per 8x8 cell, the classifier's probability
of the asked digit on the right half and SSIM to the source on the left."""


def pairs(images: torch.Tensor, labels: torch.Tensor, n: int, gen: torch.Generator):
    """``n`` edits: sources ``[n, 3, 16, 32]`` (digits a | b), targets (a | c, c != b, another
    sample of class c) and the target classes ``c``."""
    by_class = [torch.nonzero(labels == d).flatten() for d in range(10)]
    left = torch.randint(len(images), (n,), generator=gen)
    right = torch.randint(len(images), (n,), generator=gen)
    shift = torch.randint(1, 10, (n,), generator=gen)
    target = (labels[right] + shift) % 10
    picks = torch.stack([by_class[int(c)][torch.randint(len(by_class[int(c)]), (1,),
                                                        generator=gen)[0]] for c in target])
    source = torch.cat([images[left], images[right]], dim=-1)
    edited = torch.cat([images[left], images[picks]], dim=-1)
    return source, edited, target


def build_pipeline(seed: int):
    """A ``FluxKontextPipeline`` from the text-to-image toy's encoders and VAE and a new
    transformer."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxKontextPipeline,
        FluxTransformer2DModel,
    )
    from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5Tokenizer

    toy = Path(DIGITS_MODEL)
    clip = CLIPTextModel.from_pretrained(toy / "text_encoder").eval()
    t5 = T5EncoderModel.from_pretrained(toy / "text_encoder_3").eval()
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=t5.config.d_model,
        pooled_projection_dim=clip.config.hidden_size, guidance_embeds=False,
        axes_dims_rope=(4, 6, 6),
    )
    return FluxKontextPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
        vae=AutoencoderKL.from_pretrained(toy / "vae").eval(),
        text_encoder=clip, tokenizer=CLIPTokenizer.from_pretrained(toy / "tokenizer"),
        text_encoder_2=t5, tokenizer_2=T5Tokenizer.from_pretrained(toy / "tokenizer_3"),
        transformer=transformer, image_encoder=None, feature_extractor=None,
    )


def adapter_for(pipe):
    from pipelines.flux_kontext import FluxKontextAdapter

    return FluxKontextAdapter(pipeline=pipe, height=SIDE, width=2 * SIDE, max_sequence_length=8)


def train(adapter, images, labels, steps: int, gen: torch.Generator) -> None:
    """Rectified flow on edit pairs: ``x_s = (1 - s) x0 + s eps``, target ``eps - x0``, ``s``
    logit-normal; the model sees the source as reference tokens."""
    from pipelines import Cond

    model = adapter.transformer
    model.train().requires_grad_(True)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    text = [adapter.encode([digit_prompt(d)]) for d in range(10)]
    ids = adapter.encode_reference(images[:1].repeat(1, 1, 1, 2))[1]  # (1, row, col) per token
    # a fixed pool of edits, encoded once (references exactly as encode_inputs makes them)
    source, edited, target = pairs(images, labels, POOL, gen)
    with torch.no_grad():
        refs = torch.cat([encode_target(adapter, c) for c in source.split(512)])
        goals = torch.cat([encode_target(adapter, c) for c in edited.split(512)])
    started = time.time()
    for step in range(steps):
        pick = torch.randint(POOL, (BATCH,), generator=gen)
        cond = Cond.cat([text[int(c)] for c in target[pick]])
        cond.tensors["image_latents"] = refs[pick]
        cond.tensors["image_ids"] = ids.expand(BATCH, -1, -1)
        x0 = goals[pick]
        s = torch.sigmoid(torch.randn(BATCH, generator=gen))
        eps = torch.randn(x0.shape, generator=gen)
        xs = (1 - s[:, None, None]) * x0 + s[:, None, None] * eps
        loss = (adapter.velocity(xs, s, cond, 1.0) - (eps - x0)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"flow step {step:4d}  loss {loss.item():.4f}  {time.time() - started:.0f} s",
                  flush=True)
    model.eval().requires_grad_(False)


def encode_target(adapter, images: torch.Tensor) -> torch.Tensor:
    """Packed, normalised latents of images ``[B, 3, 16, 32]`` in [0, 1]: the tokens the
    adapter generates (the VAE's posterior mode, as the references are encoded)."""
    from pipelines.flux import pack_latents

    vae = adapter.pipeline.vae
    latents = vae.encode(images * 2 - 1).latent_dist.mode()
    latents = (latents - vae.config.shift_factor) * vae.config.scaling_factor
    return pack_latents(latents)


def write_prompts(images, labels, gen: torch.Generator) -> None:
    """``NUM_SOURCES`` held-out source PNGs and their rows: the prompt names the new digit;
    ``digit`` is what the classifier checks in the edit box (the right half)."""
    from torchvision.utils import save_image

    if SOURCES.exists():
        shutil.rmtree(SOURCES)
    SOURCES.mkdir(parents=True)
    source, _, target = pairs(images, labels, NUM_SOURCES, gen)
    rows = []
    for i, (img, c) in enumerate(zip(source, target.tolist())):
        name = f"{SOURCES.name}/source_{i:02d}.png"
        save_image(img, ROOT / "configs" / "prompts" / name)
        rows.append({"prompt": digit_prompt(c), "image": name, "boxes": [[0.5, 0.0, 1.0, 1.0]],
                     "digit": c})
    PROMPTS.write_text("".join(json.dumps(r) + "\n" for r in rows))


@torch.no_grad()
def evaluate(adapter, num_steps: int = 10) -> dict[str, float]:
    """Mean reward of Euler edits of the shipped sources (one seed each) under the demo's
    reward: the digit classifier on the right half and ``preserve`` on the left."""
    import reward_models
    from flowgrpo.data.prompts import load_prompts
    from flowgrpo.training.evaluation import generate
    from reward_models import Media

    items = load_prompts(str(PROMPTS))
    prompts, metadata = [p for p, _ in items], [m for _, m in items]
    media = generate(adapter, adapter.encode_inputs, prompts, list(range(len(items))),
                     num_steps, 1.0, 64, metadata=metadata)
    reward = reward_models.get("edit_regions", **REWARD_PARAMS)
    out = reward(Media("image", media), prompts, metadata)
    return {"reward": float(out.scores.mean()),
            **{k: float(v.mean()) for k, v in out.components.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=FLOW_STEPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_digit_split()
    train_images = digits_to_images(x_train, SIDE)
    test_images = digits_to_images(x_test, SIDE)
    adapter = adapter_for(build_pipeline(args.seed))
    train(adapter, train_images, y_train, args.steps, gen)
    out = Path(DIGIT_EDITS_MODEL)
    if out.exists():
        shutil.rmtree(out)
    adapter.pipeline.save_pretrained(out, safe_serialization=True)
    write_prompts(test_images, y_test, torch.Generator().manual_seed(args.seed + 1))
    print(f"wrote {out} and {PROMPTS}")
    print("base model:", {k: round(v, 4) for k, v in evaluate(adapter).items()})


if __name__ == "__main__":
    main()
