"""dFlowGRPO's Monte-Carlo step probability against the exact metric-path step, by ``n_mc``.

    python benchmarks/discrete_mc.py

Prints, for each ``n_mc``, the mean absolute error of the estimated step probability of a realised
next token (over 64 tokens and 20 draws of the estimator) and that error times ``sqrt(n_mc)``,
which stays about constant when the error falls as ``1 / sqrt(n_mc)``.
"""

from __future__ import annotations

import math

import torch

from samplers import discrete


def main() -> None:
    v, tokens = 17, 64  # intensities 0..16 of the 8x8 digits
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, tokens, v, generator=gen)
    old = logits + 0.3 * torch.randn(1, tokens, v, generator=gen)
    i = torch.arange(v, dtype=torch.float32)
    distance = (i[:, None] - i[None, :]).abs()
    x_t = torch.randint(0, v, (1, tokens), generator=gen)
    exact = discrete.metric_step(logits, x_t, distance, t=0.5, h=0.125)
    x_next = exact.sample(gen)
    truth = exact.token_log_probs(x_next).exp()
    print(f"{'n_mc':>6} {'mean |error|':>13} {'error * sqrt(n)':>16}")
    for n_mc in (1, 4, 16, 64, 256, 1024):
        errors = []
        for r in range(20):
            est = discrete.metric_step_log_prob_mc(logits, old, x_t, x_next, distance, 0.5, 0.125,
                                                   n_mc, torch.Generator().manual_seed(r))
            errors.append(float((est.exp() - truth).abs().mean()))
        err = sum(errors) / len(errors)
        print(f"{n_mc:>6} {err:>13.5f} {err * math.sqrt(n_mc):>16.4f}")


if __name__ == "__main__":
    main()
