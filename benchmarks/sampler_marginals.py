"""Final-marginal error of each sampler on the 1-D analytic bed, at matched randomness.

Data ``N(mu, c^2)``, exact velocity (no model), so the only error is the sampler's
discretization. Every sampler starts from the same noise ``x1`` and, where it is stochastic,
draws the same per-step noise ``z_k``; ``sde`` (Flow-GRPO ``g``) and ``langevin`` inject the same
std per step, ``cps`` uses the same ``noise_level``. The error is the 1-D 2-Wasserstein distance
between the final samples and ``N(mu, c^2)`` (sorted samples against exact quantiles); the
``exact ODE`` row is the Monte-Carlo floor (the exact flow ``mu + c * x1`` of the same noise).

    python benchmarks/sampler_marginals.py [--samples 200000] [--mu 0.5] [--c 0.5] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import torch

import samplers
from samplers.analytic import GaussianFlow, w2_to_marginal

ROWS = [
    ("ode", "ode", {}),
    ("sde (flow_grpo)", "sde", {"schedule": "flow_grpo", "noise_level": 0.7}),
    ("cps", "cps", {"noise_level": 0.7}),
    ("langevin (reuse)", "langevin", {"noise_level": 0.7, "velocity": "reuse"}),
    ("langevin (model)", "langevin", {"noise_level": 0.7, "velocity": "model"}),
]
STEPS = (4, 6, 10, 20)


def schedule(num_steps: int, shift: float) -> torch.Tensor:
    """``[num_steps + 1]`` sigmas from 1 to 0, SD3-shifted: ``shift*s / (1 + (shift-1)*s)``."""
    s = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    return (shift * s / (1.0 + (shift - 1.0) * s)).to(torch.float32)


def final_samples(
    sampler: samplers.Sampler, flow: GaussianFlow, sigmas: torch.Tensor, x1: torch.Tensor,
    noises: torch.Tensor,
) -> torch.Tensor:
    """Roll ``x1`` ``[n]`` down ``sigmas`` with the exact velocity; ``noises`` ``[N, n]``."""
    x = x1
    for k in range(len(sigmas) - 1):
        s, s_next = float(sigmas[k]), float(sigmas[k + 1])
        t = sampler.transition(flow.velocity(x, s), x, s, s_next, velocity_fn=flow.velocity)
        x = samplers.sample_next(t, noise=noises[k])
    return x


def table(flow: GaussianFlow, shift: float, n: int, seed: int) -> str:
    """One markdown table: a row per sampler, a column per number of steps."""
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n, generator=g)
    noises = torch.randn(max(STEPS), n, generator=g)
    lines = [
        "| sampler | " + " | ".join(f"{k} steps" for k in STEPS) + " |",
        "| --- |" + " ---: |" * len(STEPS),
    ]
    for label, name, params in ROWS:
        sampler = samplers.build(name, **params)
        errors = [
            w2_to_marginal(final_samples(sampler, flow, schedule(k, shift), x1, noises[:k]), flow)
            for k in STEPS
        ]
        lines.append(f"| {label} | " + " | ".join(f"{e:.4f}" for e in errors) + " |")
    floor = w2_to_marginal(flow.ode_solution(x1, 0.0), flow)
    lines.append("| exact ODE (MC floor) | " + " | ".join(f"{floor:.4f}" for _ in STEPS) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000, help="1-D samples per run")
    parser.add_argument("--mu", type=float, default=0.5, help="data mean")
    parser.add_argument("--c", type=float, default=0.5, help="data standard deviation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    flow = GaussianFlow(mu=args.mu, c=args.c)
    start = time.perf_counter()
    print(
        f"Final-marginal W2 to N({flow.mu}, {flow.c}^2), {args.samples} samples, seed "
        f"{args.seed}, noise_level 0.7, same x1 and per-step noise for every sampler.\n"
    )
    for shift, title in ((1.0, "uniform sigmas"), (3.0, "SD3-shifted sigmas (shift 3)")):
        print(f"**{title}**\n\n{table(flow, shift, args.samples, args.seed)}\n")
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
