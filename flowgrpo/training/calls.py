"""Model-call accounting: transformer calls per sample, with and without gradient.

Sample efficiency is compared on model calls, not iterations (docs/design.md, "Data flow of one
iteration"). A forward pre-hook on the transformer counts the rows of every call: a call on ``b``
samples counts ``b``, and classifier-free guidance, which runs as one batched call on ``2b`` rows,
counts ``2b``. Calls under ``torch.no_grad`` (rollout, completions, reference, old-policy
recomputes) go to ``calls/nograd``, calls that build a graph (training forwards) to ``calls/grad``;
the running totals are ``calls/nograd_total`` and ``calls/grad_total``. Eval is not counted. Counts
are per process, like every batch size (the logged value is their mean over processes).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def _rows(args: tuple, kwargs: dict) -> int:
    """Batch size of a transformer call: dim 0 of ``hidden_states`` or the first tensor."""
    first = kwargs.get("hidden_states")
    if not isinstance(first, torch.Tensor):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        first = tensors[0] if tensors else None
    return int(first.shape[0]) if first is not None and first.ndim else 0


class CallCounter:
    """Counts the rows of every call of the hooked modules, per epoch and in total."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self.epoch = {"nograd": 0, "grad": 0}
        self.total = {"nograd": 0, "grad": 0}
        self.active = True
        for module in modules:
            module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        if self.active:
            self.epoch["grad" if torch.is_grad_enabled() else "nograd"] += _rows(args, kwargs)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Calls inside the block are not counted (eval)."""
        self.active = False
        try:
            yield
        finally:
            self.active = True

    def take(self) -> dict[str, float]:
        """This epoch's counts and the running totals; starts a new epoch."""
        out = {}
        for key in ("nograd", "grad"):
            self.total[key] += self.epoch[key]
            out[f"calls/{key}"] = float(self.epoch[key])
            out[f"calls/{key}_total"] = float(self.total[key])
            self.epoch[key] = 0
        return out

    def state(self) -> dict[str, int]:
        """The running totals (checkpointed, so a resumed run keeps counting)."""
        return dict(self.total)

    def load(self, state: dict[str, int]) -> None:
        self.total = {"nograd": int(state.get("nograd", 0)), "grad": int(state.get("grad", 0))}
