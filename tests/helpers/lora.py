"""A LoRA round trip through an adapter's own files, for the family tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch


def assert_lora_round_trip(adapter, loaded, directory: str | Path,
                           outputs: Callable[[object], torch.Tensor]) -> dict[str, torch.Tensor]:
    """Add a rank-4 LoRA on ``adapter.default_lora_targets``, move its ``B`` matrices off zero
    (peft starts them there, which would make any round trip trivially equal), save it with
    ``adapter.save_lora`` and load it into ``loaded`` with ``load_lora``: ``outputs`` of both
    must agree and differ from ``adapter``'s before the LoRA. Returns the saved state dict."""
    from peft import LoraConfig, get_peft_model_state_dict

    with torch.no_grad():
        base = outputs(adapter)
    config = LoraConfig(r=4, lora_alpha=4, target_modules=list(adapter.default_lora_targets),
                        init_lora_weights="gaussian")
    adapter.add_lora(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in adapter.transformer.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    state = get_peft_model_state_dict(adapter.transformer)
    adapter.save_lora(str(directory), state, config.to_dict())
    loaded.load_lora(str(directory))
    with torch.no_grad():
        trained = outputs(adapter)
        torch.testing.assert_close(outputs(loaded), trained)
    assert not torch.allclose(trained, base), "the LoRA does not change the outputs"
    return state
