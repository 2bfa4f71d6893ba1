"""Cost of an iteration per step selection: full trajectory, MixGRPO, MixGRPO-Flash, Flash-GRPO.

Per configuration, on the shipped toy and on the tiny SD3 (``benchmarks/_iteration.py``): the
trained steps per sample ``J``, the transformer calls per iteration without and with gradient
(``calls/nograd``, ``calls/grad`` from ``trainer.calls.take()``: rows per iteration, CFG counted
twice, the reference calls of the KL term included), the median time per iteration and the peak
extra resident memory of an iteration (with glibc's default allocator settings, and with
``MALLOC_MMAP_THRESHOLD_=65536``: see ``_iteration.py``), with ratios against the full trajectory:

- ``all``: every trainable step (Flow-GRPO): 9 of the 10 steps;
- ``window``: MixGRPO's sliding window, ``{size: 2, strategy: progressive}`` (it moves one
  step per iteration, so the window sits at a different place in each timed iteration);
- ``window + dpm2``: the same window with the deterministic tail after it re-gridded and solved
  with DPM-Solver++(2M) (``sampler.after_window: dpm2``, MixGRPO-Flash): fewer rollout calls,
  how many fewer depends on where the window is (the range is printed);
- ``flash``: Flash-GRPO, one trained step per prompt group.

Time: all four trainers live in one process per model and their iterations are interleaved
round-robin, so load from other processes hits all alike; peak memory: a fresh process per
configuration (see ``_iteration.py``).

    python benchmarks/step_selection.py [--model toy|sd3|both] [--iterations 5] [--warmup 1]
        [--memory-iterations 1] [--threads 1]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _iteration import compare_main  # noqa: E402

WINDOW = ["train.step_selection=window",
          "train.step_selection_params={size: 2, strategy: progressive}"]
CONFIGS = {
    "all (Flow-GRPO)": [],
    "window (MixGRPO)": WINDOW,
    "window + dpm2 (MixGRPO-Flash)": [*WINDOW, "sampler.after_window=dpm2"],
    "flash (Flash-GRPO)": ["train.step_selection=flash"],
}

if __name__ == "__main__":
    compare_main(__doc__.split("\n")[0], __file__, CONFIGS, "all (Flow-GRPO)")
