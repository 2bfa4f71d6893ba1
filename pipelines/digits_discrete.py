"""``digits_discrete``: the shipped discrete toy, a tiny text-conditioned token model of 8x8 digits.

scikit-learn's 8x8 digits are already tokens: 64 pixel intensities in ``0..16``. The model is a
small transformer over those 64 tokens, conditioned on the digit named in the prompt ("a
handwritten digit 7") and on the noise level, that returns the posterior logits of the clean
intensities. One model is trained per token path (``scripts/make_digits_discrete_model.py``):

- ``masked``: 18 states, the mask is 17;
- ``uniform``: 17 states, the source is uniform intensities;
- ``metric``: 17 states, FUDOKI's metric-induced path on the intensity distance ``|i - j|``.

A model folder holds ``config.json`` (the architecture and the path) and
``model.safetensors``. The LoRA targets are the attention projections, as in the diffusers
families; a LoRA is saved in peft's format (:func:`pipelines.base.save_peft_lora`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from samplers import TokenPath

from .base import Cond, PeftLoraFiles, guided_call, register
from .discrete import DiscreteAdapter

SIDE = 8
LEVELS = 17  # intensities 0..16
NULL_LABEL = 10  # the unconditional "prompt" of classifier-free guidance
_DIGIT = re.compile(r"(?<![0-9])([0-9])(?![0-9])")
CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim) for _ in range(3))
        self.to_out = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, n, d = h.shape
        q, k, v = (f(h).reshape(b, n, self.heads, d // self.heads).transpose(1, 2)
                   for f in (self.to_q, self.to_k, self.to_v))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.norm1(h + c))
        return h + self.ff(self.norm2(h))


class DigitTokenModel(nn.Module):
    """``(tokens [B, 64], sigma [B], label [B]) -> logits [B, 64, num_states]``.

    Args:
        num_states: values a token takes (18 with the mask, 17 without).
        dim, depth, heads: the transformer's width, blocks and attention heads.
    """

    def __init__(self, num_states: int = LEVELS, dim: int = 64, depth: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        self.config = {"num_states": num_states, "dim": dim, "depth": depth, "heads": heads}
        self.tokens = nn.Embedding(num_states, dim)
        self.position = nn.Parameter(torch.zeros(1, SIDE * SIDE, dim))
        self.label = nn.Embedding(NULL_LABEL + 1, dim)
        self.time = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_states)

    def time_features(self, sigma: torch.Tensor) -> torch.Tensor:
        half = self.config["dim"] // 2
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=sigma.device) / half)
        angles = 1000.0 * sigma.float()[:, None] * freqs[None]
        return torch.cat([angles.sin(), angles.cos()], -1)

    def forward(self, tokens: torch.Tensor, sigma: torch.Tensor,
                label: torch.Tensor) -> torch.Tensor:
        h = self.tokens(tokens.long()) + self.position
        c = (self.time(self.time_features(sigma)) + self.label(label.long()))[:, None]
        for block in self.blocks:
            h = block(h, c)
        return self.head(self.norm(h))


def token_path(kind: str) -> TokenPath:
    """The toy's path of ``kind``: masked (mask 17), uniform, or metric on ``|i - j|``."""
    if kind == "masked":
        return TokenPath("masked", LEVELS + 1, mask_id=LEVELS)
    if kind == "metric":
        levels = torch.arange(LEVELS, dtype=torch.float32)
        return TokenPath("metric", LEVELS, distance=(levels[:, None] - levels[None]).abs())
    return TokenPath(kind, LEVELS)


def prompt_label(prompt: str) -> int:
    """The digit a prompt names (its first lone digit), or the null label when it names none."""
    found = _DIGIT.search(prompt)
    return int(found.group(1)) if found else NULL_LABEL


def tokens_to_images(tokens: torch.Tensor) -> torch.Tensor:
    """``[B, 64]`` intensity tokens -> ``[B, 3, 8, 8]`` gray images in [0, 1] (a mask, which a
    finished sample has none of, shows as black)."""
    x = tokens.long().clamp_max(LEVELS - 1).float() / (LEVELS - 1)
    return x.reshape(-1, 1, SIDE, SIDE).expand(-1, 3, -1, -1)


