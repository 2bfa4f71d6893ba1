"""Cost of an iteration per objective: ratio (Flow-GRPO) and the likelihood-free elbo, nft, awm.

Per objective, on the shipped toy and on the tiny SD3 (``benchmarks/_iteration.py``): the
transformer calls per iteration without and with gradient (``calls/nograd``, ``calls/grad``:
rows per iteration, CFG counted twice, the KL term's reference calls included), the median time
per iteration and the peak extra resident memory of an iteration (with glibc's default
allocator settings, and with ``MALLOC_MMAP_THRESHOLD_=65536``: see ``_iteration.py``), with
ratios against ``ratio``:

- ``ratio``: the per-step Gaussian ratio on the ``sde`` rollout, every trainable step (``J`` =
  9 of 10), the run's ``clip`` loss;
- ``elbo``, ``nft``, ``awm``: trained on the final samples through the forward process with
  their default parameters (``draws: 4`` noise levels per sample), so the rollout is the
  deterministic ODE (``sampler.name: ode``, ``sampler.params: {}``; ``J`` = 0). ``elbo`` runs
  its 4 draws as one batched call per minibatch, ``nft`` and ``awm`` one unit (call) per draw;
  each recomputes its old-policy quantities before the update (``objective.prepare``), ``nft``
  from a snapshot of the weights it swaps in for sampling.

Time: all four trainers live in one process per model, their iterations interleaved
round-robin; peak memory: a fresh process per objective (see ``_iteration.py``).

    python benchmarks/objectives.py [--model toy|sd3|both] [--iterations 5] [--warmup 1]
        [--memory-iterations 1] [--threads 1]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _iteration import compare_main  # noqa: E402

LIKELIHOOD_FREE = ["sampler.name=ode", "sampler.params={}"]
CONFIGS = {
    "ratio (sde)": [],
    "elbo (ode)": ["train.objective=elbo", *LIKELIHOOD_FREE],
    "nft (ode)": ["train.objective=nft", *LIKELIHOOD_FREE],
    "awm (ode)": ["train.objective=awm", *LIKELIHOOD_FREE],
}

if __name__ == "__main__":
    compare_main(__doc__.split("\n")[0], __file__, CONFIGS, "ratio (sde)")
