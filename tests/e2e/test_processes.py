"""One process with a global batch of 2N and two processes with N each compute the same run:
the same prompt groups, noise, rewards, advantages and updated weights. All sampling randomness
is keyed by global indices, and each global minibatch's gradient is its mean on any number of
processes."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from helpers import ROOT

JOB = str(ROOT / "tests" / "helpers" / "equal_job.py")


def job(*args: str, processes: int = 1) -> subprocess.CompletedProcess:
    launch = [sys.executable]
    if processes > 1:
        launch += ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                   str(processes), "--num_machines", "1", "--mixed_precision", "no",
                   "--dynamo_backend", "no", "--main_process_port", "29523"]
    proc = subprocess.run([*launch, JOB, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """Two epochs of the toy in one process with a batch of 16."""
    one = tmp_path_factory.mktemp("one")
    job(str(one), "16")
    return load_file(str(one / "record.safetensors"))


@pytest.mark.slow
def test_one_process_equals_two_processes(tmp_path, one_process):
    two = tmp_path / "two"
    proc = job(str(two), "8", processes=2)
    assert "flowgrpo: 2 processes, DDP, cpu" in proc.stdout  # the world size is shown at start
    a, b = dict(one_process), load_file(str(two / "record.safetensors"))
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


@pytest.mark.slow
def test_a_two_process_checkpoint_resumes_in_one_process_with_the_global_batch(tmp_path,
                                                                                one_process):
    """Correct by construction: 2 x 8 for an epoch, then 1 x 16 for the next, is the run of
    1 x 16 throughout; a resume that changes the global batch is refused."""
    run = tmp_path / "run"
    job(str(run), "8", "1", processes=2)
    proc = subprocess.run([sys.executable, JOB, str(run), "8", "2", "resume"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "train.batch_size x processes is 16 in the checkpoint (2 processes) and 8 now (1)" \
        in proc.stderr
    job(str(run), "16", "2", "resume")
    b = load_file(str(run / "record.safetensors"))
    for key in [k for k in b if k.startswith(("1.", "weight."))]:
        torch.testing.assert_close(one_process[key], b[key], atol=1e-5, rtol=0, msg=key)