def save_model(model: DigitTokenModel, path: str, kind: str) -> None:
    """Write a model folder: ``config.json`` (architecture and path) and safetensors weights."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_NAME).write_text(json.dumps({**model.config, "path": kind}, indent=2))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / WEIGHTS_NAME))


def load_model(path: str) -> tuple[DigitTokenModel, str]:
    """The model of a folder written by :func:`save_model`, and its path's kind."""
    from safetensors.torch import load_file

    folder = Path(path)
    if not (folder / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{folder} is not a digits_discrete model folder (no "
                                f"{CONFIG_NAME}: scripts/make_digits_discrete_model.py makes one)")
    config = json.loads((folder / CONFIG_NAME).read_text())
    kind = config.pop("path")
    model = DigitTokenModel(**config)
    model.load_state_dict(load_file(str(folder / WEIGHTS_NAME)))
    return model, kind


class DigitTokenPipeline:
    """The toy's "pipeline": its model under the name ``transformer`` and the path it was trained
    on; ``save_pretrained`` writes a model folder the adapter loads."""

    def __init__(self, transformer: DigitTokenModel, path: str = "masked") -> None:
        self.transformer, self.path = transformer, path

    def to(self, device: torch.device | str) -> DigitTokenPipeline:
        self.transformer.to(device)
        return self

    def save_pretrained(self, directory: str) -> None:
        save_model(self.transformer, directory, self.path)

    def set_progress_bar_config(self, **_: Any) -> None:
        """No progress bar to configure (the toy has no sampling loop of its own)."""


@register("digits_discrete")
class DigitsDiscreteAdapter(PeftLoraFiles, DiscreteAdapter):
    """The discrete toy: tokens ``[B, 64]`` of 8x8 intensities, decoded as gray images.

    Args:
        path_or_id: a model folder (:func:`save_model`), or None with ``model`` given.
        model: a built :class:`DigitTokenModel` (tests); ``path`` then names its token path.
        path: ``masked``, ``uniform`` or ``metric`` when ``model`` is given.
        pipeline: a :class:`DigitTokenPipeline` (model and path) in place of both.
        torch_dtype: the weights' dtype.
    """

    default_lora_targets = ("to_q", "to_k", "to_v", "to_out")
    text_encoder_names = ()
    token_shape = (SIDE, SIDE)

    def __init__(self, path_or_id: str | None = None, model: DigitTokenModel | None = None,
                 path: str = "masked", torch_dtype: Any = "float32",
                 pipeline: DigitTokenPipeline | None = None, **_: Any) -> None:
        if pipeline is not None:
            model, path = pipeline.transformer, pipeline.path
        elif model is None:
            if path_or_id is None:
                raise ValueError("digits_discrete needs a model folder (or a built `model`)")
            model, path = load_model(str(path_or_id))
        dtype = getattr(torch, torch_dtype) if isinstance(torch_dtype, str) else torch_dtype
        self.transformer = model.to(dtype).eval()
        self.pipeline = DigitTokenPipeline(self.transformer, path)
        self.path = token_path(path)
        if self.path.num_states != model.config["num_states"]:
            raise ValueError(f"a {path} path has {self.path.num_states} states; the model "
                             f"predicts {model.config['num_states']}")

    def encode(self, prompts: list[str]) -> Cond:
        labels = torch.tensor([prompt_label(p) for p in prompts], device=self.device)
        return Cond({"label": labels, "neg_label": torch.full_like(labels, NULL_LABEL)})

    def logits(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond,
               guidance: float) -> torch.Tensor:
        return guided_call(lambda **inputs: self.transformer(**inputs).float(), guidance,
                           {"tokens": x, "sigma": sigma, "label": cond.tensors["label"]},
                           {"label": cond.tensors["neg_label"]})

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return tokens_to_images(x)
