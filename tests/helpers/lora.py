"""A family loaded from its saved folder, and a LoRA round trip through the adapter's own files,
for the family tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch


def assert_folder_and_lora_round_trip(adapter, load: Callable[[str], object],
                                      directory: str | Path,
                                      outputs: Callable[[object], torch.Tensor]
                                      ) -> dict[str, torch.Tensor]:
    """Save ``adapter``'s pipeline under ``directory`` and ``load`` it back from that folder: its
    ``outputs`` equal the adapter's. Then add a rank-4 LoRA on ``adapter.default_lora_targets``,
    move its ``B`` matrices off zero (peft starts them there, which would make any round trip
    trivially equal), save it with ``adapter.save_lora`` and load it into the loaded one with
    ``load_lora``: ``outputs`` of both must agree and differ from ``adapter``'s before the LoRA.
    Returns the saved state dict."""
    from peft import LoraConfig, get_peft_model_state_dict

    directory = Path(directory)
    adapter.pipeline.save_pretrained(str(directory / "model"))
    loaded = load(str(directory / "model"))
    with torch.no_grad():
        base = outputs(adapter)
        torch.testing.assert_close(outputs(loaded), base)
    config = LoraConfig(r=4, lora_alpha=4, target_modules=list(adapter.default_lora_targets),
                        init_lora_weights="gaussian")
    adapter.add_lora(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in adapter.transformer.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    state = get_peft_model_state_dict(adapter.transformer)
    adapter.save_lora(str(directory / "lora"), state, config.to_dict())
    loaded.load_lora(str(directory / "lora"))
    with torch.no_grad():
        trained = outputs(adapter)
        torch.testing.assert_close(outputs(loaded), trained)
    assert not torch.allclose(trained, base), "the LoRA does not change the outputs"
    return state
