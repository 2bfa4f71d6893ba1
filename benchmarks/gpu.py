"""GPU benchmark: real GRPO iterations of the shipped recipes' architectures, against their
transformer-call floor, with model-FLOPs utilisation and the speed levers.

Models. The real architectures are built in code from their configs (written below, with the
public ``config.json`` each comes from) with random weights, directly on the device in the
recipe's dtype: SD3.5-Medium's ``SD3Transformer2DModel`` and VAE, FLUX.1-dev's
``FluxTransformer2DModel`` and VAE, Wan2.1-T2V-1.3B's ``WanTransformer3DModel`` and VAE. The text
encoders are not built into the pipelines: each prompt's encoding is drawn at random in the real
shapes (SD3.5: ``[77 + 256, 4096]`` and a pooled ``[2048]``; FLUX: ``[512, 4096]``, ``[768]``;
Wan: ``[512, 4096]``), seeded by the prompt, so the transformer sees real sequence lengths.
The dominant text encoder's cost (T5-XXL for SD3.5 and FLUX, umT5-XXL for Wan) is measured
apart: one forward at real size on a rollout chunk of prompts, and the host-device round trip
that ``model.offload_encoders`` pays for it per epoch (``--no-text-encoder`` skips it; it is
skipped by itself when the device lacks the memory). The CLIP encoders of SD3.5 and FLUX
(0.1-0.7 B parameters) are left out. The reward is ``jpeg_compressibility`` (on the CPU, no
weights to load) instead of PickScore, and ``train.skip_zero_advantage`` is off, so a group of
identical random images still trains.

Iterations. Each family runs real :class:`~flowgrpo.training.trainer.Trainer` iterations (the
work of ``Trainer.epoch`` but logging, ``benchmarks/_iteration.py``) of its shipped recipe
(``configs/sd35_pickscore.yaml``, ``flux_pickscore.yaml``, ``wan_t2v.yaml``: resolution, frames,
CFG, LoRA rank and alpha, bf16, gradient checkpointing, sampler, KL weight, rollout and training
chunk sizes), scaled to one GPU and the time budget by cutting the number of transformer calls,
never their shapes: the batch is one rollout chunk (``train.batch_size`` =
``sample_batch_size`` = ``train_batch_size``, the group size cut to divide it) and the
rollout has fewer steps (:data:`PLANS`). Every call is the one the recipe makes, so its memory
and its MFU are the recipe's; seconds per iteration scale with the number of calls.

The **floor** is ``benchmarks/overhead.py``'s: the iteration's transformer calls replayed alone
(inputs captured in the last warm-up iteration, the reference calls with the LoRA off, each
training forward followed by a backward fed the gradient the loss gave it), under the run's
autocast. Iterations and floors alternate. Every timer synchronizes the device first.

Figures per family (and per lever):

- ``seconds_per_iteration`` (median), ``samples_per_second`` (``train.batch_size`` / that);
- ``floor_seconds``, ``iteration_over_floor`` (median of the pairs' ratios);
- ``peak_memory_bytes``: ``torch.cuda.max_memory_allocated()`` over a timed iteration (the
  captured floor inputs subtracted), weights included; on the CPU the process's peak resident
  set (``VmHWM``), which also counts the allocator's cache;
- ``mfu_train``: model FLOPs of the training forwards and their backwards
  (``benchmarks/_flops.py``: counted from the config, the backward as LoRA training runs it)
  over their time inside the iteration (forward hooks on the transformer,
  ``accelerator.backward`` timed) and the device's dense bf16 peak; ``mfu_train_3x``: the same
  with the ``3 x forward`` of full fine-tuning (comparable with figures quoted for full
  training; it overstates a LoRA backward); ``mfu_nograd``: the no-grad forwards (rollout,
  reference, recomputes). A checkpointing recompute is not a model FLOP.

The peak comes from :data:`PEAK_BF16_TFLOPS` by ``torch.cuda.get_device_name()``, or
``--peak-tflops``; on a device not in the table (and on the CPU) it is measured: the best of a
few large bf16 (CPU: float32) matrix products, said in ``peak_source``.

Levers (:data:`LEVERS`; each config key is ``flowgrpo/config/schema.py``'s): ``model.compile``,
``model.gradient_checkpointing`` (toggled from the recipe's), CFG-free training
(``train.objective_params: {guidance: 1}``), ``steps_per_call`` (``train.objective_params``;
measured with checkpointing on, against checkpointing alone, since stacked steps multiply the
activations), ``train.optimizer_kernel: foreach`` (the base is ``auto``: fused AdamW on CUDA),
``sampler.storage_dtype: float32`` (the recipes store bf16), ``model.offload_encoders: false``
(with no text encoder built, this moves only the VAE; the text encoder's round trip is the
text-encoder section's), and two processes (``accelerate launch``, DDP) when 2 GPUs are
visible. Each lever is a fresh trainer: warm-up, then timed iterations, with the same hooks as
the base; ``x`` is its time (and peak) over the base's (or over the lever it builds on). A lever
that would overrun ``--budget`` seconds is skipped and says so; one that runs out of memory
says so. When the base itself runs out of memory it is retried with gradient checkpointing,
then with half the chunk size (``fallback`` says which ran).

Outputs: ``OUT/gpu_bench.json`` (every figure, the overrides each trainer ran with, the device)
and ``OUT/gpu_bench.md`` (the tables), with progress on stdout.

    python benchmarks/gpu.py [--out DIR] [--families sd3 flux wan] [--levers default|all|none|
        NAME ...] [--iterations 2] [--warmup 1] [--peak-tflops F] [--budget 480]
        [--no-text-encoder] [--estimate] [--tiny]

``--tiny`` runs the same code on tiny configs of the same classes (CPU, seconds); ``--estimate``
prints the default set's time predicted from the FLOP counts and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _flops import call_flops  # noqa: E402
from _iteration import build_trainer as _build_trainer  # noqa: E402
from _iteration import (  # noqa: E402
    iteration,
    machine_info,
    peak_bytes,
    quiet,
    reset_peak,
)
from overhead import (  # noqa: E402
    BACKWARD,
    FWD_GRAD,
    FWD_NOGRAD,
    FWD_REF,
    Call,
    Clock,
    TransformerProbe,
    floor,
    now,
    timed_iteration,
)

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("sd3", "flux", "wan")
PROMPTS = ROOT / "configs" / "prompts" / "pickscore_example.txt"

# ----------------------------------------------------------------------------- architectures
# stabilityai/stable-diffusion-3.5-medium, transformer/config.json (MMDiT-X: the first 13 blocks
# add an image-only self-attention).
SD35_MEDIUM_TRANSFORMER = {
    "sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 24,
    "attention_head_dim": 64, "num_attention_heads": 24, "joint_attention_dim": 4096,
    "caption_projection_dim": 1536, "pooled_projection_dim": 2048, "out_channels": 16,
    "pos_embed_max_size": 384, "dual_attention_layers": tuple(range(13)), "qk_norm": "rms_norm",
}
# stabilityai/stable-diffusion-3.5-medium, vae/config.json (the SD3 VAE, 16 latent channels).
SD35_VAE = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 16,
    "block_out_channels": (128, 256, 512, 512), "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4, "layers_per_block": 2, "norm_num_groups": 32,
    "act_fn": "silu", "sample_size": 1024, "scaling_factor": 1.5305, "shift_factor": 0.0609,
    "use_quant_conv": False, "use_post_quant_conv": False, "force_upcast": True,
}
# stabilityai/stable-diffusion-3.5-medium, scheduler/scheduler_config.json.
SD35_SCHEDULER = {"num_train_timesteps": 1000, "shift": 3.0}
# black-forest-labs/FLUX.1-dev, transformer/config.json (19 double-stream, 38 single-stream
# blocks, guidance-distilled).
FLUX_DEV_TRANSFORMER = {
    "patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38,
    "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 4096,
    "pooled_projection_dim": 768, "guidance_embeds": True, "axes_dims_rope": (16, 56, 56),
}
# black-forest-labs/FLUX.1-dev, vae/config.json: the SD3 VAE's layout, its own scaling.
FLUX_DEV_VAE = {**SD35_VAE, "scaling_factor": 0.3611, "shift_factor": 0.1159}
# black-forest-labs/FLUX.1-dev, scheduler/scheduler_config.json (resolution-dependent shift).
FLUX_DEV_SCHEDULER = {
    "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5,
    "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096,
}
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/config.json.
WAN21_1P3B_TRANSFORMER = {
    "patch_size": (1, 2, 2), "num_attention_heads": 12, "attention_head_dim": 128,
    "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 8960,
    "num_layers": 30, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6,
    "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024,
}
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers, vae/config.json (AutoencoderKLWan; 8x spatial, 4x temporal).
WAN21_VAE = {
    "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
    "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0,
    "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                     0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
    "latents_std": [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687,
                    2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160],
}
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers, scheduler/scheduler_config.json (UniPC with flow sigmas;
# the adapter takes its flow_shift for its Euler schedule).
WAN21_SCHEDULER = {"num_train_timesteps": 1000, "flow_shift": 3.0, "use_flow_sigmas": True,
                   "prediction_type": "flow_prediction"}
# google/t5-v1_1-xxl, config.json: SD3.5's text_encoder_3 and FLUX.1's text_encoder_2 (encoder).
T5_XXL = {"vocab_size": 32128, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24,
          "num_heads": 64, "feed_forward_proj": "gated-gelu", "relative_attention_num_buckets": 32,
          "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-6}
# google/umt5-xxl, config.json: Wan2.1's text_encoder (its vocabulary is 8x T5's).
UMT5_XXL = {**T5_XXL, "vocab_size": 256384}

REAL = {
    "sd3": {"transformer": SD35_MEDIUM_TRANSFORMER, "vae": SD35_VAE, "scheduler": SD35_SCHEDULER,
            "clip_tokens": 77, "text_encoder": ("t5", T5_XXL)},
    "flux": {"transformer": FLUX_DEV_TRANSFORMER, "vae": FLUX_DEV_VAE,
             "scheduler": FLUX_DEV_SCHEDULER, "text_encoder": ("t5", T5_XXL)},
    "wan": {"transformer": WAN21_1P3B_TRANSFORMER, "vae": WAN21_VAE,
            "scheduler": WAN21_SCHEDULER, "text_encoder": ("umt5", UMT5_XXL)},
}
# The same classes at test size (a 2x VAE for the images, a narrow one for the videos).
TINY_VAE = {**SD35_VAE, "block_out_channels": (8, 8),
            "down_block_types": ("DownEncoderBlock2D",) * 2,
            "up_block_types": ("UpDecoderBlock2D",) * 2, "layers_per_block": 1,
            "norm_num_groups": 4, "sample_size": 32}
TINY_T5 = {**T5_XXL, "vocab_size": 128, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
           "num_heads": 4}
TINY = {
    "sd3": {"transformer": {**SD35_MEDIUM_TRANSFORMER, "sample_size": 8, "num_layers": 3,
                            "attention_head_dim": 8, "num_attention_heads": 4,
                            "joint_attention_dim": 48, "caption_projection_dim": 32,
                            "pooled_projection_dim": 24, "pos_embed_max_size": 16,
                            "dual_attention_layers": (0,)},
            "vae": TINY_VAE, "scheduler": SD35_SCHEDULER, "clip_tokens": 4,
            "text_encoder": ("t5", TINY_T5)},
    "flux": {"transformer": {**FLUX_DEV_TRANSFORMER, "num_layers": 2, "num_single_layers": 2,
                             "attention_head_dim": 16, "num_attention_heads": 2,
                             "joint_attention_dim": 48, "pooled_projection_dim": 24,
                             "axes_dims_rope": (4, 6, 6)},
             "vae": {**TINY_VAE, "scaling_factor": 0.3611, "shift_factor": 0.1159},
             "scheduler": {**FLUX_DEV_SCHEDULER, "base_image_seq_len": 4, "max_image_seq_len": 64},
             "text_encoder": ("t5", TINY_T5)},
    "wan": {"transformer": {**WAN21_1P3B_TRANSFORMER, "num_attention_heads": 2,
                            "attention_head_dim": 16, "text_dim": 48, "freq_dim": 32,
                            "ffn_dim": 80, "num_layers": 2, "rope_max_seq_len": 32},
            "vae": {**WAN21_VAE, "base_dim": 3, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1},
            "scheduler": WAN21_SCHEDULER, "text_encoder": ("umt5", {**TINY_T5, "vocab_size": 256})},
}
ARCHS = {"real": REAL, "tiny": TINY}

# ----------------------------------------------------------------------------- plans
# Per family: the recipe, and the cut that fits the default set into the budget (the shapes of
# every call stay the recipe's; see the module docstring). ``tiny`` adds the sizes of the tiny
# models on top.
PLANS = {
    "sd3": {"recipe": "configs/sd35_pickscore.yaml", "unit": "images",
            "scale": ["sampler.num_steps=4"],  # recipe: 10 steps, all 9 trained
            "tiny": ["model.height=32", "model.width=32", "model.options={max_sequence_length: 4}",
                     "train.train_batch_size=4", "train.sample_batch_size=4",
                     "sampler.num_steps=3"]},
    "flux": {"recipe": "configs/flux_pickscore.yaml", "unit": "images",
             "scale": ["sampler.num_steps=3"],  # recipe: 16 steps, 15 trained
             "tiny": ["model.height=32", "model.width=32",
                      "model.options={max_sequence_length: 8}", "train.train_batch_size=4",
                      "train.sample_batch_size=4", "sampler.num_steps=3"]},
    "wan": {"recipe": "configs/wan_t2v.yaml", "unit": "videos",
            # recipe: 20 steps, a window of 4 trained
            "scale": ["sampler.num_steps=6",
                      "train.step_selection_params={size: 2, strategy: progressive}"],
            "tiny": ["model.height=32", "model.width=32",
                     "model.options={num_frames: 9, max_sequence_length: 8}",
                     "train.train_batch_size=4", "train.sample_batch_size=4",
                     "sampler.num_steps=3"]},
}
COMMON = ["model.path=random-weights", "reward.name=jpeg_compressibility", "reward.params={}",
          "train.skip_zero_advantage=false", "run.max_nonfinite_steps=1000000",
          f"data.prompts={PROMPTS}", "data.eval_prompts="]

# name: (what it is, config overrides, the measurement it is compared with)
LEVERS: dict[str, tuple[str, list[str], str]] = {
    "gradient_checkpointing": ("model.gradient_checkpointing toggled from the recipe's",
                               [], "base"),  # overrides filled per family
    "cfg_free": ("CFG-free training: train.objective_params {guidance: 1}",
                 ["train.objective_params={guidance: 1}"], "base"),
    "steps_per_call": ("train.objective_params {steps_per_call: 2}, with checkpointing",
                       ["train.objective_params={steps_per_call: 2}",
                        "model.gradient_checkpointing=true"], "checkpointing on"),
    "adamw_foreach": ("train.optimizer_kernel: foreach (base auto: fused AdamW on CUDA)",
                      ["train.optimizer_kernel=foreach"], "base"),
    "storage_fp32": ("sampler.storage_dtype: float32 (recipes: bfloat16)",
                     ["sampler.storage_dtype=float32"], "base"),
    "no_offload": ("model.offload_encoders: false (here only the VAE moves)",
                   ["model.offload_encoders=false"], "base"),
    "two_processes": ("2 processes (accelerate launch, DDP), one GPU each", [], "base"),
    "compile": ("model.compile: default (TorchDynamo + Inductor)", ["model.compile=default"],
                "base"),
}
# The default set: each lever where it matters, in the order they run (compile last: longest).
DEFAULT_LEVERS = {
    "sd3": ["gradient_checkpointing", "cfg_free", "steps_per_call", "adamw_foreach",
            "storage_fp32", "no_offload", "two_processes", "compile"],
    "flux": ["gradient_checkpointing"],
    "wan": ["cfg_free", "gradient_checkpointing"],
}
TRUE_CFG = {"sd3", "wan"}  # FLUX.1-dev's guidance is an embedding: one call per step

# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, from the vendors' data sheets; the
# first entry whose key is in torch.cuda.get_device_name() wins, so the specific ones come first.
PEAK_BF16_TFLOPS = [
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H800", 989.0),
    ("H200", 989.0), ("GH200", 989.0), ("H20", 148.0), ("B200", 2250.0), ("A100", 312.0),
    ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("MI300X", 1307.0),
]
RECIPE_GPU_BYTES = 80 * 2**30  # the recipes' card: 80 GB


# ----------------------------------------------------------------------------- the adapters
@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def device_name() -> str:
    """This process's device: its GPU under ``accelerate launch`` (``LOCAL_RANK``), else the
    first, else the CPU."""
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"


def build_pipeline(family: str, size: str, dtype: torch.dtype) -> Any:
    """The family's diffusers pipeline with random weights and no text encoders, built on the
    device in ``dtype`` (what ``from_pretrained(dtype=...)`` gives, ``_keep_in_fp32_modules``
    included); parameters are created there directly, so a 12 B model takes seconds."""
    import diffusers

    arch = ARCHS[size][family]
    names = {"sd3": ("SD3Transformer2DModel", "AutoencoderKL",
                     "FlowMatchEulerDiscreteScheduler", "StableDiffusion3Pipeline"),
             "flux": ("FluxTransformer2DModel", "AutoencoderKL",
                      "FlowMatchEulerDiscreteScheduler", "FluxPipeline"),
             "wan": ("WanTransformer3DModel", "AutoencoderKLWan", "UniPCMultistepScheduler",
                     "WanPipeline")}[family]
    model_cls, vae_cls, scheduler_cls, pipeline_cls = (getattr(diffusers, n) for n in names)
    device = device_name()
    torch.manual_seed(0)
    with default_dtype(dtype), torch.device(device):
        transformer = model_cls.from_config(dict(arch["transformer"])).eval()
        vae = vae_cls.from_config(dict(arch["vae"])).eval()
    for module in (transformer, vae):
        module.to(device, dtype)  # buffers made from numpy (positional tables) too
        keep = getattr(module, "_keep_in_fp32_modules", None) or []
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if any(k in name.split(".") for k in keep):
                tensor.data = tensor.data.float()
    scheduler = scheduler_cls.from_config(dict(arch["scheduler"]))
    parts = {"transformer": transformer, "vae": vae, "scheduler": scheduler}
    empty = {"sd3": ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
                     "text_encoder_3", "tokenizer_3"),
             "flux": ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
                      "image_encoder", "feature_extractor"),
             "wan": ("text_encoder", "tokenizer")}[family]
    return pipeline_cls(**parts, **dict.fromkeys(empty))


def text_shapes(family: str, config: Any, size: str, max_sequence_length: int) -> dict:
    """Per-sample shapes of the encodings the family's ``encode`` returns (``neg_*`` for CFG)."""
    if family == "sd3":
        tokens = ARCHS[size]["sd3"]["clip_tokens"] + max_sequence_length
        pos = {"prompt_embeds": (tokens, config.joint_attention_dim),
               "pooled": (config.pooled_projection_dim,)}
        return {**pos, **{f"neg_{k}": v for k, v in pos.items()}}
    if family == "flux":
        return {"prompt_embeds": (max_sequence_length, config.joint_attention_dim),
                "pooled": (config.pooled_projection_dim,)}
    shape = (max_sequence_length, config.text_dim)
    return {"prompt_embeds": shape, "neg_prompt_embeds": shape}


