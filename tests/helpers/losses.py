"""A policy loss evaluated on hand-made log-ratios, for the tests of every loss."""

from __future__ import annotations

import torch

from flowgrpo.rl import losses


def run_loss(name: str, log_ratio: list[float], adv: list[float], **params):
    """Evaluate loss ``name`` at the given log-ratios; return ``(loss, grad wrt logp, metrics)``."""
    logp_old = torch.linspace(-3.0, -1.0, len(log_ratio))
    logp = (logp_old + torch.tensor(log_ratio)).requires_grad_(True)
    loss, metrics = losses.get(name)(logp, logp_old, torch.tensor(adv), **params)
    loss.backward()
    return loss.detach(), logp.grad, metrics
