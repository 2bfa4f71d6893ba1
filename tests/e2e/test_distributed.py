"""Two CPU processes through accelerate: groups gathered, DDP keeps the weights identical."""

import json
import subprocess
import sys

import pytest

from helpers import ROOT

HELPERS = ROOT / "tests" / "helpers"


@pytest.mark.slow
def test_two_process_training_on_cpu(tiny_sd3_dir, tmp_path):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
           "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--main_process_port", "29517",
           str(HELPERS / "dist_job.py"), tiny_sd3_dir,
           str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]  # two processes, each aware of the other
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # DDP kept the replicas in step
    assert ranks[0]["reward_mean"] == ranks[1]["reward_mean"]  # rewards gathered globally
    assert (tmp_path / "checkpoints" / "step_2" / "rng_rank1.safetensors").is_file()
