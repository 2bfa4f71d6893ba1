"""One process with a global batch of 2N and two processes with N each compute the same run:
the same prompt groups, noise, rewards, advantages and updated weights. All sampling randomness
is keyed by global indices, and each global minibatch's gradient is its mean on any number of
processes."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

JOB = str(Path(__file__).with_name("equal_job.py"))


@pytest.mark.slow
def test_one_process_equals_two_processes(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    proc = subprocess.run([sys.executable, JOB, str(one), "16"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
         "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
         "--main_process_port", "29523", JOB, str(two), "8"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 processes" in proc.stdout  # the world size is shown at start
    a, b = load_file(str(one / "record.safetensors")), load_file(str(two / "record.safetensors"))
    assert int(a.pop("world")) == 1 and int(b.pop("world")) == 2
    assert sorted(a) == sorted(b)
    for key in sorted(a):
        if key.endswith((".groups", ".noise")):  # drawn from global indices: bitwise equal
            assert torch.equal(a[key], b[key]), key
        else:
            torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=0, msg=key)
    moved = [k for k in a if k.startswith("weight.") and a[k].abs().max() > 0]
    assert moved, "the run did not train"
    # the advantages are not all zero and differ between groups: the update had a signal
    assert a["1.advantages"].abs().max() > 0.1
