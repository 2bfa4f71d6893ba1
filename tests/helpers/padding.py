"""A check shared by the per-prompt-length families: what lies beyond a sample's own length moves
no loss and no metric of any objective unit."""

from __future__ import annotations

import torch

from flowgrpo.training.trainer import canonical_advantages


def assert_padding_moves_no_loss(trainer, batch, advantages, lengths) -> None:
    """With advantages made distinct per sample and the weights moved after ``prepare`` (so
    ratios and KLs are not at their trivial values), every unit's loss and metrics are the same
    when each sample's latents past ``lengths[i]`` are replaced by large noise."""
    adv = canonical_advantages(advantages, batch)  # [B, V, J, P], nonzero
    n = adv.shape[0]
    batch.advantages = adv + torch.linspace(1.0, -1.0, n).reshape(n, 1, 1, 1)
    weights = [w.detach().clone() for w in trainer.params]
    idx = torch.arange(n)

    def losses():
        """Prepared at the sampling weights, the loss of every unit at moved ones."""
        with torch.no_grad():
            for w, w0 in zip(trainer.params, weights):
                w.copy_(w0)
        state = trainer.objective.prepare(batch)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for w in trainer.params:
                w.add_(0.05 * torch.randn(w.shape, generator=gen))
        out = [trainer.objective.loss(batch, state, idx, unit)
               for unit in trainer.objective.units(batch)]
        return [(loss.item(), {k: float(v) for k, v in m.items()}) for loss, m in out]

    before = losses()
    assert any(m.get("train/kl", 0.0) > 1e-6 for _, m in before)
    for i, length in enumerate(lengths.tolist()):
        tail = batch.traj.latents[i, :, length:]
        batch.traj.latents[i, :, length:] = 5 * torch.randn(tail.shape)
    for (loss, metrics), (moved, moved_metrics) in zip(before, losses()):
        assert abs(loss - moved) <= 1e-6 * max(1.0, abs(loss))
        for key, value in metrics.items():
            assert abs(moved_metrics[key] - value) <= 1e-6 * max(1.0, abs(value)), key
