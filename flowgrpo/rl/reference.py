"""The reference policy for the KL term, and the trained LoRA weights that set the policy apart
from it.

The reference is the base model: with LoRA, the same transformer with the adapter disabled (no
extra memory); with full fine-tuning, a frozen copy made before training
(``adapter.reference_copy``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from flowgrpo.distributed import unwrap
from pipelines import FlowAdapter

ADAPTER_NAME = "default"


_LORA_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The peft LoRA layers of ``model``, found once per model and cached (weakly).

    diffusers' ``disable_adapters``/``enable_adapters`` walk every module and re-read peft's
    installed version on each use: 2.8 ms per reference call on the toy, ~3% of an iteration
    (``benchmarks/lora_toggle.py``). Switching the cached layers with peft's own per-layer
    ``enable_adapters`` does the same thing (the flag, and the LoRA weights' ``requires_grad``)
    in a quarter of the time."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = _LORA_LAYERS.get(model)
    if layers is None:
        layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        _LORA_LAYERS[model] = layers
    return layers


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
    layers = lora_layers(model)
    if not layers:
        model.disable_adapters()  # diffusers' own error: the model has no adapter
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def lora_state_dict(adapter: FlowAdapter) -> dict[str, torch.Tensor]:
    """The transformer's LoRA weights in the layout diffusers' ``load_lora_weights`` expects."""
    from peft.utils import get_peft_model_state_dict

    return get_peft_model_state_dict(unwrap(adapter.transformer), adapter_name=ADAPTER_NAME)
