"""Exponential moving average of the trainable weights (used for eval when enabled)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class EMA:
    """``shadow = decay * shadow + (1 - decay) * param`` after every optimizer step (fp32)."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float) -> None:
        self.params = params
        self.decay = decay
        self.shadow = [p.detach().float().clone() for p in params]

    @torch.no_grad()
    def update(self) -> None:
        for s, p in zip(self.shadow, self.params):
            s.lerp_(p.detach().float(), 1 - self.decay)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Within the block the parameters hold the EMA weights."""
        backup = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for s, p in zip(self.shadow, self.params):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for b, p in zip(backup, self.params):
                    p.copy_(b)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {str(i): s for i, s in enumerate(self.shadow)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from flowgrpo.distributed import copy_full_

        for i, s in enumerate(self.shadow):
            copy_full_(s, state[str(i)])  # whole tensors from a checkpoint, sharded or not
