"""Model setup: load the adapter (after :func:`flowgrpo.training.hub.check_model_path`), make the
transformer trainable (LoRA or full fine-tuning, which keeps a frozen reference copy) and compile
its forward. The reference policy itself is :mod:`flowgrpo.rl.reference`."""

from __future__ import annotations

import copy

import torch

import pipelines
from flowgrpo import console
from flowgrpo.config.schema import ModelConfig
from flowgrpo.distributed import unwrap
from flowgrpo.rl.reference import ADAPTER_NAME
from flowgrpo.training.hub import check_model_path, resolve_path
from pipelines import FlowAdapter


def load_adapter(cfg: ModelConfig, device: torch.device | str = "cpu") -> FlowAdapter:
    """Check ``model.path`` (:func:`check_model_path`), load the configured family and move it to
    ``device``; every weight starts frozen."""
    check_model_path(cfg)
    options = dict(cfg.options)
    if cfg.height:
        options["height"] = cfg.height
    if cfg.width:
        options["width"] = cfg.width
    if cfg.negative_prompt:  # else each family's own default (sd3: "")
        options.setdefault("negative_prompt", cfg.negative_prompt)
    console.apply_to_libraries()  # the command's --quiet / --verbose, before the loading bars
    adapter = pipelines.load(cfg.family, resolve_path(cfg.path), torch_dtype=cfg.dtype, **options)
    adapter.to(device)
    for name in ("transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
        module = getattr(adapter.pipeline, name, None)
        if isinstance(module, torch.nn.Module):
            module.requires_grad_(False)
            module.eval()
    return adapter


def lora_config(cfg: ModelConfig, adapter: FlowAdapter):
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        init_lora_weights="gaussian",
        target_modules=list(cfg.lora_targets or adapter.default_lora_targets),
    )


def make_trainable(cfg: ModelConfig, adapter: FlowAdapter) -> list[torch.nn.Parameter]:
    """Add a LoRA (or unfreeze everything) and return the trainable parameters (fp32)."""
    transformer = adapter.transformer
    if cfg.lora:
        adapter.add_lora(lora_config(cfg, adapter), ADAPTER_NAME)
        params = [p for n, p in transformer.named_parameters() if "lora_" in n]
    else:
        adapter.reference_copy = copy.deepcopy(transformer).requires_grad_(False).eval()
        params = list(transformer.parameters())
    for p in params:
        p.requires_grad_(True)
        p.data = p.data.float()  # trainable weights live in fp32; autocast handles compute
    if cfg.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    transformer.train()
    return params


def compile_forward(module: torch.nn.Module, mode: str) -> None:
    """``torch.compile`` the forward of ``module`` (the model inside any wrapper) in place.

    Only ``forward`` is compiled, so the module's hooks (the call counter) still run eagerly
    around it, and wrappers (DDP, FSDP) and ``unwrap`` see the same module as before. The LoRA
    switch of a reference call and grad / no-grad each get their own graph on first use."""
    inner = unwrap(module)
    inner.forward = torch.compile(inner.forward, mode=mode)


