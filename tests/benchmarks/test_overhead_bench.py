"""``benchmarks/overhead.py`` still times every phase it names: each wrapped function exists
where the trainer calls it (a renamed or moved one stops the script), and the phases it prints
add up to the iteration it measured."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.mark.slow
def test_toy_overhead_run_times_every_phase():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--model", "toy",
         "--iterations", "1", "--warmup", "1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for label in ("rollout", "sampler transition", "replay_step", "decode (VAE)",
                  "compute_advantages", "objective.loss"):
        assert label in out, f"no {label!r} row in:\n{out[-3000:]}"
    phases = dict(re.findall(r"^  (sample|update)\s+([\d.]+) = transformer", out, re.M))
    assert set(phases) == {"sample", "update"}, out[-3000:]
    assert all(float(ms) > 0 for ms in phases.values())