def random_encode(self: Any, prompts: list[str]) -> Any:
    """Encodings drawn at random in the real shapes, each seeded by its prompt (the negative
    ones by the negative prompt), in place of the text encoders."""
    from pipelines import Cond

    out = {}
    for key, shape in self.text_shapes.items():
        rows = []
        for prompt in prompts:
            text = self.negative_prompt if key.startswith("neg_") else prompt
            gen = torch.Generator().manual_seed(zlib.crc32(f"{key}\0{text}".encode()))
            rows.append(torch.randn(shape, generator=gen))
        out[key] = torch.stack(rows).to(self.device, self.dtype)
    return Cond(out)


def bench_adapter(family: str) -> type:
    """A subclass of the family's adapter whose pipeline is :func:`build_pipeline`'s and whose
    ``encode`` is :func:`random_encode`; ``pipeline_classes`` is empty, so ``model.path`` is
    not checked against the hub."""
    from pipelines.flux import FluxAdapter
    from pipelines.sd3 import SD3Adapter
    from pipelines.wan import WanAdapter

    base = {"sd3": SD3Adapter, "flux": FluxAdapter, "wan": WanAdapter}[family]

    def __init__(self: Any, path_or_id: str | None = None, *, size: str = "real",
                 torch_dtype: str = "float32", **options: Any) -> None:
        dtype = getattr(torch, torch_dtype) if isinstance(torch_dtype, str) else torch_dtype
        base.__init__(self, pipeline=build_pipeline(family, size, dtype),
                      torch_dtype=torch_dtype, **options)
        self.negative_prompt = getattr(self, "negative_prompt", "")
        self.text_shapes = text_shapes(family, self.transformer.config, size,
                                       self.max_sequence_length)

    return type(f"Bench{base.__name__}", (base,), {
        "__init__": __init__, "encode": random_encode, "pipeline_classes": (),
        "__doc__": f"{base.__name__} on random weights of the real architecture."})


