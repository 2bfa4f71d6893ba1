"""The speed levers of a GRPO iteration, each against the default, in one run.

Per configuration, on the shipped toy and on the tiny SD3 (``benchmarks/_iteration.py``): the
transformer calls per iteration without and with gradient, the median time per iteration and
the peak extra resident memory (a fresh process per configuration), with ratios against
``default``:

- ``steps_per_call=3`` / ``=9``: the ratio objective replays 3 (or all 9) trained steps in one
  transformer call with one backward (``train.objective_params: {steps_per_call: N}``);
- ``rollout chunks of 16``: the rollout runs in chunks of 16 samples (``train.sample_batch_size``)
  while training keeps minibatches of the whole batch;
- ``compile``: ``model.compile: default`` (TorchDynamo + Inductor on the transformer's forward;
  the warm-up iterations pay the compilation, the timed ones do not);
- ``fused AdamW``: ``train.optimizer_kernel: fused`` (on by default on CUDA only).

    python benchmarks/levers.py [--model toy|sd3|both] [--iterations 5] [--warmup 1]
        [--memory-iterations 1] [--threads 1]

Use ``--warmup 2``: the first iteration compiles the no-grad and grad graphs, the second may
still compile the shapes it has not met (the last, smaller chunk).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _iteration import compare_main  # noqa: E402

CONFIGS = {
    "default": [],
    "steps_per_call=3": ["train.objective_params={steps_per_call: 3}"],
    "steps_per_call=9": ["train.objective_params={steps_per_call: 9}"],
    "rollout chunks of 16": ["train.sample_batch_size=16"],
    "compile": ["model.compile=default"],
    "fused AdamW": ["train.optimizer_kernel=fused"],
}

if __name__ == "__main__":
    compare_main(__doc__.split("\n")[0], __file__, CONFIGS, "default")
