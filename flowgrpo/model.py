"""Model setup: load the adapter, make the transformer trainable (LoRA or full), the reference.

The reference policy for the KL term is the base model: with LoRA, the same transformer with the
adapter disabled (no extra memory); with full fine-tuning, a frozen copy made before training.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch

import pipelines
from pipelines import FlowAdapter

from .config import ModelConfig

ADAPTER_NAME = "default"


def resolve_path(path: str) -> str:
    """``"digits"`` -> the shipped toy model folder; anything else unchanged."""
    if path == "digits":
        from pipelines.toy import DIGITS_MODEL

        return str(DIGITS_MODEL)
    return path


def load_adapter(cfg: ModelConfig, device: torch.device | str = "cpu") -> FlowAdapter:
    """Load the configured family and move it to ``device``; every weight starts frozen."""
    options = dict(cfg.options)
    if cfg.height:
        options["height"] = cfg.height
    if cfg.width:
        options["width"] = cfg.width
    if cfg.family == "sd3" or cfg.negative_prompt:
        options.setdefault("negative_prompt", cfg.negative_prompt)
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
        transformer.add_adapter(lora_config(cfg, adapter), adapter_name=ADAPTER_NAME)
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


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP/compile wrapper."""
    while hasattr(module, "module"):
        module = module.module
    return getattr(module, "_orig_mod", module)


@contextmanager
def reference(adapter: FlowAdapter) -> Iterator[None]:
    """Within the block, ``adapter.velocity`` is the reference (base) model's."""
    ref = getattr(adapter, "reference_copy", None)
    if ref is not None:
        trained, adapter.transformer = adapter.transformer, ref
        try:
            yield
        finally:
            adapter.transformer = trained
        return
    model = unwrap(adapter.transformer)
    model.disable_adapters()
    try:
        yield
    finally:
        model.enable_adapters()


def lora_state_dict(adapter: FlowAdapter) -> dict[str, torch.Tensor]:
    """The transformer's LoRA weights in the layout diffusers' ``load_lora_weights`` expects."""
    from peft.utils import get_peft_model_state_dict

    return get_peft_model_state_dict(unwrap(adapter.transformer), adapter_name=ADAPTER_NAME)