@contextlib.contextmanager
def bench_families() -> Iterator[None]:
    """``gpubench_sd3``, ``gpubench_flux``, ``gpubench_wan`` registered for the block."""
    import pipelines

    with contextlib.ExitStack() as stack:
        for family in FAMILIES:
            stack.enter_context(pipelines.FAMILIES.registered(f"gpubench_{family}",
                                                              bench_adapter(family)))
        yield


# ----------------------------------------------------------------------------- configurations
@functools.cache
def recipe(family: str) -> Any:
    """The family's recipe file, loaded."""
    from flowgrpo.config.io import load_config

    return load_config(str(ROOT / PLANS[family]["recipe"]))


def recipe_value(family: str, key: str) -> Any:
    """A value of the family's recipe file (``section.key``)."""
    cfg = recipe(family)
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def base_overrides(family: str, size: str, chunk_divisor: int = 1) -> list[str]:
    """The overrides of the family's scaled recipe (see :data:`PLANS`): one rollout chunk per
    iteration, fewer steps; ``chunk_divisor`` cuts the chunk further (the out-of-memory
    fallback)."""
    plan = PLANS[family]
    options = dict(recipe_value(family, "model.options"))
    extra = plan["scale"]
    if size == "tiny":
        for item in plan["tiny"]:
            if item.startswith("model.options="):
                import yaml

                options.update(yaml.safe_load(item.split("=", 1)[1]))
        extra = [*extra, *(i for i in plan["tiny"] if not i.startswith("model.options="))]
    options["size"] = size
    chunk = recipe_value(family, "train.train_batch_size")
    for item in extra:
        if item.startswith("train.train_batch_size="):
            chunk = int(item.split("=")[1])
    chunk = max(chunk // chunk_divisor, 2)
    group = recipe_value(family, "train.group_size")
    if chunk % group:
        group = max(chunk // 2, 2)
    out = [*COMMON, f"model.family=gpubench_{family}", f"model.options={json.dumps(options)}",
           *extra, f"train.batch_size={chunk}", f"train.sample_batch_size={chunk}",
           f"train.train_batch_size={chunk}", f"train.group_size={group}"]
    return out


def lever_overrides(family: str, lever: str) -> list[str]:
    if lever == "gradient_checkpointing":
        return [f"model.gradient_checkpointing="
                f"{str(not recipe_value(family, 'model.gradient_checkpointing')).lower()}"]
    return list(LEVERS[lever][1])


def build(family: str, overrides: list[str], folder: str) -> Any:
    return _build_trainer(overrides, folder, config=str(ROOT / PLANS[family]["recipe"]))


# ----------------------------------------------------------------------------- measuring
def sync() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def reset_memory() -> Any:
    if torch.cuda.is_initialized():
        sync()
        torch.cuda.reset_peak_memory_stats()
        return True
    return reset_peak()


def read_memory(was_reset: Any) -> int:
    if torch.cuda.is_initialized():
        sync()
        return int(torch.cuda.max_memory_allocated())
    return int(peak_bytes(bool(was_reset)))


def captured_bytes(calls: list[Call]) -> int:
    """Bytes the floor's captured inputs and gradients hold on the device."""
    total = 0
    for call in calls:
        values = [*call.args, *(call.kwargs or {}).values(), call.grad_output]
        total += sum(v.nbytes for v in values
                     if isinstance(v, torch.Tensor) and v.device.type == "cuda")
    return total


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def own_by_kind(own: dict) -> dict[str, float]:
    """Seconds per transformer kind (and backward) in one iteration's own times."""
    out = dict.fromkeys((FWD_NOGRAD, FWD_REF, FWD_GRAD, BACKWARD), 0.0)
    for path, seconds in own.items():
        if path[-1] in out:
            out[path[-1]] += seconds
    return out


def per_row_flops(trainer: Any, family: str, call: Call) -> dict[str, float]:
    """Forward and backward model FLOPs per row of this family's calls (from a captured call's
    shapes, with the trainer's LoRA)."""
    cfg = trainer.cfg.model
    hidden = (call.kwargs or {}).get("hidden_states", call.args[0] if call.args else None)
    text = (call.kwargs or {})["encoder_hidden_states"]
    targets = tuple(cfg.lora_targets or trainer.adapter.default_lora_targets)
    from flowgrpo.distributed import unwrap

    count = call_flops(family, dict(unwrap(trainer.adapter.transformer).config),
                       (1, *hidden.shape[1:]), int(text.shape[1]),
                       cfg.lora_rank if cfg.lora else 0, targets)
    return {"forward": count.forward, "backward": count.backward}


def measure(trainer: Any, family: str, warmup: int, iterations: int, with_floor: bool,
            flops: dict | None, peak: float, log: Any) -> dict:
    """Warm up, then time ``iterations`` iterations (alternating with floors when
    ``with_floor``); the figures of :func:`figures`. ``flops`` (per-row counts) comes from
    this measurement's capture when None."""
    from flowgrpo.distributed import unwrap

    clock = Clock()
    probe = TransformerProbe(clock, unwrap(trainer.adapter.transformer))
    clock.wrap(trainer.acc, "backward", BACKWARD)
    try:
        epoch = 0
        for w in range(warmup):
            probe.calls, probe.capture = [], with_floor and w == warmup - 1
            start = now()
            iteration(trainer, epoch)
            log(f"warm-up iteration {w + 1}/{warmup}: {now() - start:.2f} s")
            epoch += 1
        probe.capture = False
        captured = probe.calls
        if flops is None:
            first = next(c for c in captured if c.kwargs or c.args)
            flops = per_row_flops(trainer, family, first)
        held = captured_bytes(captured) if with_floor else 0
        clock.take()
        rows: list[dict] = []
        for _ in range(iterations):
            probe.calls = []
            token = reset_memory()
            seconds, _, own, _ = timed_iteration(trainer, clock, epoch)
            memory = read_memory(token) - held
            epoch += 1
            row = {"seconds": seconds, "memory": memory, "kinds": own_by_kind(own),
                   "calls": [(c.rows, c.grad) for c in probe.calls]}
            if with_floor:
                row["floor"] = sum(floor(trainer, captured, clock).values())
                clock.take()
            rows.append(row)
            log(f"iteration {len(rows)}/{iterations}: {seconds:.2f} s"
                + (f", floor {row['floor']:.2f} s" if with_floor else ""))
    finally:
        clock.restore()
        probe.remove()
    return {**figures(trainer, rows, flops, peak, with_floor), "flops_per_row": flops}


def figures(trainer: Any, rows: list[dict], flops: dict, peak: float, with_floor: bool) -> dict:
    """Medians over the timed iterations: time, throughput, peak memory, MFU (module
    docstring)."""
    cfg = trainer.cfg
    seconds = statistics.median(r["seconds"] for r in rows)
    fwd, bwd = flops["forward"], flops["backward"]

    def mfu(kind: str, r: dict) -> float:
        grad_rows = sum(n for n, grad in r["calls"] if grad)
        nograd_rows = sum(n for n, grad in r["calls"] if not grad)
        k = r["kinds"]
        if kind == "train":
            work, t = grad_rows * (fwd + bwd), k[FWD_GRAD] + k[BACKWARD]
        elif kind == "train_3x":
            work, t = grad_rows * 3 * fwd, k[FWD_GRAD] + k[BACKWARD]
        else:
            work, t = nograd_rows * fwd, k[FWD_NOGRAD] + k[FWD_REF]
        return work / max(t, 1e-12) / (peak * 1e12)

    out = {
        "seconds_per_iteration": seconds,
        "samples_per_second": cfg.train.batch_size / seconds,
        "peak_memory_bytes": max(r["memory"] for r in rows),
        "mfu_train": statistics.median(mfu("train", r) for r in rows),
        "mfu_train_3x": statistics.median(mfu("train_3x", r) for r in rows),
        "mfu_nograd": statistics.median(mfu("nograd", r) for r in rows),
        "rows_grad": sum(n for n, g in rows[-1]["calls"] if g),
        "rows_nograd": sum(n for n, g in rows[-1]["calls"] if not g),
        "transformer_calls": len(rows[-1]["calls"]),
        "train_seconds": statistics.median(r["kinds"][FWD_GRAD] + r["kinds"][BACKWARD]
                                           for r in rows),
        "nograd_seconds": statistics.median(r["kinds"][FWD_NOGRAD] + r["kinds"][FWD_REF]
                                            for r in rows),
        "model_tflops_per_iteration": (
            sum(n * (fwd + (bwd if g else 0.0)) for n, g in rows[-1]["calls"]) / 1e12),
    }
    if with_floor:
        out["floor_seconds"] = statistics.median(r["floor"] for r in rows)
        out["iteration_over_floor"] = statistics.median(r["seconds"] / r["floor"] for r in rows)
    return out


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


# ----------------------------------------------------------------------------- peak, text encoder
def measured_peak() -> float:
    """TFLOP/s of the best of a few large matrix products (bf16 on CUDA, float32 on the CPU)."""
    cuda = torch.cuda.is_available()
    n = 8192 if cuda else 512
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=device_name(), dtype=dtype)
    b = torch.randn(n, n, device=device_name(), dtype=dtype)
    best = math.inf
    for _ in range(5):
        start = now()
        for _ in range(4):
            a @ b
        best = min(best, (now() - start) / 4)
    return 2 * n**3 / best / 1e12


def device_peak(flag: float | None) -> tuple[float, str]:
    """The dense bf16 peak (TFLOP/s) the MFU is measured against, and where it comes from."""
    if flag:
        return flag, "--peak-tflops"
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, tflops in PEAK_BF16_TFLOPS:
            if key in name:
                return tflops, f"table: {key} ({name})"
        return measured_peak(), f"measured bf16 matmul ({name} not in the table)"
    return measured_peak(), "measured float32 matmul (CPU)"


def text_encoder_cost(family: str, size: str, batch: int, log: Any) -> dict:
    """One forward of the family's dominant text encoder at its size (random weights, bf16 on
    the device) on ``batch`` prompts of its sequence length, and the host-device round trip
    ``model.offload_encoders`` makes with it each epoch."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kind, config = ARCHS[size][family]["text_encoder"]
    seq = 8 if size == "tiny" else (256 if family == "sd3" else 512)  # T5 tokens
    config_cls, model_cls = ((T5Config, T5EncoderModel) if kind == "t5"
                             else (UMT5Config, UMT5EncoderModel))
    bytes_ = 2 * sum(_t5_params(config).values())
    device = device_name()
    if device != "cpu":
        free, _ = torch.cuda.mem_get_info()
        if free < 1.5 * bytes_:
            return {"skipped": f"{bytes_ / 2**30:.1f} GiB of weights, {free / 2**30:.1f} GiB "
                               f"free"}
    torch.manual_seed(0)
    with default_dtype(torch.bfloat16), torch.device(device):
        model = model_cls(config_cls(**config)).eval()
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, config["vocab_size"], (batch, seq), device=device)
    with torch.no_grad():
        model(input_ids=ids)  # warm-up
        start = now()
        model(input_ids=ids)
        forward = now() - start
    start = now()
    model.to("cpu")
    to_cpu = now() - start
    start = now()
    model.to(device)
    to_device = now() - start
    del model
    free_memory()
    log(f"text encoder {kind}: forward {forward:.3f} s on {batch} x {seq} tokens")
    return {"encoder": kind, "parameters": params, "weight_bytes": bytes_, "batch": batch,
            "tokens": seq, "forward_seconds": forward, "offload_round_trip_seconds":
            to_cpu + to_device}


def _t5_params(c: dict) -> dict[str, int]:
    """Parameters of a (um)T5 encoder from its config: embeddings, attention, gated MLP."""
    d, inner, ff, n = c["d_model"], c["num_heads"] * c["d_kv"], c["d_ff"], c["num_layers"]
    return {"embed": c["vocab_size"] * d, "attn": n * 4 * d * inner, "mlp": n * 3 * d * ff}


# ----------------------------------------------------------------------------- one family
class Progress:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, text: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {text}", flush=True)


def run_base(family: str, args: Any, peak: float, progress: Progress, folder: str) -> dict:
    """The family's base measurement (with the out-of-memory fallbacks) and its text encoder's
    cost; its ``levers`` are filled later by :func:`run_lever`."""
    size = "tiny" if args.tiny else "real"
    out: dict[str, Any] = {"unit": PLANS[family]["unit"], "recipe": PLANS[family]["recipe"]}
    fallbacks = [("recipe", []), ("gradient checkpointing", ["model.gradient_checkpointing=true"]),
                 ("half chunk, checkpointing", ["model.gradient_checkpointing=true"])]
    base = None
    for i, (name, extra) in enumerate(fallbacks):
        overrides = [*base_overrides(family, size, 2 if i == 2 else 1), *extra]
        progress(f"{family}: building the trainer ({name})")
        trainer = None
        try:
            trainer = build(family, overrides, f"{folder}/{family}-base-{i}")
            describe(trainer, out)
            base = measure(trainer, family, args.warmup, args.iterations, True, None, peak,
                           lambda t: progress(f"{family}: base {t}"))
            out.update(overrides=overrides, fallback=name, **base)
            break
        except RuntimeError as err:
            if not is_oom(err):
                raise
            progress(f"{family}: out of memory with {name}")
            out.setdefault("out_of_memory", []).append(name)
        finally:
            del trainer
            free_memory()
    if base is None:
        return out
    progress(f"{family}: {base['seconds_per_iteration']:.2f} s/iteration, "
             f"{base['iteration_over_floor']:.3f} x floor, MFU train {base['mfu_train']:.1%}, "
             f"peak {base['peak_memory_bytes'] / 2**30:.2f} GiB")
    if not args.no_text_encoder:
        out["text_encoder"] = text_encoder_cost(family, size, int(out["batch_size"]),
                                                lambda t: progress(f"{family}: {t}"))
    out["levers"] = {}
    return out


def describe(trainer: Any, out: dict) -> None:
    """The settings the trainer runs with (the recipe's, scaled)."""
    cfg = trainer.cfg
    transformer = trainer.adapter.transformer
    out.update({
        "height": cfg.model.height, "width": cfg.model.width,
        "options": {k: v for k, v in cfg.model.options.items() if k != "size"},
        "dtype": cfg.model.dtype, "mixed_precision": cfg.model.mixed_precision,
        "guidance": cfg.model.guidance, "lora_rank": cfg.model.lora_rank,
        "gradient_checkpointing": cfg.model.gradient_checkpointing,
        "num_steps": cfg.sampler.num_steps, "batch_size": cfg.train.batch_size,
        "group_size": cfg.train.group_size, "beta": cfg.train.beta,
        "step_selection": cfg.train.step_selection,
        "transformer_parameters": sum(p.numel() for n, p in transformer.named_parameters()
                                      if "lora_" not in n),
        "lora_parameters": sum(p.numel() for n, p in transformer.named_parameters()
                               if "lora_" in n),
    })


def lever_plan(family: str, args: Any) -> list[str]:
    if args.levers == ["none"]:
        return []
    if args.levers == ["all"]:
        return list(LEVERS)
    if args.levers == ["default"]:
        return list(DEFAULT_LEVERS[family])
    return [lever for lever in args.levers if lever in LEVERS]


def run_lever(family: str, lever: str, args: Any, peak: float, progress: Progress,
              folder: str, base: dict) -> dict:
    """One lever of ``family`` against its base (``base``, whose ``levers`` holds the levers
    measured so far)."""
    size = "tiny" if args.tiny else "real"
    what, _, against = LEVERS[lever]
    skip = lever_skip(family, lever, args, base)
    warmup = args.warmup + (1 if lever == "compile" else 0)
    need = (warmup + args.iterations) * base["seconds_per_iteration"] + (
        args.compile_allowance if lever == "compile" else 0)
    if not skip and args.budget and progress.elapsed() + need > args.budget:
        skip = (f"time budget: {progress.elapsed():.0f} s spent, about {need:.0f} s needed, "
                f"--budget {args.budget:.0f} s")
    reference = base
    if not skip and against == "checkpointing on":
        if base["gradient_checkpointing"]:
            against = "base"
        else:
            reference = base["levers"].get("gradient_checkpointing", {})
            against = "gradient_checkpointing"
            if "seconds_per_iteration" not in reference:
                skip = "needs the gradient_checkpointing lever's measurement to compare with"
    if skip:
        progress(f"{family}: lever {lever} skipped ({skip})")
        return {"what": what, "skipped": skip}
    overrides = [*base["overrides"], *lever_overrides(family, lever)]
    progress(f"{family}: lever {lever}")
    if lever == "two_processes":
        result = two_processes(family, overrides, args, size, folder)
    else:
        trainer = None
        try:
            trainer = build(family, overrides, f"{folder}/{family}-{lever}")
            result = measure(trainer, family, warmup, args.iterations, False,
                             base["flops_per_row"], peak,
                             lambda t: progress(f"{family}: {lever} {t}"))
        except RuntimeError as err:
            if not is_oom(err):
                raise
            result = {"error": "out of memory"}
        finally:
            del trainer
            if lever == "compile":
                torch._dynamo.reset()
            free_memory()
    result = {"what": what, "against": against, "overrides": lever_overrides(family, lever),
              **result}
    if lever == "two_processes" and "samples_per_second" in result:
        result["scaling_efficiency"] = (result["samples_per_second"]
                                        / (2 * reference["samples_per_second"]))
    if "seconds_per_iteration" in result:
        result["time_x"] = result["seconds_per_iteration"] / reference["seconds_per_iteration"]
        result["memory_x"] = result["peak_memory_bytes"] / max(reference["peak_memory_bytes"], 1)
        progress(f"{family}: {lever}: {result['seconds_per_iteration']:.2f} s/iteration "
                 f"({result['time_x']:.2f} x), peak {result['memory_x']:.2f} x")
    else:
        progress(f"{family}: {lever}: {result.get('error')}")
    return result


def lever_skip(family: str, lever: str, args: Any, base: dict) -> str:
    """Why ``lever`` is not measured on ``family`` ('' when it is)."""
    if lever == "cfg_free" and (family not in TRUE_CFG or base["guidance"] <= 1):
        return "no true CFG in this recipe (FLUX.1-dev's guidance is an embedding)"
    if lever == "two_processes" and not args.two_processes:
        n = torch.cuda.device_count()
        return f"{n} GPU visible: needs 2" if n < 2 else "--two-processes off"
    if lever == "compile" and args.tiny and "compile" not in args.levers:
        return "tiny runs on the CPU, where Inductor compiles for minutes (name it to run it)"
    return ""


# ----------------------------------------------------------------------------- two processes
def two_processes(family: str, overrides: list[str], args: Any, size: str, folder: str) -> dict:
    """The base configuration on 2 processes (``accelerate launch``, DDP; each process keeps
    the per-process sizes): seconds per iteration and samples per second of both together."""
    out_file = Path(folder) / f"{family}-2proc.json"
    spec = {"family": family, "overrides": overrides, "warmup": args.warmup,
            "iterations": args.iterations, "folder": f"{folder}/{family}-2proc",
            "out": str(out_file)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(29500 + os.getpid() % 1000), "--multi_gpu",
           __file__, "--worker", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": f"2-process run failed: {proc.stderr.strip().splitlines()[-1:]}"}
    return json.loads(out_file.read_text())


def worker(spec: dict) -> None:
    """One process of :func:`two_processes`."""
    quiet()
    with bench_families():
        trainer = build(spec["family"], spec["overrides"], spec["folder"])
        for epoch in range(spec["warmup"]):
            iteration(trainer, epoch)
        seconds = []
        token = reset_memory()
        for epoch in range(spec["warmup"], spec["warmup"] + spec["iterations"]):
            trainer.acc.wait_for_everyone()
            start = now()
            iteration(trainer, epoch)
            trainer.acc.wait_for_everyone()
            seconds.append(now() - start)
        memory = read_memory(token)
        world = trainer.acc.num_processes
        if trainer.acc.is_main_process:
            s = statistics.median(seconds)
            Path(spec["out"]).write_text(json.dumps({
                "processes": world, "seconds_per_iteration": s, "peak_memory_bytes": memory,
                "samples_per_second": world * trainer.cfg.train.batch_size / s}))


# ----------------------------------------------------------------------------- estimate
def estimate(args: Any, peak: float, mfu: float = 0.35) -> dict:
    """Seconds the default set should take on a device of ``peak`` TFLOP/s at ``mfu``: every
    planned iteration's hardware FLOPs (checkpointing recomputes included) from the counts, plus
    the fixed costs. Builds no model."""
    from flowgrpo.config.io import load_config
    from flowgrpo.rl import step_selection

    out: dict[str, Any] = {}
    total = 25.0  # start, imports, CUDA context, peak lookup
    for family in args.families:
        with bench_families():
            cfg = load_config(str(ROOT / PLANS[family]["recipe"]), base_overrides(family, "real"))
        arch = REAL[family]["transformer"]
        h, w = cfg.model.height, cfg.model.width
        seq = dict(cfg.model.options).get("max_sequence_length", 512)
        if family == "sd3":
            shape, text = (1, 16, h // 8, w // 8), REAL["sd3"]["clip_tokens"] + 256
        elif family == "flux":
            shape, text = (1, (h // 16) * (w // 16), 64), seq
        else:
            frames = (dict(cfg.model.options)["num_frames"] - 1) // 4 + 1
            shape, text = (1, 16, frames, h // 8, w // 8), seq
        count = call_flops(family, arch, shape, text, cfg.model.lora_rank,
                           tuple(bench_adapter(family).default_lora_targets))
        selection = step_selection.build(cfg.train.step_selection,
                                         **cfg.train.step_selection_params)
        import samplers

        sampler = samplers.build(cfg.sampler.name, **cfg.sampler.params)
        sigmas = torch.linspace(1, 0, cfg.sampler.num_steps + 1)
        trained = selection.select(sigmas, torch.zeros(cfg.train.group_size, dtype=torch.long),
                                   0, sampler).shape[1]
        rows = cfg.train.batch_size * (2 if family in TRUE_CFG and cfg.model.guidance > 1 else 1)
        f, b = count.forward, count.backward
        train = f + b + (f if cfg.model.gradient_checkpointing else 0.0)
        it_flops = rows * (cfg.sampler.num_steps * f + trained * train
                           + (trained * f if cfg.train.beta > 0 else 0.0))
        it_seconds = it_flops / (peak * 1e12 * mfu) + 0.5  # + decode, reward, glue
        base_runs = args.warmup + 2 * args.iterations  # iterations and floors
        levers = [lv for lv in DEFAULT_LEVERS[family] if lv != "two_processes"
                  and not (lv == "cfg_free" and family not in TRUE_CFG)]
        lever_runs = sum(args.warmup + args.iterations + (lv == "compile") for lv in levers)
        builds = (1 + len(levers)) * (3.0 if family != "flux" else 6.0)
        family_s = ((base_runs + lever_runs) * it_seconds + builds + 10.0
                    + (args.compile_allowance if "compile" in levers else 0.0))
        out[family] = {"forward_tflops_per_row": f / 1e12, "backward_tflops_per_row": b / 1e12,
                       "iteration_tflops": it_flops / 1e12, "iteration_seconds": it_seconds,
                       "levers": levers, "seconds": family_s}
        total += family_s
    out["total_seconds"] = total
    out["assumed_mfu"] = mfu
    out["peak_tflops"] = peak
    return out


# ----------------------------------------------------------------------------- report
def gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def markdown(result: dict) -> str:
    lines = [f"# GPU benchmark ({'tiny, ' if result['tiny'] else ''}{result['device']})", "",
             f"Peak {result['peak_tflops']:.1f} TFLOP/s ({result['peak_source']}); "
             f"{result['seconds_total']:.0f} s in all.", "",
             "| family | s/iteration | samples/s | peak GiB | iteration / floor | MFU train | "
             "MFU train (3x) | MFU no-grad | config |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for family, r in result["families"].items():
        if "seconds_per_iteration" not in r:
            lines.append(f"| {family} | out of memory ({', '.join(r.get('out_of_memory', []))})"
                         " | | | | | | | |")
            continue
        guidance = "CFG" if family in TRUE_CFG else "guidance embedding"
        config = (f"{r['height']}x{r['width']} {r['options'] or ''} steps {r['num_steps']}, "
                  f"batch {r['batch_size']}, {guidance} {r['guidance']}, LoRA {r['lora_rank']}, "
                  f"ckpt {str(r['gradient_checkpointing']).lower()} ({r['fallback']})")
        lines.append(f"| {family} | {r['seconds_per_iteration']:.3f} | "
                     f"{r['samples_per_second']:.2f} {r['unit']} | "
                     f"{gib(r['peak_memory_bytes'])} | {r['iteration_over_floor']:.3f} | "
                     f"{r['mfu_train']:.1%} | {r['mfu_train_3x']:.1%} | {r['mfu_nograd']:.1%} | "
                     f"{config} |")
    lines += ["", "| family | lever | s/iteration | x | peak GiB | x | MFU train | against |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for family, r in result["families"].items():
        for lever, v in r.get("levers", {}).items():
            if "time_x" in v:
                mfu = f"{v['mfu_train']:.1%}" if "mfu_train" in v else ""
                lines.append(f"| {family} | {lever} | {v['seconds_per_iteration']:.3f} | "
                             f"{v['time_x']:.2f} | {gib(v['peak_memory_bytes'])} | "
                             f"{v['memory_x']:.2f} | {mfu} | {v['against']} |")
            else:
                lines.append(f"| {family} | {lever} | {v.get('skipped') or v.get('error')} "
                             "| | | | | |")
    encoders = [(f, r["text_encoder"]) for f, r in result["families"].items()
                if "text_encoder" in r]
    if encoders:
        lines += ["", "| family | text encoder | parameters | forward s | batch x tokens | "
                  "offload round trip s |", "| --- | --- | --- | --- | --- | --- |"]
        for family, t in encoders:
            if "skipped" in t:
                lines.append(f"| {family} | skipped: {t['skipped']} | | | | |")
            else:
                lines.append(f"| {family} | {t['encoder']} | {t['parameters']:.3g} | "
                             f"{t['forward_seconds']:.3f} | {t['batch']} x {t['tokens']} | "
                             f"{t['offload_round_trip_seconds']:.2f} |")
    return "\n".join(lines) + "\n"


def save(result: dict, out: Path, progress: Progress) -> None:
    """Write the JSON as it stands (a run cut short keeps what it measured)."""
    result["seconds_total"] = progress.elapsed()
    (out / "gpu_bench.json").write_text(json.dumps(result, indent=2))


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="gpu_bench", help="folder for the JSON and markdown")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--levers", nargs="+", default=["default"],
                        help=f"default, all, none, or names: {', '.join(LEVERS)}")
    parser.add_argument("--iterations", type=int, default=None,
                        help="timed iterations per measurement (default 2; 1 with --tiny)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations first (>= 1)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's dense bf16 peak (default: the table, else measured)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: levers that would end later are skipped (default 480; "
                             "none with --tiny)")
    parser.add_argument("--compile-allowance", type=float, default=150.0,
                        help="seconds a compile lever is expected to spend compiling")
    parser.add_argument("--two-processes", action="store_true",
                        help="run the 2-process lever even with fewer than 2 GPUs (CPU: gloo)")
    parser.add_argument("--no-text-encoder", action="store_true")
    parser.add_argument("--estimate", action="store_true",
                        help="print the default set's predicted time and exit")
    parser.add_argument("--tiny", action="store_true",
                        help="the same code on tiny configs of the same classes (CPU, seconds)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if args.warmup < 1:
        parser.error("--warmup must be >= 1 (the floor's inputs are captured in it)")
    args.iterations = args.iterations or (1 if args.tiny else 2)
    args.budget = args.budget if args.budget is not None else (0 if args.tiny else 480.0)
    args.two_processes = args.two_processes or torch.cuda.device_count() >= 2
    quiet()
    progress = Progress()
    print(machine_info(), flush=True)
    peak, source = device_peak(args.peak_tflops)
    if args.estimate:
        print(json.dumps(estimate(args, peak), indent=2))
        return
    if not args.tiny:
        guess = estimate(args, peak)
        parts = ", ".join(f"{f} {guess[f]['seconds']:.0f} s" for f in args.families)
        progress(f"estimate from the FLOP counts at {guess['assumed_mfu']:.0%} MFU: "
                 f"{guess['total_seconds']:.0f} s ({parts})")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    progress(f"device {device}, peak {peak:.1f} TFLOP/s ({source})")
    result: dict[str, Any] = {"device": device, "peak_tflops": peak, "peak_source": source,
                              "tiny": args.tiny, "torch": torch.__version__,
                              "cuda_devices": torch.cuda.device_count(),
                              "recipe_gpu_memory_bytes": RECIPE_GPU_BYTES,
                              "iterations": args.iterations, "warmup": args.warmup,
                              "families": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="flowgrpo-gpubench-") as folder, bench_families():
        families = result["families"]
        for family in args.families:  # every base first: the budget only ever cuts levers
            families[family] = run_base(family, args, peak, progress, folder)
            save(result, out, progress)
        queue = [(f, lv) for f in args.families for lv in lever_plan(f, args) if lv != "compile"]
        queue += [(f, lv) for f in args.families for lv in lever_plan(f, args) if lv == "compile"]
        for family, lever in queue:  # compilations last: the longest and least predictable
            if "levers" in families[family]:
                families[family]["levers"][lever] = run_lever(family, lever, args, peak,
                                                              progress, folder, families[family])
                save(result, out, progress)
        for family in args.families:  # in the plan's order
            levers = families[family].get("levers")
            if levers is not None:
                families[family]["levers"] = {lv: levers[lv] for lv in lever_plan(family, args)}
    save(result, out, progress)
    table = markdown(result)
    (out / "gpu_bench.md").write_text(table)
    print("\n" + table, flush=True)
    progress(f"wrote {out / 'gpu_bench.json'} and {out / 'gpu_bench.md'}")


if __name__ == "__main__":
    main()
